"""A stack of datasets fitted as one search (``batched=True``): row ``r`` fits dataset
``r // n_starts``; every fit reported as a fit (:class:`multistart.result.batch.BatchFits`)."""

from __future__ import annotations

import contextlib
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import OptimizeWarning

from ..common import status, xla
from ..common.status import Status
from ..device.placement import keep_device_copies, send_ahead
from ..device.programs import forget_other_float_types
from ..host import progress
from ..host.checkpoint import SearchInterrupted
from ..host.config import ORDER, SearchConfig
from ..model.priors import Space, near_bound
from ..result import Result
from ..result.batch import BatchFits, bound_summary
from ..result.merge import best_rows
from ..search.least_squares import MultiStartLeastSquares
from ..starts.strategies import stack_starts
from ..width.machine import device_free_memory
from . import missing
from .arguments import STEPS_PER_PARAMETER, _Args, _bounds, _precision
from .covariance import _batch_covariances, compile_ahead
from .hold import _Held, _hold, _warn_if_tied_outside
from .model import _check_output, _CurveModel
from .starts import _inside, _space, _spread_by_curvature, _spreads, _stack_p0

#: Options a batch sets itself: each fit draws its own starts, with no filter, and one row of
#: history (every step of every row would be ``n_steps x n_fits x n_starts`` floats).
_BATCH_DEFAULTS = {"start_strategy": "band", "n_candidates": 0, "max_history": 1, "devices": 1}


# A fit of a batch ends its running starts once 3 of its settled starts found its best minimum
# (issue 38: 500 spectra at 32 starts a fit in 0.39-0.58x the wall (two runs) of every start run
# to its end, every fit's χ² within 2.2e-13 of it; profiling/HISTORY.md "A batch's fits end their
# stragglers")
BATCH_REDISCOVERIES = 3


@dataclass(frozen=True)
class _Batch:
    """A batch read and checked, before its search: what turns the search's Result (whole, or
    interrupted) into its fits (:meth:`fits`).

    Attributes:
      model: ``f`` over the free parameters (:class:`~.hold._Held`'s model); ``held`` the holds.
      names: the free parameters; ``data``: ``(x, y, weight)``, a leading axis of fits.
      starts_per_fit: starts a fit (curve_fit's ``n_starts``).
      bounds: every parameter's ``(lower, upper)``.
      refine: float32 steps, refined in float64 (:func:`.arguments._precision`).
      points: ``(n_fits,)`` each fit's points that count; ``gone``: ``(n_fits, m)`` those
        left out (:mod:`.missing`), ``None`` where none is.
    """

    model: Any
    held: _Held
    names: list
    data: tuple
    starts_per_fit: int
    bounds: tuple
    absolute_sigma: bool
    refine: bool
    points: np.ndarray
    gone: np.ndarray | None

    @property
    def empty(self) -> np.ndarray:
        """``(n_fits,)`` the fits with fewer points than free parameters: not run."""
        return self.points < len(self.names)

    @property
    def box(self) -> tuple | None:
        """The free parameters' ``(lower, upper)`` where the answers are refined, else ``None``."""
        keep = self.held.keep
        return (self.bounds[0][keep], self.bounds[1][keep]) if self.refine else None

    def compile_ahead(self) -> Future | None:
        """The covariance's program (:meth:`fits`) compiling on a worker thread while the search
        runs (:func:`.covariance.compile_ahead`), on a chip; ``None`` on a CPU, or where the
        starts' spreads compiled that very program already (unrefined, a parameter unbounded on
        both sides: :func:`.starts._spreads`). On this project's 2-core CPU a covariance
        compiled in a thread beside the fit made a cold batch of 2,000 fits slower (1.44 s ->
        1.50 s: both compiles and both traces contend for two cores and one interpreter;
        profiling/HISTORY.md "Compiling two programs at once")."""
        keep = self.held.keep
        spread = _spread_by_curvature(self.bounds[0][keep], self.bounds[1][keep])
        if not xla.on_chip() or (spread and not self.refine):
            return None
        x64 = True if self.refine else None
        return compile_ahead(
            self.model, self.names, self.data, len(self.points), box=self.box, x64=x64
        )

    def send_ahead(self) -> None:
        """On a chip, the data sent to it on a worker thread while the starts and the search
        are planned (:func:`multistart.device.placement.send_ahead`), and where the answers
        are refined, sent again in float64 for the refinement while the search runs, where
        that copy takes at most :data:`REFINE_AHEAD_SHARE` of its device's free memory (the
        search's width did not count it: a larger one is sent after the search)."""
        if not xla.on_chip():
            return
        send_ahead(self.data)
        if self.refine:
            device = xla.refine_device(len(self.points))
            bytes64 = sum(8 * np.size(a) for a in jax.tree_util.tree_leaves(self.data))
            free, _ = device_free_memory(device or jax.devices()[0])
            if free is not None and bytes64 <= REFINE_AHEAD_SHARE * free:
                with jax.default_device(device):
                    send_ahead(self.data, x64=True)

    def fits(self, result: Result, *, warn: bool = True, ahead: Future | None = None):
        """``(popt, pcov, BatchFits, fvec, (names, at_bound))`` of the search's ``result``;
        ``ahead``: the covariance's program compiled while it ran (:meth:`compile_ahead`)."""
        n_fits = len(self.points)
        popt, rows = _per_fit(result, self.names, n_fits, self.starts_per_fit)
        points = None if self.gone is None else self.points
        with jax.enable_x64(True) if self.refine else contextlib.nullcontext():
            popt, pcov, fvec = _batch_covariances(
                self.model,
                self.names,
                self.data,
                popt,
                self.absolute_sigma,
                box=self.box,
                points=points,
                ahead=ahead,
            )
            if self.gone is not None:  # no residual where there is no point (in fvec's type)
                fvec = jnp.where(self.gone, jnp.nan, fvec)
        popt, pcov = self.held.full(popt), self.held.full_cov(pcov, popt)
        empty = self.empty
        if empty.any():  # not run: nothing to report, the held parameters' values neither
            popt[empty], pcov[empty] = np.nan, np.nan
        _warn_if_tied_outside(self.held, popt, *self.bounds)
        record = (self.held, popt, pcov, rows, self.bounds, self.points, self.starts_per_fit)
        fits = _batch_fits(result, *record, warn=warn)
        return popt, pcov, fits, fvec, (fits.names, fits.at_bound)


