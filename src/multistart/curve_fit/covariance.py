"""curve_fit's ``pcov``: ``s² (JᵀJ)⁻¹`` at each fit's best point, for one fit and for a batch."""

from __future__ import annotations

import contextlib
import warnings
from concurrent.futures import Future

import jax
import numpy as np
from scipy.optimize import OptimizeWarning

from ..common import background, xla
from ..device.placement import data_on_device
from ..device.programs import programs_for
from ..result import Result, Uncertainty, laplace
from ..result.laplace import (
    Curvature,
    refine_in_blocks,
    residual_curvature,
    residual_refinement,
    residual_scale,
    settle_inverses,
)
from .model import _CurveModel, _model_key


def _with_curvature(result: Result, f, names, data) -> Result:
    """``result`` with its covariance computed by this model's program at one point
    (:func:`_curvature_at`, the one :func:`_spreads` runs and a batch's covariance runs), not
    one more compile of the same ``J``; its columns in the space's order. Where ``f`` cannot
    key a kept program, or the covariance is the full Hessian (``covariance="hessian"``), the
    Result's own."""
    problem = result.problem
    if problem is None or _model_key(f, names) is None:
        return result
    if getattr(problem, "covariance", None) == "hessian":  # the full Hessian: its own program
        return result
    perm = np.array([names.index(path) for path in problem.space.paths])

    def curvature(vecs, data):
        points = np.empty((len(vecs), len(names)))
        points[:, perm] = np.asarray(vecs)
        out = Curvature(*map(np.asarray, _curvature_at(f, names, data, points, stacked=False)))
        return Curvature(
            jac=out.jac[:, :, perm],
            ssr=out.ssr,
            r=out.r,
            norms=out.norms[:, perm],
            inverse=out.inverse[:, perm][:, :, perm],
            bad=out.bad[:, perm],
            sure=out.sure,
            at=out.at[:, perm],
        )

    return result.replaced(uncertainty=Uncertainty(problem, hessian=curvature))


