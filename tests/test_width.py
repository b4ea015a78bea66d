"""Batch width at run time: "auto", "tune", MULTISTART_MAX_BATCH, the out-of-memory back-off and
the scan backend, on tiny objectives."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import MULTIMODAL_SPACE, PARABOLA_SPACE, multimodal, parabola
from conftest import same_result as identical

import multistart as ms
from multistart import width as memory
from multistart.device.backends import Backend, ScanBackend

ROOT = Path(__file__).resolve().parents[1]


def wide(p):
    """A parabola that materialises 20 000 floats per start: memory grows with the width."""
    z = jax.lax.optimization_barrier(jnp.sin(p["x"][0] * jnp.arange(20_000.0)))
    return jnp.sum((p["x"] - 0.5) ** 2) + 1e-9 * jnp.sum(z * z)


WIDE_SPACE = {"x": ms.Uniform(-2.0, 2.0, shape=(2,))}


@pytest.fixture(autouse=True)
def _quick_tuning(monkeypatch):
    # time each width for a few steps, not a quarter of a second: these objectives are tiny
    from multistart.width import timing

    monkeypatch.setattr(timing, "TUNE_TARGET_S", 0.005)


def fit(objective=parabola, space=PARABOLA_SPACE, **kwargs):
    base = dict(n_starts=12, n_steps=40, seed=0, convergence=None, log_every=0)
    return ms.MultiStartAdam(**{**base, **kwargs}).fit(objective, space)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["fast", "AUTO", "", 0, 2.5, True])
def test_bad_batch_size_names_the_argument_and_the_options(bad):
    with pytest.raises(
        ValueError, match=r"batch_size must be a positive int, None, 'auto' or 'tune'"
    ):
        ms.MultiStartAdam(batch_size=bad)


@pytest.mark.parametrize("bad", ["gpu", "Loop", None, 1])
def test_bad_backend_names_the_argument(bad):
    with pytest.raises(ValueError, match=r"backend must be one of 'loop', 'scan'"):
        ms.MultiStartAdam(backend=bad)


def test_bad_width_env_fails_before_any_compile(monkeypatch):
    from multistart.common.monitor import CompileCounter

    search = ms.MultiStartAdam(n_starts=4, n_steps=5, batch_size=2)
    for name, value, match in [
        ("MULTISTART_MAX_BATCH", "zero", "MULTISTART_MAX_BATCH must be a positive int"),
        ("MULTISTART_MEMORY_BUDGET_GB", "-1", "MULTISTART_MEMORY_BUDGET_GB must be a positive"),
        ("MULTISTART_AUTO_WIDTH", "fast", "MULTISTART_AUTO_WIDTH must be one of 'measure'"),
    ]:
        monkeypatch.setenv(name, value)
        with CompileCounter() as c, pytest.raises(ValueError, match=match):
            search.fit(parabola, PARABOLA_SPACE)
        assert c.total == 0
        monkeypatch.delenv(name)
    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "memory")


# -- auto -------------------------------------------------------------------------------------


def test_auto_is_the_default_and_by_memory_fits_the_count_cap_with_a_single_compile():
    # MULTISTART_AUTO_WIDTH=memory (conftest): the bound alone, no timing; batch_size not given
    result = fit()
    width = result.stats["batch_size"]
    info = result.stats["width_choice"]
    assert info["selected_by"] == "auto" and info["estimate"] == "memory_analysis"
    platform = jax.default_backend()
    cap = memory.count_cap(platform, 12, ms.usable_cpu_count())
    assert width == memory.balanced_width(12, cap)
    assert result.stats["n_compiles"] == 1 and result.stats["n_tune_compiles"] == 0


@pytest.fixture(scope="module")
def wide_auto_fit():
    """``wide_auto_fit()``: the float64 ``wide`` search at ``batch_size="auto"`` under the
    memory bound alone (no budget, no timing), fitted once for the tests that tighten it.
    Lazy, so it runs inside a test, under the autouse environment of conftest."""

    @functools.cache
    def run():
        assert os.environ["MULTISTART_AUTO_WIDTH"] == "memory"
        assert "MULTISTART_MEMORY_BUDGET_GB" not in os.environ
        with jax.enable_x64(True):
            return fit(wide, WIDE_SPACE, batch_size="auto")

    return run


def test_auto_narrows_under_a_small_memory_budget(monkeypatch, x64, wide_auto_fit):
    free = wide_auto_fit()
    w_free = free.stats["batch_size"]
    assert w_free >= 4
    est = free.stats["width_choice"]["estimates"][0]
    assert est["width"] == w_free
    # a budget for about half the starts' working memory
    budget = free.stats["width_choice"]["checkpoint_bytes"] + est["extra"] // 2
    monkeypatch.setenv("MULTISTART_MEMORY_BUDGET_GB", repr(budget / 2**30))
    tight = fit(wide, WIDE_SPACE, batch_size="auto")
    info = tight.stats["width_choice"]
    assert 1 <= tight.stats["batch_size"] < w_free
    assert info["budget_source"] == "MULTISTART_MEMORY_BUDGET_GB"
    chosen = [e for e in info["estimates"] if e["width"] == tight.stats["batch_size"]][-1]
    assert chosen["extra"] + info["checkpoint_bytes"] <= info["budget_bytes"]
    # probes are counted apart; the search compiled its own step once
    assert tight.stats["n_compiles"] == 1
    assert tight.stats["n_tune_compiles"] == len({e["width"] for e in info["estimates"]}) - 1
    explicit = fit(wide, WIDE_SPACE, batch_size=tight.stats["batch_size"])
    assert identical(tight, explicit)


def test_auto_falls_back_to_sizes_then_to_the_count_cap(monkeypatch, caplog):
    def no_analysis(self):
        raise NotImplementedError("memory analysis unsupported on this backend")

    monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", no_analysis)
    result = fit(batch_size="auto")
    assert result.stats["width_choice"]["estimate"] == "io_sizes"
    monkeypatch.setattr(memory.machine, "device_free_memory", lambda device: (None, "unknown"))
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "DEBUG")
    with caplog.at_level(logging.DEBUG, logger="multistart"):
        result = fit(batch_size="auto")
    assert result.stats["width_choice"]["estimate"] == "count cap"
    assert any("using the count cap" in r.getMessage() for r in caplog.records)


# -- auto on a CPU: timed, remembered ----------------------------------------------------------


class CountCalls:
    """Counts the calls of every chunk-step program the sweep hands out."""

    def __init__(self, monkeypatch):
        self.n = 0
        original = Backend.compiled_for
        counter = self

        class Counted:
            def __init__(self, compiled):
                self._compiled = compiled

            def __call__(self, *args):
                counter.n += 1
                return self._compiled(*args)

            def __getattr__(self, name):  # memory_analysis and the like
                return getattr(self._compiled, name)

        monkeypatch.setattr(Backend, "compiled_for", lambda s, w: Counted(original(s, w)))


def no_timing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a width was timed")

    monkeypatch.setattr(Backend, "time_chunks", refuse)


def always_decide(monkeypatch):
    """The gate allows every width, and no width is skipped for its calls' dispatch: these fits
    are far too short for timing to pay, and on a fast machine a step of 8 starts takes less
    than 8 calls at CALL_FLOOR_S (CI skipped width 1 so). The tests below are about the timing
    itself; the gate and the floor are tested on cost models."""
    from multistart.width import timing

    monkeypatch.setattr(timing.Gate, "allows", lambda self, timings, width: True)
    monkeypatch.setattr(timing, "CALL_FLOOR_S", 0.0)


def test_a_short_fit_keeps_the_bound_untimed_and_remembers_its_price(monkeypatch, tmp_path):
    from multistart.width import PRIOR_GAINS, expected_share, timing

    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    # the gate, not the dispatch floor, refuses here: on a fast machine width 1's 12 calls at
    # CALL_FLOOR_S can outlast a step of 12, and the floor would skip it before the gate is asked
    monkeypatch.setattr(timing, "CALL_FLOOR_S", 0.0)
    first = fit(batch_size="auto")  # 12 starts x 40 steps of a parabola: milliseconds
    info, tuning = first.stats["width_choice"], first.stats["tuning"]
    assert info["selected_by"] == "auto (priced)" and first.stats["batch_size"] == 12
    assert re.match(r"the memory bound, untimed: timing width \d+ would cost", info["reason"])
    assert first.stats["n_compiles"] == 1 and first.stats["n_tune_compiles"] == 0
    assert [row["width"] for row in tuning["table"]] == [12]  # the one call that priced it
    prices = json.loads(Path(tuning["path"]).read_text())["prices"]
    assert prices["n_steps"] == 40 and prices["fit_s"] == info["fit_estimate_s"] > 0
    # why it did not time: one compile costs more than timing was expected to save
    assert prices["compile_s"] == info["compile_estimate_s"] > 0 and prices["start_s"] > 0
    assert prices["fit_s"] * expected_share(prices["start_s"], PRIOR_GAINS) < prices["compile_s"]
    # what deciding cost is what it ran: the chosen width's calls that priced the fit (the
    # table above) and no other width's compile (n_tune_compiles); its seconds are a clock's

    no_timing(monkeypatch)
    second = fit(batch_size="auto")
    assert second.stats["width_choice"]["selected_by"] == "auto (cache)"
    assert second.stats["batch_size"] == 12 and identical(first, second)
    # the record's prices come back with it: the tail's narrowing weighs the same values
    assert second.stats["tuning"]["prices"] == prices


def test_auto_on_a_cpu_leaves_the_sweep_chunks_to_drop(monkeypatch, tmp_path):
    # at most max(SWEEP_MIN_WIDTH, n / SWEEP_CHUNKS) starts a chunk, however much memory allows:
    # in one chunk of every start, each step costs them all until the last one ends
    from multistart.width.choice import SWEEP_CHUNKS, SWEEP_MIN_WIDTH

    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    assert (SWEEP_CHUNKS, SWEEP_MIN_WIDTH) == (64, 256)
    many = fit(n_starts=600, n_steps=3, batch_size="auto")
    assert many.stats["width_choice"]["memory_width"] == 200  # 256, balanced: 3 chunks of 200
    assert many.stats["batch_size"] <= 200
    few = fit(n_starts=200, n_steps=3, batch_size="auto")
    assert few.stats["width_choice"]["memory_width"] == 200  # under 256: the bound, one chunk


def test_auto_on_a_cpu_times_remembers_and_reuses(monkeypatch, tmp_path, x64):
    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    always_decide(monkeypatch)
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    # 8 starts, as in test_tune_measures_persists_and_the_next_fit_skips_tuning: the programs
    # are shared, and the claims below hold at any number of starts
    kwargs = dict(batch_size="auto", n_starts=8)
    first = fit(multimodal, MULTIMODAL_SPACE, **kwargs)
    info, tuning = first.stats["width_choice"], first.stats["tuning"]
    width = first.stats["batch_size"]
    assert info["selected_by"] == "auto (measured)" and tuning["method"] == "auto"
    timed = [row["width"] for row in tuning["table"]]
    # the memory bound (all 8 here) and width 1 are always timed; the choice is the fastest
    assert {1, info["memory_width"]} <= set(timed) and max(timed) <= info["memory_width"]
    assert width == min(tuning["table"], key=lambda row: row["step_s"])["width"]
    assert first.stats["n_compiles"] == 1 and first.stats["n_tune_compiles"] == len(timed) - 1
    assert json.loads(Path(tuning["path"]).read_text())["width"] == width

    no_timing(monkeypatch)
    second = fit(multimodal, MULTIMODAL_SPACE, **kwargs)
    assert second.stats["width_choice"]["selected_by"] == "auto (cache)"
    assert second.stats["batch_size"] == width and second.stats["n_tune_compiles"] == 0
    # "tune" shares the record (same key)
    assert (
        fit(multimodal, MULTIMODAL_SPACE, **{**kwargs, "batch_size": "tune"}).stats["tuning"][
            "source"
        ]
        == "cache"
    )
    assert identical(first, second)
    assert identical(first, fit(multimodal, MULTIMODAL_SPACE, n_starts=8, batch_size=width))


def test_a_long_fit_times_widths_with_the_shipped_constants(monkeypatch, tmp_path, x64):
    """End to end, nothing patched but the seconds a width is timed for: a fit priced at up
    to 100,000 steps of a model that costs about 100 us a start is worth timing, and ends
    (converged) long before that."""
    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    kwargs = dict(n_steps=100_000, learning_rate=0.1, convergence=ms.Convergence(window=20))
    result = fit(wide, WIDE_SPACE, batch_size="auto", **kwargs)
    info, tuning = result.stats["width_choice"], result.stats["tuning"]
    assert info["selected_by"] == "auto (measured)" and tuning["method"] == "auto"
    assert result.stats["n_steps_run"] < 1_000  # converged: the price was an upper bound
    timed = {row["width"]: row["step_s"] for row in tuning["table"]}
    assert {1, info["memory_width"]} <= set(timed)
    assert result.stats["batch_size"] == min(timed, key=timed.get)
    assert result.stats["n_compiles"] == 1 and result.stats["n_tune_compiles"] == len(timed) - 1
    assert identical(result, fit(wide, WIDE_SPACE, batch_size=result.stats["batch_size"], **kwargs))


# The timing tests share one configuration (parabola, 64 starts, 2 steps), so their ladders'
# programs are compiled once.
TIMING_STARTS, TIMING_STEPS = 64, 2


@pytest.mark.parametrize("spec", ["auto", "tune"])
def test_timing_is_bounded_in_chunk_calls(monkeypatch, spec):
    from multistart.width import timing as tuning

    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    always_decide(monkeypatch)  # CALL_FLOOR_S 0: width 1 is timed, as this test needs
    # 2 chunk calls a repeat instead of 16, so that a few chunks are far fewer than the 64
    # starts: width 1 then makes at most 2 * (1 + 12) * 2 = 52 calls, where timing every start
    # would make at least 64 * (1 + 3). The bound below is read from the module, whatever it is.
    monkeypatch.setattr(tuning, "TUNE_CALLS", 2)
    counter = CountCalls(monkeypatch)
    n_starts, n_steps = TIMING_STARTS, TIMING_STEPS
    result = fit(batch_size=spec, n_starts=n_starts, n_steps=n_steps)
    width, table = result.stats["batch_size"], result.stats["tuning"]["table"]
    search_calls = n_steps * -(-n_starts // width)
    deciding = counter.n - search_calls
    assert deciding == sum(row["calls"] for row in table)

    per_pass = (1 + tuning.TUNE_MAX_REPS) * tuning.TUNE_CALLS
    for row in table:  # at most two passes per width, whatever the number of starts
        assert row["calls"] <= 2 * per_pass
    one = [row for row in table if row["width"] == 1][0]
    assert one["calls"] < n_starts  # width 1 is timed on a few chunks, never every start


def test_timing_logs_each_width(monkeypatch, caplog):
    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    with caplog.at_level(logging.INFO, logger="multistart"):
        result = fit(batch_size="tune", n_starts=TIMING_STARTS, n_steps=TIMING_STEPS)
    lines = [r.getMessage() for r in caplog.records if "timing width" in r.getMessage()]
    n = len(memory.candidate_widths(TIMING_STARTS))
    assert lines[0] == f"batch_size tune: timing width 1 (1/{n}) ..."
    assert len(lines) >= len(result.stats["tuning"]["table"])


def test_auto_measures_within_the_memory_bound(monkeypatch, x64, wide_auto_fit):
    free = wide_auto_fit()  # memory bound only (conftest)
    est = free.stats["width_choice"]["estimates"][0]
    budget = free.stats["width_choice"]["checkpoint_bytes"] + est["extra"] // 2
    monkeypatch.setenv("MULTISTART_MEMORY_BUDGET_GB", repr(budget / 2**30))
    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    always_decide(monkeypatch)
    tight = fit(wide, WIDE_SPACE, batch_size="auto")
    info = tight.stats["width_choice"]
    assert info["memory_width"] < free.stats["batch_size"]
    assert max(row["width"] for row in tight.stats["tuning"]["table"]) <= info["memory_width"]
    assert tight.stats["batch_size"] <= info["memory_width"]


class CostModelSweep:
    """Stands in for a sweep in ``multistart.width.timing``: a chunk call at width ``w`` takes
    ``call_s(w)`` seconds, a compile ``compile_s``, nothing compiles or runs, and the widths
    timed are recorded."""

    def __init__(self, n_rows, call_s, compile_s=0.0):
        self.rows, self.call_s, self.compile_s, self.timed = (
            np.arange(n_rows),
            call_s,
            compile_s,
            [],
        )

    def calls_per_step(self, width):
        return -(-self.rows.size // width)

    def compile_seconds(self, width):
        return self.compile_s

    def time_chunks(self, pop, width, *, calls, target_s, min_reps, max_reps):
        self.timed.append(width)
        k = min(calls, self.calls_per_step(width))
        return [self.call_s(width)] * min_reps, k * (1 + min_reps)


def _per_start(width, unbatched, batched):
    """Seconds of a chunk call: 50 us of dispatch, then ``unbatched`` for one start and
    ``batched`` a start in a vmapped chunk."""
    return 50e-6 + (unbatched if width == 1 else batched * width)


def _auto(sweep, upper, gate=None):
    """``(best, timings, reason)`` of the "auto" ladder on a cost model."""
    from multistart.width import Timings, time_auto

    timings = Timings(sweep, None, "auto")
    reason = time_auto(timings, upper, gate)
    return timings.best(), timings, reason


def image_like(w):
    # an expensive model whose vmapped code costs 2.5x per start (the image fit's pattern)
    return _per_start(w, 4e-3, 10e-3)


def test_auto_stops_after_width_one_when_it_is_far_faster_than_the_bound():
    sweep = CostModelSweep(32, image_like)
    best, timings, reason = _auto(sweep, 32)
    assert best == 1 and set(timings.per_call) == {32, 1} and "1x as fast" not in reason
    assert set(sweep.timed) == {32, 1}  # widths 4 and 2 would each have been a compile
    # just under the threshold (width 1 at 1.4x the bound's speed) the ladder goes on
    sweep = CostModelSweep(32, lambda w: _per_start(w, 4e-3, 1.4 * 4e-3 + 50e-6 / 32))
    _auto(sweep, 32)
    assert len(set(sweep.timed)) > 2


def middle_wins(w):
    # width 1 pays its dispatch 32 times, the bound is slowed by its size: the best is inside
    return 1e-3 + w * (1e-4 if w <= 8 else 6e-4)


def test_auto_still_times_the_ladder_when_a_middle_width_wins():
    best, timings, _ = _auto(CostModelSweep(32, middle_wins), 32)
    per_step = {row["width"]: row["step_s"] for row in timings.table()}
    assert 1 < best < 32 and per_step[best] == min(per_step.values())
    assert len(per_step) >= 3


class SlowSpellSweep(CostModelSweep):
    """The bound's first timed repeat (the fit's price) caught in a slow spell, 3x its cost."""

    def time_chunks(self, pop, width, *, calls, target_s, min_reps, max_reps):
        seconds, n = super().time_chunks(
            pop, width, calls=calls, target_s=target_s, min_reps=min_reps, max_reps=max_reps
        )
        if self.timed.count(width) == 1 and width == max(self.timed):
            seconds[0] *= 3.0
        return seconds, n


def test_a_slow_spell_in_the_price_does_not_choose_a_slower_width():
    """The bound steps fastest (a cheap model); its one-repeat price was 3x slow. It is timed
    again to as many repeats as the narrower widths before the choice, and chosen."""
    from multistart.width import Gate

    cheap = lambda w: 50e-6 + 2e-6 * w  # noqa: E731
    sweep = SlowSpellSweep(256, cheap)
    best, timings, _ = _auto(sweep, 256, Gate(n_steps=100_000))  # a long fit: timing pays
    assert len(timings.per_call) > 1 and best == 256
    assert sweep.timed.count(256) >= 2
    assert all(len(s) >= 3 for s in timings.per_call.values())


# -- does deciding pay? (the gate, on cost models: nothing is timed) ---------------------------


def test_auto_keeps_the_bound_untimed_when_deciding_would_cost_more_than_the_fit():
    from multistart.width import Gate

    # 8 starts of a small model; a compile costs 2 s, a step under a millisecond
    def call_s(w):
        return 50e-6 + 100e-6 * w

    sweep = CostModelSweep(8, call_s, compile_s=2.0)
    best, timings, reason = _auto(sweep, 8, Gate(n_steps=1000))
    assert best == 8 and sweep.timed == [8]  # one call to price the fit, no other width
    assert reason.startswith("the memory bound, untimed: timing width 1 would cost")
    # the same model fitted for long enough that a compile is a small part of it: timed
    sweep = CostModelSweep(8, call_s, compile_s=2.0)
    _, timings, _ = _auto(sweep, 8, Gate(n_steps=1_000_000))
    assert set(timings.per_call) >= {8, 1}


def test_auto_does_not_compile_a_width_whose_calls_alone_cost_more_than_the_best_step():
    from multistart.width import CALL_FLOOR_S, Gate

    # 100,000 starts of a cheap objective: a step of every start costs 36 ms at once, 10 ms in
    # chunks of 12,500 (the wide chunk's temporaries fall out of cache); width 1 would need
    # 100,000 calls a step, at least 2 s of dispatch
    def call_s(w):
        return 50e-6 + w * (1e-7 if w <= 20_000 else 3.6e-7)

    sweep = CostModelSweep(100_000, call_s, compile_s=0.6)
    assert sweep.calls_per_step(1) * CALL_FLOOR_S > call_s(100_000)
    best, timings, reason = _auto(sweep, 100_000, Gate(n_steps=1000))
    assert 1 not in sweep.timed and sweep.timed[:2] == [100_000, 12_500]
    assert best == 12_500 and "widths timed" in reason
    # 8 starts of a cheap curve: one call of all 8 is cheaper than 8 calls' dispatch
    sweep = CostModelSweep(8, lambda w: 50e-6 + 1e-6 * w, compile_s=2.0)
    best, _, reason = _auto(sweep, 8, Gate(n_steps=10_000_000))
    assert best == 8 and sweep.timed == [8]
    assert reason == (
        "the memory bound, untimed: no narrower width could step faster: its chunk calls "
        "alone would not"
    )


def test_auto_times_width_one_where_the_fit_pays_for_it():
    from multistart.width import Gate

    # the image fit: 32 starts x 300 steps, about 100 s at the bound, a compile of 3 s
    sweep = CostModelSweep(32, image_like, compile_s=3.0)
    gate = Gate(n_steps=300)
    best, timings, reason = _auto(sweep, 32, gate)
    assert best == 1 and set(timings.per_call) == {32, 1} and gate.refused is None
    assert "width 1 steps" in reason
    # the decision cost one compile and its calls, a small part of what it saved
    saved = gate.fit_s(timings, 32) - gate.fit_s(timings, 1)
    assert timings.spent_s(best) <= 0.1 * saved


def test_a_short_fit_of_an_expensive_model_times_what_it_is_expected_to_save():
    """Issue 34's image fit (Adam, 40 steps): timing width 1 cost a third of the fit at the
    bound, more than the share of the fit the old gate allowed, and would have saved half of
    it. A model that costs as much a step but little a start (a cheap objective, many starts)
    is expected to save little there, and is not timed."""
    from multistart.width import PRIOR_GAINS, Gate, expected_share

    sweep = CostModelSweep(32, image_like, compile_s=4.5)  # 10 ms a start, 13 s at the bound
    gate = Gate(n_steps=40)
    best, timings, _ = _auto(sweep, 32, gate)
    assert best == 1 and gate.refused is None
    cost = gate.cost_s(timings, 1)
    assert cost > 0.3 * gate.fit_s(timings, 32)  # over the old gate's share: it kept 32
    assert gate.fit_s(timings, 32) - gate.fit_s(timings, 1) > 1.5 * cost
    # the same seconds a step in 3,200 starts of 100 us each: 1e-5 s a start, as the README's
    # fit, where no narrower width was faster
    cheap = CostModelSweep(3200, lambda w: 50e-6 + w * 1e-7 * (1 if w < 3200 else 1000))
    cheap.compile_s = 4.5
    assert expected_share(1e-4, PRIOR_GAINS) < 0.3 < expected_share(1e-2, PRIOR_GAINS)
    gate = Gate(n_steps=40)
    best, _, reason = _auto(cheap, 3200, gate)
    assert best == 3200 and cheap.timed == [3200] and "expected to save" in reason


def test_a_stack_of_fits_is_priced_at_the_share_of_its_steps_it_runs():
    """A stack's fits end early (STACK_RUN_SHARE of n_steps, measured): 16,000 starts of a
    cheap peak, a compile of 1.6 s. At every step of 400 the fit looks worth timing two more
    widths; at the steps a stack runs it keeps the bound it had to compile anyway."""
    from multistart.width import Gate
    from multistart.width.timing import STACK_RUN_SHARE

    def call_s(w):  # 1.6 us a start, narrower widths as fast a start (6e-7 s: the prior's 3x)
        return 50e-6 + 1.6e-6 * w

    whole = Gate(n_steps=400, measured=((1.6e-6, 3.0),) * 4)
    sweep = CostModelSweep(16_000, call_s, compile_s=1.6)
    _, timings, _ = _auto(sweep, 254, whole)
    assert len(timings.per_call) > 1 and whole.refused is None
    stack = Gate(n_steps=400, measured=((1.6e-6, 3.0),) * 4, run_share=STACK_RUN_SHARE)
    sweep = CostModelSweep(16_000, call_s, compile_s=1.6)
    best, timings, reason = _auto(sweep, 254, stack)
    assert best == 254 and sweep.timed == [254] and "at 5%: a stack of fits" in reason
    assert stack.fit_s(timings, 254) == pytest.approx(STACK_RUN_SHARE * whole.fit_s(timings, 254))
    assert stack.prices(timings)["run_share"] == STACK_RUN_SHARE
    assert "run_share" not in whole.prices(timings)


def test_what_this_device_measured_before_steers_the_gate():
    """The same fit and compile: untimed on the prior alone, timed when this device's records
    show models whose starts cost as much gained from another width; and a width timed in
    this decision that lost counts against the next."""
    from multistart.width import Gate

    def call_s(w):  # 64 starts of 1e-5 s each: a step of 0.7 ms at the bound
        return 50e-6 + 1e-5 * w

    prior_only = Gate(n_steps=5000)
    sweep = CostModelSweep(64, call_s, compile_s=0.5)
    _auto(sweep, 64, prior_only)
    assert sweep.timed == [64] and prior_only.refused is not None
    measured = Gate(n_steps=5000, measured=((1e-5, 2.0),) * 8)  # 8 records, each twice as fast
    sweep = CostModelSweep(64, call_s, compile_s=0.5)
    best, timings, _ = _auto(sweep, 64, measured)
    assert len(timings.per_call) > 1 and best == 64
    # the narrower widths lost (more dispatches a step): each is among the gains the next
    # width was priced on, at this model's seconds a start
    here = measured.gains(timings)[-(len(timings.per_call) - 1) :]
    for w in timings.per_call:
        if w != 64:
            assert (call_s(64) / 64, timings.step_s(64) / timings.step_s(w)) in here


def test_the_gate_stops_the_ladder_once_timing_is_not_expected_to_pay():
    from multistart.width import Gate

    ungated = CostModelSweep(32, middle_wins, compile_s=2.0)
    _auto(ungated, 32)
    assert ungated.timed == [32, 1, 4, 11]  # the bound, 1, 32 / 8, then between 4 and 32
    # 1500 steps: about 30 s at the bound, 17 s at width 4; a compile costs 2 s
    sweep = CostModelSweep(32, middle_wins, compile_s=2.0)
    gate = Gate(n_steps=1500)
    best, timings, reason = _auto(sweep, 32, gate)
    # the bound, priced on one repeat, is timed again to as many repeats as the others
    assert sweep.timed == [32, 1, 4, 32] and best == 4
    assert {w: len(s) for w, s in timings.per_call.items()} == {32: 3, 1: 3, 4: 3}
    assert gate.refused.startswith("timing width 11 would cost about")
    assert reason == f"the fastest of 3 widths timed; {gate.refused}"
    # width 4 was expected to save more than it cost; width 11, between 4 and 32, is not:
    # width 4 already gained more than most models gained at all
    assert gate.saving_s(timings, 11) < gate.cost_s(timings, 11)


# -- records, on fakes: nothing compiles ----------------------------------------------------------


class Starts(NamedTuple):
    fom: np.ndarray


class Pop(NamedTuple):
    starts: Starts
    history: np.ndarray


class MeshSweep:
    """A sweep over 4 devices, 2 rows each, whose programs need 1000 bytes beyond their
    arguments at every width (XLA's figures, faked)."""

    n_devices, n_total, data = 4, 8, ()

    def compiled_for(self, width):
        analysis = SimpleNamespace(
            temp_size_in_bytes=1000,
            output_size_in_bytes=0,
            alias_size_in_bytes=0,
            generated_code_size_in_bytes=0,
            argument_size_in_bytes=0,
        )
        return SimpleNamespace(memory_analysis=lambda: analysis)


NO_FREE_FIGURE = SimpleNamespace(platform="weird", device_kind="fake", memory_stats=lambda: None)


def _write_record(sweep, pop, **fields):
    from multistart.width import choice, record

    keyed = dict(start_step=None, backend="loop", program_hash="a model")
    rec = choice._record_of(sweep, pop, 2, NO_FREE_FIGURE, keyed)
    record.save({**rec, "table": [], **fields})
    return rec


def _read_record(spec, rec, sweep, pop, n_steps=None):
    from multistart.width import Footprint, choice

    footprint = Footprint.of(sweep, pop)
    return choice._recorded(spec, dict(rec), sweep, footprint, 2, NO_FREE_FIGURE, n_steps)


def test_a_recorded_width_on_a_mesh_is_charged_one_devices_share_of_the_population(
    monkeypatch, tmp_path
):
    from multistart.width import tree_bytes

    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    sweep = MeshSweep()
    pop = Pop(Starts(np.zeros(8)), np.zeros((100, 8)))  # 6464 bytes, 1616 on each device
    # a budget that holds a step (1000 bytes) and one device's copy, not the whole population
    monkeypatch.setenv("MULTISTART_MEMORY_BUDGET_GB", repr(4000 / 2**30))
    assert 1000 + tree_bytes(pop) // 4 < 4000 < 1000 + tree_bytes(pop)
    rec = _write_record(sweep, pop, width=2, method="auto")
    width, _ = _read_record("auto", rec, sweep, pop)
    assert width == 2
    # and a budget below one device's need sets the record aside
    monkeypatch.setenv("MULTISTART_MEMORY_BUDGET_GB", repr(2000 / 2**30))
    assert _read_record("auto", rec, sweep, pop) == (None, 0.0)


def test_a_priced_record_serves_auto_until_a_longer_fit_makes_timing_worth_it(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    sweep, pop = MeshSweep(), Pop(Starts(np.zeros(8)), np.zeros((100, 8)))
    prices = {"n_steps": 100, "fit_s": 1.0, "compile_s": 2.0}
    rec = _write_record(sweep, pop, width=2, method="auto (priced)", prices=prices)
    assert _read_record("auto", rec, sweep, pop, n_steps=100) == (2, 2.0)
    assert _read_record("auto", rec, sweep, pop, n_steps=None) == (2, 2.0)
    # 10,000 steps: a fit of about 100 s, where a 2 s compile is worth timing; the record's
    # compile seconds then price a compile (this process's may come from JAX's cache)
    assert _read_record("auto", rec, sweep, pop, n_steps=10_000) == (None, 2.0)
    assert _read_record("tune", rec, sweep, pop, n_steps=100) == (None, 2.0)  # tune times


def test_a_priced_record_of_a_cheap_model_serves_a_longer_fit_than_an_expensive_one(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    sweep, pop = MeshSweep(), Pop(Starts(np.zeros(8)), np.zeros((100, 8)))
    for start_s, set_aside in [(1e-5, False), (1e-2, True)]:
        prices = {"n_steps": 100, "fit_s": 1.0, "compile_s": 2.0, "start_s": start_s}
        rec = _write_record(sweep, pop, width=2, method="auto (priced)", prices=prices)
        # 1,000 steps, a fit of about 10 s: worth a 2 s compile only where starts cost enough
        width, _ = _read_record("auto", rec, sweep, pop, n_steps=1000)
        assert (width is None) == set_aside, start_s


def test_a_record_priced_with_junk_is_ignored_not_a_traceback(monkeypatch, tmp_path, caplog):
    """A record edited or corrupted on disk: its prices price a timing decision and the tail's
    narrowing, so anything but finite numbers sets the record aside (timed again), with a
    warning naming it, rather than raising from inside a fit."""
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    sweep, pop = MeshSweep(), Pop(Starts(np.zeros(8)), np.zeros((100, 8)))
    good = {"n_steps": 100, "fit_s": 1.0, "compile_s": 2.0, "start_s": 1e-5}
    for junk in ({"start_s": "fast"}, {"compile_s": None}, {"fit_s": float("nan")}, ["x"]):
        prices = {**good, **junk} if isinstance(junk, dict) else junk
        rec = _write_record(sweep, pop, width=2, method="auto (priced)", prices=prices)
        with caplog.at_level("WARNING", logger="multistart"):
            assert _read_record("auto", rec, sweep, pop, n_steps=100) == (None, 0.0), junk
        assert "ignoring the unreadable tuning record" in caplog.text
        caplog.clear()
    rec = _write_record(sweep, pop, width=2, method="auto (priced)", prices=good)
    assert _read_record("auto", rec, sweep, pop, n_steps=100) == (2, 2.0)


def test_device_gains_reads_what_this_kind_of_device_measured(monkeypatch, tmp_path):
    from multistart.width import record

    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    table = [
        {"width": 1, "chunk_s": 0.004, "step_s": 0.128},
        {"width": 32, "chunk_s": 0.32, "step_s": 0.32},
    ]
    here = {"platform": NO_FREE_FIGURE.platform, "device_kind": NO_FREE_FIGURE.device_kind}
    elsewhere = {**here, "device_kind": "another"}
    for i, (parts, method, rows) in enumerate(
        [
            (here, "auto", table),
            (here, "tune", table[::-1]),
            (elsewhere, "auto", table),  # another kind of device
            (here, "auto (priced)", table[1:]),  # nothing was timed
        ]
    ):
        path = tmp_path / "tuning" / f"{i}.json"
        record.save({"path": str(path), "width": 1, "method": method, "table": rows,
                     "key_parts": parts})  # fmt: skip
    (tmp_path / "tuning" / "broken.json").write_text("{")
    gains = record.device_gains(NO_FREE_FIGURE)
    assert sorted(gains) == [(0.01, 2.5), (0.01, 2.5)]


class FakeAccelerator:
    """A device that says it is a GPU with a memory pool; the rest is the real CPU device."""

    platform = "gpu"
    device_kind = "fake accelerator"

    def __init__(self, device):
        self._device = device

    def memory_stats(self):
        return {"bytes_limit": 8 * 2**30, "bytes_in_use": 0}

    def __getattr__(self, name):
        return getattr(self._device, name)


def test_auto_on_an_accelerator_keeps_the_memory_bound_without_timing(monkeypatch):
    import multistart.host.engine

    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "measure")
    real = multistart.host.engine.resolve_width

    def on_accelerator(*args, device, **kwargs):
        return real(*args, device=FakeAccelerator(device), **kwargs)

    monkeypatch.setattr(multistart.host.engine, "resolve_width", on_accelerator)
    no_timing(monkeypatch)
    result = fit(batch_size="auto", n_starts=12)
    info = result.stats["width_choice"]
    assert info["selected_by"] == "auto" and "tuning" not in result.stats
    assert result.stats["batch_size"] == 12  # the count cap on an accelerator is n_starts
    assert result.stats["n_tune_compiles"] == 0


# -- MULTISTART_MAX_BATCH -----------------------------------------------------------------------


@pytest.mark.parametrize("spec", [8, None, "auto", "tune"])
def test_max_batch_caps_every_choice_even_an_explicit_int(monkeypatch, spec):
    monkeypatch.setenv("MULTISTART_MAX_BATCH", "3")
    # 5 steps, as the back-off tests below: widths 1 and 2 ("tune") are their programs
    result = fit(batch_size=spec, n_steps=5)
    assert result.stats["batch_size"] <= 3
    if spec in (8, None):
        assert result.stats["batch_size"] == 3
    assert result.stats["width_choice"]["max_batch"] == 3


# -- tune ---------------------------------------------------------------------------------------


def test_tune_measures_persists_and_the_next_fit_skips_tuning(monkeypatch, tmp_path, x64):
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    first = fit(multimodal, MULTIMODAL_SPACE, batch_size="tune", n_starts=8)
    tuning = first.stats["tuning"]
    width = first.stats["batch_size"]
    assert tuning["source"] == "measured" and tuning["width"] == width
    timed = [row["width"] for row in tuning["table"]]
    assert timed[0] == 1 and timed == sorted(timed) and width in timed
    assert all(row["calls"] >= 4 and row["starts_steps_per_s"] > 0 for row in tuning["table"])
    best = max(tuning["table"], key=lambda row: row["starts_steps_per_s"])
    assert best["width"] == width
    # the chosen width's program was compiled once and reused; the others are counted apart
    assert first.stats["n_compiles"] == 1
    assert first.stats["n_tune_compiles"] == len(timed) - 1
    record = json.loads(Path(tuning["path"]).read_text())
    assert record["width"] == width and Path(tuning["path"]).parent == tmp_path / "tuning"

    second = fit(multimodal, MULTIMODAL_SPACE, batch_size="tune", n_starts=8)
    assert second.stats["tuning"]["source"] == "cache"
    assert second.stats["batch_size"] == width
    assert second.stats["n_tune_compiles"] == 0 and second.stats["n_compiles"] == 1
    # timing stepped a copy: a tuned search is the search at the width it chose
    assert identical(first, second)
    assert identical(first, fit(multimodal, MULTIMODAL_SPACE, batch_size=width, n_starts=8))


def test_tune_key_depends_on_the_model_not_on_the_run_length(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path))
    # one start: the ladder is width 1 alone, one compile a fit; the key does not hold widths
    a = fit(batch_size="tune", n_starts=1, n_steps=10).stats["tuning"]["key"]
    b = fit(batch_size="tune", n_starts=1, n_steps=30).stats["tuning"]
    assert b["key"] == a and b["source"] == "cache"
    other = fit(multimodal, MULTIMODAL_SPACE, batch_size="tune", n_starts=1, n_steps=10)
    assert other.stats["tuning"]["key"] != a
    scan = fit(batch_size="tune", n_starts=1, n_steps=10, backend="scan").stats["tuning"]
    assert scan["key"] != a


def test_no_cache_folder_means_no_record(monkeypatch):
    monkeypatch.setenv("MULTISTART_CACHE_DIR", "")
    for _ in range(2):  # the first fit of the test above: its program
        tuning = fit(batch_size="tune", n_starts=1, n_steps=10).stats["tuning"]
        assert tuning["source"] == "measured" and tuning["path"] is None


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_second_process_finds_the_tuned_width(tmp_path):
    script = textwrap.dedent(
        """
        import json, os, sys
        sys.path.insert(0, sys.argv[1])
        folder = os.environ["MULTISTART_CACHE_DIR"]
        import multistart as ms
        from conftest import parabola, PARABOLA_SPACE
        os.environ["MULTISTART_CACHE_DIR"] = folder  # conftest empties it for the suite
        ms.width.timing.TUNE_TARGET_S = 0.005
        r = ms.MultiStartAdam(n_starts=4, n_steps=10, batch_size="tune", seed=0).fit(
            parabola, PARABOLA_SPACE
        )
        print(json.dumps({k: r.stats["tuning"][k] for k in ("source", "key", "width")}))
        """
    )
    env = {
        **os.environ,
        "MULTISTART_CACHE_DIR": str(tmp_path),
        "MULTISTART_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", script, str(ROOT / "tests")],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()[-1]
        )
        for _ in range(2)
    ]
    assert [r["source"] for r in runs] == ["measured", "cache"]
    assert runs[0]["key"] == runs[1]["key"] and runs[0]["width"] == runs[1]["width"]


