"""What the host does at a sync, decided by one pure function over NumPy values.

At a sync the host loop (:func:`multistart.host.iterate.iterate`) reads a :class:`Reading`, calls
:func:`decide` and applies the :class:`Decision` it returns (:func:`multistart.host.iterate.apply`);
a resumed search starts with :func:`resumed`'s. Nothing here touches a device or a clock (NumPy
only), so every rule of the host loop is tested as a table (``tests/test_decide.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..common.status import Status
from ..common.tolerance import same_minimum
from .schedule import Halving, Rungs, prune

# The tail of a search (issue 38): at the steps that are multiples of TAIL_EVERY, when the
# running rows fit a width (a power of two, at least TAIL_MIN_WIDTH) at most 1/TAIL_RATIO of the
# one swept, as they did at the decision before, they are swept at that width from then on:
# its own program, compiled once, so a few long starts do not keep a wide chunk stepping. On
# one device; a decision by the step count alone, so results are deterministic for a seed.
TAIL_EVERY = 32
TAIL_RATIO = 8
TAIL_MIN_WIDTH = 16

__all__ = [
    "StopReason",
    "Due",
    "Reading",
    "Rules",
    "TailPrice",
    "Decision",
    "decide",
    "resumed",
    "settle",
    "refill_slots",
    "tail_width",
    "refound",
    "STILL_RUNNING",
]

_RUNNING = Status.RUNNING.code
_PRUNED = Status.PRUNED.code  # a slot the host ended (halving, or rediscoveries: Status.REFOUND)
_SETTLED = [s.code for s in Status if s.settled]
_NONE = np.zeros(0, np.int64)


class StopReason(str, enum.Enum):
    """Why a search stopped (``result.stats["stop_reason"]``); a ``str`` equal to its value."""

    ALL_ENDED = "all ended"  # every start converged, died or reached its own cap
    N_STEPS = "n_steps"
    TARGET_FOM = "target_fom"
    MAX_EVALS = "max_evals"
    MAX_TIME_S = "max_time_s"
    MAX_DISCOVERIES = "max_discoveries"  # TikTak re-found its best that often
    SIGINT = "SIGINT"
    SIGTERM = "SIGTERM"
    CHECKPOINT_FAILED = "a failed checkpoint"

    def __str__(self) -> str:
        return self.value

    @property
    def interrupted(self) -> bool:
        """Did something other than the search's own rules stop it (a signal, a failure)?"""
        return self in (StopReason.SIGINT, StopReason.SIGTERM, StopReason.CHECKPOINT_FAILED)


#: What a start still running when the search stopped is marked, by the reason it stopped.
STILL_RUNNING = {
    StopReason.ALL_ENDED: Status.MAX_STEPS,
    StopReason.N_STEPS: Status.MAX_STEPS,
    StopReason.TARGET_FOM: Status.STOPPED,
    StopReason.MAX_EVALS: Status.STOPPED,
    StopReason.MAX_TIME_S: Status.STOPPED,
    StopReason.MAX_DISCOVERIES: Status.STOPPED,
}


@dataclass(frozen=True)
class Due:
    """What the end of a step asks of the host; any of it means a sync (a status read)."""

    first: bool = False  # the first step of this run (its time is reported)
    last: bool = False  # n_steps reached
    logging: bool = False  # a progress line is due
    drawing: bool = False  # the progress bar is due
    checkpoint: bool = False  # a checkpoint is due by the step count
    signalled: bool = False  # SIGINT/SIGTERM arrived (in this process)
    on_schedule: bool = False  # the sync_every schedule: the only syncs that end or refill starts
    tail: bool = False  # a step where the sweep may narrow to its running rows (tail_width)
    refound: bool = False  # a step where the rediscovery rule ends starts (refound)

    @property
    def sync(self) -> bool:
        return any(vars(self).values())


