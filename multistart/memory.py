"""What fits: the chunk step's memory, the memory budget, and the device and CPU facts behind them.

A chunk step's memory is modelled as a fixed part plus a per-start part. XLA reports what a
compiled program needs (``Compiled.memory_analysis()``: its arguments, outputs, temporaries and
code); the population state and the data are arguments, so they are in the fixed part, and they
are already resident when the budget is read. The budget therefore bounds what a call allocates
*beyond* its arguments (temporaries, outputs that do not reuse a donated buffer, code) plus the
population copy the out-of-memory back-off keeps. ``batch_size="auto"`` takes the widest width,
up to a count cap, whose estimate fits the budget.

The arithmetic (:func:`linear_fit`, :func:`width_for_budget`, :func:`balanced_width`,
:func:`cap_width`, :func:`candidate_widths`, :func:`parse_cpu_max`, ...) is plain Python, tested
on literal numbers. The facts (free memory, cgroup limits, usable CPUs) are read at call time so
that environment changes between runs take effect.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Budget",
    "StepMemory",
    "WidthBound",
    "auto_candidates",
    "auto_mode_from_env",
    "auto_width",
    "balanced_width",
    "candidate_widths",
    "cap_width",
    "cgroup_cpu_limit",
    "cgroup_memory_available",
    "check_env",
    "count_cap",
    "is_out_of_memory",
    "linear_fit",
    "max_batch_from_env",
    "memory_budget",
    "budget_from_env",
    "parse_cpu_max",
    "shared_ram_device_count",
    "step_memory",
    "usable_cpu_count",
    "width_for_budget",
]

logger = logging.getLogger("multistart")  # the package logger (multistart.log.logger)

ENV_MAX_BATCH = "MULTISTART_MAX_BATCH"
ENV_BUDGET_GB = "MULTISTART_MEMORY_BUDGET_GB"
ENV_AUTO_WIDTH = "MULTISTART_AUTO_WIDTH"
AUTO_MODES = ("measure", "memory")
GB = 2**30  # the budget variable counts GiB
# Share of the free memory a search's chunk step may use: the rest is headroom for the
# allocator's fragmentation, XLA's own buffers and whatever else the process or device runs.
MEMORY_FRACTION = 0.5
# When "auto" cannot measure on a CPU (MULTISTART_AUTO_WIDTH=memory, or no free-memory figure)
# it vectorises at most this many starts per usable core: a guess that is right for the
# benchmark model (widths 4-16 fastest on 2 cores) and wrong both ways for others, which is why
# "auto" on a CPU times a few widths instead.
CPU_STARTS_PER_CORE = 4
# cgroup v1 reports "no limit" as a huge page-rounded number rather than "max".
_V1_UNLIMITED = 2**60
CGROUP_ROOT = Path("/sys/fs/cgroup")

# -- pure arithmetic ------------------------------------------------------------------------


def linear_fit(width_a: int, bytes_a: float, width_b: int, bytes_b: float) -> tuple[float, float]:
    """``(fixed, per_start)`` of the line through two (width, bytes) estimates.

    Neither part is negative: XLA can reuse buffers differently at two widths, and a slope
    below zero or an intercept below zero would only promise memory that is not there. With
    no slope, the larger estimate is the fixed part.

    >>> linear_fit(1, 300, 4, 900), linear_fit(8, 6000, 1, 11000)
    ((100.0, 200.0), (11000.0, 0.0))
    """
    if width_a == width_b:
        raise ValueError(f"two different widths are needed; got {width_a} twice")
    per = (bytes_b - bytes_a) / (width_b - width_a)
    if per <= 0:
        return float(max(bytes_a, bytes_b)), 0.0
    return max(0.0, bytes_a - per * width_a), per


def width_for_budget(fixed: float, per_start: float, budget: float, upper: int) -> int:
    """The widest width in ``[1, upper]`` with ``fixed + width * per_start <= budget``.

    Returns 1 when not even one start fits (a search cannot run narrower; the caller warns).

    >>> width_for_budget(100, 200, 1000, 64)
    4
    >>> width_for_budget(100, 0, 1000, 64), width_for_budget(2000, 0, 1000, 64)
    (64, 1)
    """
    if upper < 1:
        raise ValueError(f"upper must be >= 1; got {upper}")
    if per_start <= 0:
        return upper if fixed <= budget else 1
    return max(1, min(upper, math.floor((budget - fixed) / per_start)))


def balanced_width(n_rows: int, width: int) -> int:
    """The narrowest width that sweeps ``n_rows`` in as many chunks as ``width`` does.

    Same number of calls, less padding and less memory: 32 starts at width 12 take 3 chunks,
    and so do they at width 11.

    >>> balanced_width(32, 12)
    11
    >>> balanced_width(32, 8)
    8
    """
    if n_rows < 1 or width < 1:
        raise ValueError(f"n_rows and width must be >= 1; got {n_rows}, {width}")
    width = min(width, n_rows)
    return math.ceil(n_rows / math.ceil(n_rows / width))


def cap_width(width: int, n_starts: int, max_batch: int | None) -> int:
    """``width`` clamped to ``[1, n_starts]`` and to ``max_batch`` when set.

    >>> cap_width(64, 40, None), cap_width(64, 40, 8), cap_width(3, 40, 8)
    (40, 8, 3)
    """
    width = min(width, n_starts)
    if max_batch is not None:
        width = min(width, max_batch)
    return max(1, width)


def count_cap(platform: str, n_starts: int, n_cpus: int) -> int:
    """The widest width "auto" considers before memory: CPUs get a few starts per core.

    >>> count_cap("cpu", 64, 2), count_cap("gpu", 64, 2), count_cap("cpu", 5, 2)
    (8, 64, 5)
    """
    if platform == "cpu":
        return max(1, min(n_starts, CPU_STARTS_PER_CORE * n_cpus))
    return n_starts


def candidate_widths(upper: int) -> list[int]:
    """The widths "tune" times: 1 and the powers of two below ``upper``, then ``upper``.

    >>> candidate_widths(12), candidate_widths(16), candidate_widths(1)
    ([1, 2, 4, 8, 12], [1, 2, 4, 8, 16], [1])
    """
    if upper < 1:
        raise ValueError(f"upper must be >= 1; got {upper}")
    widths = [1 << k for k in range(upper.bit_length()) if (1 << k) < upper]
    return widths + [upper]


def auto_candidates(upper: int) -> list[int]:
    """The widths "auto" times on a CPU, in order: ``upper``, 1, then ``upper`` divided by
    8, 64, ... while above 1.

    Sparser than "tune"'s ladder, as each width costs a compile: ``upper`` is compiled anyway
    for the memory bound, width 1 is the one without a vmap (often the cheapest per start on
    a CPU), and the widths below ``upper`` are tried widest first until one is slower than the
    one before.

    >>> auto_candidates(32), auto_candidates(100_000), auto_candidates(8), auto_candidates(1)
    ([32, 1, 4], [100000, 1, 12500, 1563, 196, 25, 4], [8, 1], [1])
    """
    if upper < 1:
        raise ValueError(f"upper must be >= 1; got {upper}")
    widths = [upper]
    while (w := math.ceil(widths[-1] / 8)) > 1 and len(widths) < 64:
        widths.append(w)
    return [upper] if upper == 1 else [upper, 1, *widths[1:]]


def parse_cpu_max(text: str) -> int | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` line (``"quota period"``); None: no limit.

    >>> parse_cpu_max("max 100000"), parse_cpu_max("150000 100000"), parse_cpu_max("50000")
    (None, 2, 1)
    """
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = float(parts[1]) if len(parts) > 1 else 100_000.0
    return quota_cores(float(parts[0]), period)