# -- out-of-memory back-off -------------------------------------------------------------------


def inject_oom(monkeypatch, fits: int, after_calls: int = 0, writes_only: bool = False):
    """Programs wider than ``fits`` fail after ``after_calls`` good calls, the way a CPU
    allocation failure does: the donated population is consumed and the call raises.
    ``writes_only``: only the calls that take no step (a refill's write) fail."""
    original = Backend.compiled_for
    calls = {"good": 0}

    def compiled_for(self, width):
        compiled = original(self, width)
        if width <= fits:
            return compiled

        def failing(pop, *args):
            a_write = int(np.asarray(args[-2])[1]) == 0  # the clock: no step
            if calls["good"] >= after_calls and (a_write or not writes_only):
                for leaf in jax.tree_util.tree_leaves(pop):
                    leaf.delete()
                raise jax.errors.JaxRuntimeError(
                    f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate {width} GiB."
                )
            calls["good"] += 1
            return compiled(pop, *args)

        return failing

    monkeypatch.setattr(Backend, "compiled_for", compiled_for)


# The back-off tests and test_scan_equals_loop_bit_for_bit_in_float64 share this float64
# search: 11 starts (ragged at widths 8, 4 and 2), some of which converge (the running set
# shrinks), so the back-off tests' width-2 references are the scan test's two fits.
RAGGED_CONVERGING = dict(
    n_starts=11, n_steps=300, seed=4, convergence=ms.Convergence(window=20, rtol=1e-7, atol=1e-9)
)
# steps_per_call="auto" doubles a call's steps while calls are quick on the clock, so the
# number of chunk calls would depend on the machine's load; a fixed number of steps above one
# keeps the scan's multi-step calls under test and makes the count a function of the run.
WIDTH_TWO_STEPS_PER_CALL = 8