def _result_covariance(result: Result, names, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pcov, fvec)`` of one fit, ``(1, n, n)`` and ``(1, m)``: the Result's own covariance
    (:func:`multistart.result.laplace.residual_laplace`, one path for both) in ``f``'s order,
    and the weighted residuals at ``popt`` (scipy's ``fvec``); ``pcov`` ``inf`` everywhere,
    with one ``OptimizeWarning``, where a parameter is not determined (curve_fit's way)."""
    if result.best_index < 0:  # no start reached a finite sum of squares
        pcov, fvec = np.full((1, len(names), len(names)), np.nan), np.full((1, m), np.nan)
    else:
        with warnings.catch_warnings():  # said curve_fit's way: the OptimizeWarning below
            warnings.simplefilter("ignore", RuntimeWarning)
            fit = result.laplace
        order = [fit.names.index(name) for name in names]
        assert fit.residuals is not None  # a least-squares problem's Laplace
        pcov, fvec = fit.covariance[np.ix_(order, order)][None], fit.residuals[None]
    return _inf_if_undetermined(pcov, stacked=False), fvec


def _inf_if_undetermined(pcov: np.ndarray, *, stacked: bool, skip=None) -> np.ndarray:
    """``pcov`` (an array of the caller's own, changed in place: 200,000 fits' matrices are
    26 MB, whose every new copy the host pays for) with every fit's matrix ``inf`` where any of
    it is not finite, and one ``OptimizeWarning`` that says for how many fits; ``skip``:
    ``(n_fits,)`` fits not run (no data), their matrix ``nan`` and not counted."""
    bad = ~np.all(np.isfinite(pcov), axis=(1, 2))
    if skip is not None:
        bad &= ~skip
        pcov[skip] = np.nan
    if bad.any():
        which = "" if not stacked else f" for {bad.sum()} of {len(pcov)} fits"
        warnings.warn(
            f"Covariance of the parameters could not be estimated{which}",
            OptimizeWarning,
            stacklevel=5,
        )
        pcov[bad] = np.inf
    return pcov


def _batch_covariances(
    f, names, data, popt, absolute_sigma: bool, *, box=None, stacked=True, points=None, ahead=None
):
    """``(popt, pcov, fvec)`` of a batch: each fit's covariance as a single fit's Result has it,
    ``s² (JᵀJ)⁻¹``, ``(n_fits, n, n)``, from one program over every fit that computes each
    ``(JᵀJ)⁻¹`` on the device (:func:`multistart.result.laplace.residual_curvature`), and the
    weighted residuals ``(n_fits, m)`` (scipy's ``fvec``: a device array, read only when
    asked for). With ``box``, ``popt`` is refined first (in the program's float type: a
    float32 search's answer refined in float64) and returned refined. ``stacked=False``: one
    fit's (``popt`` ``(1, n)``). ``points``: ``(n_fits,)`` each fit's points that count (those
    left out have weight 0: not in ``s²``'s degrees of freedom), and a fit with fewer than
    ``n`` was not run: its ``pcov`` ``nan``; ``None``: every point of every fit. ``ahead``:
    the program compiled while the search ran (:func:`compile_ahead`), where it was."""
    out = _curvature_at(f, names, data, popt, stacked=stacked, box=box, ahead=ahead)
    if box is not None:  # (a float32 search's answer, refined: float64 arrays from here)
        popt = np.where(np.isfinite(popt), np.asarray(out.at, dtype=np.float64), popt)
    ssr = np.asarray(out.ssr, dtype=np.float64)
    m = out.r.shape[1] if points is None else points
    s2 = residual_scale(ssr, m, popt.shape[1], absolute_sigma)
    inverse, _ = settle_inverses(out)  # (a float64 array of its own: scaled where it lies)
    with np.errstate(invalid="ignore"):  # inf * 0 off the diagonal: inf anyway
        pcov = np.multiply(inverse, s2[:, None, None], out=inverse)
    empty = None if points is None else points < popt.shape[1]
    return popt, _inf_if_undetermined(pcov, stacked=stacked, skip=empty), out.r


def _curvature_at(f, names, data, points, *, stacked: bool, box=None, ahead=None) -> Curvature:
    """The :class:`~multistart.result.laplace.Curvature` of each fit's weighted residuals at
    ``points`` ``(k, n)`` (device arrays), by the program kept for ``f`` and the data's shapes.
    ``stacked``: ``data`` has a leading axis of fits; ``box``: ``(lower, upper)`` to refine
    the points in first, on :func:`multistart.common.xla.refine_device` (a chip without float64
    arithmetic refines a few fits on its host's CPU, from the data as given, on the host).
    ``ahead``: a Future of that program's compile for these arguments' types
    (:func:`compile_ahead`), waited for first."""
    points = np.asarray(points, dtype=np.float64)
    if box is None:
        # the data's device copy the search made, where it was kept (a batch's)
        program = _curvature_program(f, names, data, stacked)
        return _call(ahead, program, points, data_on_device(data))
    lower, upper = (np.asarray(b, dtype=np.float64) for b in box)
    points = np.where(np.isfinite(points), points, lower)
    with _refining(len(points)):
        try:
            return _refined_curvature(f, names, data, stacked, points, (lower, upper), ahead)
        except (TypeError, ValueError) as e:
            # f traced again in float64 after the float32 search: a NumPy array it captures is
            # served as the float32 copy JAX keeps of it (device/programs.forget_other_float_types)
            if "float32" not in str(e) and "compatible types" not in str(e):
                raise
            jax.clear_caches()
            return _refined_curvature(f, names, data, stacked, points, (lower, upper), None)


def _refined_curvature(f, names, data, stacked: bool, points, box, ahead) -> Curvature:
    """The curvature at ``points`` refined in ``box`` first (:func:`_curvature_at`), in the
    refinement's context: one program, or where :func:`_in_blocks`, the refinement's steps in
    blocks (:func:`multistart.result.laplace.refine_in_blocks`) and then the curvature where
    they end."""
    curvature = _curvature_program(f, names, data, stacked)
    if not _in_blocks(len(points), stacked):
        return _call(ahead, curvature, points, data_on_device(data), box)
    first, more = _refinement_programs(f, names, data)  # (compiled beside the search: ahead)
    points = _call(ahead, refine_in_blocks, first, more, points, data, box)
    return curvature(points, data_on_device(data))


def _in_blocks(n_fits: int, stacked: bool) -> bool:
    """Whether a refinement of ``n_fits`` stacked fits, in the context it runs in, takes its
    steps in blocks: more than :data:`multistart.result.laplace.REFINE_BLOCK` fits, refined
    on a CPU (:func:`multistart.result.laplace.refine_in_blocks`; a chip takes a fixed
    number of steps, all fits in one program)."""
    return stacked and n_fits > laplace.REFINE_BLOCK and xla.platform() == "cpu"


def _refining(n_fits: int):
    """The context a refinement of ``n_fits`` runs in: on :func:`xla.refine_device`."""
    return jax.default_device(xla.refine_device(n_fits))


def _call(ahead: Future | None, program, *args):
    """``program(*args)``, once the compile ``ahead`` of it (:func:`compile_ahead`) ended:
    JAX keeps that lowering's executable for the program's own call, which then compiles
    nothing; where it failed, the call compiles as it would without it."""
    if ahead is not None:
        ahead.exception()  # waits; its error, if any, is the call's to meet again
    return program(*args)


def compile_ahead(f, names, data, n_fits: int, *, box=None, x64: bool | None = None) -> Future:
    """A Future of the batch's covariance program (:func:`_curvature_at` for ``n_fits`` fits of
    the stacked ``data``, refined in ``box`` where given) lowered and compiled on a worker
    thread, while the search runs: on a chip its compile (about 4 s for 200,000 fits on a TPU
    v5e) is then paid beside the search's, on the host's other cores, not after it. Made in the
    caller's float type, or with float64 on or off (``x64``) as :meth:`_Batch.fits` will call
    it; the caller's default device. JAX keeps the executable for the jitted program's own
    call with arguments of those types (a test checks that it compiles once, on the worker);
    an exception that stops it is the Future's, and the program then compiles when called."""
    enabled = jax.config.jax_enable_x64 if x64 is None else x64  # type: ignore[attr-defined]
    device = jax.config.jax_default_device  # type: ignore[attr-defined]

    def compile_it():
        with jax.enable_x64(enabled), jax.default_device(device):
            refine = _refining(n_fits) if box is not None else contextlib.nullcontext()
            with refine:
                program = _curvature_program(f, names, data, stacked=True)
                points = _spec((n_fits, len(names)), np.float64)
                bounds = (_spec((len(names),), np.float64),) * 2
                if box is None:
                    return program.lower(points, _specs(data)).compile()
                if not _in_blocks(n_fits, stacked=True):
                    return program.lower(points, _specs(data), bounds).compile()
                # the refinement's two block programs, and the curvature where they end
                program.lower(points, _specs(data)).compile()
                block = _spec((laplace.REFINE_BLOCK, len(names)), np.float64)
                rows = _specs(data, rows=laplace.REFINE_BLOCK)
                counts = (_spec((laplace.REFINE_BLOCK,), np.int32), _spec((), np.int32))
                for refine_program in _refinement_programs(f, names, data):
                    refine_program.lower(block, rows, bounds, *counts).compile()

    return background.submit("covariance", compile_it)


def _spec(shape, dtype) -> jax.ShapeDtypeStruct:
    """The type JAX gives an array of ``shape`` and ``dtype`` now (float64 as float32 where
    ``jax_enable_x64`` is off)."""
    return jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype))


