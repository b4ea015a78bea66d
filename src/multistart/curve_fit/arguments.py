"""scipy's arguments read and checked: ``f``'s parameters, the data and their weights, the
bounds, ``nan_policy``, and scipy's options that mean something else here, refused."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import Bounds

from ..common import xla
from ..host.config import check_dtype, unknown_options
from ..search.least_squares import MultiStartLeastSquares
from ..solvers import small
from . import missing
from .model import _check_output, _trace

#: curve_fit's default starts for one fit, and for each fit of a batch (``batched=True``): a
#: batch waits for its slowest start, so its wall grows faster than its starts; 8 a fit kept
#: a batch of line fits under scipy's single-start loop with at least its good fits, where 32
#: took twice that loop (measured: docs/curve-fit.md, "How many starts a fit of a batch").
N_STARTS, N_STARTS_BATCH = 32, 8


def _default_starts(n_starts, batched: bool):
    """``n_starts``, or (``None``) the default for one fit or a batch's fits."""
    if n_starts is None:
        return N_STARTS_BATCH if batched else N_STARTS
    return n_starts


#: curve_fit's default ``n_steps`` per parameter (scipy's ``max_nfev`` for ``"trf"``: 100 n).
STEPS_PER_PARAMETER = 100


_METHODS = {None: "lm", "lm": "lm", "dogleg": "dogleg", "gauss-newton": "gauss-newton"}


def _precision(dtype, n: int) -> tuple[str, bool]:
    """``(the search's float type, refine)`` for ``n`` parameters: curve_fit answers in
    float64, as scipy, unless ``dtype="float32"``. On a chip without float64 arithmetic (a
    TPU) a float64 answer comes from float32 steps refined in float64 at the end
    (:func:`multistart.result.laplace.residual_curvature`), for up to
    :data:`multistart.solvers.small.MAX_N` parameters (solved entry by entry there; more step
    in the chip's emulated float64)."""
    dtype = check_dtype(dtype)
    if dtype == "float32":
        return "float32", False
    if xla.native_float64() or n > small.MAX_N:
        return "float64", False
    return "float32", True


