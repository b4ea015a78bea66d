"""curve_fit's ``pcov``: ``s² (JᵀJ)⁻¹`` at each fit's best point, for one fit and for a batch."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import OptimizeWarning

from ..common import xla
from ..device.programs import programs_for
from ..result import Result, Uncertainty
from ..result.laplace import gram_inverse, residual_scale
from ..solvers.base import linearize
from .model import _model_key


def _with_curvature(result: Result, f, names, data) -> Result:
    """``result`` with its covariance's Jacobian computed by this model's program at one point
    (:func:`_curvature`, the one :func:`_spreads` runs), not one more compile of the same
    ``J``; its columns in the space's order. Where ``f`` cannot key a kept program, or the
    covariance is the full Hessian (``covariance="hessian"``), the Result's own."""
    problem = result._uncertainty.problem
    if problem is None or _model_key(f, names) is None:
        return result
    if getattr(problem, "covariance", None) == "hessian":  # the full Hessian: its own program
        return result
    perm = np.array([names.index(path) for path in problem.space.paths])

    def curvature(vec, data):
        point = np.empty((1, len(names)))
        point[0, perm] = np.asarray(vec)
        jac, ssr, r = _curvature_at(f, names, data, point, stacked=False)
        return jac[0][:, perm], ssr[0], r[0]

    return dataclasses.replace(result, uncertainty=Uncertainty(problem, hessian=curvature))


def _result_covariance(result: Result, names, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pcov, fvec)`` of one fit, ``(1, n, n)`` and ``(1, m)``: the Result's own covariance
    (:func:`multistart.result.laplace.residual_laplace`, one path for both) in ``f``'s order,
    and the weighted residuals at ``popt`` (scipy's ``fvec``); ``pcov`` ``inf`` everywhere,
    with one ``OptimizeWarning``, where a parameter is not determined (curve_fit's way)."""
    if result.best_index < 0:  # no start reached a finite sum of squares
        pcov, fvec = np.full((1, len(names), len(names)), np.nan), np.full((1, m), np.nan)
    else:
        fit = result._uncertainty.at_best(result.best_index, result.best_params, warn=False)
        order = [fit.names.index(name) for name in names]
        assert fit.residuals is not None  # a least-squares problem's Laplace
        pcov, fvec = fit.covariance[np.ix_(order, order)][None], fit.residuals[None]
    return _inf_if_undetermined(pcov, stacked=False), fvec


def _inf_if_undetermined(pcov: np.ndarray, *, stacked: bool) -> np.ndarray:
    """``pcov`` with every fit's matrix ``inf`` where any of it is not finite, and one
    ``OptimizeWarning`` that says for how many fits."""
    bad = ~np.all(np.isfinite(pcov), axis=(1, 2))
    if bad.any():
        which = "" if not stacked else f" for {bad.sum()} of {len(pcov)} fits"
        warnings.warn(
            f"Covariance of the parameters could not be estimated{which}",
            OptimizeWarning,
            stacklevel=5,
        )
        pcov = np.where(bad[:, None, None], np.inf, pcov)
    return pcov


def _batch_covariances(f, names, data, popt, absolute_sigma: bool):
    """``(pcov, fvec)`` of a batch: each fit's covariance as a single fit's Result has it,
    ``s² (JᵀJ)⁻¹`` (:func:`multistart.result.laplace.gram_inverse`), ``(n_fits, n, n)``, from
    one program over every fit, and its weighted residuals ``(n_fits, m)``."""
    a, ssr, fvec = _curvature_at(f, names, data, popt, stacked=True)
    s2 = residual_scale(ssr, fvec.shape[1], popt.shape[1], absolute_sigma)
    with np.errstate(invalid="ignore"):  # inf * 0 off the diagonal: inf anyway
        pcov = gram_inverse(a)[0] * s2[:, None, None]
    return _inf_if_undetermined(pcov, stacked=True), fvec


def _curvature_at(f, names, data, points, *, stacked: bool):
    """``(J, ‖r‖², r)`` of each fit's weighted residuals at ``points`` ``(k, n)``, by the
    program kept for ``f`` and the data's shapes (:func:`_curvature`). ``stacked``: ``data``
    has a leading axis of fits."""
    model = _model_key(f, names)
    leaves, treedef = jax.tree_util.tree_flatten(data)
    shapes = tuple((a.shape, a.dtype.name) for a in map(np.asarray, leaves))
    key = None if model is None else (model, "covariance", stacked, treedef, shapes)
    curvature = programs_for(key).get("covariance", lambda: _curvature(f, names, stacked))
    points = np.asarray(points, dtype=np.float64)
    return tuple(np.asarray(v, dtype=np.float64) for v in curvature(points, data))


def _curvature(f, names, stacked: bool):
    """``jit(vmap(...))``: ``(J, ‖r‖², r)`` of each fit's weighted residuals at its point
    (the same Jacobian as a single fit's Result: :func:`multistart.solvers.base.linearize`)."""

    def one(p, data):
        x, y, weight = data

        def residuals(q):
            r = jnp.ravel(f(x, *(q[i] for i in range(len(names)))) - y)
            return weight(r) if callable(weight) else r * weight

        r, jac, _ = linearize(residuals, p)
        return jac, jnp.vdot(r, r), r

    def multistart_curve_fit_covariance(popt, data):
        return jax.vmap(one, in_axes=(0, 0 if stacked else None))(popt, data)

    return xla.jit(multistart_curve_fit_covariance)
