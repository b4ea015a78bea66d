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
current best, written as resurrection's are (by the chunk step). The blend is made in each
prior's unit interval (linear for ``Uniform``, in ``log x`` for ``LogUniform``, the normal CDF
for ``Normal``), so a blended start stays inside the priors. The search ends when ``n_local``
local searches have run, or once the best has been re-found ``max_discoveries`` times within
the tolerances of :func:`multistart.result.minima.default_tolerances` (optimagic's rule: no new
local search is started then, and those running run to their ends), or at ``n_steps``.
Replacements happen on the ``sync_every`` schedule, so results are deterministic for a seed and
independent of ``batch_size``.

``start_strategy="band_tiktak"`` (L-BFGS's default) draws the band's candidates instead of
Sobol' points, so its first wave is the band's starts, and its queue hands out starts only while
the local searches that ended took at most ``TIKTAK_SHORT_SEARCH`` evaluations on average
(:attr:`TikTakQueue.short_searches`): repeating short local searches is cheap, long ones not.
Every third start its queue hands out comes from a second pool instead, unblended: the
filter's ranking of candidates drawn over 1-99 % of each prior's unit interval, and of more
with some of their coordinates on a bound (the plan's
:attr:`~multistart.starts.strategies.StartPlan.explore`), so the search reaches optima near or
on a bound of the box, which the band's candidates (15-85 %) and their blends never come near.
Its ``n_local`` is three rounds of TikTak's default, and the weights run their schedule over
each round (``cycle``): a search that ends within the first round (its best re-found) runs as one
of ``4 * n_starts`` local searches would, one whose best keeps moving blends from far to near it
again. Under ``schedule="halving"`` the gate counts only the local searches that ended on their
own (a pruned one's length is where the race cut it), and a slot the race pruned takes a start
only once those were short (:attr:`TikTakQueue.refills_pruned`): where local searches are long,
the race keeps the evaluations it saved.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ..common.status import Status
from ..common.tolerance import same_minimum
from ..model.priors import Space
from .queues import StartQueue

__all__ = ["TikTakQueue", "Discoveries", "theta"]

_PRUNED = Status.PRUNED.code


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


class TikTakQueue(StartQueue):
    """The queue of candidates, handed out blended towards the best point, and TikTak's stop
    rule (the best minimum re-found ``max_discoveries`` times).

    Args:
      x: the queued candidates (physical params, leading axis, best first).
      space: the search's space.
      n_local: how many local searches the whole search runs (the first wave included).
      n_first: how many the first wave ran (the slots started as they were).
      discoveries: the rediscovery count, or ``None`` (no such stop).
      short: hand out starts only while the local searches that ended took at most this many
        evaluations on average (``None``: however long they are).
      explore: a second queue (physical params, best first): every ``explore_every``-th start
        handed out is its next one, as is, while it lasts (``None``: none).
      explore_every: see ``explore``.
      cycle: the weights' schedule restarts every ``cycle`` local searches (``None``: one
        schedule over ``n_local``, TikTak's own): the ``i``-th search's weight is
        ``theta(((i - 1) % cycle) + 1, cycle)``, so a long search blends far from the best
        again after each cycle, and its first ``cycle`` searches are the ones a search of
        ``n_local = cycle`` runs.
    """

    kind = "TikTak's queue"
    routine = True
    needs_best = True

    def __init__(
        self,
        x,
        space: Space,
        *,
        n_local: int,
        n_first: int,
        discoveries: Discoveries | None = None,
        short: float | None = None,
        explore: StartQueue | None = None,
        explore_every: int = 3,
        cycle: int | None = None,
    ):
        self.x = x
        self.space = space
        self.n_local = n_local
        self.n_first = n_first
        self.discoveries = discoveries
        self.short = short
        self.ended_evals, self.n_ended = 0, 0  # evaluations of the ended local searches, count
        self.size = 0 if x is None else len(jax.tree_util.tree_leaves(x)[0])
        self.taken = 0
        self.explore, self.explore_every = explore, explore_every
        self.cycle = n_local if cycle is None else cycle

    def available(self) -> int:
        if self.stop_reason is not None or not self.short_searches:
            return 0  # the best re-found enough, or the local searches are long: no new one
        return max(0, min(self.size - self.taken, self.n_local - self.n_first - self.taken))

    def take(self, m: int, best=None):
        """Up to ``m`` new starts, blended towards ``best`` (one start's physical params).

        Without ``best`` (a checkpoint being replayed) the queue only advances.
        """
        k = min(m, self.available())
        if k == 0:
            return None
        rows = slice(self.taken, self.taken + k)
        first = self.n_first + self.taken + 1  # the 1-based index of the first of these
        wild, wild_x = self._explored(k)
        self.taken += k
        cand = jax.tree_util.tree_map(lambda a: np.asarray(a)[rows], self.x)
        if best is None:
            return cand
        c = self.cycle
        w = np.array([theta((first + j - 1) % c + 1, c) for j in range(k)])
        out: list[np.ndarray] = []
        for prior, qc, qb in zip(
            self.space.priors,
            _unit(self.space, cand),
            _unit(self.space, jax.tree_util.tree_map(lambda a: np.asarray(a)[None], best)),
            strict=True,
        ):
            wb = w.reshape((k,) + (1,) * (qc.ndim - 1))
            q = prior.from_unit(np.clip((1.0 - wb) * qc + wb * qb, 1e-12, 1.0 - 1e-12))
            out.append(q if wild_x is None else _put(q, wild, wild_x[len(out)]))
        return self.space.unflatten(out)

    def _explored(self, k: int) -> tuple[np.ndarray, list | None]:
        """Which of the next ``k`` starts come from the explore pool, and those starts (one
        array a prior; ``None``: no start does). The pool advances the same on a replay."""
        if self.explore is None:
            return np.zeros(0, int), None
        at = self.taken + np.arange(k)
        wild = np.flatnonzero(at % self.explore_every == self.explore_every - 1)
        x = self.explore.take(len(wild)) if len(wild) else None
        if x is None:
            return np.zeros(0, int), None
        leaves = [np.asarray(a) for a in self.space.leaves(x)]
        return wild[: len(leaves[0])], leaves

    def observe(self, records) -> None:
        if self.discoveries is not None:
            self.discoveries.observe(records)
        # A start the halving schedule pruned stopped where the race cut it: its length says
        # how far the race let it run, not how long a local search is, so it is not counted.
        own = [r for r in records if int(r.status) != _PRUNED]
        self.ended_evals += sum(int(r.n_evals) for r in own)
        self.n_ended += len(own)

    @property
    def mean_evals(self) -> float | None:
        """Evaluations a local search took on average, over those that ended on their own
        (converged, stalled, died or at their cap; not pruned), ``None``: none yet."""
        return self.ended_evals / self.n_ended if self.n_ended else None

    @property
    def short_searches(self) -> bool:
        """Are the local searches short enough to start more (always, without ``short``)?"""
        mean = self.mean_evals
        return self.short is None or mean is None or mean <= self.short

    @property
    def refills_pruned(self) -> bool:
        """May a slot the halving schedule pruned take a start now? Under ``short`` only once
        local searches that ended on their own have shown they are short (their mean within
        ``short``): a race on long local searches keeps the evaluations it saved, where
        refilling its pruned slots would spend them all (``docs/schedule.md``). Without
        ``short`` (TikTak's own ``n_local``), always."""
        return self.short is None or (self.n_ended > 0 and self.short_searches)

    @property
    def stop_reason(self) -> str | None:
        d = self.discoveries
        return "max_discoveries" if d is not None and d.done else None


def _put(a: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a[rows] = values
    return a


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
        self.best_f, self.count = np.inf, 0
        self.best_u: np.ndarray | None = None

    @property
    def done(self) -> bool:
        return self.count >= self.limit

    def observe(self, records) -> None:
        for r in records:
            if not Status.from_code(r.status).settled or not np.isfinite(r.best_fom):
                continue
            u = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(r.best_u)])
            tol_f = self.ftol * max(1.0, abs(self.best_f)) if np.isfinite(self.best_f) else 0
            if r.best_fom < self.best_f - tol_f:
                self.best_f, self.best_u, self.count = r.best_fom, u, 1
            elif self.best_u is not None and same_minimum(
                r.best_fom, u, self.best_f, self.best_u, xtol=self.xtol, ftol=self.ftol
            ):
                self.count += 1