def _specs(data, rows: int | None = None):
    """The types of ``data``'s leaves as :func:`multistart.device.placement.data_on_device`
    puts them; ``rows``: of that many of their rows (a block's)."""

    def spec(a):
        shape = np.shape(a) if rows is None else (rows, *np.shape(a)[1:])
        return _spec(shape, np.result_type(a))

    return jax.tree_util.tree_map(spec, data)


def _curvature_program(f, names, data, stacked: bool):
    """The curvature program kept for ``f``, the data's shapes and the platform it runs on."""
    flat = _flat_residuals(f, names)
    kept = _kept(f, names, data, ("covariance", stacked))
    return kept.get("covariance", lambda: residual_curvature(flat, stacked=stacked))


def _refinement_programs(f, names, data):
    """The two block programs of a refinement
    (:func:`multistart.result.laplace.residual_refinement`: the first steps and the rest) kept
    for ``f``, the shapes of a fit's data and the platform: one pair whatever the number of
    fits."""
    kept, flat = _kept(f, names, data, ("refinement",), per_fit=True), _flat_residuals(f, names)
    first = kept.get("refine-first", lambda: residual_refinement(flat, first=True))
    return first, kept.get("refine-more", lambda: residual_refinement(flat, first=False))


def _kept(f, names, data, what: tuple, *, per_fit: bool = False):
    """The :func:`~multistart.device.programs.programs_for` of ``f``'s programs ``what`` for
    the shapes of ``data``'s leaves (``per_fit``: of one fit's, without the leading axis) and
    the platform they run on; a fresh one, kept nowhere, where ``f`` cannot key them."""
    model = _model_key(f, names)
    if model is None:
        return programs_for(None)
    leaves, treedef = jax.tree_util.tree_flatten(data)
    shapes = tuple(
        (np.shape(a)[1:] if per_fit else np.shape(a), np.result_type(a).name) for a in leaves
    )
    return programs_for((model, *what, treedef, shapes, xla.platform()))


def _flat_residuals(f, names):
    """``f``'s weighted residuals of one parameter vector (in ``names``' order) and data."""
    residuals = _CurveModel.weighted(f, names)

    def flat(vec, data):
        return residuals({k: vec[i] for i, k in enumerate(names)}, data)

    return flat
