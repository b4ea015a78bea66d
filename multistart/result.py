"""The Result of a search: the best fit and every start's record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .minima import cluster_minima
from .status import Status

__all__ = ["Result", "Minimum"]


@dataclass(frozen=True)
class Minimum:
    """One distinct local minimum reached by one or more starts.

    Attributes:
      fom: the best figure of merit among its starts.
      params: the physical parameters of that best start.
      starts: indices of the starts that reached it, best first.
    """

    fom: float
    params: Any
    starts: tuple[int, ...]

    @property
    def n_starts(self) -> int:
        return len(self.starts)


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

    def distinct_minima(
        self, xtol: float = 1e-6, ftol: float = 1e-6, *, include_nonfinite: bool = False
    ) -> list[Minimum]:
        """Group the ended starts into distinct local minima, best first.

        Two starts share a minimum when their figures of merit agree within ``ftol`` and every
        parameter within ``xtol`` (relative above magnitude 1, absolute below), as in MATLAB's
        MultiStart. Starts stopped as ``nonfinite`` are left out unless ``include_nonfinite``
        (their best finite point, if any, then takes part); starts with no finite figure of
        merit never do.

        Returns:
          A list of :class:`Minimum` (fom, params, starts), sorted by figure of merit.
        """
        leaves = jax.tree_util.tree_leaves(self.params)
        x = np.concatenate([np.asarray(v).reshape(self.n_starts, -1) for v in leaves], axis=1)
        f = np.asarray(self.foms, dtype=np.float64).copy()
        if not include_nonfinite:
            f[np.array([s is Status.NONFINITE for s in self.status], dtype=bool)] = np.inf
        labels = cluster_minima(x, f, xtol=xtol, ftol=ftol)
        minima = []
        for label in range(labels.max(initial=-1) + 1):
            members = np.flatnonzero(labels == label)
            members = members[np.argsort(f[members], kind="stable")]
            head = int(members[0])
            params = jax.tree_util.tree_map(lambda a, h=head: np.asarray(a)[h], self.params)
            minima.append(Minimum(float(f[head]), params, tuple(int(m) for m in members)))
        return minima

    def start(self, i: int) -> dict:
        """One start's record as a dict."""
        return {
            "index": i,
            "fom": float(self.foms[i]),
            "status": self.status[i],
            "n_steps": int(self.n_steps[i]),
            "best_step": int(self.best_step[i]),
            "params": jax.tree_util.tree_map(lambda a: np.asarray(a)[i], self.params),
        }

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.status_counts().items())
        return (
            f"Result(best_fom={self.best_fom:.6g}, best_index={self.best_index}, "
            f"n_starts={self.n_starts}, status: {counts}, "
            f"n_compiles={self.stats.get('n_compiles')}, wall_s={self.stats.get('wall_s', 0):.3g})"
        )