def _check_choices(method, jac, absolute_sigma, full_output, batched=False, resume=False) -> None:
    if jac is not None:
        raise ValueError(
            "jac: the Jacobian comes from JAX's automatic differentiation of f; pass jac=None"
        )
    if method not in _METHODS:
        raise ValueError(
            f"method must be 'lm' (default), 'dogleg' or 'gauss-newton'; got {method!r} "
            "(scipy's 'trf' and 'dogbox' exist to respect bounds: every method here does)"
        )
    flags = (("absolute_sigma", absolute_sigma), ("full_output", full_output))
    for name, value in (*flags, ("batched", batched), ("resume", resume)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False; got {value!r}")


def _check_scipy_options(options: dict) -> None:
    """scipy's budget arguments, which count something else here, refused with the call that
    works."""
    for name in ("maxfev", "max_nfev"):
        if name in options:
            raise TypeError(
                f"{name}={options[name]!r}: scipy's budget of evaluations for one start; here "
                "each start takes at most n_steps steps (one evaluation of the residuals and "
                f"their Jacobian each; default 100 per parameter): pass n_steps={options[name]!r}"
                " (max_evals caps the evaluations of every start together, of every fit of a "
                "batch: not scipy's meaning)"
            )
    # a misspelt option named, with the nearest, before anything is traced
    unknown_options(options, MultiStartLeastSquares)


def _array_if_list(xdata):
    """A list ``xdata`` is an array, as scipy reads it (a tuple or dict stays a pytree)."""
    return np.asarray(xdata, dtype=np.float64) if isinstance(xdata, list) else xdata


def _names(f, n: int | None) -> list[str]:
    """The parameters' names: ``f``'s arguments after ``x`` (scipy reads their number there)."""
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        params = list(sig.parameters.values())
        positional = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
        if not variadic and len(positional) < 2:
            raise ValueError(
                f"f must take x and at least one parameter, f(x, a, b, ...); got {sig}"
            )
        if not variadic:
            if n is not None and n != len(positional) - 1:
                raise ValueError(
                    f"p0 must have one value per parameter of f ({len(positional) - 1}: "
                    f"{', '.join(positional[1:])}); got {n}"
                )
            return positional[1:]
    if n is None:
        raise ValueError("p0 is needed to know the number of parameters of f(x, *params)")
    return [f"p{i}" for i in range(n)]


def _enough_points(y: np.ndarray, names) -> None:
    if y.size < len(names):  # as scipy: no fit of n parameters to fewer points
        raise ValueError(
            f"ydata has {y.size} point(s) (per fit), fewer than f's {len(names)} parameters"
        )


def _finite(name: str, a: np.ndarray, *, batched: bool = False) -> None:
    if not np.all(np.isfinite(a)):
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise ValueError(
            f"{name} holds {bad} non-finite value(s) (nan or inf): {_fix(name, batched)}"
        )


def _fix(name: str, batched: bool) -> str:
    """How to fit data with missing points, for the argument ``name`` that holds them."""
    if name == "xdata" and batched:
        return (
            "clean them (a batch leaves out each fit's missing ydata points, nan_policy='omit' "
            "or mask=, with xdata finite everywhere)"
        )
    return (
        "clean them, or pass nan_policy='omit' to leave those points out"
        + (" of their own fit" if batched else "")
        + " (mask= or a numpy.ma.MaskedArray ydata leave out the points you choose)"
    )


def _data(f, xdata, ydata, sigma, p0, check_finite, nan_policy, mask=None, *, batched=False):
    """``((x, y, weight), names, n_fits, f, gone)``: the data as float64 arrays, checked, for
    one fit or (``batched``) a stack of them, every leaf with a leading axis of fits (a shared
    ``xdata`` or ``sigma`` repeated); ``f``: traced (:class:`_Traced`) where a batch's
    ``xdata`` was read by tracing it, else as given; ``gone``: ``(n_fits, m)`` a batch's
    points left out (:mod:`.missing`: weight 0, ``y`` 0 there), ``None`` where none is (a
    single fit drops its own). Both are read here, a single fit as a batch of one."""
    _check_nan_policy(nan_policy)
    y, sigma, masks = missing.read(ydata, sigma, mask)
    ys = _fits_y(y, batched)
    n_fits, shape = ys.shape[0], ys.shape[1:]
    names = _names(f, None if p0 is None else _n_given(p0, batched))
    _enough_points(ys[0], names)
    given = missing.given(masks, ys.shape, batched)
    x = jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float64), _array_if_list(xdata))
    s = None if sigma is None else np.asarray(sigma, dtype=np.float64)
    if s is not None and s.ndim == 0:  # scipy: "None or scalar or M-length sequence"
        s = np.full(y.shape, float(s))
    per_fit, traced = False, f
    if batched:
        x, per_fit, traced = _stack_x(f, x, n_fits, shape, names)
    if s is not None:
        s = _fits_sigma(s, n_fits, shape, batched)
    gone = missing.left_out(ys, s, given, nan_policy)
    if not batched and (gone is not None or nan_policy == "omit"):
        x, ys, s = _omit(x, ys[0], s, gone, nan_policy)  # as scipy: those points dropped
        shape, gone = ys.shape[1:], None
        _enough_points(ys[0], names)
    elif gone is not None:
        ys, s = missing.filled(ys, s, gone)
    if check_finite is not False or nan_policy == "raise":
        _check_finite(x, ys, s, batched, per_fit)
    data = (x, ys if batched else ys[0], _weights(s, n_fits, shape, batched, gone))
    return data, names, n_fits, traced, gone