@pytest.fixture(scope="module")
def width_two_fit():
    """``width_two_fit(backend)``: the ``RAGGED_CONVERGING`` search on ``multimodal`` at
    batch_size 2 (chunks 2, 2, 2, 2, 2, 1), float64, 8 steps a call, fitted once per
    backend."""

    @functools.cache
    def run(backend):
        with jax.enable_x64(True):
            return fit(
                multimodal,
                MULTIMODAL_SPACE,
                batch_size=2,
                backend=backend,
                steps_per_call=WIDTH_TWO_STEPS_PER_CALL,
                **RAGGED_CONVERGING,
            )

    return run


@pytest.mark.parametrize("backend", ["loop", "scan"])
def test_out_of_memory_halves_the_width_and_loses_nothing(monkeypatch, x64, backend, width_two_fit):
    reference = width_two_fit(backend)  # fitted before the failures are injected
    # width 8 makes two calls a step (8 + 3): the sixth call fails, in the middle of step 3
    inject_oom(monkeypatch, fits=2, after_calls=5)
    result = fit(multimodal, MULTIMODAL_SPACE, batch_size=8, backend=backend, **RAGGED_CONVERGING)
    backoffs = result.stats["backoffs"]
    assert [(b["from"], b["to"]) for b in backoffs] == [(8, 4), (4, 2)]
    assert backoffs[0]["step"] >= 2 and backoffs[0]["replayed"] >= 1
    assert result.stats["batch_size"] == 2
    assert result.stats["n_compiles"] == 3  # 8, then 4 and 2 after the back-offs
    assert identical(result, reference)