@dataclass(frozen=True)
class Reading:
    """What the host knows at a sync.

    Attributes:
      step: steps run so far (the loop's count; history row ``step - 1`` was written last).
      status: ``(n,)`` each slot's status code, starts the host ended included.
      best_fom: ``(n,)`` each slot's best figure of merit so far.
      n_evals: ``(n,)`` evaluations each slot's current start made.
      evals_replaced: evaluations of the starts that were replaced in their slots.
      n_swept: rows the sweep steps now.
      due: what made this a sync.
      signal: ``"SIGINT"`` or ``"SIGTERM"`` once one arrived (in any process), else ``None``.
      out_of_time: ``max_time_s`` has passed (in any process).
      available: new starts the queue can still hand out (``None``: no end; 0 without one).
      refill_pruned: slots the halving schedule pruned may take new starts now (the queue's
        :attr:`~multistart.starts.queues.StartQueue.refills_pruned`); otherwise they stay
        pruned, and only slots whose start ended on its own are refilled.
      rungs: the halving schedule's record so far (``None`` without the schedule).
      width: the width the sweep steps at now.
      tail_since: the step of the tail decision at which the running rows first fitted a
        narrower width, -1 when they did not at the last one (:func:`tail_width`).
      best_u: ``(n, p)`` each slot's flat unconstrained point at its best, read where the
        rediscovery rule is due (``due.refound``), else ``None``.
    """

    step: int
    status: np.ndarray
    best_fom: np.ndarray
    n_evals: np.ndarray
    due: Due
    evals_replaced: int = 0
    n_swept: int = 0
    signal: str | None = None
    out_of_time: bool = False
    available: int | None = 0
    refill_pruned: bool = True
    rungs: Rungs | None = None
    width: int = 0
    tail_since: int = -1
    best_u: np.ndarray | None = None


@dataclass(frozen=True)
class TailPrice:
    """What narrowing a search's tail is weighed on: the width choice's measured prices
    (``stats["tuning"]["prices"]``), fixed for the search, so the decision stays a function of
    the step count, the running rows and these values (a record reused gives the same).

    Attributes:
      start_s: the seconds a start cost in a chunk call when the width was chosen.
      compile_s: the seconds a chunk step's compile was priced at.
      n_steps: the steps the search takes at most.
    """

    start_s: float
    compile_s: float
    n_steps: int

    @classmethod
    def of(cls, tuning, n_steps: int) -> TailPrice | None:
        """The price in a width choice's ``tuning`` record for a search of ``n_steps`` (a
        record may come from a fit of other length), or ``None`` where it holds none (an
        explicit width, ``"tune"``, an accelerator's memory bound)."""
        prices = (tuning or {}).get("prices") or {}
        if not {"start_s", "compile_s"} <= prices.keys():
            return None
        return cls(float(prices["start_s"]), float(prices["compile_s"]), int(n_steps))

    def pays(self, step: int, width: int, narrow: int, since: int) -> bool:
        """Narrow now? Each step at ``narrow`` instead of ``width`` saves ``width - narrow``
        starts' seconds. The sweep narrows once the steps of the tail so far (since step
        ``since``) have cost what the narrower program's compile does, and the steps left (at
        most ``n_steps - step``) could still repay it: the rule of renting skis until the rent
        paid would have bought them, never more than twice the best choice made knowing when
        the stragglers end. Most end soon after the tail is seen (the spectra's slowest of 500
        one-start fits at step 131, the tail first seen at 32); one that runs on is narrowed a
        compile's worth of steps late.

        >>> price = TailPrice(start_s=2e-6, compile_s=1.4, n_steps=400)
        >>> price.pays(64, 250, 16, 32)  # a cheap model: 336 x 234 x 2 us = 0.16 s < 1.4 s
        False
        >>> dear = TailPrice(start_s=2e-4, compile_s=2.0, n_steps=800)
        >>> dear.pays(224, 2000, 128, 192), dear.pays(224, 2000, 128, 223)  # 32 steps, 1 step
        (True, False)
        """
        saving = self.start_s * (width - narrow)  # seconds a step at the narrower width saves
        paid, left = (step - since) * saving, (self.n_steps - step) * saving
        return paid >= self.compile_s and left > self.compile_s


