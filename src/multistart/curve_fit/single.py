"""One dataset's fit: ``(popt, pcov, result, fvec, (names, at_bound))``."""

from __future__ import annotations

import warnings

import jax
import numpy as np
from scipy.optimize import OptimizeWarning

from ..common import xla
from ..device.programs import forget_other_float_types
from ..model.priors import near_bound
from ..search.least_squares import MultiStartLeastSquares
from .arguments import STEPS_PER_PARAMETER, _Args, _bounds, _precision, _vector
from .covariance import _batch_covariances, _result_covariance, _with_curvature
from .hold import _hold, _warn_if_tied_outside
from .model import _check_output, _CurveModel
from .starts import _first_start, _inside, _space, _spreads


def _fit(args: _Args, resume: bool, hold: dict, starts_per_fit: int, /, **options):
    """``(popt, pcov, result, fvec, (names, at_bound))`` of one dataset: ``at_bound``
    ``(1, n)`` its parameters on a bound (an ``OptimizeWarning`` names them). One fit's
    starts are its search's ``n_starts``."""
    step, refine = _precision(options.pop("dtype", None), args.n_params(batched=False))
    absolute_sigma = args.absolute_sigma
    with xla.precision(step):
        forget_other_float_types(step)
        data, all_names, _, f, _ = args.data()  # (a single fit drops the points left out)
        f = _check_output(f, data[0], all_names, data[1].shape)  # the one trace of f
        all_lower, all_upper = _bounds(args.bounds, all_names)
        held = _hold(f, all_names, hold, all_lower, all_upper)
        g, names, keep = held.model, list(held.free), held.keep
        lower, upper = all_lower[keep], all_upper[keep]
        p0 = None if args.p0 is None else _vector(args.p0, len(all_names), "p0")[keep]
        first = _first_start(p0, lower, upper, names)
        if g is not f:
            _check_output(g, data[0], names, data[1].shape)
        options = {"n_steps": STEPS_PER_PARAMETER * len(names), **options}
        search = MultiStartLeastSquares(
            absolute_sigma=absolute_sigma, n_starts=starts_per_fit, dtype=step, **options
        )
        spread = _spreads(g, names, data, first[None], lower, upper, stacked=False)
        space = _space(names, first, lower, upper, spread[0])
        inside = _inside(first, lower, upper)
        starts = {name: np.array([v]) for name, v in zip(names, inside, strict=True)}
        result = search.fit(_CurveModel(g, names, space, data), starts=starts, resume=resume)
        popt = np.array([float(result.best_params[k]) for k in names])
        result = _with_curvature(result, g, names, data)
        if refine and result.best_index >= 0:  # float32 steps: popt and pcov in float64
            with jax.enable_x64(True):
                box = (lower, upper)
                popt, pcov, fvec = _batch_covariances(
                    g, names, data, popt[None], absolute_sigma, box=box, stacked=False
                )
            popt, fvec = popt[0], np.asarray(fvec, dtype=np.float64)
        else:
            pcov, fvec = _result_covariance(result, names, np.asarray(data[1]).size)
        pcov, popt = held.full_cov(pcov, popt[None]), held.full(popt[None])
        _warn_if_tied_outside(held, popt, all_lower, all_upper)
        at_bound = near_bound(popt, all_lower, all_upper) & held.keep
        _warn_on_bound(all_names, at_bound[0])
        return popt[0], pcov[0], result, fvec[0], (tuple(all_names), at_bound)


def _warn_on_bound(names, at_bound: np.ndarray) -> None:
    """One ``OptimizeWarning`` naming the parameters on a bound, as a batch's for its fits."""
    if at_bound.any():  # (curve_fit <- _fit <- here)
        hit = ", ".join(k for k, b in zip(names, at_bound, strict=True) if b)
        warnings.warn(
            f"the fit has a parameter on a bound ({hit}); the optimum may lie outside the "
            "bounds: widen them, or the parameter is not determined there",
            OptimizeWarning,
            stacklevel=4,
        )