class _Args(NamedTuple):
    """curve_fit's arguments about the data, as given (scipy's names), before they are read."""

    f: Callable
    xdata: Any
    ydata: Any
    p0: Any
    sigma: Any
    absolute_sigma: bool
    check_finite: bool | None
    bounds: Any
    nan_policy: str | None
    mask: Any

    def n_params(self, batched: bool) -> int:
        """How many parameters ``f`` takes (:func:`_names`)."""
        return len(_names(self.f, None if self.p0 is None else _n_given(self.p0, batched)))

    def data(self, *, batched: bool = False):
        """:func:`_data` of these arguments."""
        read = (self.f, self.xdata, self.ydata, self.sigma, self.p0, self.check_finite)
        return _data(*read, self.nan_policy, self.mask, batched=batched)


def _check_nan_policy(nan_policy) -> None:
    if nan_policy not in (None, "raise", "omit"):
        raise ValueError(f"nan_policy must be None, 'raise' or 'omit'; got {nan_policy!r}")


def _fits_y(y: np.ndarray, batched: bool) -> np.ndarray:
    """``ydata`` with a leading axis of fits (one, for a single fit), checked."""
    if not batched:
        if y.size == 0:
            raise ValueError("ydata is empty")
        return y[None]
    if y.ndim < 2 or y.shape[0] == 0 or y[0].size == 0:
        raise ValueError(
            f"batched=True: ydata must have a leading axis of fits, shape (n_fits, m); got "
            f"shape {y.shape}"
        )
    return y


def _n_given(p0, batched: bool) -> int:
    """How many parameters ``p0`` gives (one fit's, or each fit's of a batch)."""
    if isinstance(p0, Mapping):
        raise TypeError(
            f"p0 must be the parameters' values in f's order, as scipy's: a sequence, or "
            f"batched (n_fits, n); got a dict with keys {list(p0)}: pass "
            f"[p0[k] for k in {tuple(p0)!r}] in f's order"
        )
    if not batched:
        return int(np.size(p0))
    return int(np.shape(p0)[-1] if np.ndim(p0) else 1)


def _check_finite(x, ys, s, batched: bool, per_fit: bool) -> None:
    """Refuse non-finite data: a single fit's by array, a batch's naming the first fit."""
    if not batched:
        for leaf in jax.tree_util.tree_leaves(x):
            _finite("xdata", leaf)
        _finite("ydata", ys[0])
        if s is not None:
            _finite("sigma", s)
        return
    for leaf in jax.tree_util.tree_leaves(x):
        if not per_fit:
            _finite("xdata", leaf[0], batched=True)
        else:
            _finite_by_fit("xdata", leaf)
    _finite_by_fit("ydata", ys)
    if s is not None:
        _finite("sigma", s[0]) if s.strides[0] == 0 else _finite_by_fit("sigma", s)


def _omit(x, y: np.ndarray, s, gone, nan_policy):
    """``(x, ys, s)`` without the points ``gone`` (:func:`missing.left_out`) and, with
    ``nan_policy="omit"``, those where ``xdata`` is not finite, as scipy's
    ``nan_policy="omit"``: ``ydata`` 1-D, each leaf of ``xdata`` with the points on its last
    axis (``(m,)``, or ``(k, m)`` as scipy's); ``ys`` ``(1, m')`` and ``s`` (if given) ``(1,
    m')`` or ``(1, m', m')``."""
    leaves = jax.tree_util.tree_leaves(x)
    if y.ndim != 1 or not all(leaf.ndim and leaf.shape[-1] == y.size for leaf in leaves):
        raise ValueError(
            "leaving points out (nan_policy='omit', mask, a masked array or an infinite "
            "sigma) needs 1-D ydata and xdata with the points on its last axis, as scipy's "
            f"(m,) or (k, m); got ydata {y.shape} and xdata "
            f"{', '.join(str(leaf.shape) for leaf in leaves) or 'of no array'}"
        )
    keep = np.ones(y.size, dtype=bool) if gone is None else ~gone[0]
    if nan_policy == "omit":
        for leaf in leaves:
            keep &= np.isfinite(leaf).reshape(-1, y.size).all(axis=0)
    if s is not None and s.ndim == 3:
        if not np.all(np.isfinite(s)):
            raise ValueError("sigma (a covariance matrix) holds non-finite values")
        s = s[:, keep][:, :, keep]
    elif s is not None:
        s = s[:, keep]
    if not keep.any():
        raise ValueError(
            "ydata has no point left (every one nan, masked or of infinite sigma): nothing to fit"
        )
    return jax.tree_util.tree_map(lambda a: a[..., keep], x), y[keep][None], s