def test_a_back_off_replays_the_refills_among_the_steps_it_replays(monkeypatch, x64):
    """TikTak refills ended slots at syncs; the population is not copied at each refill, the
    refill's write is replayed in its place: the same result as never failing."""
    kw = dict(RAGGED_CONVERGING, start_strategy="tiktak")
    reference = fit(multimodal, MULTIMODAL_SPACE, batch_size=2, **kw)
    inject_oom(monkeypatch, fits=2, after_calls=70)  # two calls a step: in step 36
    result = fit(multimodal, MULTIMODAL_SPACE, batch_size=8, **kw)
    first = result.stats["backoffs"][0]
    replayed = range(first["step"] - first["replayed"] + 1, first["step"] + 1)
    refilled = [r["replaced_at"] for r in result.incarnations if r["replaced_at"] is not None]
    assert any(step in replayed for step in refilled), (first, refilled)  # a write replayed
    assert identical(result, reference)


def test_a_back_off_replays_calls_that_ended_where_a_start_ended(monkeypatch, x64):
    """In one chunk, a refilled search's call ends at the first step where one of its starts
    ends; replayed at a narrower width (several chunks), such a call takes the same steps."""
    kw = dict(RAGGED_CONVERGING, start_strategy="tiktak")
    reference = fit(multimodal, MULTIMODAL_SPACE, batch_size=2, **kw)
    inject_oom(monkeypatch, fits=4, after_calls=40)  # (refills' writes are calls too)
    result = fit(multimodal, MULTIMODAL_SPACE, batch_size=16, **kw)  # the 11 starts: one chunk
    assert [(b["from"], b["to"]) for b in result.stats["backoffs"]] == [(11, 5), (5, 2)]
    assert result.stats["n_chunk_calls"] < reference.stats["n_chunk_calls"] / 2
    assert identical(result, reference)


