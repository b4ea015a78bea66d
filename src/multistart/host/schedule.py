"""Which local searches run to their end: every one, or successive halving of them.

The answer of a multi-start fit is the best of its starts, and most starts' runs do not need to
finish for it: a start that is far behind after a few dozen evaluations rarely ends best.
``schedule="halving"`` is asynchronous successive halving (ASHA: Li et al., *A System for
Massively Parallel Hyperparameter Tuning*, MLSys 2020; successive halving: Jamieson &
Talwalkar, AISTATS 2016) applied to local searches:

- **Rungs** are numbers of evaluations of a start: ``r0``, ``r0 * eta``, ``r0 * eta**2``, ...
- When a running start has made at least a rung's evaluations, it **reaches** that rung with
  its best figure of merit so far, compared with every start that reached the rung before or
  at the same sync, and every start that ended before reaching it (at its final best). Of
  those ``n``, the best ``ceil(n / eta)`` continue (never fewer than ``keep``).
- A start outside that cut still **continues if it is improving fast enough** to overtake the
  cut by the next rung: its best, minus ``grace * eta`` times its **decrease** over the
  interval just run, is below the worst figure of merit that continues (``grace=1``: a straight
  line to the next rung, which is ``eta`` times as far away). The interval before rung ``k``
  runs from rung ``k - 1``; before rung 0, from ``ceil(r0 / eta)`` evaluations (the rungs
  extended one step down), not from the start, whose first steps fall steeply in every start.
  Rank alone at an early rung can drop the start that ends best, which often begins far
  behind and improves fastest.
- Otherwise it **ends as pruned** (:attr:`multistart.Status.PRUNED`); its record is kept. A
  start that continues keeps its whole state (an L-BFGS memory and line search included):
  continuing is not restarting.

Decisions are made at host syncs on the ``sync_every`` schedule from the statuses, bests and
evaluation counts the host reads there, so a search is deterministic for a seed and
independent of ``batch_size`` and of the devices. Everything here is NumPy on host values (no
JAX import); :func:`prune` is a pure function of a :class:`Rungs` state, tested as a table.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..common.status import Status

__all__ = ["Schedule", "Halving", "Rungs", "check_schedule", "prune", "SCHEDULES"]

SCHEDULES = ("all", "halving")
_RUNNING = Status.RUNNING.code
_PRUNED = Status.PRUNED.code
_UNSTARTED = Status.UNSTARTED.code  # a slot with no start: no competitor at any rung


@dataclass(frozen=True)
class Schedule:
    """Base of the schedules that end running starts early (``"all"`` is no schedule)."""

    name = "schedule"

    def record(self) -> dict[str, Any]:
        return {"name": self.name}


@dataclass(frozen=True)
class Halving(Schedule):
    """Asynchronous successive halving of the running local searches (see the module doc).

    Args:
      r0: evaluations of a start at the first rung.
      eta: the rungs grow by this factor, and the best ``1 / eta`` of a rung continue.
      grace: how far a start's recent decrease is extrapolated when it is outside the cut
        (in units of the next rung's distance); ``0`` prunes by rank alone.
      keep: at least this many starts continue from every rung.

    The defaults are measured on recorded runs (``docs/schedule.md``; the figures:
    ``profiling/README.md``, "Racing the starts").
    """

    r0: int = 10
    eta: int = 3
    grace: float = 0.1
    keep: int = 2

    name = "halving"

    def __post_init__(self):
        for key, minimum in (("r0", 1), ("eta", 2), ("keep", 1)):
            value = getattr(self, key)
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Integral)
                or value < minimum
            ):
                raise ValueError(f"Halving.{key} must be an int >= {minimum}; got {value!r}")
        g = self.grace
        if isinstance(g, bool) or not isinstance(g, numbers.Real) or not (0 <= g < math.inf):
            raise ValueError(f"Halving.grace must be a finite number >= 0; got {g!r}")

    def rung(self, k: int) -> int:
        """Evaluations at rung ``k`` (from 0)."""
        return self.r0 * self.eta**k

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "r0": self.r0,
            "eta": self.eta,
            "grace": self.grace,
            "keep": self.keep,
        }


def check_schedule(schedule) -> str | Schedule:
    """``"all"``, ``"halving"`` (the default :class:`Halving`) or a :class:`Schedule`."""
    if schedule == "halving":
        return Halving()
    if isinstance(schedule, Schedule) or schedule == "all":
        return schedule
    raise ValueError(
        f"schedule must be 'all', 'halving' or a multistart.Halving(...); got {schedule!r}"
    )


@dataclass(frozen=True)
class Rungs:
    """The host's record of the rungs (JSON-able through :meth:`to_json`).

    Attributes:
      next_rung: ``(n,)`` per slot, the rung its current start reaches next.
      last_f: ``(n,)`` per slot, its current start's best at the last rung it passed (before
        rung 0: at its first sync with ``ceil(r0 / eta)`` evaluations; ``nan`` before that).
      counted: ``(n,)`` per slot, its current start ended and is counted in ``ended``.
      reached: per rung, the bests of the starts that reached it while running.
      ended: ``(best, next_rung)`` of each start that ended unpruned: it counts at every rung
        from ``next_rung`` on with its final best.
      pruned: per rung, how many starts it pruned.
    """

    next_rung: np.ndarray
    last_f: np.ndarray
    counted: np.ndarray
    reached: tuple[tuple[float, ...], ...] = ()
    ended: tuple[tuple[float, int], ...] = ()
    pruned: tuple[int, ...] = ()

    @classmethod
    def start(cls, n: int) -> Rungs:
        return cls(np.zeros(n, np.int64), np.full(n, np.nan), np.zeros(n, bool))

    def reset(self, slots: np.ndarray) -> Rungs:
        """Slots given new starts: each begins again before rung 0."""
        next_rung, last_f, counted = self.next_rung.copy(), self.last_f.copy(), self.counted.copy()
        next_rung[slots], last_f[slots], counted[slots] = 0, np.nan, False
        return replace(self, next_rung=next_rung, last_f=last_f, counted=counted)

    def occupancy(self, status: np.ndarray) -> str:
        """The running starts by the rung they head for, and the starts pruned, in words:
        ``"rungs 0:12 1:4 2:1, pruned 20"``."""
        heading = self.next_rung[status == _RUNNING]
        counts = np.bincount(heading, minlength=0) if heading.size else np.zeros(0, np.int64)
        parts = " ".join(f"{k}:{c}" for k, c in enumerate(counts) if c)
        return f"rungs {parts or '-'}, pruned {sum(self.pruned)}"

    def rung_of(self, slots=None) -> np.ndarray:
        """The rungs each slot's current start passed (``next_rung``)."""
        return self.next_rung.copy() if slots is None else self.next_rung[slots]

    def to_json(self) -> dict[str, Any]:
        return {
            "next_rung": self.next_rung.tolist(),
            "last_f": [_json_float(v) for v in self.last_f],
            "counted": self.counted.tolist(),
            "reached": [[_json_float(v) for v in r] for r in self.reached],
            "ended": [[_json_float(f), int(k)] for f, k in self.ended],
            "pruned": list(self.pruned),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Rungs:
        return cls(
            next_rung=np.asarray(d["next_rung"], np.int64),
            last_f=np.asarray([float(v) for v in d["last_f"]], np.float64),
            counted=np.asarray(d["counted"], bool),
            reached=tuple(tuple(float(v) for v in r) for r in d["reached"]),
            ended=tuple((float(f), int(k)) for f, k in d["ended"]),
            pruned=tuple(int(c) for c in d["pruned"]),
        )


def _json_float(v) -> float | str:
    v = float(v)
    return v if math.isfinite(v) else repr(v)  # 'inf', 'nan': JSON has no such numbers


@dataclass
class _Working:
    """Mutable copies of a :class:`Rungs` while :func:`prune` works (never escapes it)."""

    next_rung: np.ndarray
    last_f: np.ndarray
    counted: np.ndarray
    reached: list[list[float]]
    ended: list[tuple[float, int]]
    pruned: list[int] = field(default_factory=list)

    def grow(self, k: int) -> None:
        while len(self.reached) <= k:
            self.reached.append([])
            self.pruned.append(0)

    def competitors(self, k: int) -> list[float]:
        """Bests at rung ``k`` so far: starts that reached it, and those that ended before."""
        return self.reached[k] + [f for f, first in self.ended if first <= k]

    @classmethod
    def of(cls, rungs: Rungs) -> _Working:
        return cls(
            rungs.next_rung.copy(),
            rungs.last_f.copy(),
            rungs.counted.copy(),
            [list(r) for r in rungs.reached],
            list(rungs.ended),
            list(rungs.pruned),
        )

    def frozen(self) -> Rungs:
        reached = tuple(tuple(r) for r in self.reached)
        return Rungs(
            self.next_rung,
            self.last_f,
            self.counted,
            reached,
            tuple(self.ended),
            tuple(self.pruned),
        )

    def judge(self, k: int, arriving: np.ndarray, f: np.ndarray, halving: Halving) -> list[int]:
        """The starts ``arriving`` at rung ``k`` with bests ``f[arriving]``: those that fall
        outside its cut and are not improving fast enough to catch up (pruned; returned), the
        rest go on to rung ``k + 1``."""
        self.grow(k)
        self.reached[k].extend(float(f[i]) for i in arriving)
        values = np.sort(np.asarray(self.competitors(k)))
        m = max(halving.keep, math.ceil(values.size / halving.eta))
        cut = values[min(m, values.size) - 1]
        pruned = []
        for i in arriving:
            projected = f[i] - halving.grace * halving.eta * _decrease(self.last_f[i], f[i])
            if f[i] <= cut or projected < cut:
                self.next_rung[i] = k + 1
                self.last_f[i] = f[i]
            else:
                pruned.append(int(i))
                self.pruned[k] += 1
        return pruned


def prune(
    rungs: Rungs,
    halving: Halving,
    status: np.ndarray,
    best_fom: np.ndarray,
    n_evals: np.ndarray,
) -> tuple[np.ndarray, Rungs]:
    """``(slots to prune, rungs)`` at a sync: the running starts that reached a rung and fell
    outside its cut without improving fast enough (see the module doc). Pure.

    Args:
      rungs: the state after the last sync.
      halving: the schedule's settings.
      status, best_fom, n_evals: ``(n,)`` each slot's status code, best and evaluations now.
    """
    w = _Working.of(rungs)
    f = np.where(np.isnan(best_fom), np.inf, best_fom).astype(np.float64)
    running = status == _RUNNING
    # Starts that ended since the last sync count, at their final best, from their next rung.
    for i in np.flatnonzero(~running & ~w.counted & (status != _PRUNED) & (status != _UNSTARTED)):
        w.ended.append((float(f[i]), int(w.next_rung[i])))
        w.counted[i] = True
    # Rung 0's decrease is measured from rung "-1" (ceil(r0 / eta) evaluations), as every
    # later one is from the rung before, not from the steep first steps.
    first = running & np.isnan(w.last_f) & (n_evals >= -(-halving.r0 // halving.eta))
    w.last_f[first] = f[first]
    pruned: list[int] = []
    # Rung by rung, every start that reaches a rung at this sync is judged with the others.
    while True:
        due = running & (n_evals >= halving.r0 * halving.eta**w.next_rung)
        due[pruned] = False
        if not due.any():
            break
        k = int(w.next_rung[due].min())
        pruned += w.judge(k, np.flatnonzero(due & (w.next_rung == k)), f, halving)
    return np.asarray(sorted(pruned), np.int64), w.frozen()


def _decrease(before: float, now: float) -> float:
    """``before - now``, or ``0`` unless both are finite (a start that was never finite before
    has no rate to extrapolate)."""
    return before - now if math.isfinite(before) and math.isfinite(now) else 0.0