class _Whiten:
    """``L⁻¹ r`` for a covariance ``L Lᵀ`` (scipy's treatment of a 2-D ``sigma``). A pytree
    node, so the factor is an argument of the compiled program. ``kept``: ``(m,)`` (a batch's
    ``(n_fits, m)``) the points that count, the others' residuals 0 before whitening (their
    covariance's rows and columns the identity's: :func:`missing.filled`); ``None``: all."""

    def __init__(self, chol, kept=None):
        self.chol, self.kept = chol, kept

    def __call__(self, r):
        if self.kept is not None:
            r = r * self.kept
        return jax.scipy.linalg.solve_triangular(jnp.asarray(self.chol), r, lower=True)


jax.tree_util.register_pytree_node(
    _Whiten,
    lambda w: ((w.chol,) if w.kept is None else (w.chol, w.kept), None),
    lambda _, c: _Whiten(*c),
)


def _vector(value, n: int, name: str) -> np.ndarray:
    v = np.asarray(value, dtype=np.float64)
    if v.ndim == 0:
        v = np.full(n, float(v))
    if v.shape != (n,):
        raise ValueError(f"{name} must have one value per parameter ({n}); got shape {v.shape}")
    return v


def _bounds(bounds, names) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)``, one each per parameter; equal bounds are allowed (a fixed
    parameter, :func:`_hold`), a lower above its upper is refused naming the parameter."""
    n = len(names)
    if isinstance(bounds, Bounds):
        lower, upper = bounds.lb, bounds.ub
    else:
        try:
            lower, upper = bounds
        except (TypeError, ValueError):
            raise ValueError(
                f"bounds must be (lower, upper) or a scipy.optimize.Bounds; got {bounds!r}"
            ) from None
    lo, hi = _vector(lower, n, "bounds' lower"), _vector(upper, n, "bounds' upper")
    bad = np.isnan(lo) | np.isnan(hi) | (lo > hi) | (np.isinf(lo) & (lo == hi))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(
            f"bounds: each lower must be below its upper (or equal to it: the parameter is "
            f"then fixed there); parameter {names[j]!r} has lower {float(lo[j])!r} and upper "
            f"{float(hi[j])!r}" + (f" ({int(bad.sum()) - 1} more)" if bad.sum() > 1 else "")
        )
    return lo, hi


def _stack_x(f, x, n_fits: int, shape, names):
    """``(x, per_fit, traced)``: ``xdata`` with a leading axis of fits (one per fit when every
    leaf has ``n_fits`` rows and ``f`` of one returns one fit's shape, else shared and
    repeated), and ``f`` traced at one fit's ``x`` (:class:`_Traced`)."""
    leaves = jax.tree_util.tree_leaves(x)
    m = int(np.prod(shape))
    if leaves and all(a.ndim >= 1 and a.shape[0] == n_fits for a in leaves):
        one = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), x)
        try:
            traced = _trace(f, one, names)
        except Exception:  # noqa: BLE001 - then it must be shared: checked below
            traced = None
        if traced is not None and traced.shape is not None and int(np.prod(traced.shape)) == m:
            return x, True, traced
    traced = _check_output(f, x, names, shape, "one fit's ydata shape")
    stacked = jax.tree_util.tree_map(lambda a: np.broadcast_to(a, (n_fits, *a.shape)), x)
    return stacked, False, traced