def test_a_refill_write_out_of_memory_backs_off_to_the_same_result(monkeypatch, x64):
    """A refill's new starts are written by the chunk step (no step taken): a write that runs
    out of memory backs off as a step does (the steps since the copy replayed narrower, the
    writes among them failing again at 5 rows), and the result is never failing's."""
    kw = dict(RAGGED_CONVERGING, start_strategy="tiktak")
    reference = fit(multimodal, MULTIMODAL_SPACE, batch_size=2, **kw)
    inject_oom(monkeypatch, fits=4, after_calls=20, writes_only=True)
    result = fit(multimodal, MULTIMODAL_SPACE, batch_size=16, **kw)
    backoffs = result.stats["backoffs"]
    assert [(b["from"], b["to"]) for b in backoffs] == [(11, 5), (5, 2)]
    assert backoffs[0]["step"] < RAGGED_CONVERGING["n_steps"]  # at a refill, not the end
    assert identical(result, reference)


def test_a_refill_write_out_of_memory_backs_off_until_the_write_itself_fits(monkeypatch, x64):
    """A refill's write that runs out of memory where the calls since the population's copy
    hold no write: their replay at 5 rows fits, and only the write itself shows that 5 does
    not (it fails again there, in the same back-off, and fits at 2); the result is never
    failing's. Steps a call are fixed here: which write follows which copy depends on them."""
    kw = dict(RAGGED_CONVERGING, start_strategy="tiktak", steps_per_call=1)
    reference = fit(multimodal, MULTIMODAL_SPACE, batch_size=2, **kw)
    inject_oom(monkeypatch, fits=4, after_calls=3, writes_only=True)
    result = fit(multimodal, MULTIMODAL_SPACE, batch_size=16, **kw)
    backoffs = result.stats["backoffs"]
    assert [(b["from"], b["to"]) for b in backoffs] == [(11, 5), (5, 2)]
    assert backoffs[0]["step"] == backoffs[1]["step"]  # one write, failing at 11 and at 5
    assert identical(result, reference)


