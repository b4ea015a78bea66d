"""Giving freed slots new starts: the jitted row writer and the replaced starts' records.

When a start ends (it died in a non-finite region, with ``resurrect=k``; or its local search
ended, with TikTak), :func:`multistart.decide.decide` may give its slot a new start from the
search's queue (:class:`multistart.queues.StartQueue`). The :class:`Refiller` takes the new
starts from the queue and writes them into the population: the new start's whole state (point,
optimiser state, best-so-far, counters, convergence window) is reset by one jitted function,
compiled once for ``batch_size`` rows and called per chunk of refilled rows (padded rows write
out of bounds and are dropped), so a refill costs no eager per-row work and no recompile.

Nothing is lost: the host keeps each replaced start's record (an *incarnation*: its best
finite figure of merit and parameters, if any), and :meth:`Refiller.merge` folds them into the
Result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from . import log
from .chunking import pad_rows
from .distributed import to_host
from .fixed_width import lower_and_compile, padded_chunks
from .queues import StartQueue
from .status import Status
from .step import PopState, init_population

__all__ = ["REPLACE_NAME", "make_replace_rows", "Refiller", "Incarnation"]

REPLACE_NAME = "multistart_replace_rows"
# The per-slot entries of a record that merge() copies before folding replaced starts in.
_PER_SLOT = (
    "foms",
    "params",
    "start_params",
    "status",
    "n_steps",
    "n_evals",
    "best_step",
    "history",
)


def make_replace_rows(solver, window: int):
    """Build ``replace_rows(pop, scatter, u_new) -> pop``: fresh starts written into rows.

    ``scatter`` holds ``batch_size`` row indices (padding points one past the end and is
    dropped); ``u_new`` the new starts' unconstrained parameters, one row per index.
    """

    def multistart_replace_rows(pop: PopState, scatter, u_new) -> PopState:
        fresh = init_population(solver, u_new, 1, window).starts
        starts = jax.tree_util.tree_map(
            lambda a, b: a.at[scatter].set(b, mode="drop"), pop.starts, fresh
        )
        return PopState(starts, pop.history)

    return multistart_replace_rows


@dataclass
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


class Refiller:
    """Gives freed slots new starts from ``queue`` and keeps the replaced starts' records.

    Args:
      queue: where the new starts come from.
      solver, window: to build the fresh solver state and convergence window.
      width: rows per compiled call of the row writer (the search's chunk width).
      n_total: population size.
      n_rows: the population's rows when padded past ``n_total`` (a mesh of devices); the
        row writer's out-of-bounds index.
      to_u: physical starts (leading axis) to unconstrained NumPy, in the population's layout.
      u0: the population's initial unconstrained starts (host copy).
      to_x: one start's unconstrained parameters to physical ones (for a queue that
        :attr:`~multistart.queues.StartQueue.needs_best`).
    """

    def __init__(
        self,
        queue: StartQueue,
        *,
        solver,
        window,
        width,
        n_total,
        to_u,
        u0,
        n_rows=None,
        to_x=None,
    ):
        self.queue = queue
        self.to_x = to_x
        self._jit = jax.jit(make_replace_rows(solver, window), donate_argnums=0)
        self.compiled: Any = None
        self.compile_s = 0.0
        self.width = width
        self.n_total = n_total
        self.n_rows = n_total if n_rows is None else n_rows  # padded for a mesh of devices
        self.to_u = to_u
        self.start_u = jax.tree_util.tree_map(lambda a: np.array(a), u0)
        self.started_at = np.zeros(n_total, np.int64)
        self.count = np.zeros(n_total, np.int64)
        self.records: list[Incarnation] = []
        self.said_short = False

    @property
    def evals_replaced(self) -> int:
        """Evaluations made by the starts that were replaced."""
        return sum(r.n_evals for r in self.records)

    def refill(
        self, pop: PopState, rows: np.ndarray, short: int, step: int, status: np.ndarray
    ) -> PopState:
        """Give ``rows`` (ended slots) new starts from the queue; ``short`` more ended slots
        get none (the queue ran out: said once in the log). ``status``: each slot's status
        code as the host sees it (the replaced starts' records keep it)."""
        if short and not self.said_short:
            self.said_short = True
            (log.logger.info if self.queue.routine else log.logger.warning)(
                "%s is exhausted: %d ended start%s stay as they are from step %d",
                self.queue.kind,
                short,
                "" if short == 1 else "s",
                step,
            )
        if rows.size == 0:
            return pop
        best = self._best_x(pop) if self.queue.needs_best else None
        x_new = self.queue.take(rows.size, best)
        self._record(pop, rows, step, status)
        self.queue.observe(self.records[-rows.size :])
        u_new = self.to_u(x_new)
        if self.compiled is None:
            example = jax.tree_util.tree_map(lambda a: pad_rows(a[:1], self.width - 1), u_new)
            self.compiled, self.compile_s = lower_and_compile(
                self._jit, "the resurrection writer", pop, np.zeros(self.width, np.int32), example
            )
        for lo, hi, chunk in padded_chunks(u_new, self.width):
            # the padded rows write out of bounds (dropped)
            scatter = np.full(self.width, self.n_rows, np.int32)
            scatter[: hi - lo] = rows[lo:hi]
            pop = self.compiled(pop, scatter, chunk)
        for leaf, new in zip(
            jax.tree_util.tree_leaves(self.start_u), jax.tree_util.tree_leaves(u_new), strict=True
        ):
            leaf[rows] = new
        self.started_at[rows] = step
        self.count[rows] += 1
        (log.logger.debug if self.queue.routine else log.logger.info)(
            "step %d: %d ended start%s replaced from %s",
            step,
            rows.size,
            "" if rows.size == 1 else "s",
            self.queue.kind,
        )
        return pop

    def _best_x(self, pop: PopState):
        """The physical params of the best point found so far (running starts and records)."""
        f, u = to_host((pop.starts.best_fom, pop.starts.best_u))
        f = np.where(np.isfinite(f), f, np.inf)
        i = int(np.argmin(f))
        best_f, best_u = float(f[i]), _rows(u, i)
        for r in self.records:
            if np.isfinite(r.best_fom) and r.best_fom < best_f:
                best_f, best_u = r.best_fom, r.best_u
        return jax.tree_util.tree_map(np.asarray, jax.device_get(self.to_x(best_u)))

    def _record(self, pop: PopState, rows: np.ndarray, step: int, codes: np.ndarray) -> None:
        # Whole small vectors to the host (one transfer each), indexed in NumPy.
        s = pop.starts
        best_fom, best_step, n_steps, n_evals, best_u = to_host(
            (s.best_fom, s.best_step, s.n_steps, s.n_evals, s.best_u)
        )
        for i in rows:
            self.records.append(
                Incarnation(
                    slot=int(i),
                    number=int(self.count[i]),
                    start_u=_rows(self.start_u, i),
                    best_u=_rows(best_u, i),
                    best_fom=float(best_fom[i]),
                    best_step=int(best_step[i]),
                    n_steps=int(n_steps[i]),
                    n_evals=int(n_evals[i]),
                    status=int(codes[i]),
                    started_at=int(self.started_at[i]),
                    replaced_at=step,
                )
            )

    # -- checkpoints -------------------------------------------------------------------------

    _RECORD_INTS = ("slot", "number", "best_step", "n_steps", "n_evals", "status", "started_at")

    def state(self) -> tuple[dict, dict]:
        """The host state a checkpoint needs: ``(arrays, json)``."""
        recs = self.records
        arrays = {"start_u": self.start_u, "started_at": self.started_at, "count": self.count}
        if recs:  # (orbax refuses zero-size arrays)
            arrays["records_start_u"] = self._stack([r.start_u for r in recs])
            arrays["records_best_u"] = self._stack([r.best_u for r in recs])
        meta = {
            "takes": list(self.queue.takes),
            "exhausted": self.said_short,
            "records": [
                {
                    **{k: getattr(r, k) for k in self._RECORD_INTS},
                    "best_fom": r.best_fom,
                    "replaced_at": r.replaced_at,
                }
                for r in recs
            ],
        }
        return arrays, meta

    @staticmethod
    def _stack(trees: list):
        """Per-record trees (one start's rows each) stacked on a leading axis."""
        return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees)

    def state_like(self, meta: dict) -> dict:
        """Arrays shaped as :meth:`state` wrote them for ``meta`` (a checkpoint's target)."""
        k = len(meta["records"])
        out = {"start_u": self.start_u, "started_at": self.started_at, "count": self.count}
        if k:
            rows = jax.tree_util.tree_map(
                lambda a: np.zeros((k, *a.shape[1:]), a.dtype), self.start_u
            )
            out["records_start_u"] = out["records_best_u"] = rows
        return out

    def restore(self, arrays: dict, meta: dict) -> None:
        """Continue from :meth:`state` (of a search of the same model, configuration, seed)."""
        self.queue.replay(meta["takes"])
        self.said_short = bool(meta["exhausted"])
        self.start_u = jax.tree_util.tree_map(np.array, arrays["start_u"])
        self.started_at = np.array(arrays["started_at"], np.int64)
        self.count = np.array(arrays["count"], np.int64)
        self.records = [
            Incarnation(
                start_u=_rows(arrays["records_start_u"], j),
                best_u=_rows(arrays["records_best_u"], j),
                **{k: int(r[k]) for k in self._RECORD_INTS},
                best_fom=float(r["best_fom"]),
                replaced_at=r["replaced_at"],
            )
            for j, r in enumerate(meta["records"])
        ]
        self.queue.observe(self.records)  # the same records in the same order

    @property
    def n_resurrections(self) -> int:
        return len(self.records)

    def merge(self, rec: dict, to_physical_n) -> tuple[dict, list[dict]]:
        """The per-slot record ``rec`` with the replaced starts folded in, and every start of
        every refilled slot.

        ``rec`` holds the final starts' ``foms``, ``params``, ``start_params``, ``status``,
        ``n_steps``, ``n_evals``, ``best_step`` and ``history`` (it is not changed). In the
        record returned each refilled slot shows its best start (lowest finite figure of
        merit; the latest on ties or when none was finite) and its history is the best over its
        starts so far. The list has one dict per start that ran in a refilled slot, the final
        one included (``replaced_at`` is ``None``). ``to_physical_n`` maps ``n_total``
        unconstrained rows to physical params.
        """
        out = {
            key: jax.tree_util.tree_map(np.array, value) if key in _PER_SLOT else value
            for key, value in rec.items()
        }
        slots = np.flatnonzero(self.count)
        if slots.size == 0:
            return out, []
        final_start = self._physical(to_physical_n, [_rows(self.start_u, int(i)) for i in slots])
        by_slot = self._replaced_by_slot(to_physical_n)
        incarnations: list[dict] = []
        for j, slot in enumerate(slots):
            i = int(slot)
            final = {
                "slot": i,
                "incarnation": int(self.count[i]),
                "fom": float(rec["foms"][i]),
                "params": _rows(rec["params"], i),
                "start_params": _rows(final_start, j),
                "status": rec["status"][i],
                "n_steps": int(rec["n_steps"][i]),
                "n_evals": int(rec["n_evals"][i]),
                "best_step": int(rec["best_step"][i]),
                "started_at": int(self.started_at[i]),
                "replaced_at": None,
            }
            incs = by_slot[i] + [final]
            incarnations.extend(incs)
            self._show(out, i, incs[_best_incarnation([x["fom"] for x in incs])])
        hist = out["history"]
        if hist.size:
            hist[:, slots] = np.fmin.accumulate(hist[:, slots], axis=0)
        return out, incarnations

    def _replaced_by_slot(self, to_physical_n) -> dict[int, list[dict]]:
        """The replaced starts' records as the Result lists them, by slot."""
        old_best = self._physical(to_physical_n, [r.best_u for r in self.records])
        old_start = self._physical(to_physical_n, [r.start_u for r in self.records])
        by_slot: dict[int, list[dict]] = {int(i): [] for i in np.flatnonzero(self.count)}
        for j, r in enumerate(self.records):
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

    def _physical(self, to_physical_n, rows: list):
        """Physical params of unconstrained rows, through the ``n_total``-row compiled map."""
        stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *rows)
        parts = [
            jax.tree_util.tree_map(
                lambda a, k=hi - lo: np.asarray(a)[:k], jax.device_get(to_physical_n(chunk))
            )
            for lo, hi, chunk in padded_chunks(stacked, self.n_total)
        ]
        return jax.tree_util.tree_map(lambda *a: np.concatenate(a), *parts)

    @staticmethod
    def _show(rec: dict, i: int, inc: dict) -> None:
        rec["foms"][i] = inc["fom"]
        rec["status"][i] = inc["status"]
        rec["n_steps"][i] = inc["n_steps"]
        rec["n_evals"][i] = inc["n_evals"]
        rec["best_step"][i] = inc["best_step"]
        for key in ("params", "start_params"):
            for leaf, v in zip(
                jax.tree_util.tree_leaves(rec[key]),
                jax.tree_util.tree_leaves(inc[key]),
                strict=True,
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
