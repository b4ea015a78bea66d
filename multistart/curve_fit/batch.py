"""A stack of datasets fitted as one search (``batched=True``): row ``r`` fits dataset
``r // n_starts``; every fit reported as a fit (:class:`multistart.result.batch.BatchFits`)."""

from __future__ import annotations

import contextlib

import jax
import numpy as np

from ..common import log, xla
from ..device.programs import forget_other_float_types
from ..host import progress
from ..model.priors import Space
from ..result import Result
from ..result.batch import BatchFits, bound_summary
from ..search.least_squares import MultiStartLeastSquares
from .arguments import STEPS_PER_PARAMETER, _bounds, _data, _n_given, _names, _precision
from .covariance import _batch_covariances
from .hold import _hold, _warn_if_tied_outside
from .model import _check_output, _CurveModel
from .starts import _space, _spreads, _stack_p0, _stack_starts

#: A parameter within this of a bound is flagged (``BatchFits.at_bound``), as ``Result.at_bound``.
BOUND_RTOL = 1e-4


#: Options a batch sets itself: each fit draws its own starts, with no filter, and one row of
#: history (every step of every row would be ``n_steps x n_fits x n_starts`` floats).
_BATCH_DEFAULTS = {"start_strategy": "band", "n_candidates": 0, "max_history": 1, "devices": 1}


# A fit of a batch ends its running starts once 3 of its settled starts found its best minimum
# (issue 38: 500 spectra at 32 starts a fit in 0.39-0.58x the wall (two runs) of every start run
# to its end, every fit's χ² within 2.2e-13 of it; profiling/HISTORY.md "A batch's fits end their
# stragglers")
BATCH_REDISCOVERIES = 3


