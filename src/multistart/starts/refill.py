"""Giving freed slots new starts, and each slot's lineage.

When a start ends (it died in a non-finite region, with ``resurrect=k``; its local search
ended, with TikTak; or the halving schedule pruned it), :func:`multistart.host.decide.decide` may
give its slot a new start from the search's queue
(:class:`multistart.starts.queues.StartQueue`). The
:class:`Refiller` writes them into the population by the chunk step itself, taking no step
(:meth:`multistart.device.sweeper.Sweeper.write`: the new start's whole state reset, no
program of its own). Each replaced start's
record (an *incarnation*) is kept in the slots' :class:`Lineage`, part of the run state, and
:meth:`Refiller.fold` folds them into the Result.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import jax
import numpy as np

from ..common import log
from ..common.status import Status
from ..common.tolerance import lowest_finite
from ..device.distributed import to_host
from ..device.step import PopState
from .queues import StartQueue

__all__ = ["Refiller", "Incarnation", "Lineage"]

_RECORD_INTS = ("slot", "number", "best_step", "n_steps", "n_evals", "status", "started_at")


@dataclass(frozen=True)
class Incarnation:
    """One start that ran in a slot and was replaced (the host's record of it)."""

    slot: int
    number: int
    start_u: Any
    best_u: Any
    best_fom: float
    best_step: int
    n_steps: int
    n_evals: int
    status: int
    started_at: int
    replaced_at: int | None


def _rows(tree, rows):
    """Rows of every leaf, copied (a view would change when the slot is overwritten)."""
    return jax.tree_util.tree_map(lambda a: np.array(np.asarray(a)[rows]), tree)


def _stack(trees: list):
    """Per-record trees (one start's rows each) stacked on a leading axis."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees)


@dataclass(frozen=True)
class Lineage:
    """Which start each slot runs, and every start its slot ran before (host values).

    Attributes:
      start_u: each slot's current start (unconstrained, the population's layout).
      started_at: ``(n,)`` the step each slot's current start began at.
      count: ``(n,)`` the starts each slot's current one follows.
      records: every replaced start, in the order they were replaced.
      takes: every ``queue.take(m)`` so far: a resumed search replays them.
      exhausted: the queue ran out (said once in the log).
    """

    start_u: Any
    started_at: np.ndarray
    count: np.ndarray
    records: tuple[Incarnation, ...] = ()
    takes: tuple[int, ...] = ()
    exhausted: bool = False

    @classmethod
    def start(cls, u0) -> Lineage:
        n = len(jax.tree_util.tree_leaves(u0)[0])
        starts = jax.tree_util.tree_map(np.array, u0)
        return cls(starts, np.zeros(n, np.int64), np.zeros(n, np.int64))

    @property
    def evals_replaced(self) -> int:
        """Evaluations made by the starts that were replaced."""
        return sum(r.n_evals for r in self.records)

    def to_checkpoint(self) -> tuple[dict, dict]:
        """``(arrays, json)`` for a checkpoint."""
        arrays = {"start_u": self.start_u, "started_at": self.started_at, "count": self.count}
        if self.records:  # (orbax refuses zero-size arrays)
            arrays["records_start_u"] = _stack([r.start_u for r in self.records])
            arrays["records_best_u"] = _stack([r.best_u for r in self.records])
        meta = {
            "takes": list(self.takes),
            "exhausted": self.exhausted,
            "records": [
                {
                    **{k: getattr(r, k) for k in _RECORD_INTS},
                    "best_fom": r.best_fom,
                    "replaced_at": r.replaced_at,
                }
                for r in self.records
            ],
        }
        return arrays, meta

    def checkpoint_like(self, meta: dict) -> dict:
        """Arrays shaped as :meth:`to_checkpoint` wrote them for ``meta`` (a restore target)."""
        out = {"start_u": self.start_u, "started_at": self.started_at, "count": self.count}
        if meta["records"]:
            k = len(meta["records"])
            rows = jax.tree_util.tree_map(
                lambda a: np.zeros((k, *a.shape[1:]), a.dtype), self.start_u
            )
            out["records_start_u"] = out["records_best_u"] = rows
        return out

    @classmethod
    def from_checkpoint(cls, arrays: dict, meta: dict) -> Lineage:
        records = tuple(
            Incarnation(
                start_u=_rows(arrays["records_start_u"], j),
                best_u=_rows(arrays["records_best_u"], j),
                **{k: int(r[k]) for k in _RECORD_INTS},
                best_fom=float(r["best_fom"]),
                replaced_at=r["replaced_at"],
            )
            for j, r in enumerate(meta["records"])
        )
        return cls(
            jax.tree_util.tree_map(np.array, arrays["start_u"]),
            np.array(arrays["started_at"], np.int64),
            np.array(arrays["count"], np.int64),
            records,
            tuple(int(m) for m in meta["takes"]),
            bool(meta["exhausted"]),
        )


class Refiller:
    """Gives freed slots new starts from ``queue``, and folds the replaced ones into the Result.

    Args:
      queue: where the new starts come from.
      refills: the status codes whose slots it gives new starts.
      write: ``write(pop, rows, u_new) -> pop``, the new starts written into their rows
        (:meth:`multistart.device.sweeper.Sweeper.write`: the chunk step, no program of
        its own).
      to_u: physical starts (leading axis) to unconstrained NumPy, in the population's layout.
      to_x: the population's rows (leading axis) to physical params, NumPy (for a queue that
        :attr:`~multistart.starts.queues.StartQueue.needs_best`, and the Result's records):
        :func:`multistart.device.layout.physical_map`, the Result's own map.
    """

    def __init__(
        self,
        queue: StartQueue,
        refills,
        *,
        write: Callable[[PopState, np.ndarray, Any], PopState],
        to_u,
        to_x,
    ):
        self.queue = queue
        self.refills = frozenset(refills)
        self.to_x = to_x
        self.to_u = to_u
        self._write_rows = write
        self._best: tuple[tuple, Any] | None = None  # the last best point and its params

    def refill(
        self, pop: PopState, lineage: Lineage, rows: np.ndarray, short: int, step: int, ended
    ) -> tuple[PopState, Lineage, Callable[[PopState], PopState] | None]:
        """Give ``rows`` (ended slots, whose starts ended with the status codes ``ended``) new
        starts from the queue; ``short`` more ended slots get none (the queue ran out: said
        once in the log). Returns the population and the lineage afterwards, and the write
        that made the population (``write(pop) -> pop``, the same new starts into the same
        rows; ``None`` when nothing was written), for a back-off to replay."""
        if short and not lineage.exhausted:
            lineage = replace(lineage, exhausted=True)
            (log.logger.debug if self.queue.routine else log.logger.warning)(
                "%s is exhausted: %d ended start%s stay as they are from step %d",
                self.queue.kind,
                short,
                "" if short == 1 else "s",
                step,
            )
        if rows.size == 0:
            return pop, lineage, None
        s = pop.starts  # the small vectors and best points, to the host in one transfer
        host = _Host(*to_host((s.best_fom, s.best_step, s.n_steps, s.n_evals, s.best_u)))
        best = self._best_x(host, lineage) if self.queue.needs_best else None
        x_new = self.queue.take(rows.size, best)
        replaced = _replaced(host, lineage, rows, step, ended)
        self.queue.observe(replaced)
        u_new = self.to_u(x_new)
        write = functools.partial(self._write, rows=rows, u_new=u_new)
        pop = write(pop)
        lineage = replace(
            lineage,
            start_u=jax.tree_util.tree_map(
                lambda a, b: _set_rows(a, rows, b), lineage.start_u, u_new
            ),
            started_at=_set_rows(lineage.started_at, rows, step),
            count=_set_rows(lineage.count, rows, lineage.count[rows] + 1),
            records=lineage.records + replaced,
            takes=(*lineage.takes, int(rows.size)),
        )
        (log.logger.debug if self.queue.routine else log.logger.info)(
            "step %d: %d ended start%s replaced from %s",
            step,
            rows.size,
            "" if rows.size == 1 else "s",
            self.queue.kind,
        )
        return pop, lineage, write

    def _write(self, pop: PopState, rows: np.ndarray, u_new) -> PopState:
        """The new starts written into ``rows``."""
        return self._write_rows(pop, rows, u_new)

    def resume(self, lineage: Lineage) -> None:
        """Bring the queue to where it stood when ``lineage`` was checkpointed."""
        self.queue.replay(lineage.takes)
        self.queue.observe(lineage.records)  # the same records in the same order

    def _best_x(self, host: _Host, lineage: Lineage):
        """The physical params of the best point found so far (running starts and records);
        mapped once for each new best point (most refills find the one before)."""
        i = int(lowest_finite(host.best_fom))
        best_f = float(host.best_fom[i]) if np.isfinite(host.best_fom[i]) else np.inf
        best_u = _rows(host.best_u, i)
        for r in lineage.records:
            if np.isfinite(r.best_fom) and r.best_fom < best_f:
                best_f, best_u = r.best_fom, r.best_u
        key = (best_f, *(np.asarray(a).tobytes() for a in jax.tree_util.tree_leaves(best_u)))
        if self._best is not None and self._best[0] == key:
            return self._best[1]
        x = self.to_x(jax.tree_util.tree_map(lambda a: np.asarray(a)[None], best_u))
        x = jax.tree_util.tree_map(lambda a: a[0], x)
        self._best = (key, x)
        return x

    def fold(self, rec: dict, lineage: Lineage) -> tuple[dict, list[dict]]:
        """The per-slot record ``rec`` with the replaced starts folded in, and every start of
        every refilled slot.

        ``rec`` holds the final starts' per-slot records (it is not changed). What comes back
        is what ``Result.incarnations`` and the per-slot arrays of :class:`multistart.Result`
        describe.
        """
        out = copy.deepcopy(rec)  # host arrays: the folded starts are written into a copy
        slots = np.flatnonzero(lineage.count)
        if slots.size == 0:
            return out, []
        final_start = self.to_x(_rows(lineage.start_u, slots))
        by_slot = _replaced_by_slot(lineage, self.to_x)
        incarnations: list[dict] = []
        for j, slot in enumerate(slots):
            i = int(slot)
            final = {
                "slot": i,
                "incarnation": int(lineage.count[i]),
                "fom": float(rec["foms"][i]),
                "params": _rows(rec["params"], i),
                "start_params": _rows(final_start, j),
                "status": Status.from_code(rec["status"][i]),  # (the records hold codes)
                "n_steps": int(rec["n_steps"][i]),
                "n_evals": int(rec["n_evals"][i]),
                "best_step": int(rec["best_step"][i]),
                "started_at": int(lineage.started_at[i]),
                "replaced_at": None,
            }
            incs = by_slot[i] + [final]
            incarnations.extend(incs)
            _show(out, i, incs[_best_incarnation([x["fom"] for x in incs])])
        hist = out["history"]
        if hist.size:
            hist[:, slots] = np.fmin.accumulate(hist[:, slots], axis=0)
        return out, incarnations


def _set_rows(a, rows: np.ndarray, new) -> np.ndarray:
    out = np.array(a)
    out[rows] = new
    return out


class _Host(NamedTuple):
    """What a refill reads of every start on the host (NumPy)."""

    best_fom: np.ndarray
    best_step: np.ndarray
    n_steps: np.ndarray
    n_evals: np.ndarray
    best_u: Any


def _replaced(host: _Host, lineage: Lineage, rows, step: int, ended) -> tuple:
    """The records of the starts in ``rows`` as they are replaced at ``step``."""
    best_fom, best_step, n_steps, n_evals, best_u = host
    return tuple(
        Incarnation(
            slot=int(i),
            number=int(lineage.count[i]),
            start_u=_rows(lineage.start_u, i),
            best_u=_rows(best_u, i),
            best_fom=float(best_fom[i]),
            best_step=int(best_step[i]),
            n_steps=int(n_steps[i]),
            n_evals=int(n_evals[i]),
            status=int(code),
            started_at=int(lineage.started_at[i]),
            replaced_at=step,
        )
        for i, code in zip(rows, ended, strict=True)
    )


def _replaced_by_slot(lineage: Lineage, to_x) -> dict[int, list[dict]]:
    """The replaced starts' records as the Result lists them, by slot."""
    old_best = to_x(_stack([r.best_u for r in lineage.records]))
    old_start = to_x(_stack([r.start_u for r in lineage.records]))
    by_slot: dict[int, list[dict]] = {int(i): [] for i in np.flatnonzero(lineage.count)}
    for j, r in enumerate(lineage.records):
        by_slot[r.slot].append(
            {
                "slot": r.slot,
                "incarnation": r.number,
                "fom": r.best_fom,
                "params": _rows(old_best, j),
                "start_params": _rows(old_start, j),
                "status": Status.from_code(r.status),
                "n_steps": r.n_steps,
                "n_evals": r.n_evals,
                "best_step": r.best_step,
                "started_at": r.started_at,
                "replaced_at": r.replaced_at,
            }
        )
    return by_slot


def _show(rec: dict, i: int, inc: dict) -> None:
    for key in ("foms", "n_steps", "n_evals", "best_step"):
        rec[key][i] = inc["fom" if key == "foms" else key]
    rec["status"][i] = Status(inc["status"]).code
    for key in ("params", "start_params"):
        for leaf, v in zip(
            jax.tree_util.tree_leaves(rec[key]), jax.tree_util.tree_leaves(inc[key]), strict=True
        ):
            leaf[i] = v


def _best_incarnation(foms: list[float]) -> int:
    """Index of the lowest finite figure of merit; the last one on ties or when none is finite.

    >>> _best_incarnation([3.0, 1.0, 1.0]), _best_incarnation([np.inf, np.inf])
    (2, 1)
    >>> _best_incarnation([0.5, np.inf, 2.0])
    0
    """
    f = np.where(np.isfinite(foms), foms, np.inf)
    best = np.min(f)
    return int(np.flatnonzero(f == best)[-1])