def test_the_back_off_copy_is_made_before_the_steps_it_precedes_none_after_the_last_sync(
    monkeypatch,
):
    """A sync after 16 steps asks for a copy of the population (the point a back-off restarts
    from); the next call makes it, before its steps: three calls of 16 steps copy before each
    (the first, and after each sync that is followed by steps), not after the last sync."""
    from multistart.device import sweeper

    copies = []

    def counted(tree):
        copies.append(jax.tree_util.tree_leaves(tree)[0].shape)
        return sweeper_copy(tree)

    sweeper_copy = sweeper.copy_tree
    monkeypatch.setattr(sweeper, "copy_tree", counted)
    result = fit(n_steps=48, steps_per_call=16, batch_size=12)
    assert result.stats["n_chunk_calls"] == 3
    assert len(copies) == 3  # before the calls at steps 0, 16 and 32; none at step 48
    copies.clear()
    fit(n_steps=48, steps_per_call=8, batch_size=12)  # syncs at 8, 16 (a copy due), 24, ...
    assert len(copies) == 3  # before the calls at steps 0, 16 and 32


def test_on_a_chip_a_back_off_before_the_first_copy_restarts_from_the_population_made_again(
    monkeypatch, x64, width_two_fit
):
    """On a chip (the platform injected) the initial population is made there by a program,
    and made again for a back-off instead of copied before the first step: a back-off in the
    first 16 steps (before any copy) gives the result of never failing, and the copies made
    are the syncs' alone."""
    from multistart.common import xla
    from multistart.device import sweeper

    reference = width_two_fit("loop")
    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    monkeypatch.setattr("multistart.host.engine.DEVICE_POPULATION_BYTES", 0)  # 11 starts
    copies = []
    real_copy = sweeper.copy_tree
    monkeypatch.setattr(sweeper, "copy_tree", lambda tree: copies.append(1) or real_copy(tree))
    inject_oom(monkeypatch, fits=2, after_calls=3)  # two calls a step: in step 2
    result = fit(multimodal, MULTIMODAL_SPACE, batch_size=8, steps_per_call=1, **RAGGED_CONVERGING)
    backoffs = result.stats["backoffs"]
    assert [(b["from"], b["to"]) for b in backoffs] == [(8, 4), (4, 2)]
    assert backoffs[0]["step"] < sweeper.BACKOFF_COPY_STEPS  # before the first copy
    assert identical(result, reference)
    steps = result.stats["n_steps_run"]
    assert 0 < len(copies) <= steps // sweeper.BACKOFF_COPY_STEPS  # none before the first step