def _fit_batch(
    f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds, nan_policy, resume, hold, **kw
):
    """``(popt, pcov, BatchFits, fvec)`` of a stack of datasets."""
    n_starts = kw.pop("n_starts")
    if isinstance(n_starts, bool) or not isinstance(n_starts, int | np.integer) or n_starts < 1:
        raise ValueError(f"n_starts must be an int >= 1; got {n_starts!r}")
    n_starts = int(n_starts)
    options = _batch_options(kw)
    step, refine = _precision(
        options.pop("dtype", None), len(_names(f, None if p0 is None else _n_given(p0, True)))
    )
    with xla.precision(step):
        forget_other_float_types(step)
        read = (f, xdata, ydata, sigma, p0, check_finite, nan_policy)
        data, all_names, n_fits, f = _data(*read, batched=True)  # f traced once
        all_lower, all_upper = _bounds(bounds, all_names)
        held = _hold(f, all_names, hold, all_lower, all_upper)
        g, names, keep = held.model, list(held.free), held.keep
        if g is not f:
            one = jax.tree_util.tree_map(
                lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), data[0]
            )
            _check_output(g, one, names, np.shape(data[1])[1:], "one fit's ydata shape")
        lower, upper = all_lower[keep], all_upper[keep]
        first = _stack_p0(p0, n_fits, all_names, all_lower, all_upper, keep)
        options = {"n_steps": STEPS_PER_PARAMETER * len(names), **options}
        search = MultiStartLeastSquares(
            absolute_sigma=absolute_sigma, n_starts=n_fits * n_starts, dtype=step, **options
        )
        spread = _spreads(g, names, data, first, lower, upper, stacked=True)
        # One space for every fit, as the programs may not depend on p0.
        reference = np.where(np.isfinite(lower), lower, np.where(np.isfinite(upper), upper, 0.0))
        space = _space(names, reference, lower, upper)
        box = (lower, upper)
        starts = _stack_starts(names, first, box, Space(space), n_starts, search.options, spread)
        model = _CurveModel(g, names, space, data, rows_per_datum=n_starts)
        with progress.fits_of(n_starts):
            result = search.fit(model, starts=starts, resume=resume)
        popt, rows = _per_fit(result, names, n_fits, n_starts)
        with jax.enable_x64(True) if refine else contextlib.nullcontext():
            refined = box if refine else None
            popt, pcov, fvec = _batch_covariances(g, names, data, popt, absolute_sigma, box=refined)
        popt, pcov = held.full(popt), held.full_cov(pcov, popt)
        _warn_if_tied_outside(held, popt, all_lower, all_upper)
        m = int(np.asarray(data[1]).size // n_fits)
        bounds = (all_lower, all_upper)
        fits = _batch_fits(result, held, popt, pcov, rows, bounds, m, n_starts)
        return popt, pcov, fits, fvec


def _batch_options(options: dict) -> dict:
    """The user's options with the batch's defaults; a start strategy or filter that would
    couple the fits is refused (the other couplings by the search: problem.check_stack)."""
    strategy = options.get("start_strategy", "band")
    if strategy not in ("band", "auto"):
        raise ValueError(
            f"batched=True: start_strategy={strategy!r} ranks or replaces starts across the "
            "whole search, so across fits; a batch draws each fit's starts as a single fit "
            "with start_strategy='band', n_candidates=0 would (p0, then draws in the band): "
            "drop start_strategy, or fit those datasets one by one"
        )
    if options.get("n_candidates") not in (None, 0):
        raise ValueError(
            "batched=True runs no broad-start filter (its candidates would be ranked across "
            f"all fits); got n_candidates={options['n_candidates']!r}: drop it"
        )
    # (a rule the stack refuses, named by its own error, leaves the rule off)
    ends_starts = options.get("resurrect") or options.get("schedule", "all") != "all"
    rule = {"rediscoveries": None if ends_starts else BATCH_REDISCOVERIES}
    return {**_BATCH_DEFAULTS, **rule, **options, "start_strategy": "band", "n_candidates": 0}


def _per_fit(result: Result, names, n_fits: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(popt, rows)``: each fit's best start, as a single fit chooses it (the lowest figure
    of merit, the first on ties; ``popt`` nan when none is finite), and its row."""
    foms = np.asarray(result.foms).reshape(n_fits, k)
    finite = np.isfinite(foms)
    best = np.argmin(np.where(finite, foms, np.inf), axis=1)
    rows = np.arange(n_fits) * k + best
    popt = np.stack([np.asarray(result.params[name])[rows] for name in names], axis=1)
    popt[~finite.any(axis=1)] = np.nan
    return popt, rows


def _batch_fits(result, held, popt, pcov, rows, bounds, m: int, k: int) -> BatchFits:
    """The record of every fit, and the one warning for those with a parameter on a bound."""
    n_fits = len(popt)
    free = held.keep
    at_bound = _at_bound(popt, *bounds)
    at_bound[:, ~free] = False  # a held parameter's bound is its value, not the fit's doing
    fits = BatchFits(
        names=tuple(held.names),
        popt=popt,
        pcov=pcov,
        best_fom=np.asarray(result.foms)[rows],
        dof=np.full(n_fits, m - int(free.sum())),
        status=np.asarray(result.status)[rows],
        at_bound=at_bound,
        n_evals=np.asarray(result.n_evals).reshape(n_fits, k).sum(axis=1),
        best_row=rows,
        n_starts=k,
        free=free,
        held=held.words(),
        result=result,
    )
    message = bound_summary(fits)
    if message is not None:
        log.logger.warning("%s", message)
    return fits


def _at_bound(popt: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``(n_fits, n)``: within ``BOUND_RTOL`` of a bound: of a finite box's width, or of
    ``max(|bound|, 1)`` for a one-sided one."""
    boxed = np.isfinite(lower) & np.isfinite(upper)
    span = np.where(boxed, upper - lower, 1.0)
    lo_scale = np.where(boxed, span, np.maximum(np.abs(np.where(np.isfinite(lower), lower, 0)), 1))
    hi_scale = np.where(boxed, span, np.maximum(np.abs(np.where(np.isfinite(upper), upper, 0)), 1))
    with np.errstate(invalid="ignore"):
        near = (popt - lower <= BOUND_RTOL * lo_scale) | (upper - popt <= BOUND_RTOL * hi_scale)
    return near & np.isfinite(popt)