#: The most of a device's free memory a batch's float64 copy of its data, sent for its
#: refinement while the search runs (:meth:`_Batch.send_ahead`), may take: 200,000 fits of 60
#: points are 96 MB of a TPU v5e's 15.7 GB.
REFINE_AHEAD_SHARE = 1 / 16


def _fit_batch(args: _Args, resume: bool, hold: dict, starts_per_fit, /, **kw):
    """``(popt, pcov, BatchFits, fvec, (names, at_bound))`` of a stack of datasets."""
    starts_per_fit = _starts_per_fit(starts_per_fit)
    options = _batch_options(kw, starts_per_fit)
    step, refine = _precision(options.pop("dtype", None), args.n_params(batched=True))
    with xla.precision(step), keep_device_copies():  # the covariance reads the search's data
        forget_other_float_types(step)
        batch, first = _read(args, hold, starts_per_fit, refine)
        batch.send_ahead()
        options = {"n_steps": STEPS_PER_PARAMETER * len(batch.names), **options}
        n = len(first) * starts_per_fit  # the search's n_starts
        search = MultiStartLeastSquares(
            absolute_sigma=args.absolute_sigma, n_starts=n, dtype=step, **options
        )
        model, starts = _model_and_starts(batch, first, search)
        ahead = batch.compile_ahead()
        return batch.fits(_run(search, model, starts, resume, batch, ahead), ahead=ahead)


def _starts_per_fit(k) -> int:
    """curve_fit's ``n_starts``, batched: the starts of each fit, checked."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"n_starts must be an int >= 1; got {k!r}")
    return int(k)


def _read(args: _Args, hold, starts_per_fit: int, refine: bool):
    """``(batch, first)``: the :class:`_Batch` of the arguments ``args``, checked, and each
    fit's first start."""
    data, all_names, n_fits, f, gone = args.data(batched=True)  # f traced once
    p0, absolute_sigma = args.p0, args.absolute_sigma
    all_lower, all_upper = _bounds(args.bounds, all_names)
    held = _hold(f, all_names, hold, all_lower, all_upper)
    g, names = held.model, list(held.free)
    if g is not f:
        one = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), data[0])
        _check_output(g, one, names, np.shape(data[1])[1:], "one fit's ydata shape")
    first = _stack_p0(p0, n_fits, all_names, all_lower, all_upper, held.keep)
    points = missing.points(gone, n_fits, int(np.asarray(data[1])[0].size))
    bounds = (all_lower, all_upper)
    batch = _Batch(
        g, held, names, data, starts_per_fit, bounds, absolute_sigma, refine, points, gone
    )
    if batch.empty.all():  # as a single fit's empty ydata: nothing to fit, refused
        raise ValueError(
            f"ydata: no fit of the batch has {len(names)} points left, as many as its free "
            "parameters (the others nan, masked or of infinite sigma): nothing to fit"
        )
    return batch, first


def _model_and_starts(batch: _Batch, first: np.ndarray, search):
    """The search's model (the fits without points never started) and every fit's starts."""
    keep, names = batch.held.keep, batch.names
    lower, upper = batch.bounds[0][keep], batch.bounds[1][keep]
    spread = _spreads(batch.model, names, batch.data, first, lower, upper, stacked=True)
    # One space for every fit, as the programs may not depend on p0.
    reference = np.where(np.isfinite(lower), lower, np.where(np.isfinite(upper), upper, 0.0))
    space = _space(names, reference, lower, upper)
    # each fit's p0, then the draws a single fit makes, mapped by its own priors
    own = Space(_space(names, first, lower, upper, spread))
    p0 = dict(zip(names, _inside(first, lower, upper).T, strict=True))
    o = search.options
    draws = {"strategy": o.start_strategy, "band": o.start_band, "seed": o.seed}
    starts = stack_starts(Space(space), p0, own, batch.starts_per_fit, **draws)
    empty = batch.empty if batch.empty.any() else None
    model = _CurveModel(
        batch.model, names, space, batch.data, rows_per_datum=batch.starts_per_fit, empty_data=empty
    )
    return model, starts


