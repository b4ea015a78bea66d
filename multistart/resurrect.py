"""Resurrection: a start that died in a non-finite region is replaced by a fresh one.

With ``resurrect=k`` a start ends as ``nonfinite`` after ``k`` non-finite evaluations without an
improvement (or at once if it never had a finite value). At the next host sync its slot gets a
new start (an *incarnation*) from the reserve: the filter's next-best finite candidates, or
fresh draws of the start strategy when no filter ran. The new incarnation's whole state (point,
optimiser state, best-so-far, counters, convergence window) is reset by one jitted function,
compiled once for ``batch_size`` rows and called per chunk of replaced rows (padded rows write
out of bounds and are dropped), so a replacement costs no eager per-row work and no recompile.

Nothing is lost: the host keeps each replaced incarnation's record (its best finite figure of
merit and parameters, if any), and :meth:`Resurrector.merge` folds them into the Result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from . import log
from .chunking import pad_rows
from .distributed import to_host
from .status import Status
from .step import PopState, init_population
from .sweep import lower_and_compile, padded_chunks

__all__ = ["REPLACE_NAME", "make_replace_rows", "Resurrector", "Discoveries"]

REPLACE_NAME = "multistart_replace_rows"
_NONFINITE, _RUNNING = Status.NONFINITE.code, Status.RUNNING.code


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
class _Incarnation:
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


class Resurrector:
    """Replaces dead starts at host sync points and keeps the replaced ones' records.

    Args:
      reserve: a source with ``take(m)`` returning up to ``m`` physical starts (or ``None``) and
        a ``kind`` for the log.
      solver, window: to build the fresh solver state and convergence window.
      width: rows per compiled replacement call (the search's chunk width).
      n_total: population size.
      n_rows: the population's rows when padded past ``n_total`` (a mesh of devices); the
        replacement writer's out-of-bounds index.
      to_u: physical starts (leading axis) to unconstrained NumPy, in the population's layout.
      u0: the population's initial unconstrained starts (host copy).
    """

    def __init__(
        self,
        reserve,
        *,
        solver,
        window,
        width,
        n_total,
        to_u,
        u0,
        n_rows=None,
        codes=(Status.NONFINITE,),
        to_x=None,
        discoveries: Discoveries | None = None,
    ):
        self.reserve = reserve
        self.codes = np.array([c.code for c in codes])
        self.to_x = to_x
        self.discoveries = discoveries
        self._jit = jax.jit(make_replace_rows(solver, window), donate_argnums=0)
        self.compiled = None
        self.compile_s = 0.0
        self.width = width
        self.n_total = n_total
        self.n_rows = n_total if n_rows is None else n_rows  # padded for a mesh of devices
        self.to_u = to_u
        self.start_u = jax.tree_util.tree_map(lambda a: np.array(a), u0)
        self.started_at = np.zeros(n_total, np.int64)
        self.count = np.zeros(n_total, np.int64)
        self.records: list[_Incarnation] = []
        self.exhausted = False

    @property
    def stop_reason(self) -> str | None:
        """Why the search should stop now (TikTak's rediscovery rule), or ``None``."""
        d = self.discoveries
        return "max_discoveries" if d is not None and d.done else None

    def __call__(self, pop: PopState, status: np.ndarray, step: int):
        """Replace every ended start (of ``codes``) that the reserve can; ``(pop, status)``."""
        dead = np.flatnonzero(np.isin(status, self.codes))
        if dead.size == 0 or self.exhausted:
            return pop, status
        if getattr(self.reserve, "blends", False):
            x_new = self.reserve.take(dead.size, self._best_x(pop))
        else:
            x_new = self.reserve.take(dead.size)
        k = 0 if x_new is None else len(jax.tree_util.tree_leaves(x_new)[0])
        if k < dead.size:
            self.exhausted = True
            (log.logger.info if getattr(self.reserve, "blends", False) else log.logger.warning)(
                "%s is exhausted: %d ended start%s stay as they are from step %d",
                self.reserve.kind,
                dead.size - k,
                "" if dead.size - k == 1 else "s",
                step,
            )
        if k == 0:
            return pop, status
        rows = dead[:k]
        self._record(pop, rows, step)
        if self.discoveries is not None:
            self.discoveries.observe(self.records[-k:])
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
        status = status.copy()
        status[rows] = _RUNNING
        tiktak = getattr(self.reserve, "blends", False)  # routine for TikTak: not news
        (log.logger.debug if tiktak else log.logger.info)(
            "step %d: %d ended start%s replaced from %s",
            step,
            k,
            "" if k == 1 else "s",
            self.reserve.kind,
        )
        return pop, status

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

    def _record(self, pop: PopState, rows: np.ndarray, step: int) -> None:
        # Whole small vectors to the host (one transfer each), indexed in NumPy.
        s = pop.starts
        best_fom, best_step, n_steps, n_evals, codes, best_u = to_host(
            (s.best_fom, s.best_step, s.n_steps, s.n_evals, s.status, s.best_u)
        )
        for i in rows:
            self.records.append(
                _Incarnation(
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
            "takes": list(self.reserve.takes),
            "exhausted": self.exhausted,
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
        from .starts import replay_takes

        replay_takes(self.reserve, meta["takes"])
        self.exhausted = bool(meta["exhausted"])
        self.start_u = jax.tree_util.tree_map(np.array, arrays["start_u"])
        self.started_at = np.array(arrays["started_at"], np.int64)
        self.count = np.array(arrays["count"], np.int64)
        self.records = [
            _Incarnation(
                start_u=_rows(arrays["records_start_u"], j),
                best_u=_rows(arrays["records_best_u"], j),
                **{k: int(r[k]) for k in self._RECORD_INTS},
                best_fom=float(r["best_fom"]),
                replaced_at=r["replaced_at"],
            )
            for j, r in enumerate(meta["records"])
        ]
        if self.discoveries is not None:
            self.discoveries.observe(self.records)  # the same records in the same order

    @property
    def n_resurrections(self) -> int:
        return len(self.records)

    def merge(self, rec: dict, to_physical_n) -> dict:
        """Fold the replaced incarnations into the per-slot record ``rec`` (in place).

        ``rec`` holds the final incarnations' ``foms``, ``params``, ``start_params``,
        ``status``, ``n_steps``, ``best_step`` and ``history``. Each resurrected slot then shows
        its best incarnation (lowest finite figure of merit; the latest on ties or when none was
        finite), its history becomes the best over its incarnations so far, and every
        incarnation of every resurrected slot is listed in ``incarnations``.
        ``to_physical_n`` maps ``n_total`` unconstrained rows to physical params.

        Returns ``{"incarnations": [...], "resurrections": counts, "n_evals_replaced": int}``.
        """
        out = {
            "incarnations": [],
            "resurrections": self.count.copy(),
            "n_evals_replaced": sum(r.n_evals for r in self.records),
        }
        slots = np.flatnonzero(self.count)
        if slots.size == 0:
            return out
        final_start = self._physical(to_physical_n, [_rows(self.start_u, int(i)) for i in slots])
        old_best = self._physical(to_physical_n, [r.best_u for r in self.records])
        old_start = self._physical(to_physical_n, [r.start_u for r in self.records])
        by_slot: dict[int, list[dict]] = {int(i): [] for i in slots}
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
        for j, i in enumerate(slots):
            i = int(i)
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
            out["incarnations"].extend(incs)
            shown = _best_incarnation([x["fom"] for x in incs])
            self._show(rec, i, incs[shown])
        hist = rec["history"]
        if hist.size:
            hist[:, slots] = np.fmin.accumulate(hist[:, slots], axis=0)
        return out

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


class Discoveries:
    """Counts how often ended local searches re-find the best minimum (TikTak's stop rule).

    Records are observed in the order they ended. A converged one better than the best by more
    than ``ftol`` becomes the best (found once); one within ``ftol`` of it in the figure of
    merit and within ``xtol`` in every unconstrained coordinate (both relative above magnitude
    1) counts as a rediscovery. The search stops once the best has been found ``limit`` times.
    The state is a function of the records alone, so a resumed search replays it.
    """

    def __init__(self, limit: int, *, xtol: float, ftol: float):
        self.limit, self.xtol, self.ftol = limit, xtol, ftol
        self.best_f, self.best_u, self.count = np.inf, None, 0

    @property
    def done(self) -> bool:
        return self.count >= self.limit

    def observe(self, records) -> None:
        for r in records:
            if r.status != Status.CONVERGED.code or not np.isfinite(r.best_fom):
                continue
            u = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(r.best_u)])
            tol_f = self.ftol * max(1.0, abs(self.best_f)) if np.isfinite(self.best_f) else 0
            if r.best_fom < self.best_f - tol_f:
                self.best_f, self.best_u, self.count = r.best_fom, u, 1
            elif abs(r.best_fom - self.best_f) <= tol_f and np.all(
                np.abs(u - self.best_u) <= self.xtol * np.maximum(1.0, np.abs(self.best_u))
            ):
                self.count += 1


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
