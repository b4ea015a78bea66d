"""The run state: everything that changes while a search runs, in one value.

A fit's host loop (:func:`multistart.host.iterate.iterate`) threads one :class:`RunState` through
its steps, as optimistix threads one state through ``step``: ``state = sweep(state)`` every
step and, at a sync, ``state = apply(state, decide(read(state)))``. What never changes while
the search runs (the compiled sweep, the refiller, the checkpoints) is the
:class:`multistart.host.iterate.Engine` beside it. A checkpoint saves a RunState and a resumed
search restores one (:meth:`RunState.to_checkpoint`, :meth:`RunState.restored`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

from ..device.distributed import to_host
from ..device.step import PopState
from ..starts.refill import Lineage
from .decide import StopReason
from .schedule import Halving, Rungs

__all__ = ["RunState"]


class RunState(NamedTuple):
    """Everything a running search changes (see the module doc), as optax's states are: a
    NamedTuple, new at every step (``state._replace(...)``).

    Attributes:
      pop: the population, on its devices (on several, padded with inert rows to a multiple of
        their number). Its only owner: every other holder gets it from here.
      pruned: ``(n_pop,)`` slots whose start the halving schedule ended (an overlay on the
        device's status, which still says running).
      step: steps run.
      n_chunk_calls: compiled chunk calls made.
      rungs: the halving schedule's record (``None`` without the schedule).
      best_seen: the best figure of merit read at any sync so far, replaced starts' included.
      evals_to_best: the evaluations made in all when ``best_seen`` was first read.
      pending: pruning or refills were due at the last sync, where the search stopped; a run
        resuming from it makes them first.
      lineage: the slots' replaced starts (``None`` without a queue to refill them).
      saved: the steps this run wrote checkpoints of.
      resumed_from: the step this run began at, when it resumed from a checkpoint.
      first_step_s: seconds from ``fit`` to the end of this run's first step.
      stop: why the search stopped (``None`` while it runs).
      error: the failed checkpoint write that stopped it, if one did.
      width: the narrower width its tail is swept at (0: the search's own width).
      tail_since: see :attr:`multistart.host.decide.Reading.tail_since`.
    """

    pop: PopState
    pruned: np.ndarray
    step: int = 0
    n_chunk_calls: int = 0
    rungs: Rungs | None = None
    best_seen: float = math.inf
    evals_to_best: int | None = None
    pending: bool = False
    lineage: Lineage | None = None
    saved: tuple[int, ...] = ()
    resumed_from: int | None = None
    first_step_s: float | None = None
    stop: StopReason | None = None
    error: Exception | None = None
    width: int = 0
    tail_since: int = -1

    @classmethod
    def start(cls, pop: PopState, halving: Halving | None, lineage: Lineage | None) -> RunState:
        """The state before the first step."""
        n_pop = int(pop.history.shape[1])
        rungs = None if halving is None else Rungs.start(n_pop)
        return cls(pop, np.zeros(n_pop, bool), rungs=rungs, lineage=lineage)

    # -- checkpoints --------------------------------------------------------------------------

    def to_checkpoint(self) -> tuple[dict, dict]:
        """``(arrays, json)``: what a checkpoint of this state holds."""
        arrays: dict[str, Any] = {"pop": self.pop}
        meta: dict[str, Any] = {
            "steps_run": self.step,
            "history_rows": int(self.pop.history.shape[0]),
            "loop": {
                "n_chunk_calls": self.n_chunk_calls,
                "pending": self.pending,
                "pruned": np.flatnonzero(self.pruned).tolist(),
                "rungs": None if self.rungs is None else self.rungs.to_json(),
                "best_seen": [repr(float(self.best_seen)), self.evals_to_best],
                "tail": [self.width, self.tail_since],
            },
        }
        if self.lineage is not None:  # under "resurrector", the checkpoint format's key
            arrays["resurrector"], meta["resurrector"] = self.lineage.to_checkpoint()
        return arrays, meta

    def checkpoint_like(self, meta: dict) -> dict:
        """The arrays of a checkpoint with the JSON record ``meta``, as shapes, dtypes and
        shardings (laid out as this state's population, a global array over several processes
        included; the history's rows are the checkpoint's)."""
        pop: Any = self.pop  # the history below is a shape, not an array
        h = pop.history
        rows = int(meta.get("history_rows", h.shape[0]))
        history = jax.ShapeDtypeStruct((rows, *h.shape[1:]), h.dtype, sharding=h.sharding)
        out: dict[str, Any] = {"pop": pop._replace(history=history)}
        if self.lineage is not None:
            out["resurrector"] = self.lineage.checkpoint_like(meta["resurrector"])
        return out

    def restored(self, arrays: dict, meta: dict) -> RunState:
        """This fresh state continued from a checkpoint's ``arrays`` and ``meta``.

        A checkpoint of a search with a smaller ``n_steps`` has fewer history rows; the rows
        this search adds start empty (nan), as in a search that had not reached them.
        """
        pop, h = arrays["pop"], self.pop.history
        missing = h.shape[0] - pop.history.shape[0]
        if missing:  # on the host: the population is placed again before the next step
            pad = np.full((missing, *h.shape[1:]), np.nan, h.dtype)
            pop = pop._replace(history=np.concatenate([to_host(pop.history), pad]))
        loop = meta.get("loop", {})
        pruned = np.zeros_like(self.pruned)
        pruned[np.asarray(loop.get("pruned", []), np.int64)] = True
        rungs = self.rungs if loop.get("rungs") is None else Rungs.from_json(loop["rungs"])
        best_seen, evals_to_best = loop.get("best_seen", ["inf", None])
        lineage = self.lineage
        if lineage is not None:
            lineage = Lineage.from_checkpoint(arrays["resurrector"], meta["resurrector"])
        step = int(meta["steps_run"])
        width, tail_since = loop.get("tail", [0, -1])
        return self._replace(
            pop=pop,
            pruned=pruned,
            step=step,
            n_chunk_calls=int(loop.get("n_chunk_calls", 0)),
            rungs=rungs,
            best_seen=float(best_seen),
            evals_to_best=evals_to_best,
            pending=bool(loop.get("pending", loop.get("resurrect_pending"))),
            lineage=lineage,
            resumed_from=step or None,
            width=int(width),
            tail_since=int(tail_since),
        )
