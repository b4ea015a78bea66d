"""The width arithmetic, environment knobs and machine facts of multistart.width, on literal
numbers and fake devices: nothing here compiles."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from multistart import width as m
from multistart.width import machine

GiB = 2**30


# -- pure arithmetic -------------------------------------------------------------------------


def test_linear_fit_through_two_estimates():
    assert m.linear_fit(1, 300, 4, 900) == (100.0, 200.0)
    assert m.linear_fit(8, 6000, 1, 11000) == (11000.0, 0.0)  # not monotone: no slope
    assert m.linear_fit(1, 100, 3, 700) == (0.0, 300.0)  # intercept below zero is clipped
    with pytest.raises(ValueError, match="two different widths"):
        m.linear_fit(2, 1, 2, 5)


@pytest.mark.parametrize(
    "fixed, per, budget, upper, expected",
    [
        (100, 200, 1000, 64, 4),  # (1000 - 100) / 200 = 4.5
        (100, 200, 1100, 64, 5),  # exactly fits
        (0, 1, 10**9, 64, 64),  # capped by upper
        (2000, 200, 1000, 64, 1),  # not even one fits: one, and the caller warns
        (100, 0, 1000, 64, 64),  # no per-start cost
        (2000, 0, 1000, 64, 1),
    ],
)
def test_width_for_budget(fixed, per, budget, upper, expected):
    width = m.width_for_budget(fixed, per, budget, upper)
    assert width == expected
    if expected > 1:
        assert fixed + width * per <= budget
        assert width == upper or fixed + (width + 1) * per > budget


def test_balanced_width_keeps_the_chunk_count_and_trims_padding():
    assert m.balanced_width(32, 12) == 11  # 3 chunks either way
    assert m.balanced_width(32, 8) == 8
    assert m.balanced_width(10, 8) == 5  # 2 chunks: 5 + 5 rather than 8 + 2 (+6 padding)
    assert m.balanced_width(5, 64) == 5
    for n in range(1, 40):
        for w in range(1, 45):
            b = m.balanced_width(n, w)
            assert b <= min(n, w) and math.ceil(n / b) == math.ceil(n / min(n, w))
    with pytest.raises(ValueError):
        m.balanced_width(0, 4)


def test_caps():
    assert m.cap_width(64, 40, None) == 40
    assert m.cap_width(64, 40, 8) == 8
    assert m.cap_width(3, 40, 8) == 3
    assert m.count_cap("cpu", 64, 2) == 8
    assert m.count_cap("cpu", 64, 16) == 64
    assert m.count_cap("cpu", 5, 2) == 5
    assert m.count_cap("gpu", 4096, 2) == 4096
    assert m.count_cap("tpu", 4096, 2) == 4096  # a TPU: at most TPU_AUTO_WIDTH
    assert m.count_cap("tpu", 10 * m.TPU_AUTO_WIDTH, 2) == m.TPU_AUTO_WIDTH


def test_candidate_widths():
    assert m.candidate_widths(1) == [1]
    assert m.candidate_widths(2) == [1, 2]
    assert m.candidate_widths(12) == [1, 2, 4, 8, 12]
    assert m.candidate_widths(16) == [1, 2, 4, 8, 16]
    assert m.candidate_widths(17) == [1, 2, 4, 8, 16, 17]
    with pytest.raises(ValueError):
        m.candidate_widths(0)


def test_auto_candidates_start_at_the_bound_then_one_then_narrow_by_eight():
    assert m.auto_candidates(1) == [1]
    assert m.auto_candidates(2) == [2, 1]
    assert m.auto_candidates(32) == [32, 1, 4]
    assert m.auto_candidates(100_000) == [100_000, 1, 12_500, 1563, 196, 25, 4]
    for upper in (3, 17, 64, 4096, 10**6):
        widths = m.auto_candidates(upper)
        assert widths[:2] == [upper, 1] and widths[2:] == sorted(widths[2:], reverse=True)
        assert len(widths) == len(set(widths)) <= 2 + upper.bit_length() // 3
    with pytest.raises(ValueError):
        m.auto_candidates(0)


def test_cpu_quota_arithmetic():
    assert m.parse_cpu_max("max 100000\n") is None
    assert m.parse_cpu_max("150000 100000") == 2  # 1.5 cores keep two threads half busy
    assert m.parse_cpu_max("200000 100000") == 2
    assert m.parse_cpu_max("50000") == 1  # the default period
    assert m.quota_cores(-1, 100000) is None  # cgroup v1: no quota
    assert m.quota_cores(250000, 100000) == 3


def test_out_of_memory_messages():
    assert m.is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 bytes."))
    assert m.is_out_of_memory(
        RuntimeError("INTERNAL: Error dispatching computation: Out of memory allocating 96 bytes.")
    )
    assert m.is_out_of_memory(RuntimeError("Failed to allocate request for 58.0GiB on device"))
    assert m.is_out_of_memory(MemoryError())
    assert not m.is_out_of_memory(RuntimeError("INVALID_ARGUMENT: shapes differ"))
    assert not m.is_out_of_memory(ValueError("RESOURCE_EXHAUSTED"))  # not a runtime error


# -- environment ------------------------------------------------------------------------------


def test_max_batch_from_env(monkeypatch):
    monkeypatch.delenv(m.ENV_MAX_BATCH, raising=False)
    assert m.max_batch_from_env() is None
    monkeypatch.setenv(m.ENV_MAX_BATCH, " 4 ")
    assert m.max_batch_from_env() == 4
    monkeypatch.setenv(m.ENV_MAX_BATCH, "")
    assert m.max_batch_from_env() is None
    for bad in ("0", "-2", "four", "2.5"):
        monkeypatch.setenv(m.ENV_MAX_BATCH, bad)
        with pytest.raises(ValueError, match="MULTISTART_MAX_BATCH must be a positive int"):
            m.max_batch_from_env()


def test_budget_from_env(monkeypatch):
    monkeypatch.delenv(m.ENV_BUDGET_GB, raising=False)
    assert m.budget_from_env() is None
    monkeypatch.setenv(m.ENV_BUDGET_GB, "0.5")
    assert m.budget_from_env() == GiB // 2
    for bad in ("0", "-1", "lots", "nan", "inf"):
        monkeypatch.setenv(m.ENV_BUDGET_GB, bad)
        with pytest.raises(ValueError, match="MULTISTART_MEMORY_BUDGET_GB must be a positive"):
            m.budget_from_env()


def test_auto_mode_from_env(monkeypatch):
    monkeypatch.delenv(m.ENV_AUTO_WIDTH, raising=False)
    assert m.auto_mode_from_env() == "measure"
    monkeypatch.setenv(m.ENV_AUTO_WIDTH, " memory ")
    assert m.auto_mode_from_env() == "memory"
    for bad in ("Memory", "time", "1"):
        monkeypatch.setenv(m.ENV_AUTO_WIDTH, bad)
        with pytest.raises(ValueError, match="MULTISTART_AUTO_WIDTH must be one of"):
            m.auto_mode_from_env()
        with pytest.raises(ValueError, match="MULTISTART_AUTO_WIDTH"):
            m.check_env()


# -- cgroups, on fake trees ------------------------------------------------------------------


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limits_take_the_tightest_level(tmp_path):
    _write(tmp_path / "job/memory.max", "max\n")
    _write(tmp_path / "job/step/memory.max", str(8 * GiB))
    _write(tmp_path / "job/step/memory.current", str(3 * GiB))
    _write(tmp_path / "job/memory.current", str(3 * GiB))
    _write(tmp_path / "job/cpu.max", "300000 100000\n")
    _write(tmp_path / "job/step/cpu.max", "max 100000\n")
    proc = "0::/job/step\n"
    assert m.cgroup_memory_available(tmp_path, proc) == 5 * GiB
    assert m.cgroup_cpu_limit(tmp_path, proc) == 3
    _write(tmp_path / "memory.max", str(4 * GiB))  # a tighter limit at the root
    _write(tmp_path / "memory.current", str(1 * GiB))
    assert m.cgroup_memory_available(tmp_path, proc) == 3 * GiB


def test_cgroup_v1_limits(tmp_path):
    _write(tmp_path / "memory/slurm/job1/memory.limit_in_bytes", str(6 * GiB))
    _write(tmp_path / "memory/slurm/job1/memory.usage_in_bytes", str(2 * GiB))
    _write(tmp_path / "memory/memory.limit_in_bytes", "9223372036854771712")  # unlimited
    _write(tmp_path / "cpu/slurm/job1/cpu.cfs_quota_us", "200000")
    _write(tmp_path / "cpu/slurm/job1/cpu.cfs_period_us", "100000")
    _write(tmp_path / "cpu/cpu.cfs_quota_us", "-1")
    _write(tmp_path / "cpu/cpu.cfs_period_us", "100000")
    proc = "4:memory:/slurm/job1\n3:cpu,cpuacct:/slurm/job1\n0::/\n"
    assert m.cgroup_memory_available(tmp_path, proc) == 4 * GiB
    assert m.cgroup_cpu_limit(tmp_path, proc) == 2


def test_no_cgroup_means_no_limit(tmp_path):
    assert m.cgroup_memory_available(tmp_path, "0::/\n") is None
    assert m.cgroup_cpu_limit(tmp_path, "0::/\n") is None


def test_usable_cpu_count_uses_affinity_then_quota_then_cpu_count(monkeypatch):
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda: None)
    assert m.usable_cpu_count() == 4
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda: 2)
    assert m.usable_cpu_count() == 2
    monkeypatch.delattr(machine.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda: None)
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 6)
    assert m.usable_cpu_count() == 6
    monkeypatch.setattr(machine.os, "cpu_count", lambda: None)
    assert m.usable_cpu_count() == 1


def test_usable_cpu_count_is_public():
    import multistart as ms

    assert ms.usable_cpu_count is m.usable_cpu_count
    assert 1 <= ms.usable_cpu_count()


# -- budgets, on fake devices -----------------------------------------------------------------


def _gpu(limit, in_use):
    return SimpleNamespace(
        platform="gpu",
        device_kind="fake",
        memory_stats=lambda: {"bytes_limit": limit, "bytes_in_use": in_use},
    )


def _cpu():
    return SimpleNamespace(platform="cpu", device_kind="cpu", memory_stats=lambda: None)


def test_gpu_budget_is_a_share_of_the_pool_left(monkeypatch):
    monkeypatch.delenv(m.ENV_BUDGET_GB, raising=False)
    budget = m.memory_budget(_gpu(80 * GiB, 20 * GiB))
    assert budget.nbytes == int(m.MEMORY_FRACTION * 60 * GiB)
    assert "gpu memory_stats" in budget.source
    monkeypatch.setenv(m.ENV_BUDGET_GB, "2")
    capped = m.memory_budget(_gpu(80 * GiB, 20 * GiB))
    assert capped.nbytes == 2 * GiB and capped.source == m.ENV_BUDGET_GB
    monkeypatch.setenv(m.ENV_BUDGET_GB, "500")  # above what is free: the free share wins
    assert m.memory_budget(_gpu(80 * GiB, 20 * GiB)).nbytes == budget.nbytes


def test_cpu_budget_is_shared_by_the_logical_cpu_devices(monkeypatch):
    monkeypatch.delenv(m.ENV_BUDGET_GB, raising=False)
    monkeypatch.setattr(machine, "host_available_memory", lambda: (16 * GiB, "host RAM (fake)"))
    monkeypatch.setattr(machine, "shared_ram_device_count", lambda devices=None: 1)
    assert m.memory_budget(_cpu()).nbytes == 8 * GiB
    monkeypatch.setattr(machine, "shared_ram_device_count", lambda devices=None: 4)
    four = m.memory_budget(_cpu())
    assert four.nbytes == 2 * GiB and four.shared_devices == 4 and "4 devices" in four.source


def test_shared_ram_device_count_counts_cpu_devices_only():
    assert m.shared_ram_device_count([_cpu(), _cpu(), _cpu()]) == 3
    assert m.shared_ram_device_count([_gpu(1, 0), _gpu(1, 0)]) == 1


def test_host_memory_is_the_lower_of_psutil_and_the_cgroup(monkeypatch):
    monkeypatch.setattr(machine, "cgroup_memory_available", lambda: 1 * GiB)
    free, source = m.host_available_memory()
    assert free <= 1 * GiB
    monkeypatch.setattr(machine, "cgroup_memory_available", lambda: None)
    free, source = m.host_available_memory()
    assert free > 0 and "psutil" in source


def test_unknown_free_memory_without_env_is_no_budget(monkeypatch):
    monkeypatch.delenv(m.ENV_BUDGET_GB, raising=False)
    tpu = SimpleNamespace(platform="weird", device_kind="?", memory_stats=lambda: None)
    assert m.memory_budget(tpu).nbytes is None
    monkeypatch.setenv(m.ENV_BUDGET_GB, "1")
    assert m.memory_budget(tpu).nbytes == GiB


# -- estimates and the auto width, on fake compiled programs ----------------------------------


class _FakeCompiled:
    """A compiled program whose XLA memory analysis is ``fixed + per * width`` temporaries."""

    def __init__(self, width, fixed, per, analysis=True):
        self.width, self.fixed, self.per, self.analysis = width, fixed, per, analysis
        self.in_avals = ()

    def memory_analysis(self):
        if not self.analysis:
            raise NotImplementedError("memory analysis unsupported")
        return SimpleNamespace(
            argument_size_in_bytes=1000,
            output_size_in_bytes=1000,
            alias_size_in_bytes=1000,  # the donated population is the output
            temp_size_in_bytes=self.fixed + self.per * self.width,
            generated_code_size_in_bytes=0,
        )


def _compiler(fixed, per, analysis=True):
    compiled = []

    def compile_at(width):
        compiled.append(width)
        return _FakeCompiled(width, fixed, per, analysis)

    return compile_at, compiled


def _auto(compile_at, *, start_bytes=8, checkpoint_bytes=0):
    """:func:`auto_width` of 64 starts on a fake device of 80 GiB free (the budget is the
    test's ``MULTISTART_MEMORY_BUDGET_GB``)."""
    return m.auto_width(
        compile_at,
        starts_per_device=64,
        device=_gpu(80 * GiB, 0),
        start_bytes=start_bytes,
        checkpoint_bytes=checkpoint_bytes,
    )


def test_step_memory_reads_xla_then_falls_back_to_sizes():
    est = m.step_memory(_FakeCompiled(4, 100, 50), 4, start_bytes=10)
    assert (est.resident, est.extra, est.source) == (1000, 300, "memory_analysis")
    est = m.step_memory(_FakeCompiled(4, 100, 50, analysis=False), 4, start_bytes=10)
    assert (est.extra, est.source) == (80, "io_sizes")


def test_auto_width_fits_at_the_cap_with_one_compile(monkeypatch):
    monkeypatch.setenv(m.ENV_BUDGET_GB, "1")
    compile_at, compiled = _compiler(fixed=1000, per=1000)
    bound = _auto(compile_at)
    assert bound.width == 64 and compiled == [64] and bound.estimate == "memory_analysis"


def test_auto_width_narrows_under_a_small_budget(monkeypatch):
    monkeypatch.setenv(m.ENV_BUDGET_GB, str(10_000 / GiB))  # 10 000 bytes
    compile_at, compiled = _compiler(fixed=1000, per=1000)
    bound = _auto(compile_at, checkpoint_bytes=500)
    # 1000 + 500 + 1000 w <= 10 000 -> w = 8 (8 divides 64: no rebalancing)
    assert bound.width == 8
    assert compiled == [64, 1, 8]  # the cap, width 1, and the chosen width (checked)
    assert bound.fixed_bytes == pytest.approx(1500) and bound.per_start_bytes == pytest.approx(1000)


def test_auto_width_checks_its_choice_and_narrows_again(monkeypatch):
    """XLA is not linear in width: a width that misses the budget is refitted and rechecked."""
    monkeypatch.setenv(m.ENV_BUDGET_GB, str(10_000 / GiB))

    class Jump(_FakeCompiled):  # 20 000 more bytes from width 4 on
        def memory_analysis(self):
            out = super().memory_analysis()
            out.temp_size_in_bytes += 20_000 * (self.width >= 4)
            return out

    compiled = []

    def compile_at(width):
        compiled.append(width)
        return Jump(width, 1000, 1000)

    bound = _auto(compile_at)
    # the line through widths 1 and 64 says 7; 7 needs 28 000 bytes; the line through 1 and 7
    # says 2, which fits
    assert compiled == [64, 1, 7, 2] and bound.width == 2
    assert bound.estimates[-1].extra <= 10_000


def test_auto_width_without_a_budget_uses_the_count_cap(monkeypatch):
    monkeypatch.delenv(m.ENV_BUDGET_GB, raising=False)
    monkeypatch.setattr(machine, "usable_cpu_count", lambda: 2)
    monkeypatch.setattr(machine, "device_free_memory", lambda device: (None, "unknown"))
    compile_at, compiled = _compiler(fixed=1000, per=1000)
    bound = m.auto_width(
        compile_at, starts_per_device=64, device=_cpu(), start_bytes=8, checkpoint_bytes=0
    )
    assert bound.width == 8 and bound.estimate == "count cap" and compiled == []


def test_auto_width_is_capped_by_max_batch(monkeypatch):
    monkeypatch.setenv(m.ENV_BUDGET_GB, "1")
    monkeypatch.setenv(m.ENV_MAX_BATCH, "3")
    compile_at, compiled = _compiler(fixed=1000, per=1000)
    bound = _auto(compile_at)
    assert bound.width == 3 and compiled == [3]


def test_auto_width_size_fallback_when_xla_has_no_analysis(monkeypatch):
    monkeypatch.setenv(m.ENV_BUDGET_GB, str(1000 / GiB))
    compile_at, compiled = _compiler(fixed=0, per=0, analysis=False)
    bound = _auto(compile_at, start_bytes=50)
    # the size fallback counts 2 * 50 bytes per start: 1000 bytes hold 10 starts
    assert bound.estimate == "io_sizes" and bound.width <= 10
    assert 2 * 50 * bound.width <= 1000


def _refusing(limit, fixed=1000, per=1000):
    """A compiler that refuses (as a TPU's: RESOURCE_EXHAUSTED at compile) any width over
    ``limit``, and compiles the others as :func:`_compiler`'s."""
    compile_at, compiled = _compiler(fixed=fixed, per=per)

    def refusing(width):
        if width > limit:
            compiled.append(width)
            raise RuntimeError(
                "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 16.11G of "
                "15.75G hbm. Exceeded hbm capacity by 368.0M."
            )
        return compile_at(width)

    return refusing, compiled


def test_auto_width_takes_a_refused_compile_as_too_wide(monkeypatch):
    """A chip's compiler refuses a program its memory cannot hold before any memory analysis:
    the bound takes that width as too wide and halves down to one that compiles and fits."""
    monkeypatch.setenv(m.ENV_BUDGET_GB, "1")
    compile_at, compiled = _refusing(limit=16)
    bound = _auto(compile_at)
    assert bound.width == 16
    # the cap and 32 refused, halved to 16, which fits: width 1 (which would only have drawn
    # a line through a refused width) is never compiled
    assert compiled == [64, 32, 16]
    sources = [e.source for e in bound.estimates]
    assert sources == ["compile refused", "compile refused", "memory_analysis"]
    assert bound.estimate == "memory_analysis" and bound.per_start_bytes is None


def test_after_a_refused_compile_width_1_draws_the_line_only_where_one_is_needed(monkeypatch):
    """The cap refused, its half compiles but misses the budget: width 1 is compiled then, and
    the line through it and the half gives the width (checked)."""
    monkeypatch.setenv(m.ENV_BUDGET_GB, str(10_000 / GiB))  # 10 000 bytes
    compile_at, compiled = _refusing(limit=32)
    bound = _auto(compile_at, checkpoint_bytes=500)
    # 32 needs 1000 + 500 + 32 000: over; the line through 1 and 32 says 8, which fits
    assert compiled == [64, 32, 1, 8] and bound.width == 8
    assert bound.fixed_bytes == pytest.approx(1500) and bound.per_start_bytes == pytest.approx(1000)


def test_a_tpu_budget_is_most_of_its_free_memory_and_a_gpu_keeps_half(monkeypatch):
    """A TPU's compiler refuses what its memory cannot hold: its budget is MEMORY_FRACTIONS'
    share (0.9), where half turned away widths that ran; a GPU (unmeasured) keeps half."""
    monkeypatch.delenv(m.ENV_BUDGET_GB, raising=False)
    tpu = SimpleNamespace(
        platform="tpu",
        device_kind="TPU v5 lite",
        memory_stats=lambda: {"bytes_limit": 16 * GiB, "bytes_in_use": 1 * GiB},
    )
    budget = m.memory_budget(tpu)
    assert budget.nbytes == int(0.9 * 15 * GiB) and budget.source.startswith("0.9 of tpu")
    assert m.memory_budget(_gpu(16 * GiB, 1 * GiB)).nbytes == int(0.5 * 15 * GiB)


def test_a_refusal_that_is_not_for_memory_is_raised():
    def broken(width):
        raise RuntimeError("INVALID_ARGUMENT: something else")

    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        m.auto_width(broken, starts_per_device=8, device=_gpu(80 * GiB, 0), start_bytes=8,
                     checkpoint_bytes=0)  # fmt: skip