@dataclass(frozen=True)
class Rules:
    """The search's rules for its syncs (from its options).

    Attributes:
      target_fom, max_evals: the budgets checked at every sync (``max_time_s`` is read as
        :attr:`Reading.out_of_time`).
      refills: status codes whose slots a queue gives new starts (none without a queue).
      checkpoints: does the search write checkpoints?
      halving: the halving schedule, or ``None`` (every start runs to its own end).
      rediscoveries: end the running starts of a group whose best minimum this many settled
        starts found (:func:`refound`), or ``None``.
      group: slots ``i * group`` to ``(i + 1) * group - 1`` are one fit's (a stack of fits),
        or all of them (0).
      xtol, ftol: the tolerances within which a settled start found the best minimum
        (:func:`multistart.result.minima.default_tolerances`).
      tail: what narrowing the tail is weighed on (:func:`tail_width`), or ``None``: the
        tail narrows by the step count and the running rows alone.
    """

    target_fom: float | None = None
    max_evals: int | None = None
    refills: frozenset[int] = frozenset()
    checkpoints: bool = False
    halving: Halving | None = None
    rediscoveries: int | None = None
    group: int = 0
    xtol: float = 0.0
    ftol: float = 0.0
    tail: TailPrice | None = None

    @property
    def settles(self) -> bool:
        """Does a sync on the ``sync_every`` schedule end or refill starts?"""
        return self.halving is not None or bool(self.refills)


@dataclass(frozen=True)
class Decision:
    """What the loop does after a sync.

    Attributes:
      stop: why the search stops here, or ``None`` to go on.
      prune: running slots the halving schedule ends here.
      refill: slots to give new starts from the queue, in this order.
      short: ended slots the queue could not refill (it ran out at this sync).
      ended: the status each slot of ``refill`` ended with.
      pending: pruning or refills were due but the search stops here (a resumed run makes
        them first).
      rungs: the halving schedule's record after this sync (``None`` without it).
      status: every slot's status after this decision.
      checkpoint: write a checkpoint.
      rows: the rows to sweep from now on, or ``None`` when they stay as they are.
      report: draw the progress bar and log a progress line if due.
      width: the narrower width to sweep at from now on, or ``None`` (:func:`tail_width`).
      tail_since: the reading's next :attr:`Reading.tail_since`.
    """

    stop: StopReason | None = None
    prune: np.ndarray = field(default_factory=lambda: _NONE)
    refill: np.ndarray = field(default_factory=lambda: _NONE)
    short: int = 0
    ended: np.ndarray = field(default_factory=lambda: _NONE)
    pending: bool = False
    rungs: Rungs | None = None
    status: np.ndarray = field(default_factory=lambda: _NONE)
    checkpoint: bool = False
    rows: np.ndarray | None = None
    report: bool = False
    width: int | None = None
    tail_since: int = -1

    def stopping(self, reason: StopReason) -> Decision:
        """This decision, stopping for ``reason`` found while it was applied (TikTak's
        rediscovery count is only known once the refilled slots' records are taken). It
        checkpoints as it was to: a search that ended writes its last step once, and a
        resumed one that had ended writes nothing more."""
        return replace(self, stop=reason, rows=None, width=None)


def settle(r: Reading, rules: Rules) -> dict[str, Any]:
    """Prune (the halving schedule) then refill (the queue), from ``r``'s values: a
    :class:`Decision`'s ``prune``, ``refill``, ``short``, ``ended``, ``status`` and ``rungs``
    (refilled slots start again before rung 0). Pure.

    A slot pruned here may be refilled at once (a queue refills ``pruned`` slots), when the
    queue takes pruned slots now (``r.refill_pruned``); one it does not take stays pruned, and
    a later sync refills it once the queue does.
    """
    status, rungs, pruned = r.status, r.rungs, _NONE
    if rules.halving is not None and rungs is not None:
        pruned, rungs = prune(rungs, rules.halving, status, r.best_fom, r.n_evals)
        if pruned.size:
            status = status.copy()
            status[pruned] = _PRUNED
    refill, short, ended = _NONE, 0, _NONE
    if rules.refills:
        codes = rules.refills if r.refill_pruned else rules.refills - {_PRUNED}
        refill, short = refill_slots(status, codes, r.available)
        if refill.size:
            ended = status[refill]
            status = status.copy()
            status[refill] = _RUNNING
            if rungs is not None:
                rungs = rungs.reset(refill)
    return dict(prune=pruned, refill=refill, short=short, ended=ended, status=status, rungs=rungs)