def _run(search, model, starts, resume: bool, batch: _Batch, ahead=None) -> Result:
    """The search's Result; stopped by Ctrl-C or SIGTERM, its
    :class:`multistart.SearchInterrupted` carries the fits so far (``.fits``: those that
    ended, and those still running marked ``interrupted``, with their best so far; their
    covariance by ``ahead``, the program compiled while the search ran, where it was)."""
    try:
        with progress.fits_of(batch.starts_per_fit):
            return search.fit(model, starts=starts, resume=resume)
    except SearchInterrupted as e:
        if e.result is not None:
            with warnings.catch_warnings():  # the fits so far: no warning about them now
                warnings.simplefilter("ignore", OptimizeWarning)
                e.fits = batch.fits(e.result, warn=False, ahead=ahead)[2]
        raise


def _batch_options(options: dict, per_fit: int) -> dict:
    """The user's options with the batch's defaults for ``per_fit`` starts a fit; a start
    strategy or filter that would couple the fits is refused (the other couplings by the
    search: problem.check_stack)."""
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
    batch = {**_BATCH_DEFAULTS, **options, "start_strategy": "band", "n_candidates": 0}
    # the rule only where no option that ends starts by its own rule (the configuration's one
    # list of couplings) is given; one the stack refuses is named by its own error
    given = SearchConfig(**{k: v for k, v in batch.items() if k in ORDER})
    ends_starts = any(c.ends_starts for c in given.couplings())
    # nor where a fit has fewer starts than the rule needs to act: it could end none, and its
    # readings (every start's point each REFOUND_EVERY steps) would cost a wide batch's calls
    idle = ends_starts or per_fit < BATCH_REDISCOVERIES
    rule = {"rediscoveries": None if idle else BATCH_REDISCOVERIES}
    return {**_BATCH_DEFAULTS, **rule, **options, "start_strategy": "band", "n_candidates": 0}


def _per_fit(result: Result, names, n_fits: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(popt, rows)``: each fit's best start, as a single fit chooses it (the lowest figure
    of merit, the first on ties; ``popt`` nan when none is finite), and its row."""
    rows, found = best_rows(np.asarray(result.foms).reshape(n_fits, k))
    popt = np.stack([np.asarray(result.params[name])[rows] for name in names], axis=1)
    popt[~found] = np.nan
    return popt, rows


def _batch_fits(
    result, held, popt, pcov, rows, bounds, points, k: int, *, warn: bool = True
) -> BatchFits:
    """The record of every fit, and one ``OptimizeWarning`` for those with a parameter on a
    bound (``warn``)."""
    n_fits = len(popt)
    free = held.keep
    n_free = int(free.sum())
    at_bound = near_bound(popt, *bounds)
    at_bound[:, ~free] = False  # a held parameter's bound is its value, not the fit's doing
    best_fom = np.asarray(result.foms)[rows]
    empty = points < n_free
    if empty.any():
        best_fom = np.where(empty, np.nan, best_fom)
    fits = BatchFits(
        names=tuple(held.names),
        popt=popt,
        pcov=pcov,
        best_fom=best_fom,
        dof=np.maximum(points - n_free, 0),
        status=_fit_status(result, rows, n_fits, k),
        at_bound=at_bound,
        n_evals=np.asarray(result.n_evals).reshape(n_fits, k).sum(axis=1),
        best_row=rows,
        n_starts=k,
        free=free,
        held=held.words(),
        result=result,
        n_points=points,
    )
    message = bound_summary(fits)
    if message is not None and warn:  # (curve_fit <- _fit_batch <- _Batch.fits <- here)
        warnings.warn(message, OptimizeWarning, stacklevel=5)
    return fits


#: a start still running when the search stopped: its fit is still running too
_STILL_RUNNING = (Status.STOPPED.code, Status.INTERRUPTED.code)


def _fit_status(result, rows: np.ndarray, n_fits: int, k: int) -> np.ndarray:
    """``(n_fits,)`` each fit's :class:`multistart.Status`: its best start's, but where the
    search stopped before all its starts ended (a budget: ``stopped``; Ctrl-C or SIGTERM:
    ``interrupted``), which says the fit is still running (its best so far is kept)."""
    codes = result.status_codes.reshape(n_fits, k)
    out = codes.reshape(-1)[rows]
    for code in _STILL_RUNNING:
        out = np.where((codes == code).any(axis=1), code, out)
    return status.members(out)
