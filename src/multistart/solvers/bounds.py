"""Bounds in the logistic coordinate: where a bounded prior's map saturates, and the
projected trial that takes a coordinate there in one step.

A bounded prior's logistic coordinate ``u`` (:mod:`multistart.model.priors`) reaches its
bound only asymptotically: near it the figure of merit is ``f_bound + c exp(-|u|)``, whose
gradient in ``u`` vanishes with the distance, so a start whose minimum lies on the bound
creeps there (quasi-Newton steps grow ``|u|`` by about ``log 2`` a step; a damped
Gauss-Newton step, whose scaling remembers the column's larger past, by far less). A rule that
``projects_to_bounds`` does what L-BFGS-B's projection does instead: the first trial from a
new point takes a coordinate near a bound whose step leads out to the saturation point (the
bound to rounding), and a trial that fails there is tried again unprojected, once and for all,
so a minimum just inside a bound is reached as before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["NEAR_BOUND", "saturation", "to_bounds", "on_bounds", "at_bound", "inside"]
__all__ += ["prior_scale"]

# A bounded coordinate this close to its bound (in the prior's unit interval) whose step
# leads out is taken to the bound by a fresh trial (see to_bounds).
NEAR_BOUND = 1e-2


def saturation(dtype) -> float:
    """The logistic coordinate ``u`` at which a bounded prior's map
    (:mod:`multistart.model.priors`) rounds to its bound: at
    ``u = log(1 / eps)`` the unit value ``sigmoid(u)`` is ``1 - eps`` (``eps`` of ``dtype``),
    so the physical value is the bound to rounding of the prior's range, and the gradient
    there, ``eps`` times the physical one, still has its sign. 36.0 in float64, 15.9 in
    float32."""
    return float(-np.log(np.finfo(dtype).eps))


def to_bounds(x, d, fresh, bounded, *, alpha=None, unprojected=None):
    """The trial point ``x + alpha d`` (``alpha > 0``; ``None``: 1) with its bounded logistic
    coordinates within :data:`NEAR_BOUND` of a bound, whose direction ``d`` leads out, put on
    the bound (the saturation point) when ``fresh`` and not ``unprojected``; no bounded
    coordinate goes beyond it.

    ``bounded``: a bool per coordinate (a bounded prior's logistic one), or ``None`` (no
    projection).
    """
    trial = x + (d if alpha is None else alpha * d)
    if bounded is None:
        return trial
    bounded = jnp.asarray(bounded)
    if unprojected is not None:
        fresh = fresh & ~unprojected
    sat = saturation(x.dtype)
    near = float(np.log((1.0 - NEAR_BOUND) / NEAR_BOUND))
    up = bounded & fresh & (x > near) & (d > 0)
    down = bounded & fresh & (x < -near) & (d < 0)
    out = jnp.where(up, sat, jnp.where(down, -sat, trial))
    return jnp.where(bounded, jnp.clip(out, -sat, sat), out)


def on_bounds(x, g, bounded, *, started, base, d, alpha=None):
    """``(projected, leaves)`` at the point ``x`` just evaluated, its gradient ``g``:

    - ``projected``: was it a projected trial, a bounded coordinate put on its bound by
      :func:`to_bounds` where the step alone (``base + alpha d``) would not have reached it?
    - ``leaves``: is a coordinate on its bound there with the descent direction ``-g`` leading
      inside? Its minimum lies inside, and its gradient there, ``eps`` times the physical one,
      is too small to bring it back.

    Both ``False`` without ``bounded``.
    """
    if bounded is None:
        return jnp.bool_(False), jnp.bool_(False)
    sat = saturation(x.dtype)
    at = jnp.asarray(bounded) & (jnp.abs(x) >= sat)
    unprojected = base + (d if alpha is None else alpha * d)
    projected = started & jnp.any(at & (jnp.abs(unprojected) < sat))
    return projected, jnp.any(at & (x * g > 0))


def at_bound(x, bounded):
    """A bool per coordinate: a bounded logistic coordinate on its bound (at or beyond the
    saturation point); all ``False`` without ``bounded``."""
    if bounded is None:
        return jnp.zeros(x.shape, bool)
    return jnp.asarray(bounded) & (jnp.abs(x) >= saturation(x.dtype))


def inside(x, g, bounded):
    """A bool per coordinate: ``False`` where a bounded coordinate is on its bound (the
    saturation point) and the descent direction ``-g`` leads out, so the bound holds it and its
    gradient, ``eps`` times the physical one there, is no test of optimality (the projected
    gradient is zero). All ``True`` without ``bounded``."""
    return ~(at_bound(x, bounded) & (x * g < 0))


def prior_scale(x, bounded):
    """How far the prior's own coordinate ``z`` (the physical value, or its log for a
    log-uniform prior) moves for a step in the logistic coordinate, relative to the least it
    moves inside :data:`NEAR_BOUND` of the bounds: 1 there and for a coordinate that is not
    bounded; ``σ'(u) / σ'(u_near)`` nearer a bound (``σ' = σ (1 - σ)``, at least ``eps``).

    A rule that scales its steps by a column's largest past curvature (Marquardt's scaling)
    scales a coordinate near its bound by this squared, so the column's collapse in ``u``
    there, which is the map's and not the model's, does not damp its steps to a crawl."""
    if bounded is None:
        return jnp.ones_like(x)
    near = float(np.log((1.0 - NEAR_BOUND) / NEAR_BOUND))
    s = jax.nn.sigmoid(x)
    slope = s * (1.0 - s) / (NEAR_BOUND * (1.0 - NEAR_BOUND))
    ratio = jnp.minimum(jnp.maximum(slope, jnp.finfo(x.dtype).eps), 1.0)
    return jnp.where(jnp.asarray(bounded) & (jnp.abs(x) > near), ratio, 1.0)
