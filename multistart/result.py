"""The Result of a search: the best fit and every start's record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .status import Status

__all__ = ["Result"]


@dataclass
class Result:
    """What a search returns. Figures of merit are always minimised.

    Attributes:
      best_params: physical parameters of the best start (the same pytree as the space).
      best_fom: the best figure of merit (``inf`` when no start was ever finite).
      best_index: index of the best start (``-1`` when no start was ever finite).
      foms: ``(n_starts,)`` each start's best figure of merit.
      params: each start's best physical parameters (leaves with a leading ``n_starts`` axis).
      start_params: where each start began (physical, leading ``n_starts`` axis).
      status: ``(n_starts,)`` array of :class:`multistart.Status`.
      n_steps: ``(n_starts,)`` evaluations each start took.
      best_step: ``(n_starts,)`` the step at which each start found its best (``-1``: never).
      history: ``(n_rows, n_starts)`` best-so-far figure of merit per recorded step and start.
      history_steps: ``(n_rows,)`` the step (1-based count of steps taken) of each history row.
      stats: run statistics: ``n_compiles`` (compiles of the chunk step), ``n_compiles_total``,
        ``compile_s``, ``wall_s``, ``n_evals``, ``batch_size``, ... .
      paths: dotted parameter names, in the order of the space's leaves.
      config: the search's configuration, for the record.
      resurrections: ``(n_starts,)`` how many times each slot's start was replaced
        (``resurrect``); all zeros without resurrection.
      incarnations: with resurrection, one record (a dict: ``slot``, ``incarnation``, ``fom``,
        ``params``, ``start_params``, ``status``, ``n_steps``, ``best_step``, ``started_at``,
        ``replaced_at``) for every start that ever ran in a slot that was resurrected, the final
        one included (``replaced_at`` is ``None``). The per-slot arrays above show each slot's
        best incarnation (lowest finite figure of merit; the latest on ties or when none was
        finite), and ``history`` is the slot's best over its incarnations so far, so a replaced
        start's best point is never lost.
    """

    best_params: Any
    best_fom: float
    best_index: int
    foms: np.ndarray
    params: Any
    start_params: Any
    status: np.ndarray
    n_steps: np.ndarray
    best_step: np.ndarray
    history: np.ndarray
    history_steps: np.ndarray
    stats: dict = field(default_factory=dict)
    paths: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    resurrections: np.ndarray | None = None
    incarnations: list = field(default_factory=list)

    def __post_init__(self):
        if self.resurrections is None:
            self.resurrections = np.zeros(np.shape(self.foms)[0], dtype=np.int64)

    @property
    def n_starts(self) -> int:
        return int(self.foms.shape[0])

    @property
    def best_history(self) -> np.ndarray:
        """Best-so-far over all starts at each history row."""
        h = np.where(np.isnan(self.history), np.inf, self.history)
        return h.min(axis=1) if h.size else h.reshape(0)

    def status_counts(self) -> dict[str, int]:
        counts = Counter(str(s) for s in self.status)
        return {str(s): counts[str(s)] for s in Status if counts[str(s)]}

    def ranked(self) -> np.ndarray:
        """Start indices from best to worst figure of merit (non-finite last)."""
        f = np.where(np.isfinite(self.foms), self.foms, np.inf)
        return np.argsort(f, kind="stable")

    def start(self, i: int) -> dict:
        """One start's record as a dict."""
        return {
            "index": i,
            "fom": float(self.foms[i]),
            "status": self.status[i],
            "n_steps": int(self.n_steps[i]),
            "best_step": int(self.best_step[i]),
            "resurrections": int(self.resurrections[i]),
            "params": jax.tree_util.tree_map(lambda a: np.asarray(a)[i], self.params),
        }

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.status_counts().items())
        return (
            f"Result(best_fom={self.best_fom:.6g}, best_index={self.best_index}, "
            f"n_starts={self.n_starts}, status: {counts}, "
            f"n_compiles={self.stats.get('n_compiles')}, wall_s={self.stats.get('wall_s', 0):.3g})"
        )