def _fits_sigma(s: np.ndarray, n_fits: int, shape, batched: bool) -> np.ndarray:
    """``sigma`` (not a scalar) as each fit's standard deviations ``(n_fits, m)`` or
    covariance ``(n_fits, m, m)``: one fit's, or (``batched``) one per fit or shared."""
    m = int(np.prod(shape))
    if not batched:
        if s.shape not in (shape, (m,), (m, m)):
            raise ValueError(
                f"sigma must have ydata's shape {tuple(shape)} (standard deviations) or be a "
                f"({m}, {m}) covariance matrix; got shape {s.shape}"
            )
        return s.reshape(1, *(s.shape if s.shape == (m, m) else (m,)))
    if s.shape in (shape, (m,)):  # one fit's: shared by every fit
        return np.broadcast_to(s.reshape(m), (n_fits, m))
    if s.shape in ((n_fits, *shape), (n_fits, m)):
        if s.shape == (m, m) and np.allclose(s, s.T) and np.ptp(s) > 0:
            raise ValueError(
                f"batched=True: sigma of shape {s.shape} with {n_fits} fits of {m} points reads "
                "as each fit's standard deviations, but it is symmetric, as a covariance is: "
                f"pass a covariance shared by every fit as np.broadcast_to(sigma, {(n_fits, m, m)})"
            )
        return s.reshape(n_fits, m)
    if s.shape == (n_fits, m, m):
        return s
    raise ValueError(
        f"batched=True: sigma must have ydata's shape {(n_fits, *shape)} (standard "
        f"deviations per fit), one fit's shape {shape} (shared), or be {(n_fits, m, m)} "
        f"covariance matrices; got shape {s.shape}"
    )


def _weights(s: np.ndarray | None, n_fits: int, shape, batched: bool, gone=None):
    """What multiplies each fit's raw residuals: ``1/sigma`` ``(n_fits, m)``, or a whitening
    by each covariance (scipy's 2-D ``sigma``); a single fit's without the leading axis.
    ``gone``: ``(n_fits, m)`` a batch's points left out, their weight 0."""
    if gone is not None:
        all_points = _weights(s, n_fits, shape, batched)
        if isinstance(all_points, _Whiten):
            return _Whiten(all_points.chol, (~gone).astype(np.float64))
        return np.where(gone, 0.0, all_points)
    m = int(np.prod(shape))
    if s is None:  # broadcast, not copied: hashed (the identity) and read as one row
        w: Any = np.broadcast_to(1.0, (n_fits, m))
    elif s.ndim == 3:
        try:
            chol = np.linalg.cholesky(s)
        except np.linalg.LinAlgError:
            if not batched:
                raise ValueError("sigma, a covariance matrix, is not positive definite") from None
            bad = next(i for i in range(n_fits) if not _is_positive_definite(s[i]))
            raise ValueError(
                f"sigma of fit {bad}, a covariance matrix, is not positive definite"
            ) from None
        return _Whiten(chol if batched else chol[0])
    else:
        if np.any(s <= 0):
            fit = f" (fit {int(np.argmax(np.any(s <= 0, 1)))})" if batched else ""
            raise ValueError(f"sigma must be positive{fit}")
        shared = s.ndim == 2 and s.strides[0] == 0  # one fit's sigma for every fit
        w = np.broadcast_to(1.0 / s[:1], s.shape) if shared else 1.0 / s
    return w if batched else w[0]


def _is_positive_definite(a: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return False
    return True


def _finite_by_fit(name: str, a: np.ndarray) -> None:
    """Refuse non-finite values, naming the first fit (leading axis) that holds one."""
    if np.isfinite(a).all():  # (the fits' own flags only where one is not: 2.5x the time)
        return
    bad = ~np.isfinite(a).reshape(len(a), -1).all(axis=1)
    if bad.any():
        first, more = int(np.argmax(bad)), int(bad.sum()) - 1
        others = f" (and {more} other fit{'s' if more > 1 else ''})" if more else ""
        raise ValueError(
            f"{name} of fit {first}{others} holds non-finite values (nan or inf): "
            + _fix(name, batched=True)
        )
