"""Timing widths: the ``"tune"`` and ``"auto"`` ladders, and the gate that prices timing.

A width is timed on a bounded number of chunk calls (never every start) and a step's time
predicted from the median seconds per call. The ladders need of a backend only ``time_chunks``,
``calls_per_step``, ``compile_seconds`` and ``rows``, so they are tested on cost models.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..common import log
from ..device.oom import is_out_of_memory
from .widths import auto_candidates, balanced_width, candidate_widths

__all__ = [
    "AUTO_WIDTH_ONE_FASTER",
    "CALL_FLOOR_S",
    "Gate",
    "PRIOR_DECADES",
    "PRIOR_GAINS",
    "Timings",
    "expected_share",
    "say",
    "time_auto",
    "time_tune",
]

# Timing per candidate width and pass: TUNE_CALLS chunk calls at a time (fewer when a step has
# fewer), repeated at least MIN and at most MAX times, stopping once TARGET seconds have passed.
TUNE_TARGET_S = 0.1
TUNE_CALLS = 16
TUNE_MIN_REPS = 3
TUNE_MAX_REPS = 12
# Throughput against width rises and then falls. Widths are tried narrow to wide, and timing
# stops once two successive widths each fall below this share of the best so far.
TUNE_STOP_RATIO = 0.75
# After the ladder, widths whose step is within this factor of the best are timed again, so a
# slow spell during the first pass does not decide between close widths.
TUNE_AGAIN_RATIO = 1.25
# "auto" times the widest width, then width 1. When width 1 steps at least this many times as
# fast (an expensive model, whose single evaluation keeps the cores busy), the narrower widths
# are not timed: each is a compile, and on the models measured the best width was then 1.
AUTO_WIDTH_ONE_FASTER = 1.5
# What "auto" expects timing to gain before this device has measured anything: pairs of
# (seconds a start cost in one chunk call at the memory bound, the bound's step / the best
# width's step), measured on this project's 2-core CPU (profiling/README.md), weighed by how
# close their seconds a start are to the model's own (PRIOR_DECADES).
PRIOR_GAINS = ((6e-7, 3.0), (7e-6, 1.0), (5e-5, 1.0), (8e-4, 2.0), (1e-2, 2.5))
# The width of that weighting, in decades of seconds a start (a Gaussian kernel in log10).
PRIOR_DECADES = 0.5
# A stack of fits (ms.curve_fit(batched=True)) is priced at this share of n_steps x every start:
# its small independent fits end on their own tests and the rediscovery rule, and the sweep drops
# their chunks. Measured (the mean steps a start took over n_steps): 2,000 peak fits, 1 and 8
# starts a fit, centred and anywhere, 0.024-0.051; 500 spectra, 1 and 32 starts, 0.019
# (profiling/HISTORY.md, "A stack of fits priced at the steps it runs").
STACK_RUN_SHARE = 0.05
# No chunk call costs less than this on a CPU (dispatch, gathers and scatters): a width needing
# more calls a step than the best step's seconds allow at this price cannot win.
CALL_FLOOR_S = 20e-6


def say(spec, *args) -> None:
    """What the width choice is doing: INFO for an explicit ``"tune"``, DEBUG otherwise."""
    (log.logger.info if spec == "tune" else log.logger.debug)(*args)


class Timings:
    """Seconds per chunk call of each width timed for one decision, and what timing cost.

    Args:
      backend: what compiles and times a width (``compiled_for``, ``time_chunks``,
        ``calls_per_step``, ``compile_seconds``, ``rows``).
      pop: the initial population (timing steps a copy).
      spec: ``"auto"`` or ``"tune"``, for the log.
    """

    def __init__(self, backend, pop, spec: str):
        self.backend, self.pop, self.spec = backend, pop, spec
        self.per_call: dict[int, list[float]] = {}
        self.calls: dict[int, int] = {}
        self.failed: list[int] = []
        self.timing_s = 0.0  # the timed calls' seconds (their count x the median per call)

    def time(self, width: int, label: str, *, min_reps: int = TUNE_MIN_REPS, target_s=None):
        """Time ``width`` (compiling it first if needed) and keep its seconds per call."""
        say(self.spec, "batch_size %s: timing width %d (%s) ...", self.spec, width, label)
        seconds, n = self.backend.time_chunks(
            self.pop,
            width,
            calls=TUNE_CALLS,
            target_s=TUNE_TARGET_S if target_s is None else target_s,
            min_reps=min_reps,
            max_reps=max(min_reps, TUNE_MAX_REPS),
        )
        self.per_call.setdefault(width, []).extend(seconds)
        self.calls[width] = self.calls.get(width, 0) + n
        self.timing_s += n * statistics.median(seconds)

    def try_time(self, width: int, label: str, **kwargs) -> bool:
        """:meth:`time`, but a width that runs out of memory is noted and skipped."""
        try:
            self.time(width, label, **kwargs)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            self.per_call.pop(width, None)
            self.failed.append(width)
            return False
        return True

    def step_s(self, width: int) -> float:
        """Predicted seconds of one step at ``width``: calls a step x median seconds a call."""
        return self.backend.calls_per_step(width) * statistics.median(self.per_call[width])

    def best(self) -> int:
        if not self.per_call:
            raise RuntimeError(
                f"batch_size {self.spec}: no width ran without running out of memory"
            )
        return min(self.per_call, key=self.step_s)

    def top_up(self) -> None:
        """Time again every width timed fewer than :data:`TUNE_MIN_REPS` times (the fit's
        price is one repeat), so that widths are compared on medians of as many repeats: one
        slow spell in a single repeat once made a narrower width look faster."""
        for w in sorted(self.per_call, reverse=True):
            short = TUNE_MIN_REPS - len(self.per_call[w])
            if short > 0:
                self.time(w, "to as many repeats", min_reps=short, target_s=0.0)

    def again(self) -> None:
        """Time the widths within :data:`TUNE_AGAIN_RATIO` of the best again, widest first."""
        if len(self.per_call) < 2:
            return
        best = self.step_s(self.best())
        close = [w for w in self.per_call if self.step_s(w) <= TUNE_AGAIN_RATIO * best]
        if len(close) < 2:
            return
        for w in sorted(close, reverse=True):
            self.time(w, "again")

    def spent_s(self, kept: int) -> float:
        """Seconds deciding has cost so far, were ``kept`` the width chosen: the compiles of
        the other widths timed and every timed call."""
        compiles = sum(self.backend.compile_seconds(w) for w in self.per_call if w != kept)
        return compiles + self.timing_s

    def table(self) -> list[dict[str, Any]]:
        n_rows = self.backend.rows.size
        rows: list[dict[str, Any]] = [
            {
                "width": w,
                "calls": self.calls[w],
                "chunk_s": statistics.median(self.per_call[w]),
                "step_s": self.step_s(w),
                "steps_per_s": 1.0 / self.step_s(w),
                "starts_steps_per_s": n_rows / self.step_s(w),
                "compile_s": self.backend.compile_seconds(w),
            }
            for w in sorted(self.per_call)
        ]
        return rows + [{"width": w, "error": "out of memory"} for w in self.failed]


def expected_share(start_s: float, gains) -> float:
    """The share of a step at the memory bound that the best width is expected to save, for a
    model whose start costs ``start_s`` seconds in a chunk call there: over ``gains`` (pairs of
    seconds a start and the bound's step / the best step, as :data:`PRIOR_GAINS`), the mean of
    ``1 - 1 / gain`` (nothing when the bound was best), each pair weighted by how near its
    seconds a start are to ``start_s`` (:data:`PRIOR_DECADES`).

    >>> round(expected_share(1e-2, [(1e-2, 2.0)]), 3), expected_share(1e-5, [(1e-5, 1.0)])
    (0.5, 0.0)
    >>> round(expected_share(1e-2, [(1e-2, 2.0), (1e-3, 1.0)]), 3)  # the far one counts less
    0.44
    """
    return _weighted(start_s, gains, lambda g: max(0.0, 1.0 - 1.0 / g))


def _weighted(start_s: float, gains, value) -> float:
    if not gains:
        return 0.0
    at = math.log10(max(start_s, 1e-12))
    total = norm = 0.0
    for s, g in gains:
        weight = math.exp(-0.5 * ((at - math.log10(max(s, 1e-12))) / PRIOR_DECADES) ** 2)
        total += weight * value(g)
        norm += weight
    return total / norm if norm > 0 else 0.0


@dataclass
class Gate:
    """Whether ``"auto"`` times one more width: when the seconds it is expected to save the fit
    exceed what timing it costs.

    The fit is priced at ``n_steps`` x ``run_share`` x the memory bound's step (with a share
    of 1, an upper bound when starts converge early). A width not yet timed costs one compile,
    at ``compile_s`` (the memory bound's, or a slower one a record remembers: a compile served
    from JAX's persistent cache says nothing of a compile's price), plus its timed calls. It is
    expected to save ``n_steps`` x ``run_share`` x how much faster than the best so far its
    step would be, were the bound's step ``gain`` times its step, averaged over :meth:`gains`
    (:func:`expected_share`'s weights), never faster than its chunk calls at
    :data:`CALL_FLOOR_S` each.

    Args:
      n_steps: the steps the search takes at most.
      compile_s: the seconds one compile is priced at (at least; the first compile may raise it).
      measured: ``(seconds a start at the bound, gain)`` pairs this device recorded before.
      run_share: the share of ``n_steps`` the fit's starts are expected to run
        (:data:`STACK_RUN_SHARE` for a stack of fits; 1 otherwise).
    """

    n_steps: int
    compile_s: float = 0.0
    measured: tuple[tuple[float, float], ...] = ()
    run_share: float = 1.0
    refused: str | None = field(default=None, init=False)

    @property
    def steps(self) -> float:
        """The steps the fit is priced at: ``n_steps`` x ``run_share``."""
        return self.n_steps * self.run_share

    def fit_s(self, timings: Timings, width: int) -> float:
        return self.steps * timings.step_s(width)

    def cost_s(self, timings: Timings, width: int) -> float:
        """The price of timing ``width``: a compile and its timed calls."""
        best = timings.best()
        per_start = statistics.median(timings.per_call[best]) / best
        k = min(TUNE_CALLS, timings.backend.calls_per_step(width))
        return self.compile_s + (1 + TUNE_MIN_REPS) * k * per_start * width

    def gains(self, timings: Timings) -> list[tuple[float, float]]:
        """Every ``(seconds a start, gain)`` the expectation weighs: the prior, this device's
        records, and the widths timed so far against the bound (at this model's seconds)."""
        bound, start_s = _bound_of(timings)
        step = timings.step_s
        here = [(start_s, step(bound) / step(w)) for w in timings.per_call if w != bound]
        return [*PRIOR_GAINS, *self.measured, *here]

    def saving_s(self, timings: Timings, width: int) -> float:
        """The seconds timing ``width`` is expected to save the fit (see the class)."""
        bound, start_s = _bound_of(timings)
        at_bound, best = timings.step_s(bound), timings.step_s(timings.best())
        floor = timings.backend.calls_per_step(width) * CALL_FLOOR_S

        def saved(gain: float) -> float:
            return max(0.0, best - max(at_bound / gain, floor))

        return self.steps * _weighted(start_s, self.gains(timings), saved)

    def allows(self, timings: Timings, width: int) -> bool:
        """Is timing ``width`` worth it? When not, :attr:`refused` says why."""
        if not timings.per_call:  # nothing priced yet (the bound ran out of memory)
            return True
        saving, cost = self.saving_s(timings, width), self.cost_s(timings, width)
        if saving > cost:
            return True
        best = timings.best()
        self.refused = (
            f"timing width {width} would cost about {cost:.3g} s and is expected to save "
            f"about {saving:.3g} s of a fit of about {self.fit_s(timings, best):.3g} s at "
            f"width {best} ({self.n_steps} steps{self._share()})"
        )
        return False

    def prices(self, timings: Timings) -> dict[str, Any]:
        """What the decision was weighed on, for the record and ``stats``: the fit at the best
        width, a compile, and the seconds a start cost at the bound."""
        _, start_s = _bound_of(timings)
        fit_s = self.fit_s(timings, timings.best())
        prices = dict(n_steps=self.n_steps, fit_s=fit_s, compile_s=self.compile_s, start_s=start_s)
        return prices if self.run_share == 1.0 else {**prices, "run_share": self.run_share}

    def _share(self) -> str:
        return "" if self.run_share == 1.0 else f" at {self.run_share:.0%}: a stack of fits"


def _bound_of(timings: Timings) -> tuple[int, float]:
    """The widest width timed (the memory bound, unless it ran out of memory) and the seconds
    a start cost in one of its chunk calls."""
    bound = max(timings.per_call)
    return bound, statistics.median(timings.per_call[bound]) / bound


def time_tune(timings: Timings, upper: int) -> str:
    """``"tune"``: time 1 and the powers of two up to ``upper``, narrow to wide, stopping once
    two in a row fall well below the best (:data:`TUNE_STOP_RATIO`); time the close ones again.
    Returns the reason for the log."""
    n_rows = timings.backend.rows.size
    ladder = sorted({balanced_width(n_rows, w) for w in candidate_widths(upper)})
    best, n_slow = None, 0
    for i, w in enumerate(ladder):
        if not timings.try_time(w, f"{i + 1}/{len(ladder)}"):
            break
        if best is None or timings.step_s(w) < timings.step_s(best):
            best, n_slow = w, 0
        elif timings.step_s(best) < TUNE_STOP_RATIO * timings.step_s(w):
            n_slow += 1
        else:
            n_slow = 0
        if n_slow >= 2:
            break
    return _finish(timings, f"the fastest of {len(timings.per_call)} widths timed")


def time_auto(timings: Timings, upper: int, gate: Gate | None) -> str:
    """``"auto"`` on a CPU: time a sparse ladder of widths up to ``upper`` (compiled for the
    memory bound) while ``gate`` allows; without a gate, all of it. Returns the reason.

    With a gate, ``upper`` is first timed on one call after a warm-up: the fit's price. The
    ladder: :func:`multistart.width.auto_candidates` until one is slower than the last
    (:func:`_descend`), then the width halfway between the best and its faster neighbour
    (:func:`_between`). Widths are balanced over the rows (same chunk count, least padding).
    """
    n_rows = timings.backend.rows.size
    ladder = list(dict.fromkeys(balanced_width(n_rows, w) for w in auto_candidates(upper)))
    if gate is None:
        timings.try_time(upper, f"1/{len(ladder)}")
    else:
        timings.try_time(upper, "the fit's price", min_reps=1, target_s=0.0)
        gate.compile_s = max(gate.compile_s, timings.backend.compile_seconds(upper))
    unbatched_wins, gated = _descend(timings, ladder, upper, gate)
    if unbatched_wins is not None:
        return unbatched_wins
    if not gated and timings.per_call:
        between = _between(timings, n_rows)
        if between is not None and (gate is None or gate.allows(timings, between)):
            timings.try_time(between, "between the best two")
    refused = None if gate is None else gate.refused
    if len(timings.per_call) == 1:
        why = refused or "no narrower width could step faster: its chunk calls alone would not"
        return f"the memory bound, untimed: {why}"
    why = f"the fastest of {len(timings.per_call)} widths timed"
    return _finish(timings, why if refused is None else f"{why}; {refused}")


def _descend(
    timings: Timings, ladder: list[int], upper: int, gate: Gate | None
) -> tuple[str | None, bool]:
    """Time the ladder below ``upper``, wide to narrow after width 1, until a width is slower
    than the last or the gate refuses. Returns ``(reason, gated)``: a reason when width 1 won
    outright (the choice is made), and whether the gate stopped the walk."""
    previous = None
    for i, w in enumerate(ladder[1:], start=1):
        if _cannot_win(timings, w):  # its calls' dispatch alone: no compile spent on it
            continue
        if gate is not None and not gate.allows(timings, w):
            return None, True
        if not timings.try_time(w, f"{i + 1}/{len(ladder)}"):
            continue
        if w == 1:
            if upper in timings.per_call:
                ratio = timings.step_s(upper) / timings.step_s(w)
                if ratio >= AUTO_WIDTH_ONE_FASTER:
                    why = f"width 1 steps {ratio:.3g}x as fast as width {upper}"
                    return _finish(timings, why), False
            continue
        if previous is not None and timings.step_s(w) > timings.step_s(previous):
            break
        previous = w
    return None, False


def _cannot_win(timings: Timings, width: int) -> bool:
    """Would ``width``'s chunk calls alone, at :data:`CALL_FLOOR_S` each, outlast the best step?"""
    if not timings.per_call:
        return False
    floor = timings.backend.calls_per_step(width) * CALL_FLOOR_S
    return floor >= timings.step_s(timings.best())


def _finish(timings: Timings, reason: str) -> str:
    timings.top_up()
    timings.again()
    _log_table(timings, timings.best())
    return reason


def _between(timings: Timings, n_rows: int) -> int | None:
    """The untimed width halfway (geometric mean) between the best and its faster neighbour."""
    best = timings.best()
    timed = sorted(timings.per_call)
    i = timed.index(best)
    near = timed[max(0, i - 1) : i] + timed[i + 1 : i + 2]
    if not near:
        return None
    other = min(near, key=timings.step_s)
    w = balanced_width(n_rows, max(1, round(math.sqrt(best * other))))
    return None if w in timings.per_call else w


def _log_table(timings: Timings, best: int) -> None:
    spec = timings.spec
    lines = [f"batch_size {spec}: width  calls  steps/s  starts*steps/s  compile s"]
    for row in timings.table():
        if "error" in row:
            lines.append(f"  {row['width']:>5}  {row['error']}")
            continue
        mark = "  <- chosen" if row["width"] == best else ""
        lines.append(
            f"  {row['width']:>5}  {row['calls']:>5}  {row['steps_per_s']:>7.3g}"
            f"  {row['starts_steps_per_s']:>14.4g}"
            f"  {row['compile_s']:>9.2f}{mark}"
        )
    say(spec, "\n".join(lines))
