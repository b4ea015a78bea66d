"""Where a curve_fit's starts come from: ``p0`` (or scipy's default), the priors of the box,
and how widely the draws spread around ``p0`` where a parameter is unbounded. The draws are
:mod:`multistart.starts.strategies`' (``plan_starts``; a batch's ``stack_starts``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model.priors import HalfBounded, Normal, Uniform
from ..starts.strategies import BOUND_MARGIN
from .arguments import _vector
from .covariance import _curvature_at


def _first_start(p0, lower, upper, names=None) -> np.ndarray:
    """``p0``, checked against the bounds, or scipy's default start."""
    if p0 is not None:
        _check_p0(p0, lower, upper, names or [f"p{i}" for i in range(len(p0))])
        return p0
    lo_open, hi_open = np.isinf(lower), np.isinf(upper)
    start = np.ones_like(lower)
    both = ~lo_open & ~hi_open
    start[both] = 0.5 * (lower[both] + upper[both])
    start[~lo_open & hi_open] = lower[~lo_open & hi_open] + 1.0
    start[lo_open & ~hi_open] = upper[lo_open & ~hi_open] - 1.0
    return start


def _check_p0(p0, lower, upper, names) -> None:
    """``p0`` (``(n,)``, or ``(n_fits, n)``) must be finite and inside the bounds."""
    bad = np.atleast_2d(~np.isfinite(p0) | (p0 < lower) | (p0 > upper))
    if bad.any():
        i = int(np.argmax(bad.any(axis=1)))
        fit = f" of fit {i}" if np.ndim(p0) > 1 else ""
        where = [names[j] for j in np.flatnonzero(bad[i])]
        raise ValueError(f"p0{fit} is not finite or lies outside bounds at parameter(s) {where}")


def _inside(p0, lower, upper) -> np.ndarray:
    """``p0`` moved just inside a bound it sits on, as scipy's trf makes its start strictly
    feasible (a start on a bound never moves: its coordinate there is infinite). Column by
    column (a parameter's bounds are numbers there; NumPy broadcasting a short last axis runs
    a loop of its length): a margin of the box's width, or of ``max(|p0|, 1)`` without one."""
    p0 = np.asarray(p0)
    out = np.empty(p0.shape, np.result_type(p0, lower, upper))
    for j in range(p0.shape[-1]):
        lo, hi, x = lower[j], upper[j], p0[..., j]
        width = hi - lo
        span = width if np.isfinite(width) else np.maximum(np.abs(x), 1.0)
        x = np.maximum(x, lo + 4 * BOUND_MARGIN * span) if np.isfinite(lo) else x
        out[..., j] = np.minimum(x, hi - 4 * BOUND_MARGIN * span) if np.isfinite(hi) else x
    return out


def _space(names, first, lower, upper, spread=None) -> dict[str, Any]:
    """Each parameter's prior: its box, its one open side, or a normal around its start
    ``first``, ``(n,)`` or one per fit ``(n_fits, n)`` (then the priors are per fit), of width
    ``spread`` (:func:`_spreads`; default ``max(|first|, 1)``)."""
    first = np.asarray(first)
    spread = np.maximum(np.abs(first), 1.0) if spread is None else np.asarray(spread)
    space: dict[str, Any] = {}
    for name, x0, width, lo, hi in zip(names, first.T, spread.T, lower, upper, strict=True):
        if np.isfinite(lo) and np.isfinite(hi):
            space[name] = Uniform(lo, hi)
        elif np.isfinite(lo) or np.isfinite(hi):
            bound, side = (lo, "lower") if np.isfinite(lo) else (hi, "upper")
            typical = np.where(x0 != bound, x0, bound + (1.0 if side == "lower" else -1.0))
            space[name] = HalfBounded(bound, typical, side=side)
        else:
            space[name] = Normal(x0, width)
    return space


def _spreads(f, names, data, first, lower, upper, *, stacked: bool) -> np.ndarray:
    """``(k, n)``: how widely the starts of a parameter unbounded on both sides are drawn
    around ``first``: the change that alone would move the weighted residuals by their norm
    at ``first``, ``‖r‖ / ‖∂r/∂pⱼ‖`` (the linearised distance the misfit allows), rounded up
    to a power of ten (so the space, a constant of the program, changes only with that
    decade) and at most ``max(|first|, 1)`` (where the residuals are 0 or blind to it too).
    A line centre at 6563 Å with a 2 Å width is drawn within Ångströms, not ±6563."""
    base = np.maximum(np.abs(first), 1.0)
    if not _spread_by_curvature(lower, upper):
        return base
    out = _curvature_at(f, names, data, first, stacked=stacked)
    ssr, norms = np.asarray(out.ssr, np.float64), np.asarray(out.norms, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.sqrt(ssr)[:, None] / norms
        decade = 10.0 ** np.ceil(np.log10(scale))
    return np.where(np.isfinite(decade) & (decade > 0), np.minimum(decade, base), base)


def _spread_by_curvature(lower, upper) -> bool:
    """Whether :func:`_spreads` reads the curvature at p0: a parameter unbounded on both sides."""
    return bool(np.any(np.isinf(lower) & np.isinf(upper)))


def _stack_p0(p0, n_fits: int, names, lower, upper, keep) -> np.ndarray:
    """:func:`_first_start` of each fit's free parameters (``keep``), ``(n_fits, n_free)``;
    ``p0`` is one for all or one per fit."""
    n = len(names)
    lower, upper, free = (
        lower[keep],
        upper[keep],
        [k for k, f in zip(names, keep, strict=True) if f],
    )
    if p0 is None or np.ndim(p0) <= 1:
        one = None if p0 is None else _vector(p0, n, "p0")[keep]
        return np.tile(_first_start(one, lower, upper, free), (n_fits, 1))
    first = np.asarray(p0, dtype=np.float64)
    if first.shape != (n_fits, n):
        raise ValueError(
            f"p0 must be one start ({n},) for every fit or one per fit ({n_fits}, {n}); got "
            f"shape {first.shape}"
        )
    first = first[:, keep]
    _check_p0(first, lower, upper, free)
    return first
