"""What fits: the memory budget, the chunk step's memory, and the memory-bounded width.

A chunk step's memory is modelled as a fixed part plus a per-start part. XLA reports what a
compiled program needs (``Compiled.memory_analysis()``: its arguments, outputs, temporaries and
code); the population state and the data are arguments, so they are in the fixed part, and they
are already resident when the budget is read. The budget therefore bounds what a call allocates
*beyond* its arguments (temporaries, outputs that do not reuse a donated buffer, code) plus the
population copy the out-of-memory back-off keeps (:func:`need`). ``batch_size="auto"`` takes
the widest width, up to a count cap, whose estimate fits the budget (:func:`auto_width`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..device.oom import is_out_of_memory
from . import env, machine
from .widths import balanced_width, cap_width, count_cap, linear_fit, width_for_budget

__all__ = [
    "MEMORY_FRACTION",
    "MEMORY_FRACTIONS",
    "Budget",
    "StepMemory",
    "WidthBound",
    "auto_width",
    "memory_budget",
    "need",
    "step_memory",
    "tree_bytes",
]

logger = logging.getLogger("multistart")  # the package logger (multistart.common.log.logger)

# Share of the free memory a search's chunk step may use: the rest is headroom for the
# allocator's fragmentation, XLA's own buffers and whatever else the process or device runs.
MEMORY_FRACTION = 0.5
#: ...and where a platform's memory is known better, its own share. A TPU's compiler assigns a
#: program's buffers before it runs and refuses one its memory cannot hold, and the free figure
#: (``memory_stats``' limit less what is in use) already leaves out what the runtime keeps, so
#: half of it turned away widths that run (issue 70: 16,384 L-BFGS starts of an image fit on
#: 512², ``"auto"`` took 5,462 where 8,192 compiled and ran). A GPU's allocator pools and
#: fragments its buffers, and no GPU has been measured: it keeps the default.
MEMORY_FRACTIONS = {"tpu": 0.9}


@dataclass(frozen=True)
class Budget:
    """Bytes a chunk step may allocate beyond its arguments; ``nbytes`` None when unknown."""

    nbytes: int | None
    source: str
    free: int | None = None
    shared_devices: int = 1


def memory_budget(device) -> Budget:
    """The chunk step's memory budget on ``device``: a share of its free memory
    (:data:`MEMORY_FRACTIONS` for its platform, else :data:`MEMORY_FRACTION`), split between
    devices that share one RAM, capped by ``MULTISTART_MEMORY_BUDGET_GB``."""
    capped = env.budget_from_env()
    free, source = machine.device_free_memory(device)
    shared = machine.shared_ram_device_count() if device.platform == "cpu" else 1
    fraction = MEMORY_FRACTIONS.get(device.platform, MEMORY_FRACTION)
    nbytes = None if free is None else int(fraction * free / shared)
    if capped is not None and (nbytes is None or capped < nbytes):
        return Budget(capped, env.ENV_BUDGET_GB, free, shared)
    if nbytes is None:
        return Budget(None, source, free, shared)
    share = f"{fraction:g} of {source}"
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
            math.prod(getattr(x, "shape", ())) * x.dtype.itemsize
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


def need(estimate: StepMemory, checkpoint_bytes: int) -> int:
    """Bytes the budget must hold for a chunk step: what a call allocates beyond its arguments
    and the population copy the out-of-memory back-off keeps (one device's share on a mesh).

    The one rule every width is checked by, measured or remembered.

    >>> need(StepMemory(width=4, resident=10_000, extra=3_000, source="memory_analysis"), 500)
    3500
    """
    return int(estimate.extra + checkpoint_bytes)


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
    starts_per_device: int,
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
      starts_per_device: the starts each device holds; no width exceeds it.
      device: the device the search runs on (its free memory is the budget).
      start_bytes: one start's state, for the size-only fallback.
      checkpoint_bytes: the population copy the back-off keeps, counted in the fixed part.
      upper: the widest width to consider (default: the count cap and ``MULTISTART_MAX_BATCH``).
    """
    if upper is None:
        upper = cap_width(
            count_cap(device.platform, starts_per_device, machine.usable_cpu_count()),
            starts_per_device,
            env.max_batch_from_env(),
        )
        upper = balanced_width(starts_per_device, upper)
    budget = memory_budget(device)
    if budget.nbytes is None:
        logger.debug(
            "batch_size auto: no memory figure on %s; using the count cap", device.platform
        )
        return WidthBound(upper, upper, "count cap", budget)

    def estimate(w):
        try:
            compiled = compile_at(w)
        except Exception as e:  # a chip's compiler refuses a program its memory cannot hold
            if not is_out_of_memory(e):
                raise
            logger.info("batch_size auto: width %d does not compile within the device's memory", w)
            return StepMemory(w, 0, 0, "compile refused"), math.inf
        est = step_memory(compiled, w, start_bytes)
        return est, need(est, checkpoint_bytes)

    top, top_need = estimate(upper)
    estimates = [top]
    if top_need <= budget.nbytes or upper == 1:
        if top_need > budget.nbytes:
            _warn_over_budget(top_need, budget)
        return WidthBound(upper, upper, top.source, budget, estimates=estimates)
    return _narrow(estimate, starts_per_device, upper, top_need, budget, estimates)


def _narrow(estimate, starts_per_device: int, upper: int, top_need, budget: Budget, estimates):
    """``upper`` does not fit: the widest width under the budget on a line through width 1's
    estimate and ``upper``'s is compiled and checked, narrowed until one fits (or width 1).
    Where the compiler refused ``upper`` (no estimate to draw a line through) it is halved,
    and width 1 is compiled only if a line is needed after all: a chip's first narrower width
    usually fits, and a compile of width 1 (seconds there) would only have drawn the line."""
    assert budget.nbytes is not None  # a width is narrowed only against a known budget
    ones: list[tuple[StepMemory, float]] = []  # width 1's estimate, once compiled

    def one_need() -> float:
        if not ones:
            ones.append(estimate(1))
            estimates.append(ones[0][0])
        return ones[0][1]

    hi = upper  # the narrowest width known not to fit
    fixed: float | None = None
    per: float | None = None
    if math.isfinite(top_need):
        fixed, per = linear_fit(1, one_need(), upper, top_need)
        width = balanced_width(
            starts_per_device, width_for_budget(fixed, per, budget.nbytes, upper - 1)
        )
    else:  # the compile refused it: no estimate to draw a line through; halve
        width = balanced_width(starts_per_device, max(1, upper // 2))
    while width > 1:
        est, w_need = estimate(width)
        estimates.append(est)
        if w_need <= budget.nbytes:
            break
        hi = width
        # with no usable slope (XLA's estimate is not monotone in width, or the compile refused
        # the width) halve instead of creeping down one width and one compile at a time
        fit = hi // 2
        if math.isfinite(w_need):
            fixed, per = linear_fit(1, one_need(), width, w_need)
            if per > 0:
                fit = width_for_budget(fixed, per, budget.nbytes, hi - 1)
        width = balanced_width(starts_per_device, max(1, fit))
    if width == 1 and one_need() > budget.nbytes:
        _warn_over_budget(one_need(), budget)
    known = [e.source for e in estimates if e.source != "compile refused"]
    source = known[-1] if known else "compile refused"
    return WidthBound(width, upper, source, budget, fixed, per, estimates)


def _warn_over_budget(nbytes: float, budget: Budget) -> None:
    assert budget.nbytes is not None  # called only where the budget is known
    logger.warning(
        "batch_size auto: even width 1 needs about %.3g GiB beyond its arguments, over the "
        "budget of %.3g GiB (%s); running at width 1",
        nbytes / env.GB,
        budget.nbytes / env.GB,
        budget.source,
    )