def refill_slots(
    status: np.ndarray, refills: Sequence[int] | frozenset[int], available: int | None
) -> tuple[np.ndarray, int]:
    """``(slots, short)``: the ended slots (of status codes ``refills``) a queue refills, in
    slot order, as far as ``available`` goes; ``short`` counts those it cannot.

    >>> refill_slots(np.array([0, 1, 3, 1, 1]), {1, 3}, 2)
    (array([1, 2]), 2)
    >>> refill_slots(np.array([0, 1]), {1}, None)
    (array([1]), 0)
    """
    ended = np.flatnonzero(np.isin(status, list(refills)))
    k = ended.size if available is None else min(ended.size, available)
    return ended[:k], int(ended.size - k)


def _budget(r: Reading, rules: Rules) -> StopReason | None:
    """The first budget or target that is met, or ``None``."""
    if r.out_of_time:
        return StopReason.MAX_TIME_S
    if rules.target_fom is not None and r.best_fom.min(initial=np.inf) <= rules.target_fom:
        return StopReason.TARGET_FOM
    if rules.max_evals is not None and int(r.n_evals.sum()) + r.evals_replaced >= rules.max_evals:
        return StopReason.MAX_EVALS
    return None


def tail_width(
    r: Reading, n_running: int, price: TailPrice | None = None
) -> tuple[int | None, int]:
    """``(width, tail_since)``: the narrower width the sweep takes at a tail decision
    (``r.due.tail``), or ``None``, and the next :attr:`Reading.tail_since`.

    The running rows fit ``w``, the least power of two at least ``n_running`` and
    ``TAIL_MIN_WIDTH``; when ``w`` is at most ``1 / TAIL_RATIO`` of the width swept (of the
    power of two at least it: a width balanced over the rows, 254 for 256, counts as 256), and
    was at the decision before (a tail that lasted, worth a program of its own), the sweep
    narrows to ``w``, unless ``price`` says not yet (:meth:`TailPrice.pays`: the tail so far
    has not cost ``w``'s compile, or the steps left could not repay it; a cheap model's few
    stragglers step on at the width swept). By the step count, the running rows and the price
    alone: deterministic.

    >>> due = Due(tail=True)
    >>> r = Reading(64, np.zeros(0), np.zeros(0), np.zeros(0), due, width=2000)
    >>> tail_width(r, 16), tail_width(replace(r, tail_since=32), 16)
    ((None, 64), (16, -1))
    >>> tail_width(replace(r, tail_since=32), 300)  # 512 x 8 > 2048: no tail
    (None, -1)
    >>> tail_width(replace(r, tail_since=32, width=254), 20)  # 32 x 8 <= 256
    (32, -1)
    >>> cheap = TailPrice(start_s=2e-6, compile_s=1.4, n_steps=400)
    >>> tail_width(replace(r, tail_since=32, width=250), 1, cheap)  # not repaid: it lasts on
    (None, 32)
    """
    if not r.due.tail:
        return None, r.tail_since
    width = max(TAIL_MIN_WIDTH, 1 << max(0, n_running - 1).bit_length())
    if width * TAIL_RATIO > 1 << max(0, r.width - 1).bit_length():
        return None, -1
    if r.tail_since < 0:
        return None, r.step
    if price is not None and not price.pays(r.step, r.width, width, r.tail_since):
        return None, r.tail_since
    return width, -1