def test_out_of_memory_at_width_one_is_a_clear_error(monkeypatch):
    inject_oom(monkeypatch, fits=0)
    with pytest.raises(RuntimeError, match="ran out of memory even at batch_size 1") as info:
        fit(batch_size=2, n_steps=5)
    assert "RESOURCE_EXHAUSTED" in str(info.value.__cause__)


def test_other_runtime_errors_are_not_retried(monkeypatch):
    original = Backend.compiled_for

    def compiled_for(self, width):
        def broken(pop, *args):
            raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: something else")

        original(self, width)
        return broken

    monkeypatch.setattr(Backend, "compiled_for", compiled_for)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT"):
        fit(batch_size=2, n_steps=5)  # the program of the test above


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(
    sys.platform != "linux" or jax.default_backend() != "cpu",
    reason="limits the address space with RLIMIT_AS and reads /proc (Linux, CPU backend)",
)
def test_a_real_allocation_failure_backs_off(tmp_path):
    """A real out-of-memory error on the CPU: an address-space limit the wide chunk step cannot
    allocate under. XLA's CPU client fails asynchronously and consumes the donated population,
    so this checks the path a monkeypatched failure cannot."""
    script = textwrap.dedent(
        """
        import json, os, resource
        os.environ["MULTISTART_LOG_LEVEL"] = "ERROR"
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp, numpy as np
        import multistart as ms

        def big(p):  # 16 MB of float64 per start, materialised
            z = jax.lax.optimization_barrier(jnp.sin(p["x"] * jnp.arange(2_000_000)))
            return jnp.sum((p["x"] - 0.3) ** 2) + 1e-12 * jnp.sum(z * z)

        def run(bs):
            search = ms.MultiStartAdam(
                n_starts=8, batch_size=bs, n_steps=8, seed=0, convergence=None, log_every=0
            )
            return search.fit(big, {"x": ms.Uniform(-1.0, 1.0)})

        run(1)  # threads and helpers exist before the limit
        status = open("/proc/self/status").read()
        vm = int(status.split("VmSize:")[1].split()[0]) * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        # width 8 needs about 400 MB, width 1 about 50: a margin no transient mapping of the
        # process (a thread's stack or malloc arena, tens of MB) can close
        resource.setrlimit(resource.RLIMIT_AS, (vm + 160 * 2**20, hard))
        result = run(8)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        reference = run(result.stats["batch_size"])
        print(json.dumps({
            "backoffs": result.stats["backoffs"],
            "width": result.stats["batch_size"],
            "same": bool(np.array_equal(result.foms, reference.foms)
                         and np.array_equal(result.history, reference.history, equal_nan=True)),
        }))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "MULTISTART_CACHE_DIR": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["backoffs"] and report["backoffs"][0]["from"] == 8
    assert report["width"] < 8 and report["same"]


# -- scan backend -----------------------------------------------------------------------------


def test_scan_equals_loop_bit_for_bit_in_float64(x64, width_two_fit):
    # 11 starts at batch_size 2, ragged (2, 2, 2, 2, 2, 1), with a convergence test, 8 steps
    # a call (fixed, so the chunk calls counted below do not depend on the clock): the
    # back-off tests' references
    loop, scan = width_two_fit("loop"), width_two_fit("scan")
    assert loop.stats["batch_size"] == scan.stats["batch_size"] == 2
    assert any(s.settled for s in scan.status)  # the running set shrank
    assert identical(loop, scan)
    assert scan.stats["n_compiles"] == 1 and scan.stats["backend"] == "scan"
    assert scan.stats["n_chunk_calls"] == loop.stats["n_chunk_calls"]


def test_scan_equals_loop_in_float32_to_rounding():
    kwargs = dict(n_starts=10, batch_size=4, n_steps=150, seed=1, convergence=None)
    loop = ms.MultiStartAdam(backend="loop", **kwargs).fit(multimodal, MULTIMODAL_SPACE)
    scan = ms.MultiStartAdam(backend="scan", **kwargs).fit(multimodal, MULTIMODAL_SPACE)
    np.testing.assert_allclose(scan.foms, loop.foms, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scan.params["n"], loop.params["n"], rtol=1e-4, atol=1e-5)


def _scan_program_text(level):
    from multistart.common import log

    log.logger.setLevel(level)
    try:
        data = ()

        class OnlyU(NamedTuple):  # a population whose starts hold only u
            u: jax.Array

        pop = Pop(OnlyU(jnp.zeros((4, 1))), jnp.zeros((1, 4)))  # type: ignore[arg-type]

        def chunk_step(pop, gather, scatter, new, clock, data):
            return pop._replace(starts=OnlyU(pop.starts.u.at[scatter].add(1.0, mode="drop")))

        sweep = ScanBackend(chunk_step, n_total=4, data=data, pop=pop)
        return sweep.ticks, sweep.compiled_for(2).as_text()
    finally:
        log.logger.setLevel(logging.WARNING)


def test_scan_ticks_are_compiled_in_only_when_debug_logging():
    ticks, text = _scan_program_text(logging.INFO)
    assert not ticks and "callback" not in text.lower()
    ticks, text = _scan_program_text(logging.DEBUG)
    assert ticks and "callback" in text.lower()


def test_scan_ticks_once_per_batch(monkeypatch, caplog):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "DEBUG")
    with caplog.at_level(logging.DEBUG, logger="multistart"):
        # one call a step: 12 starts, batches of 5, 5, 2(+3), each ticking once a call
        fit(batch_size=5, n_steps=3, backend="scan", steps_per_call=1)
        jax.effects_barrier()
    ticks = [r.getMessage() for r in caplog.records if "scan batch" in r.getMessage()]
    assert len(ticks) == 3 * 3
    assert {t.split("scan batch ")[1] for t in ticks} == {"1/3", "2/3", "3/3"}


def test_an_explicit_width_the_compiler_refuses_runs_at_the_widest_that_compiles(
    monkeypatch, caplog
):
    """A chip's compiler refuses a program too big for its memory (RESOURCE_EXHAUSTED raised
    by the compile, before any call): an explicit width backs off, halving, to one that
    compiles, says so, and the fit is the one that width gives."""
    original = Backend.compiled_for

    def compiled_for(self, width):
        if width > 3:
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 16.11G of "
                "15.75G hbm."
            )
        return original(self, width)

    reference = fit(batch_size=3)
    monkeypatch.setattr(Backend, "compiled_for", compiled_for)
    with caplog.at_level("WARNING", logger="multistart"):
        result = fit(batch_size=12)
    info = result.stats["width_choice"]
    assert result.stats["batch_size"] == 3  # 12 -> 6 -> 3
    assert info["compile_backoffs"] == [{"from": 12, "to": 6}, {"from": 6, "to": 3}]
    assert "does not fit the device's memory" in caplog.text
    np.testing.assert_array_equal(result.foms, reference.foms)
