"""TikTak: each new local search starts part of the way towards the best point found so far.

TikTak (Arnoud, Guvenen & Kleineberg, "Benchmarking global optimizers", NBER working paper
26340, 2019; the multistart algorithm of optimagic and MultistartOptimization.jl) runs local
searches from a ranked quasi-random sample. The ``i``-th of ``N`` local searches starts not at
the ``i``-th sample point ``s_i`` but at

    x_i = (1 - theta_i) * s_i + theta_i * x_best,   theta_i = clamp(sqrt(i / N), 0.1, 0.995),

where ``x_best`` is the best point found by the local searches so far: early searches explore,
later ones refine around the incumbent. Random local searches waste most of their budget
re-finding the same poor minima; the blend spends it near the best basin found so far.

Inside this engine the slots run in parallel. The first wave (``n_starts`` local searches)
starts at the broad-start filter's choice, as is; whenever a slot's local search ends
(converged, non-finite, or out of its ``local_steps``), at the next host sync the slot gets the
next queued candidate (the filter's other finite candidates, best first), blended towards the
current best, by the same compiled row writer as resurrection. The blend is made in each
prior's unit interval (linear for ``Uniform``, in ``log x`` for ``LogUniform``, the normal CDF
for ``Normal``), so a blended start stays inside the priors. The search ends when ``n_local``
local searches have run, or when the best has been re-found ``max_discoveries`` times within
the tolerances of :func:`multistart.minima.default_tolerances` (optimagic's rule), or at
``n_steps``. Replacements happen on the ``sync_every`` schedule, so results are deterministic
for a seed and independent of ``batch_size``.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from .priors import Space

__all__ = ["TikTakQueue", "theta"]


def theta(i: int, n_local: int) -> float:
    """TikTak's weight on the best point for the ``i``-th (1-based) of ``n_local`` searches.

    >>> theta(1, 100), theta(25, 100), theta(100, 100)
    (0.1, 0.5, 0.995)
    """
    return min(max(math.sqrt(i / n_local), 0.1), 0.995)


def _unit(space: Space, x) -> list[np.ndarray]:
    return [
        np.asarray(p.to_unit(np.asarray(v, np.float64)), np.float64)
        for p, v in zip(space.priors, space.leaves(x), strict=True)
    ]


class TikTakQueue:
    """The queue of candidates, handed out blended towards the best point.

    Args:
      x: the queued candidates (physical params, leading axis, best first).
      space: the search's space.
      n_local: how many local searches the whole search runs (the first wave included).
      n_first: how many the first wave ran (the slots started as they were).
    """

    kind = "TikTak's queue"
    blends = True

    def __init__(self, x, space: Space, *, n_local: int, n_first: int):
        self.x = x
        self.space = space
        self.n_local = n_local
        self.n_first = n_first
        n = 0 if x is None else len(jax.tree_util.tree_leaves(x)[0])
        self.size = n
        self.taken = 0
        self.takes: list[int] = []  # every take(m), so a resumed search can replay them

    @property
    def remaining(self) -> int:
        return max(0, min(self.size - self.taken, self.n_local - self.n_first - self.taken))

    def take(self, m: int, best=None):
        """Up to ``m`` new starts, blended towards ``best`` (one start's physical params).

        Without ``best`` (a checkpoint being replayed) the queue only advances.
        """
        self.takes.append(int(m))
        k = min(m, self.remaining)
        if k == 0:
            return None
        rows = slice(self.taken, self.taken + k)
        first = self.n_first + self.taken + 1  # the 1-based index of the first of these
        self.taken += k
        cand = jax.tree_util.tree_map(lambda a: np.asarray(a)[rows], self.x)
        if best is None:
            return cand
        w = np.array([theta(first + j, self.n_local) for j in range(k)])
        out = []
        for prior, qc, qb in zip(
            self.space.priors,
            _unit(self.space, cand),
            _unit(self.space, jax.tree_util.tree_map(lambda a: np.asarray(a)[None], best)),
            strict=True,
        ):
            wb = w.reshape((k,) + (1,) * (qc.ndim - 1))
            q = (1.0 - wb) * qc + wb * qb
            out.append(prior.from_unit(np.clip(q, 1e-12, 1.0 - 1e-12)))
        return self.space.unflatten(out)