def refound(r: Reading, rules: Rules) -> np.ndarray:
    """The running slots the rediscovery rule ends at ``r`` (``r.due.refound``), in order.

    In each group (a fit's slots, :attr:`Rules.group`) the best minimum is its settled starts'
    lowest figure of merit; a settled start found it when its figure of merit is within
    ``ftol`` of it and its point within ``xtol`` in every coordinate (both relative above
    magnitude 1, as :class:`multistart.starts.tiktak.Discoveries`). Once ``rediscoveries``
    settled starts found it (itself included), the group's running starts end, but for
    those already below it (at any scale of the figure of merit: the tolerance, absolute
    below magnitude 1, would otherwise end a better start of a small figure of merit). Pure,
    by the reading alone.

    >>> due = Due(refound=True)
    >>> status = np.array([1, 1, 0, 0, 1, 0], np.int8)  # converged x3, running x3
    >>> fom = np.array([1.0, 1.0 + 1e-9, 3.0, 0.5, 2.0, 2.5])
    >>> u = np.zeros((6, 1))
    >>> r = Reading(16, status, fom, np.zeros(6), due, best_u=u)
    >>> refound(r, Rules(rediscoveries=2, group=3, xtol=1e-3, ftol=1e-3))
    array([2])
    >>> refound(r, Rules(rediscoveries=2, xtol=1e-3, ftol=1e-3))  # one group: 0.5 runs on
    array([2, 5])
    """
    if rules.rediscoveries is None or not r.due.refound or r.best_u is None:
        return _NONE
    n = r.status.size
    size = rules.group or n
    groups = -(-n // size)
    pad = groups * size - n
    status = np.pad(r.status, (0, pad), constant_values=_PRUNED).reshape(groups, size)
    fom = np.pad(r.best_fom, (0, pad), constant_values=np.inf).reshape(groups, size)
    u = np.pad(r.best_u.reshape(n, -1), ((0, pad), (0, 0))).reshape(groups, size, -1)
    settled = np.isin(status, _SETTLED) & np.isfinite(fom)
    f_settled = np.where(settled, fom, np.inf)
    at = np.argmin(f_settled, axis=1)
    f_best = np.take_along_axis(f_settled, at[:, None], axis=1)  # (groups, 1)
    u_best = np.take_along_axis(u, at[:, None, None], axis=1)  # (groups, 1, p)
    same = same_minimum(fom, u, f_best, u_best, xtol=rules.xtol, ftol=rules.ftol)
    found = settled & same  # (a group with no settled start is not done, whatever it says)
    done = np.isfinite(f_best[:, 0]) & (found.sum(axis=1) >= rules.rediscoveries)
    ends = done[:, None] & (status == _RUNNING) & ~(fom < f_best)
    return np.flatnonzero(ends.reshape(-1)[:n])


def decide(r: Reading, rules: Rules) -> Decision:
    """The host's decision at a sync.

    - **Stop** on a signal (first), then on a budget (``max_time_s``, ``target_fom``,
      ``max_evals``); otherwise when no start is running (``"all ended"``) or at ``n_steps``.
    - **Settle** the slots (:func:`settle`: the halving schedule prunes, the queue refills
      ended slots in slot order as far as it goes) only on the ``sync_every`` schedule and
      never at a sync where the search stops: that is left pending for a resumed run.
    - **Checkpoint** when due by the step count, and whenever the search stops.
    - **Repack** the sweep when the running rows changed, and **narrow** it to them at a
      tail decision once few are left (:func:`tail_width`).
    - **End** the running starts of a fit whose best minimum was found often enough
      (:func:`refound`: first, at every sync where it is due, as ``prune`` does; never
      together with a refill or the halving schedule).
    """
    ended = refound(r, rules)
    if ended.size:
        status = r.status.copy()
        status[ended] = _PRUNED
        r = replace(r, status=status)
    stop = StopReason(r.signal) if r.signal is not None else _budget(r, rules)
    due = rules.settles and r.due.on_schedule
    settling = due and not (r.due.last or stop is not None)
    s = settle(r, rules) if settling else {"status": r.status, "rungs": r.rungs}
    if ended.size:  # (settle prunes nothing then: rediscoveries excludes halving)
        s["prune"] = ended
    running = np.flatnonzero(s["status"] == _RUNNING)
    if stop is None and running.size == 0:
        stop = StopReason.ALL_ENDED
    elif stop is None and r.due.last:
        stop = StopReason.N_STEPS
    ends_here = stop is not None
    width, tail_since = (
        (None, r.tail_since) if ends_here else tail_width(r, running.size, rules.tail)
    )
    return Decision(
        stop=stop,
        pending=due and not settling,
        checkpoint=rules.checkpoints and (r.due.checkpoint or ends_here),
        rows=None if ends_here or running.size == r.n_swept else running,
        report=r.due.logging or r.due.drawing,
        width=width,
        tail_since=tail_since,
        **s,
    )


def resumed(r: Reading, rules: Rules, pending: bool) -> Decision:
    """The decision a search resumed from a checkpoint starts with: the pruning and refills its
    run left ``pending`` (:func:`settle`, as the uninterrupted run made them at that sync), and
    the running rows to sweep. No budget is judged here (the next sync does); a search whose
    every start had ended stays ended, without a step of nothing."""
    s = settle(r, rules) if pending else {"status": r.status, "rungs": r.rungs}
    rows = np.flatnonzero(s["status"] == _RUNNING)
    stop = None if rows.size else StopReason.ALL_ENDED
    return Decision(rows=rows, stop=stop, tail_since=r.tail_since, **s)