def quota_cores(quota: float, period: float) -> int | None:
    """Cores a CPU quota allows (rounded up: 1.5 cores can keep two threads busy half the
    time); None when there is no quota (cgroup v1 writes -1).

    >>> quota_cores(-1, 100000), quota_cores(250000, 100000), quota_cores(10000, 100000)
    (None, 3, 1)
    """
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


# -- environment ----------------------------------------------------------------------------


def max_batch_from_env() -> int | None:
    """``MULTISTART_MAX_BATCH``: the widest chunk allowed, whatever ``batch_size`` asks for.

    It also caps an explicit int, so a run that failed for memory can be retried narrower
    without a code change. Unset or empty: no cap.

    Raises:
      ValueError: the variable is set to anything but a positive int.
    """
    text = os.environ.get(ENV_MAX_BATCH, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{ENV_MAX_BATCH} must be a positive int (the widest batch allowed) or unset; "
            f"got {text!r}"
        )
    return value


def budget_from_env() -> int | None:
    """``MULTISTART_MEMORY_BUDGET_GB`` in bytes (GiB, fractions allowed); None when unset.

    Raises:
      ValueError: the variable is set to anything but a positive number.
    """
    text = os.environ.get(ENV_BUDGET_GB, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(
            f"{ENV_BUDGET_GB} must be a positive number of GiB (e.g. 0.5) or unset; got {text!r}"
        )
    return int(value * GB)


def auto_mode_from_env() -> str:
    """``MULTISTART_AUTO_WIDTH``: how ``"auto"`` chooses on a CPU.

    ``"measure"`` (the default): time a few widths within the memory bound and remember the
    choice. ``"memory"``: the widest width that fits, at most 4 starts per usable core, with no
    timing (the same width in every run, whatever the load).

    Raises:
      ValueError: the variable is set to anything else.
    """
    text = os.environ.get(ENV_AUTO_WIDTH, "").strip()
    if not text:
        return AUTO_MODES[0]
    if text not in AUTO_MODES:
        raise ValueError(
            f"{ENV_AUTO_WIDTH} must be one of {', '.join(map(repr, AUTO_MODES))} or unset; "
            f"got {text!r}"
        )
    return text


def check_env() -> None:
    """Read every width variable, so a bad value fails before anything is compiled even when
    this run would not have used it."""
    max_batch_from_env()
    budget_from_env()
    auto_mode_from_env()


# -- CPU and memory facts -------------------------------------------------------------------


def _own_cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """Controller -> this process's cgroup path, from ``/proc/self/cgroup`` text ("" is v2)."""
    paths = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def _cgroup_dirs(root: Path, controller: str, proc_cgroup: str | None) -> list[Path]:
    """Folders whose limits apply to this process: its own cgroup, its ancestors, the root.

    Covers cgroup v2 (one hierarchy at ``root``) and v1 (one per controller, ``root/<ctl>``).
    """
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    own = _own_cgroup_paths(proc_cgroup)
    dirs = []
    for base, key in ((root, ""), (root / controller, controller)):
        rel = Path(own.get(key, "/").lstrip("/"))
        chain = [rel, *rel.parents] if str(rel) != "." else [Path(".")]
        dirs.extend(base / p for p in chain)
    seen, out = set(), []
    for d in dirs:
        if d not in seen and d.is_dir():
            seen.add(d)
            out.append(d)
    return out


def _read_number(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return math.inf
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """Cores the cgroup CPU quota allows this process (the tightest level); None: no quota."""
    limits = []
    for d in _cgroup_dirs(root, "cpu", proc_cgroup):
        try:
            limits.append(parse_cpu_max((d / "cpu.max").read_text()))
        except (OSError, ValueError, IndexError):
            pass
        quota, period = _read_number(d / "cpu.cfs_quota_us"), _read_number(d / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            limits.append(quota_cores(quota, period))
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def usable_cpu_count() -> int:
    """Cores this process may actually run on: its CPU affinity and its cgroup quota.

    A container, a Slurm cpuset or a CPU quota gives a process fewer cores than the machine
    has; sizing work by ``os.cpu_count()`` there oversubscribes it. Falls back to
    ``os.cpu_count()``, then 1.

    >>> import multistart as ms
    >>> ms.usable_cpu_count() >= 1
    True
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota = cgroup_cpu_limit()
    except OSError:
        quota = None
    if quota is not None:
        n = min(n, quota)
    return max(1, n)


def cgroup_memory_available(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """Bytes this process's memory cgroup still allows (limit minus usage, the tightest
    level); None when no level sets a limit.

    cgroup v2: ``memory.max`` - ``memory.current``; v1: ``memory.limit_in_bytes`` -
    ``memory.usage_in_bytes`` (where "no limit" is a number near 2**63).
    """
    room = []
    for d in _cgroup_dirs(root, "memory", proc_cgroup):
        for limit_name, usage_name in (
            ("memory.max", "memory.current"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        ):
            limit = _read_number(d / limit_name)
            if limit is None or not math.isfinite(limit) or limit >= _V1_UNLIMITED:
                continue
            usage = _read_number(d / usage_name) or 0.0
            room.append(max(0, int(limit - usage)))
    return min(room) if room else None


def host_available_memory() -> tuple[int | None, str]:
    """Free host RAM in bytes: the lower of psutil's available memory and the cgroup's room."""
    found = []
    try:
        import psutil

        found.append((int(psutil.virtual_memory().available), "host RAM available (psutil)"))
    except Exception:  # psutil missing or unsupported platform: the cgroup may still tell
        pass
    cgroup = cgroup_memory_available()
    if cgroup is not None:
        found.append((cgroup, "cgroup memory limit"))
    if not found:
        return None, "unknown"
    return min(found)


def device_free_memory(device) -> tuple[int | None, str]:
    """Free memory of ``device`` in bytes and where the figure came from.

    Accelerators report their allocator's pool (``device.memory_stats()``: ``bytes_limit``
    minus ``bytes_in_use``); a CPU device has no such statistics and uses host RAM.
    """
    try:
        stats = device.memory_stats()
    except Exception:  # not implemented on this backend
        stats = None
    if stats and "bytes_limit" in stats:
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        return max(0, free), f"{device.platform} memory_stats"
    if device.platform == "cpu":
        return host_available_memory()
    return None, "unknown"


def shared_ram_device_count(devices=None) -> int:
    """How many devices hold their batches in one RAM: the logical CPU devices of
    ``--xla_force_host_platform_device_count`` share the host's memory, while each GPU or TPU
    has its own. A budget read from host RAM is split between them."""
    if devices is None:
        import jax

        try:
            devices = jax.local_devices()
        except RuntimeError:
            return 1
    return max(1, sum(1 for d in devices if d.platform == "cpu"))


@dataclass(frozen=True)
class Budget:
    """Bytes a chunk step may allocate beyond its arguments; ``nbytes`` None when unknown."""

    nbytes: int | None
    source: str
    free: int | None = None
    shared_devices: int = 1


def memory_budget(device) -> Budget:
    """The chunk step's memory budget on ``device``: a share of its free memory, split
    between devices that share one RAM, capped by ``MULTISTART_MEMORY_BUDGET_GB``."""
    env = budget_from_env()
    free, source = device_free_memory(device)
    shared = shared_ram_device_count() if device.platform == "cpu" else 1
    nbytes = None if free is None else int(MEMORY_FRACTION * free / shared)
    if env is not None and (nbytes is None or env < nbytes):
        return Budget(env, ENV_BUDGET_GB, free, shared)
    if nbytes is None:
        return Budget(None, source, free, shared)
    share = f"{MEMORY_FRACTION:g} of {source}"
    return Budget(nbytes, share if shared == 1 else f"{share} / {shared} devices", free, shared)


# -- estimates of the chunk step ------------------------------------------------------------


@dataclass(frozen=True)
class StepMemory:
    """What one compiled chunk step needs at ``width``.

    Attributes:
      resident: bytes of its arguments (population, data, indices), already on the device.
      extra: bytes a call allocates beyond them: temporaries, outputs not written into a
        donated argument, generated code.
      source: ``"memory_analysis"`` (XLA's buffer assignment) or ``"io_sizes"`` (the
        gathered chunk's inputs and outputs only: an underestimate, used when XLA gives none).
    """

    width: int
    resident: int
    extra: int
    source: str


def tree_bytes(tree) -> int:
    """Bytes of every array (or shape-dtype struct) in ``tree``."""
    import jax

    return int(
        sum(
            math.prod(getattr(x, "shape", ())) * getattr(x, "dtype", None).itemsize
            for x in jax.tree_util.tree_leaves(tree)
            if getattr(x, "dtype", None) is not None
        )
    )


def step_memory(compiled, width: int, start_bytes: int) -> StepMemory:
    """Estimate a compiled chunk step's memory from XLA's analysis, else from sizes.

    ``start_bytes`` is one start's state; the size fallback counts each start gathered in and
    written out (``2 * width * start_bytes``) because the donated population is the output.
    """
    try:
        m = compiled.memory_analysis()
    except Exception:  # NotImplementedError on backends without the analysis
        m = None
    if m is not None and hasattr(m, "temp_size_in_bytes"):
        extra = (
            m.temp_size_in_bytes
            + max(0, m.output_size_in_bytes - m.alias_size_in_bytes)
            + m.generated_code_size_in_bytes
        )
        return StepMemory(width, int(m.argument_size_in_bytes), int(extra), "memory_analysis")
    try:
        resident = tree_bytes(compiled.in_avals)
    except Exception:
        resident = 0
    return StepMemory(width, resident, 2 * width * start_bytes, "io_sizes")


@dataclass
class WidthBound:
    """How ``batch_size="auto"`` chose: the width and everything it was derived from."""

    width: int
    upper: int
    estimate: str  # "memory_analysis", "io_sizes" or "count cap"
    budget: Budget
    fixed_bytes: float | None = None
    per_start_bytes: float | None = None
    estimates: list[StepMemory] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("budget", "estimates")}
        out.update(
            budget_bytes=self.budget.nbytes,
            budget_source=self.budget.source,
            estimates=[asdict(e) for e in self.estimates],
        )
        return out


def auto_width(
    compile_at: Callable[[int], Any],
    *,
    n_starts: int,
    device,
    start_bytes: int,
    checkpoint_bytes: int,
    upper: int | None = None,
) -> WidthBound:
    """The widest width up to the count cap whose chunk step fits the memory budget.

    ``compile_at(width)`` returns the compiled chunk step at ``width`` (the caller keeps the
    one it ends up using, so the search does not compile it again). The candidate at the count
    cap is compiled first: when it fits, that is the width and nothing else was compiled.
    Otherwise width 1 is compiled too, a line through the two estimates gives the fixed and
    per-start parts, and the widest width under the budget is checked by compiling it (XLA is
    not exactly linear in width; a width that misses is narrowed and checked again).

    Args:
      compile_at: width -> compiled chunk step.
      n_starts: number of starts; no width exceeds it.
      device: the device the search runs on (its free memory is the budget).
      start_bytes: one start's state, for the size-only fallback.
      checkpoint_bytes: the population copy the back-off keeps, counted in the fixed part.
      upper: the widest width to consider (default: the count cap and ``MULTISTART_MAX_BATCH``).
    """
    if upper is None:
        upper = cap_width(
            count_cap(device.platform, n_starts, usable_cpu_count()),
            n_starts,
            max_batch_from_env(),
        )
        upper = balanced_width(n_starts, upper)
    budget = memory_budget(device)
    if budget.nbytes is None:
        logger.debug(
            "batch_size auto: no memory figure on %s; using the count cap", device.platform
        )
        return WidthBound(upper, upper, "count cap", budget)

    def need(w):
        est = step_memory(compile_at(w), w, start_bytes)
        return est, est.extra + checkpoint_bytes

    top, top_need = need(upper)
    estimates = [top]
    if top_need <= budget.nbytes or upper == 1:
        if top_need > budget.nbytes:
            _warn_over_budget(top_need, budget)
        return WidthBound(upper, upper, top.source, budget, estimates=estimates)
    one, one_need = need(1)
    estimates.append(one)
    fixed, per = linear_fit(1, one_need, upper, top_need)
    hi = upper  # the narrowest width known not to fit
    width = balanced_width(n_starts, width_for_budget(fixed, per, budget.nbytes, upper - 1))
    while width > 1:
        est, w_need = need(width)
        estimates.append(est)
        if w_need <= budget.nbytes:
            break
        hi = width
        fixed, per = linear_fit(1, one_need, width, w_need)
        # with no usable slope (XLA's estimate is not monotone in width) halve instead of
        # creeping down one width and one compile at a time
        fit = width_for_budget(fixed, per, budget.nbytes, hi - 1) if per > 0 else hi // 2
        width = balanced_width(n_starts, max(1, fit))
    if width == 1 and one_need > budget.nbytes:
        _warn_over_budget(one_need, budget)
    return WidthBound(width, upper, one.source, budget, fixed, per, estimates)


def _warn_over_budget(nbytes: float, budget: Budget) -> None:
    logger.warning(
        "batch_size auto: even width 1 needs about %.3g GiB beyond its arguments, over the "
        "budget of %.3g GiB (%s); running at width 1",
        nbytes / GB,
        budget.nbytes / GB,
        budget.source,
    )


# -- failures -------------------------------------------------------------------------------

_OOM = re.compile(
    r"RESOURCE_EXHAUSTED|out of memory|failed to allocate|could not allocate|allocation fail",
    re.IGNORECASE,
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Is ``exc`` XLA reporting an allocation failure?

    A launch that cannot allocate raises ``RESOURCE_EXHAUSTED: Out of memory ...``; on the CPU
    the failure is asynchronous and a later call or read that depends on the failed buffers
    raises ``INTERNAL: ... Out of memory allocating ...``. Both count.
    """
    if isinstance(exc, MemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    return bool(_OOM.search(str(exc)))
