"""Where the local searches begin: start strategies, user starts and the broad-start filter.

Starts are drawn in the unit cube of the priors' quantiles, inside a central ``band`` of each
prior, by independent uniform draws (``"band"``), a scrambled Sobol' sequence (``"sobol"``) or a
Latin hypercube (``"lhs"``), then mapped to physical values. The broad-start filter evaluates
many candidates' figure of merit in one compiled program and keeps the best finite ones that
keep their distance (:func:`diverse_candidates`); the finite rest is the reserve resurrection
draws from. docs/starts.md explains them.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import numpy as np
from scipy.spatial import cKDTree
from scipy.stats import qmc

from ..common import log
from ..device.evaluator import ValueEvaluator
from ..model.priors import Space, Uniform
from ..model.problem import Problem
from .queues import StartQueue

__all__ = [
    "STRATEGIES",
    "NoFiniteStartsError",
    "StartStream",
    "StartPlan",
    "Explore",
    "check_band",
    "check_strategy",
    "check_strategy_space",
    "uniform_band_starts",
    "user_starts",
    "rank_candidates",
    "critical_distance",
    "diverse_candidates",
    "unit_coords",
    "check_max_candidates",
    "describe_region",
    "plan_starts",
    "stack_starts",
]

STRATEGIES = ("band", "sobol", "lhs", "tiktak", "band_tiktak")
# TikTak draws its candidates as a scrambled Sobol' sequence (as its authors do); what makes it
# TikTak is how the driver hands them out (multistart.starts.tiktak). "band_tiktak" draws the
# band's (its first wave is the band's), and hands them out as TikTak does while they are short.
_SAMPLER = {"tiktak": "sobol", "band_tiktak": "band"}


class NoFiniteStartsError(ValueError):
    """No candidate start had a finite figure of merit, so no search could begin."""


def check_band(band) -> tuple[float, float]:
    """Validate a unit-cube band ``(lo, hi)`` with ``0 <= lo < hi <= 1``."""
    try:
        lo, hi = (float(b) for b in band)
    except (TypeError, ValueError) as e:
        raise ValueError(f"start_band must be a pair (lo, hi) of floats; got {band!r}") from e
    if not (0.0 <= lo < hi <= 1.0):
        raise ValueError(f"start_band must satisfy 0 <= lo < hi <= 1; got {band!r}")
    return lo, hi


def check_strategy(strategy) -> str:
    """Validate a start strategy name."""
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(
            f"start_strategy must be one of {', '.join(map(repr, STRATEGIES))}; got {strategy!r}"
        )
    return strategy


def uniform_band_starts(space: Space, n: int, rng: np.random.Generator, band=(0.15, 0.85)):
    """``n`` starts drawn uniformly in the central ``band`` of each prior's quantiles.

    Returns the physical params pytree with a leading ``n`` axis on every leaf (float64).
    Keeping starts off the tails of each prior avoids beginning where a bounded prior's logit
    is steep and a normal prior's tail is implausible.
    """
    return space.from_unit(_band_unit(space, n, rng, band))


def _band_unit(space: Space, n: int, rng: np.random.Generator, band) -> list[np.ndarray]:
    lo, hi = check_band(band)
    return [rng.uniform(lo, hi, size=(n, *p.shape)) for p in space.priors]


def check_strategy_space(strategy: str, space: Space) -> None:
    """Fail early when a strategy cannot draw in this space (Sobol' has a dimension limit)."""
    if _SAMPLER.get(strategy, strategy) == "sobol" and space.n_dims > qmc.Sobol.MAXDIM:
        raise ValueError(
            f"start_strategy={strategy!r} (Sobol' points) supports at most "
            f"{qmc.Sobol.MAXDIM} parameters; "
            f"the space has {space.n_dims}: use 'lhs' or 'band'"
        )


class StartStream:
    """Starts of one strategy, drawn in order: the same seed gives the same sequence.

    ``draw(m)`` returns the next ``m`` starts (physical params, leading ``m`` axis). Sobol'
    points continue one sequence across draws; each Latin-hypercube draw is a hypercube of its
    own; band draws are those of :func:`uniform_band_starts`.
    """

    def __init__(self, space: Space, strategy: str, band, rng: np.random.Generator):
        self.space = space
        self.strategy = check_strategy(strategy)
        self.band = check_band(band)
        self.rng = rng
        d = space.n_dims
        check_strategy_space(strategy, space)
        strategy = self.sampler = _SAMPLER.get(strategy, strategy)
        if strategy == "sobol":
            self._engine = qmc.Sobol(d=d, scramble=True, rng=rng)
            self._buffer = np.empty((0, d))
        elif strategy == "lhs":
            self._engine = qmc.LatinHypercube(d=d, scramble=True, rng=rng)

    def unit(self, m: int) -> np.ndarray:
        """The next ``m`` points in ``[0, 1)^n_dims`` (before the band), flat in space order."""
        if self.sampler == "sobol":
            return self._sobol(m)
        if self.sampler == "lhs":
            return self._engine.random(m) if m else np.empty((0, self.space.n_dims))
        raise ValueError("band draws are made per prior; use draw()")

    def _sobol(self, m: int) -> np.ndarray:
        # Sobol' points balance only in power-of-two blocks (scipy warns otherwise): the first
        # block is a power of two, each later one doubles the total, and a draw takes what it
        # needs from the front, so every draw continues the one sequence.
        while len(self._buffer) < m:
            done = self._engine.num_generated
            if done == 0:
                block = self._engine.random_base2(max(0, math.ceil(math.log2(m))))
            else:
                block = self._engine.random(done)
            self._buffer = np.concatenate([self._buffer, block])
        out, self._buffer = self._buffer[:m], self._buffer[m:]
        return out

    def draw(self, m: int, priors: Space | None = None):
        """The next ``m`` starts: physical params with a leading ``m`` axis (float64), mapped
        by the stream's space, or by ``priors``: its priors with a leading axis of datasets on
        every parameter, each dataset's draws alike (leaves ``(m, n_datasets, *shape)``)."""
        q = self.unit_leaves(m)
        if priors is None:
            return self.space.from_unit(q)
        return priors.from_unit([u[:, None] for u in q])

    def unit_leaves(self, m: int) -> list[np.ndarray]:
        """The next ``m`` starts in each prior's unit interval (inside the band), one array
        ``(m, *prior.shape)`` per prior: what :meth:`draw` maps to physical values."""
        if self.sampler == "band":
            return _band_unit(self.space, m, self.rng, self.band)
        lo, hi = self.band
        return self.space.split_rows(lo + (hi - lo) * self.unit(m))


# -- user starts ---------------------------------------------------------------------------------


def _flat_paths(tree) -> tuple[list[str], list[Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: not isinstance(x, dict))
    return [".".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat], [
        leaf for _, leaf in flat
    ]


def _match_paths(space: Space, tree, where: str) -> dict[str, Any]:
    if not isinstance(tree, dict):
        raise TypeError(f"{where} must be a params dict like the space; got {type(tree).__name__}")
    paths, leaves = _flat_paths(tree)
    given, known = set(paths), set(space.paths)  # (lists: a start of n leaves cost n² lookups)
    missing = [p for p in space.paths if p not in given]
    extra = [p for p in paths if p not in known and p not in space.fixed]
    for path, leaf in zip(paths, leaves, strict=True):  # a fixed one may be given, at its value
        fixed = space.fixed.get(path)
        if fixed is not None and not np.all(_as_float(leaf, f"{where}[{path!r}]") == fixed.value):
            raise ValueError(
                f"{where}[{path!r}] is {leaf!r}, but the space holds {path!r} at "
                f"{fixed!r}: leave it out of the starts, or give its value"
            )
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"is missing {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"has {', '.join(map(repr, extra))}, not in the space")
        raise ValueError(f"{where} {' and '.join(parts)}")
    return {p: v for p, v in zip(paths, leaves, strict=True) if p not in space.fixed}


def _as_float(value, where: str) -> np.ndarray:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where} must be a real number or array; got {value!r}") from e


def user_starts(space: Space, starts, n_starts: int):
    """Validate user-supplied starts; return them as physical params with a leading axis.

    ``starts`` is a params pytree whose leaves have a leading axis of ``k`` starts, or a list of
    ``k`` params dicts, with ``1 <= k <= n_starts``. Every value must be finite and inside its
    prior's bounds, off them by at least ``BOUND_MARGIN`` of the prior's unit interval.

    Raises:
      TypeError / ValueError: naming the offending start index and parameter path.
    """
    if isinstance(starts, (list, tuple)):
        stacked = _stack_start_list(space, starts)
    else:
        stacked = _start_columns(space, starts)
    k = len(next(iter(stacked.values())))
    if k > n_starts:
        raise ValueError(
            f"starts gives {k} starts but the search has n_starts={n_starts}: raise n_starts "
            "or give fewer starts"
        )
    for path, prior in zip(space.paths, space.priors, strict=True):
        _check_inside(stacked[path], prior, path)
        _check_off_bound(stacked[path], prior, path)
    return space.unflatten(stacked[p] for p in space.paths)


def _stack_start_list(space: Space, starts) -> dict[str, np.ndarray]:
    """A list of ``k`` params dicts as one array per path with a leading axis of ``k``."""
    if not starts:
        raise ValueError("starts is an empty list: give at least one params dict")
    rows = []
    for i, one in enumerate(starts):
        named = _match_paths(space, one, f"starts[{i}]")
        row = {}
        for path, prior in zip(space.paths, space.priors, strict=True):
            v = _as_float(named[path], f"starts[{i}][{path!r}]")
            if v.shape != prior.shape:
                raise ValueError(
                    f"starts[{i}][{path!r}] must have shape {prior.shape} like its prior; "
                    f"got {v.shape}"
                )
            row[path] = v
        rows.append(row)
    return {p: np.stack([r[p] for r in rows]) for p in space.paths}


def _start_columns(space: Space, starts) -> dict[str, np.ndarray]:
    """A params pytree whose leaves have a leading axis of starts, one array per path."""
    named = _match_paths(space, starts, "starts")
    stacked, k = {}, None
    for path, prior in zip(space.paths, space.priors, strict=True):
        v = _as_float(named[path], f"starts[{path!r}]")
        if v.ndim != 1 + len(prior.shape) or v.shape[1:] != prior.shape:
            raise ValueError(
                f"starts[{path!r}] must have shape (n, *{prior.shape}) with a leading axis "
                f"of starts; got {v.shape}"
            )
        if k is not None and v.shape[0] != k:
            raise ValueError(
                f"starts[{path!r}] has {v.shape[0]} starts but {space.paths[0]!r} has {k}"
            )
        k = v.shape[0]
        stacked[path] = v
    if k == 0:
        raise ValueError("starts has no starts (a leading axis of length 0)")
    return stacked


# A start this close to a bound, in its prior's unit interval, is refused: its logit is past
# +-13.8 (infinite on the bound), where the step's gradient vanishes and float32 rounds the
# start onto the bound, so it never moves and is reported converged there.
BOUND_MARGIN = 1e-6


def _check_off_bound(v: np.ndarray, prior, path: str) -> None:
    if not isinstance(prior, Uniform):  # unbounded priors have no bound to sit on
        return
    q = np.asarray(prior.to_unit(v))
    near = (q < BOUND_MARGIN) | (q > 1.0 - BOUND_MARGIN)
    if not near.any():
        return
    bad = np.argwhere(near)[0]
    i, element = int(bad[0]), tuple(int(b) for b in bad[1:])
    where = f"starts[{i}][{path!r}]" + ("" if not element else str(list(element)))
    low = q[tuple(bad)] < 0.5
    side = "lower" if low else "upper"
    bound = np.broadcast_to(prior.lower_bound if low else prior.upper_bound, prior.shape)
    inside = np.broadcast_to(
        prior.from_unit(np.full(prior.shape, BOUND_MARGIN if low else 1.0 - BOUND_MARGIN)),
        prior.shape,
    )
    raise ValueError(
        f"{where} = {v[tuple(bad)]:.9g} is on the {side} bound {bound[element]:.9g} of {prior!r}"
        f" (within {BOUND_MARGIN:g} of its range): a start there never moves (its logit is "
        f"infinite) and would be reported converged; start it inside, e.g. at "
        f"{inside[element]:.9g}, or widen the prior"
    )


def _check_inside(v: np.ndarray, prior, path: str) -> None:
    ok = prior.contains(v)
    if ok.all():
        return
    bad = np.argwhere(~ok)[0]
    i, element = int(bad[0]), tuple(int(b) for b in bad[1:])
    value = v[tuple(bad)]
    where = f"starts[{i}][{path!r}]" + ("" if not element else str(list(element)))
    if not np.isfinite(value):
        raise ValueError(f"{where} is {value}: starts must be finite")
    lo = np.broadcast_to(prior.lower_bound, prior.shape)[element]
    hi = np.broadcast_to(prior.upper_bound, prior.shape)[element]
    raise ValueError(f"{where} = {value:g} is outside the bounds [{lo:g}, {hi:g}] of {prior!r}")


# -- the broad-start filter ------------------------------------------------------------------------


def rank_candidates(foms: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the best ``m`` finite candidates, best first, and of the other finite ones.

    Ties keep candidate order, so the ranking is deterministic.

    >>> chosen, reserve = rank_candidates(np.array([3.0, np.nan, 1.0, np.inf, 2.0]), 2)
    >>> chosen.tolist(), reserve.tolist()
    ([2, 4], [0])
    """
    foms = np.asarray(foms)
    finite = np.flatnonzero(np.isfinite(foms))
    order = finite[np.argsort(foms[finite], kind="stable")]
    return order[:m], order[m:]


# Rinnooy Kan & Timmer's sigma: with sigma > 4 multi-level single linkage starts finitely many
# local searches even as the sample grows without bound (their Theorem 8), so the rule thins
# candidates in basins that are already represented however many candidates are drawn.
MLSL_SIGMA = 4.0

# MLSL's reduced sample: the distance rule considers only this best fraction of the finite
# candidates (Rinnooy Kan & Timmer's gamma; 0.1-0.2 is the usual range), so no start is spent
# where the figure of merit is among the worst (a flat region where a model misses its data:
# with gamma 0.25 the README's peak fit started one of 64 there, with 0.15 none).
MLSL_GAMMA = 0.15

# The top-up's default ceiling: ten times the default number of candidates.
MAX_CANDIDATES_PER_START = 100


def critical_distance(n_points: int, n_dims: int, sigma: float = MLSL_SIGMA) -> float:
    """Multi-level single linkage's critical distance in the unit cube (Rinnooy Kan & Timmer).

    ``r = pi**-0.5 * (gamma(1 + d/2) * sigma * log(N) / N) ** (1/d)`` for ``N`` sample points
    in ``d`` dimensions (Rinnooy Kan & Timmer 1987, "Stochastic global optimization methods
    part II: multi level methods", Math. Programming 39, eq. (8) with the measure of the unit
    cube, 1). A ball of radius ``r`` has volume ``sigma * log(N) / N``: it holds about
    ``sigma * log(N)`` of the ``N`` points, so two points closer than ``r`` are likely in the
    same basin, while ``r`` shrinks as the sample grows. ``0.0`` for ``N < 2``.

    >>> round(critical_distance(2560, 9), 3)
    0.537
    """
    if n_dims < 1:
        raise ValueError(f"n_dims must be >= 1; got {n_dims}")
    if n_points < 2:
        return 0.0
    n, d = float(n_points), float(n_dims)
    # in logs: gamma(1 + d/2) overflows a float beyond d ~ 340
    log_r = (math.lgamma(1.0 + d / 2) + math.log(sigma * math.log(n) / n)) / d
    return math.exp(log_r) / math.sqrt(math.pi)


def diverse_candidates(
    unit: np.ndarray, foms: np.ndarray, m: int, radius: float, reduced: int | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """The best ``m`` finite candidates that keep their distance, and the finite rest.

    Going down the ranking by figure of merit (ties keep candidate order), a candidate is kept
    unless it lies within ``radius`` (Euclidean, in the unit cube) of a better one already kept,
    so one wide basin cannot take every slot (multi-level single linkage's rule). If fewer than
    ``m`` are kept, the best skipped ones fill the remaining places.

    Args:
      unit: ``(n, d)`` candidate coordinates in the unit cube.
      foms: ``(n,)`` figures of merit; non-finite candidates are dropped.
      m: how many to choose.
      radius: the critical distance; ``0`` keeps plain ranking (:func:`rank_candidates`).
      reduced: the distance rule looks only at the best ``reduced`` finite candidates
        (MLSL's reduced sample; default: all of them).

    Returns:
      ``(chosen, reserve, n_kept)``: indices of the chosen candidates, best first; of the
      other finite ones, best first; and how many chosen were kept by the distance rule
      (the others filled in).

    >>> unit = np.array([[0.1, 0.1], [0.12, 0.1], [0.9, 0.9], [0.5, 0.5]])
    >>> chosen, reserve, kept = diverse_candidates(unit, np.array([0.0, 1.0, 2.0, 3.0]), 2, 0.1)
    >>> chosen.tolist(), reserve.tolist(), kept
    ([0, 2], [1, 3], 2)
    """
    foms = np.asarray(foms)
    unit = np.asarray(unit, dtype=np.float64)
    if unit.ndim != 2 or len(unit) != len(foms):
        raise ValueError(f"unit must be (n, d) with n = len(foms) = {len(foms)}; got {unit.shape}")
    chosen, rest = rank_candidates(foms, m)
    if radius <= 0 or len(rest) == 0:
        return chosen, rest, len(chosen)
    order = np.concatenate([chosen, rest])
    points = unit[order]
    tree = cKDTree(points)
    skipped = np.zeros(len(order), dtype=bool)
    kept: list[int] = []
    # Every kept point marks its neighbours within the radius; a point still unmarked when the
    # ranking reaches it has no better kept neighbour. A ball holds ~sigma*log(N) points at
    # the critical distance, so this is about m ball queries, not an (N x N) distance matrix.
    for i in range(len(order) if reduced is None else min(len(order), max(reduced, m))):
        if skipped[i]:
            continue
        kept.append(i)
        if len(kept) == m:
            break
        skipped[tree.query_ball_point(points[i], radius)] = True
    n_kept = len(kept)
    take = np.zeros(len(order), dtype=bool)
    take[kept] = True
    if n_kept < m:
        take[np.flatnonzero(~take)[: m - n_kept]] = True
    return order[take], order[~take], n_kept


def unit_coords(space: Space, x, band=(0.0, 1.0)) -> np.ndarray:
    """``(n, n_dims)`` coordinates of a batch of physical params in the unit cube of ``band``.

    Each prior's quantile ``q`` maps to ``(q - lo) / (hi - lo)``, so the band the starts were
    drawn in is the unit cube and every parameter counts alike in a distance.
    """
    lo, hi = check_band(band)
    leaves = space.leaves(x)
    q = np.concatenate(
        [
            p.to_unit(np.asarray(v)).reshape(len(v), -1)
            for p, v in zip(space.priors, leaves, strict=True)
        ],
        axis=1,
    )
    return (q - lo) / (hi - lo)


def check_max_candidates(max_candidates, n_candidates: int, n_starts: int) -> int | None:
    """Validate ``max_candidates``: ``None`` is ``max(100 * n_starts, n_candidates)``.

    Returns ``None`` when the filter is off (``n_candidates == 0``).
    """
    if n_candidates == 0:
        if max_candidates is not None:
            raise ValueError(
                "max_candidates has no effect with n_candidates=0 (no filter); drop one"
            )
        return None
    if max_candidates is None:
        return max(MAX_CANDIDATES_PER_START * n_starts, n_candidates)
    if (
        isinstance(max_candidates, bool)
        or not isinstance(max_candidates, numbers.Integral)
        or max_candidates < n_candidates
    ):
        raise ValueError(
            f"max_candidates must be None ({MAX_CANDIDATES_PER_START} x n_starts) or an int "
            f">= n_candidates ({n_candidates}); got {max_candidates!r}"
        )
    return int(max_candidates)


def describe_region(space: Space, strategy: str, band, max_params: int = 8) -> str:
    """Where starts were drawn: the strategy, the band, and each parameter's range and prior."""
    lo, hi = check_band(band)
    parts = []
    for path, prior in list(zip(space.paths, space.priors, strict=True))[:max_params]:
        a = prior.from_unit(np.full(prior.shape, lo))
        b = prior.from_unit(np.full(prior.shape, hi))
        rng = f"[{np.min(a):.4g}, {np.max(b):.4g}]"
        parts.append(f"{path} in {rng} of {prior!r}")
    more = len(space.paths) - max_params
    if more > 0:
        parts.append(f"... and {more} more")
    return f"{strategy!r} draws in the quantile band ({lo:g}, {hi:g}): " + "; ".join(parts)


class CandidateReserve(StartQueue):
    """The filter's finite candidates that were not chosen, best first (resurrection's source)."""

    kind = "the filter's reserve"

    def __init__(self, x, foms: np.ndarray):
        self.x = x
        self.foms = np.asarray(foms)
        self.taken = 0

    def available(self) -> int:
        return len(self.foms) - self.taken

    def take(self, m: int, best=None):
        """Up to ``m`` candidates (physical params, leading axis), or ``None`` if none is left."""
        k = min(m, self.available())
        if k == 0:
            return None
        rows = slice(self.taken, self.taken + k)
        self.taken += k
        return jax.tree_util.tree_map(lambda a: a[rows], self.x)


class StreamReserve(StartQueue):
    """Fresh draws of the start strategy (resurrection's source when no filter ran)."""

    def __init__(self, stream: StartStream):
        self.stream = stream
        self.kind = f"fresh {stream.strategy!r} draws"

    def take(self, m: int, best=None):
        return self.stream.draw(m) if m else None


@dataclass
class StartPlan:
    """The starts a search begins from, and what it can replace dead starts with.

    Attributes:
      x0: physical params with a leading ``n_starts`` axis (NaN rows for slots never started).
      started: ``(n_starts,)`` which slots have a start.
      reserve: the queue of further starts (the filter's other finite candidates, or fresh
        draws when no filter ran), or ``None``.
      stats: figures for the Result (filter counts and times).
      explore: a second queue: the filter's ranking of candidates drawn over a wider box
        (``plan_starts(explore=...)``), or ``None``.
      evaluator: the filter's compiled evaluator (``None``: no filter ran), whose program also
        maps the search's rows to physical parameters.
    """

    x0: Any
    started: np.ndarray
    reserve: StartQueue | None = None
    stats: dict = field(default_factory=dict)
    explore: StartQueue | None = None
    evaluator: ValueEvaluator | None = None


def _concat(a, b):
    if a is None:
        return b
    return jax.tree_util.tree_map(lambda x, y: np.concatenate([x, y]), a, b)


def _take(x, rows):
    return jax.tree_util.tree_map(lambda a: a[rows], x)


def filter_evaluator(problem: Problem, dtype, width: int, programs=None) -> ValueEvaluator:
    """The filter's evaluator: the figure of merit at flat unconstrained points, compiled.

    It maps points the way a flat search step does (``forward_flat``), so a start's filter
    value is the value its first step sees (to rounding); the mapped points come back too
    (:meth:`~multistart.device.evaluator.ValueEvaluator.points`). ``programs``: where it is kept for
    a refit of the same model (:class:`multistart.device.programs.Programs`).
    """
    space, fom = problem.space, problem.fom  # not problem: a kept program would keep its data

    def fom_u(u, data):
        x = space.forward_flat(u)
        return fom(space.unravel(x), data), x  # the point too: the Result's map of its rows

    evaluator = ValueEvaluator(fom_u, width=width, data=problem.data, programs=programs)
    evaluator.compile(space.n_dims, dtype)
    return evaluator


def plan_starts(
    problem: Problem,
    dtype,
    *,
    n_starts: int,
    strategy: str,
    band,
    n_candidates: int,
    filter_width: int,
    seed: int,
    user=None,
    max_candidates: int | None = None,
    diverse: bool = True,
    programs=None,
    explore: Explore | None = None,
) -> StartPlan:
    """Decide every slot's start: user starts first, then strategy draws (filtered or not).

    With ``n_candidates > 0``, blocks of ``n_candidates`` draws are evaluated until as many are
    finite as there are free slots, up to ``max_candidates`` (default ``n_candidates``), and the
    free slots get :func:`diverse_candidates` of them (``diverse=False``: the plain best). Slots
    left over stay ``unstarted``; no finite candidate and no user start raises
    :class:`NoFiniteStartsError`. ``programs``: the filter's, kept. ``explore``: the filter
    also ranks a second pool of candidates over a wider box (:class:`Explore`); the plan's
    ``explore`` holds the finite ones, one a basin first.
    """
    space = problem.space
    stream = StartStream(space, strategy, band, np.random.default_rng(seed))
    k = 0 if user is None else len(jax.tree_util.tree_leaves(user)[0])
    free = n_starts - k
    started = np.ones(n_starts, dtype=bool)
    stats: dict[str, Any] = {"start_strategy": strategy, "n_user_starts": k}
    if free == 0 or n_candidates == 0:
        drawn = stream.draw(free) if free else None
        x0 = user if drawn is None else _concat(user, drawn)
        return StartPlan(x0, started, StreamReserve(stream), stats)

    limits = (n_candidates, max_candidates, filter_width)
    cand, foms, chosen, rest, filtered, evaluator = _run_filter(
        problem, dtype, stream, free, limits, band, diverse, programs
    )
    stats.update(filtered)
    n_drawn, n_finite = len(foms), len(chosen) + len(rest)
    if n_finite == 0 and k == 0:
        raise NoFiniteStartsError(
            f"no finite figure of merit for {problem.name!r} at any of {n_drawn} candidate "
            f"starts ({describe_region(space, strategy, band)}); check the objective, or widen "
            "start_band / the priors, or give starts= inside the region where it is finite"
        )
    picked = _take(cand, chosen)
    if len(chosen) < free:
        missing = free - len(chosen)
        started[k + len(chosen) :] = False
        blank = jax.tree_util.tree_map(lambda a: np.full((missing, *a.shape[1:]), np.nan), picked)
        picked = _concat(picked, blank)
    _log_filter(stats, foms[chosen], free, k, strategy)
    stats["n_unstarted"] = int(np.sum(~started))
    reserve = CandidateReserve(_take(cand, rest), foms[rest])
    pool = None if explore is None else _explore_pool(space, dtype, evaluator, seed, explore, stats)
    return StartPlan(_concat(user, picked), started, reserve, stats, pool, evaluator)


def stack_starts(space: Space, first, priors: Space, k: int, *, strategy: str, band, seed: int):
    """The starts of a stack of datasets fitted as one search, dataset ``i``'s in rows ``i * k``
    to ``(i + 1) * k - 1`` (a problem's ``rows_per_datum``): each dataset's start ``first``
    (params, a leading axis of datasets), then the ``k - 1`` draws :func:`plan_starts` makes
    after one user start without a filter (the same seed: the same draws in the unit interval
    for every dataset), each dataset's mapped by its own ``priors`` (``space``'s, each with a
    leading axis of datasets: :meth:`StartStream.draw`). Params with a leading ``n * k`` axis.
    """
    stream = StartStream(space, strategy, band, np.random.default_rng(seed))
    drawn = stream.draw(k - 1, priors)

    def rows(x0, x):  # (n, *shape) and (k - 1, n, *shape): (n * k, *shape)
        x0 = np.asarray(x0, dtype=np.float64)
        x = np.moveaxis(np.broadcast_to(x, (k - 1, *x0.shape)), 0, 1)
        return np.concatenate([x0[:, None], x], axis=1).reshape(-1, *x0.shape[1:])

    return jax.tree_util.tree_map(rows, space.unflatten(space.leaves(first)), drawn)


class Explore(NamedTuple):
    """band_tiktak's second pool (:func:`plan_starts`): ``n`` uniform draws over ``box`` of
    each prior's unit interval (the seed's second stream), and ``n_bound`` more (its fourth
    stream) with each bounded coordinate put on a bound with probability ``on_bound``
    (:func:`on_bounds`; the third stream)."""

    n: int
    box: tuple[float, float]
    n_bound: int = 0
    on_bound: float = 0.0


def _explore_pool(space, dtype, evaluator, seed, explore: Explore, stats: dict) -> CandidateReserve:
    """The pool's draws (:class:`Explore`), ranked by the filter's compiled ``evaluator``: the
    finite ones, spread first (:func:`spread_first`)."""
    m, box = explore.n + explore.n_bound, explore.box
    stats["n_explore_candidates"] = m
    inside = StartStream(space, "band", box, np.random.default_rng([seed, 41]))
    more = StartStream(space, "band", box, np.random.default_rng([seed, 43]))
    bound = np.random.default_rng([seed, 42])
    q = on_bounds(space, more.unit_leaves(explore.n_bound), explore.on_bound, bound)
    x = space.from_unit(
        [np.concatenate(pair) for pair in zip(inside.unit_leaves(explore.n), q, strict=True)]
    )
    foms = evaluator(space.ravel(space.to_unconstrained(x, dtype=np.dtype(dtype))))
    radius = critical_distance(m, space.n_dims)
    reduced = math.ceil(MLSL_GAMMA * int(np.isfinite(foms).sum()))
    order = spread_first(unit_coords(space, x, box), foms, radius, reduced)
    return CandidateReserve(_take(x, order), foms[order])


def on_bounds(space: Space, leaves: list, share: float, rng: np.random.Generator) -> list:
    """Each prior's unit-interval draws (``leaves``, as :meth:`StartStream.unit_leaves`), every
    coordinate of a bounded prior (``Uniform``, ``LogUniform``: a logistic coordinate) put on
    its lower or upper bound with probability ``share``, each side alike. A start on a bound
    is the bound itself; its unconstrained coordinate is the inverse map's clip (the quantile
    ``1e-12`` from the bound, +-27.6), so a local search that starts there searches that face
    (its gradient across it is about ``1e-12`` times the physical one, and a step that leads
    out is put on the bound). Optima on a bound of the box, which a logistic coordinate
    reaches only asymptotically, are where such a search starts (issue 41).

    >>> space = Space({"a": Uniform(0.0, 1.0, shape=(1000,))})
    >>> q = on_bounds(space, [np.full((1, 1000), 0.5)], 0.25, np.random.default_rng(0))[0]
    >>> round(float(np.mean(q != 0.5)), 2), sorted(set(q[q != 0.5].tolist()))
    (0.23, [0.0, 1.0])
    """
    out = []
    for q, bounded in zip(leaves, space.split_rows(space.logistic_mask()[None]), strict=True):
        snap = (rng.random(q.shape) < share) & bounded[0]
        out.append(np.where(snap, np.where(rng.random(q.shape) < 0.5, 1.0, 0.0), q))
    return out


def spread_first(unit: np.ndarray, foms: np.ndarray, radius: float, reduced: int) -> np.ndarray:
    """The finite candidates' indices: first, down the ranking of the best ``reduced``, each
    one not within ``radius`` of a better one already placed (one a basin, best first), then
    the others, best first (the filter's distance rule, :func:`diverse_candidates`, as an order).

    >>> unit = np.array([[0.1, 0.1], [0.12, 0.1], [0.9, 0.9], [0.5, 0.5], [0.3, 0.3]])
    >>> spread_first(unit, np.array([0.0, 1.0, 2.0, np.inf, 3.0]), 0.1, 3).tolist()
    [0, 2, 1, 4]
    """
    order, _ = rank_candidates(np.asarray(foms), int(np.isfinite(foms).sum()))
    points = np.asarray(unit, dtype=np.float64)[order]
    if len(order) == 0:
        return order
    tree = cKDTree(points)
    near = np.zeros(len(order), dtype=bool)
    first = np.zeros(len(order), dtype=bool)
    for i in range(min(len(order), reduced)):
        if not near[i]:
            first[i] = True
            near[tree.query_ball_point(points[i], radius)] = True
    return np.concatenate([order[first], order[~first]])


def _run_filter(problem, dtype, stream, free, limits, band, diverse, programs):
    """``(candidates, foms, chosen, rest, stats, evaluator)``: the broad-start filter's draws,
    their figures of merit, the rows chosen for the free slots, the other finite ones, and the
    compiled evaluator that ranked them.
    ``limits``: ``(n_candidates, max_candidates, width)``."""
    n_candidates, max_candidates, width = limits
    space = problem.space
    max_candidates = n_candidates if max_candidates is None else max(max_candidates, n_candidates)
    t0 = time.perf_counter()
    evaluator = filter_evaluator(problem, dtype, width, programs)
    cand, foms = _draw_finite(stream, evaluator, space, dtype, free, n_candidates, max_candidates)
    n_drawn = len(foms)
    radius = critical_distance(n_drawn, space.n_dims) if diverse else 0.0
    unit = unit_coords(space, cand, band)
    reduced = math.ceil(MLSL_GAMMA * int(np.isfinite(foms).sum()))
    chosen, rest, n_kept = diverse_candidates(unit, foms, free, radius, reduced)
    stats = dict(
        n_candidates=n_drawn,
        n_finite_candidates=len(chosen) + len(rest),
        n_filter_draws=-(-n_drawn // n_candidates),
        max_candidates=max_candidates,
        filter_rule="mlsl" if diverse else "rank",
        critical_distance=radius,
        n_diverse=n_kept,
        filter_batch_size=evaluator.width,
        filter_compile_s=evaluator.compile_s,
        filter_s=time.perf_counter() - t0,
        filter_backoffs=list(evaluator.backoffs),
    )
    return cand, foms, chosen, rest, stats, evaluator


def _log_filter(stats: dict, kept: np.ndarray, free: int, k: int, strategy: str) -> None:
    """What the filter found: a warning when it filled fewer slots than it had, else DEBUG."""
    n_finite, n_drawn = stats["n_finite_candidates"], stats["n_candidates"]
    if kept.size < free:
        missing = free - kept.size
        log.logger.warning(
            "broad-start filter: only %d of %d candidates have a finite figure of merit; "
            "running %d starts, and %d slot%s stay unstarted (status 'unstarted')",
            n_finite,
            n_drawn,
            k + kept.size,
            missing,
            "" if missing == 1 else "s",
        )
        return
    log.logger.debug(
        "broad-start filter: %d %s candidates, %d finite, kept %d (%d at least %.3g apart "
        "in the unit band, figure of merit %.6g .. %.6g) in %.2f s (compile %.2f s)",
        n_drawn,
        strategy,
        n_finite,
        free,
        stats["n_diverse"],
        stats["critical_distance"],
        kept[0],
        kept[-1],
        stats["filter_s"],
        stats["filter_compile_s"],
    )


def _draw_finite(stream, evaluator, space, dtype, free, block, max_candidates):
    """Candidates and their figures of merit, drawn in blocks until ``free`` are finite.

    The first block always runs; further ones (the top-up) only while fewer than ``free`` are
    finite and fewer than ``max_candidates`` have been drawn. Every block goes through the
    same compiled ``evaluator`` (its width is fixed, the ragged block padded): no second compile.
    """
    cand, foms, n_finite = None, None, 0
    while True:
        m = block if foms is None else min(block, max_candidates - len(foms))
        x = stream.draw(m)
        f = evaluator(space.ravel(space.to_unconstrained(x, dtype=np.dtype(dtype))))
        cand, foms = _concat(cand, x), f if foms is None else np.concatenate([foms, f])
        n_finite += int(np.isfinite(f).sum())
        if n_finite >= free or len(foms) >= max_candidates:
            break
    if len(foms) > block:
        log.logger.info(
            "broad-start filter topped up: %d of %d candidates finite after drawing %d more "
            "(max_candidates=%d)",
            n_finite,
            len(foms),
            len(foms) - block,
            max_candidates,
        )
    return cand, foms
