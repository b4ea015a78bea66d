"""Width arithmetic: plain Python on literal numbers, no JAX, no machine facts.

The memory bound (:func:`multistart.width.budget.auto_width`) and the width choice
(:mod:`multistart.width`) are built from these: the line through two memory estimates, the
widest width under a budget, the width that sweeps the rows in as many chunks with the least
padding, the caps, and the ladders of widths ``"tune"`` and ``"auto"`` time.
"""

from __future__ import annotations

import math

__all__ = [
    "CPU_STARTS_PER_CORE",
    "TPU_AUTO_WIDTH",
    "auto_candidates",
    "balanced_width",
    "candidate_widths",
    "cap_width",
    "count_cap",
    "linear_fit",
    "width_for_budget",
]

# When "auto" cannot measure on a CPU (MULTISTART_AUTO_WIDTH=memory, or no free-memory figure)
# it vectorises at most this many starts per usable core: a guess that is right for the
# benchmark model (widths 4-16 fastest on 2 cores) and wrong both ways for others, which is why
# "auto" on a CPU times a few widths instead.
CPU_STARTS_PER_CORE = 4
# On a TPU "auto" takes no chunk wider than this. There the step's compile grows with the width
# while its throughput has nearly saturated: 200,000 small fits (4 parameters, 60 points) at
# width 12,500 compiled in 6.5 s and ran warm in 0.77 s, at 200,000 in 20.3 s and 0.67 s
# (50,000: 15.6 s, 0.70 s; python -m profiling.experiments.warm_many_profile --first
# --batch-size W on a TPU v5e, issue 70; at the default, python -m profiling.accelerator --only
# many: first call 26.0 s -> 14.4 s). Since a chunk call on a chip touches only its window of
# the population (device/step.windowed), the capped width's warm call took 0.50 s (0.88 s
# before; the widest's 0.68 s before, not measured since). No GPU has been measured: a GPU
# keeps the memory bound.
TPU_AUTO_WIDTH = 16384


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


def cap_width(width: int, starts_per_device: int, max_batch: int | None) -> int:
    """``width`` clamped to ``[1, starts_per_device]`` and to ``max_batch`` when set.

    >>> cap_width(64, 40, None), cap_width(64, 40, 8), cap_width(3, 40, 8)
    (40, 8, 3)
    """
    width = min(width, starts_per_device)
    if max_batch is not None:
        width = min(width, max_batch)
    return max(1, width)


def count_cap(platform: str, starts_per_device: int, n_cpus: int) -> int:
    """The widest width "auto" considers before memory: CPUs get a few starts per core, a TPU
    at most :data:`TPU_AUTO_WIDTH`.

    >>> count_cap("cpu", 64, 2), count_cap("gpu", 64, 2), count_cap("cpu", 5, 2)
    (8, 64, 5)
    >>> count_cap("tpu", 200_000, 2), count_cap("gpu", 200_000, 2)
    (16384, 200000)
    """
    if platform == "cpu":
        return max(1, min(starts_per_device, CPU_STARTS_PER_CORE * n_cpus))
    if platform == "tpu":
        return min(starts_per_device, TPU_AUTO_WIDTH)
    return starts_per_device


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
