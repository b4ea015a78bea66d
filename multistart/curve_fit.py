"""``curve_fit``: scipy's interface, many starts, and the data as arguments of the program.

The residuals ``(f(x, *p) - y) / sigma`` take ``(x, y, sigma)`` as an argument of the compiled
step, so a refit of the same ``f`` on data of the same shapes compiles nothing (its programs are
kept by :func:`multistart.device.programs.programs_for`, keyed by ``f`` itself as ``jax.jit`` keys
its cache). ``batched=True``: one search whose row ``r`` fits dataset ``r // n_starts``.
docs/curve-fit.md explains the rest.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import Bounds, OptimizeWarning

from .common import log, xla
from .common.digest import Replay
from .common.status import Status
from .device.programs import programs_for
from .host import progress
from .host.config import unknown_options
from .model.priors import HalfBounded, Normal, Space, Uniform
from .model.problem import add_note, tracer_hint
from .result import Result, Uncertainty
from .result.batch import BatchFits, bound_summary
from .result.laplace import gram_inverse, residual_scale
from .search.least_squares import MultiStartLeastSquares
from .solvers.base import linearize
from .starts.strategies import BOUND_MARGIN, StartStream

__all__ = ["curve_fit", "BatchFits"]

N_STARTS = 32
#: curve_fit's default ``n_steps`` per parameter (scipy's ``max_nfev`` for ``"trf"``: 100 n).
STEPS_PER_PARAMETER = 100
#: A parameter within this of a bound is flagged (``BatchFits.at_bound``), as ``Result.at_bound``.
BOUND_RTOL = 1e-4
_METHODS = {None: "lm", "lm": "lm", "dogleg": "dogleg", "gauss-newton": "gauss-newton"}


def curve_fit(
    f: Callable,
    xdata,
    ydata,
    p0=None,
    sigma=None,
    absolute_sigma: bool = False,
    check_finite: bool | None = None,
    bounds=(-np.inf, np.inf),
    method: str | None = None,
    jac=None,
    *,
    full_output: bool = False,
    nan_policy: str | None = None,
    n_starts: int = N_STARTS,
    batched: bool = False,
    resume: bool = False,
    fixed: dict | None = None,
    tied: dict | None = None,
    **options,
):
    """Fit ``f(xdata, *params)`` to ``ydata`` by least squares from many starts.

    scipy's arguments mean what they mean there (docs/curve-fit.md's table says each); ``f``
    is traced by JAX, in float64. ``p0`` is the first start; the others are drawn in the box,
    log-normally inside a one-sided bound, normally around ``p0`` where unbounded (at the
    spread the data allow, :func:`_spreads`). No step leaves the bounds; a start takes at most
    ``n_steps`` steps (default ``100 * n``).

    Args:
      f: ``f(x, *params)`` in ``jax.numpy``; it and ``xdata`` ... ``jac``, ``nan_policy`` are
        scipy's (``method`` ``"lm"``, ``"dogleg"`` or ``"gauss-newton"``; ``jac`` None: JAX
        differentiates ``f``; ``sigma`` a scalar, ``ydata``'s shape or ``(m, m)``).
      full_output: scipy's ``infodict, mesg, ier`` too, the Result in ``infodict``.
      n_starts: local searches run at once (default 32); with ``batched``, per fit.
      batched: ``ydata`` (and ``sigma``, ``xdata``, ``p0`` if they do) carry a leading axis of
        independent fits, fitted in one search, each as alone with ``start_strategy="band"``.
      resume: continue the search checkpointed in ``checkpoint_dir``, as ``fit(resume=True)``.
      fixed: ``{name: value}`` held (lmfit's ``vary=False``; equal bounds fix one too).
      tied: ``{name: other}`` or ``{name: g}``, ``g(params)`` of the free and fixed ones by
        name (lmfit's ``expr``). ``pcov`` is over the free ones, a held one's rows 0.
      **options: the search's options (:class:`multistart.MultiStartLeastSquares`).

    Returns:
      ``(popt, pcov)``, or with ``full_output`` scipy's ``(popt, pcov, infodict, mesg, ier)``
      (``infodict["result"]``, or batched ``infodict["fits"]``, a :class:`BatchFits`); ``pcov``
      ``inf``, with an ``OptimizeWarning``, where it cannot be estimated. Bad arguments raise
      ValueError / TypeError before any compile.
    """
    _check_choices(method, jac, absolute_sigma, full_output, batched, resume)
    _check_scipy_options(options)
    args = (f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds, nan_policy)
    fit, hold = _fit_batch if batched else _fit, {"fixed": fixed, "tied": tied}
    with log.quiet():  # as scipy: nothing printed unless something needs the user
        popt, pcov, record, fvec = fit(
            *args, resume, hold, n_starts=n_starts, method=_METHODS[method], **options
        )
    if not full_output:
        return popt, pcov
    return (popt, pcov, *_full_output(record, fvec))


def _full_output(record, fvec) -> tuple[dict, Any, Any]:
    """scipy's ``(infodict, mesg, ier)``: ``ier`` 1 where the best start settled (converged,
    or stalled: see ``mesg``), 5 where it took ``n_steps`` (MINPACK's ``maxfev``), 0
    otherwise; with the Result (``"result"``) or a batch's :class:`BatchFits` (``"fits"``)."""
    if isinstance(record, BatchFits):
        statuses = list(record.status)
        info = {"nfev": np.asarray(record.n_evals), "fvec": fvec, "fits": record}
        mesg: Any = [Status(s).message for s in statuses]
        ier: Any = np.array([_ier(s) for s in statuses])
        return info, mesg, ier
    best = record.best_index
    status = Status(record.status[best]) if best >= 0 else Status.NONFINITE
    info = {"nfev": int(np.sum(record.n_evals)), "fvec": fvec, "result": record}
    return info, status.message, _ier(status)


def _ier(status) -> int:
    status = Status(status)
    return 1 if status.settled else 5 if status is Status.MAX_STEPS else 0


def _fit(
    f,
    xdata,
    ydata,
    p0,
    sigma,
    absolute_sigma,
    check_finite,
    bounds,
    nan_policy,
    resume,
    hold,
    **options,
):
    """``(popt, pcov, result, fvec)`` of one dataset."""
    with jax.enable_x64(True):
        data, all_names, _, f = _data(f, xdata, ydata, sigma, p0, check_finite, nan_policy)
        f = _check_output(f, data[0], all_names, data[1].shape)  # the one trace of f
        all_lower, all_upper = _bounds(bounds, all_names)
        held = _hold(f, all_names, hold, all_lower, all_upper)
        g, names, keep = held.model, list(held.free), held.keep
        lower, upper = all_lower[keep], all_upper[keep]
        p0 = None if p0 is None else _vector(p0, len(all_names), "p0")[keep]
        first = _first_start(p0, lower, upper, names)
        if g is not f:
            _check_output(g, data[0], names, data[1].shape)
        options = {"n_steps": STEPS_PER_PARAMETER * len(names), **options}
        search = MultiStartLeastSquares(absolute_sigma=absolute_sigma, **options)
        spread = _spreads(g, names, data, first[None], lower, upper, stacked=False)
        space = _space(names, first, lower, upper, spread[0])
        inside = _inside(first, lower, upper)
        starts = {name: np.array([v]) for name, v in zip(names, inside, strict=True)}
        result = search.fit(_CurveModel(g, names, space, data), starts=starts, resume=resume)
        popt = np.array([float(result.best_params[k]) for k in names])
        result = _with_curvature(result, g, names, data)
        pcov, fvec = _result_covariance(result, names, np.asarray(data[1]).size)
        pcov, popt = held.full_cov(pcov, popt[None]), held.full(popt[None])
        _warn_if_tied_outside(held, popt, all_lower, all_upper)
        return popt[0], pcov[0], result, fvec[0]


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


class _CurveModel:
    """The residuals with ``(x, y, sigma)`` as the program's data and its own space;
    ``rows_per_datum``: the data are a stack of fits, each with that many starts."""

    def __init__(self, f, names, space, data, rows_per_datum=None):
        self.f, self.names, self.space, self.data = f, names, space, data
        self.rows_per_datum = rows_per_datum
        self.__name__ = _name(f)

    def multistart_residual_problem(self):
        f, names = self.f, self.names

        def residuals(params, data):
            x, y, weight = data
            r = jnp.ravel(f(x, *(params[k] for k in names)) - y)
            return weight(r) if callable(weight) else r * weight

        extra = {"rows_per_datum": self.rows_per_datum, "program_key": _model_key(f, names)}
        return residuals, Space(self.space), self.data, self.__name__, extra


def _name(f) -> str:
    """``f``'s name, or its type's (a callable object)."""
    return getattr(f, "__name__", type(f).__name__)


def _model_key(f, names) -> tuple | None:
    """What curve_fit's programs depend on besides the data's shapes: ``f`` itself (a global it
    reads changing is not noticed, as in ``jax.jit``) and the names; ``None`` if unhashable."""
    try:
        hash(f)
    except TypeError:
        return None
    return ("curve_fit", f, tuple(names))


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


def _finite(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise ValueError(
            f"{name} holds {bad} non-finite value(s) (nan or inf): clean them, or pass "
            "nan_policy='omit' to drop those points"
        )


def _data(f, xdata, ydata, sigma, p0, check_finite, nan_policy, *, batched: bool = False):
    """``((x, y, weight), names, n_fits, f)``: the data as float64 arrays, checked, for one
    fit or (``batched``) a stack of them, every leaf with a leading axis of fits (a shared
    ``xdata`` or ``sigma`` repeated), and ``f``: traced (:class:`_Traced`) where a batch's
    ``xdata`` was read by tracing it, else as given. Both are read here, a single fit as a
    batch of one."""
    _check_nan_policy(nan_policy, batched)
    y = np.asarray(ydata, dtype=np.float64)
    ys = _fits_y(y, batched)
    n_fits, shape = ys.shape[0], ys.shape[1:]
    names = _names(f, None if p0 is None else _n_given(p0, batched))
    _enough_points(ys[0], names)
    x = jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float64), _array_if_list(xdata))
    s = None if sigma is None else np.asarray(sigma, dtype=np.float64)
    if s is not None and s.ndim == 0:  # scipy: "None or scalar or M-length sequence"
        s = np.full(y.shape, float(s))
    if not batched and nan_policy == "omit":
        x, y, s = _omit(x, y, None if s is None else _fits_sigma(s, 1, shape, False)[0])
        return (x, y, _weights(None if s is None else s[None], 1, y.shape, False)), names, 1, f
    per_fit, traced = False, f
    if batched:
        x, per_fit, traced = _stack_x(f, x, n_fits, shape, names)
    if s is not None:
        s = _fits_sigma(s, n_fits, shape, batched)
    if check_finite is not False or nan_policy == "raise":
        _check_finite(x, ys, sigma, s, batched, per_fit)
    data = (x, ys if batched else y, _weights(s, n_fits, shape, batched))
    return data, names, n_fits, traced


def _check_nan_policy(nan_policy, batched: bool) -> None:
    if nan_policy not in (None, "raise", "omit"):
        raise ValueError(f"nan_policy must be None, 'raise' or 'omit'; got {nan_policy!r}")
    if batched and nan_policy == "omit":
        raise ValueError(
            "nan_policy='omit' would give each fit of a batch its own number of points: fit "
            "the datasets with missing points one by one, or give those points a huge sigma"
        )


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
    if not batched:
        return int(np.size(p0))
    return int(np.shape(p0)[-1] if np.ndim(p0) else 1)


def _check_finite(x, ys, sigma, s, batched: bool, per_fit: bool) -> None:
    """Refuse non-finite data: a single fit's by array, a batch's naming the first fit."""
    if not batched:
        for leaf in jax.tree_util.tree_leaves(x):
            _finite("xdata", leaf)
        _finite("ydata", ys[0])
        if s is not None:
            _finite("sigma", s)
        return
    for leaf in jax.tree_util.tree_leaves(x):
        _finite_by_fit("xdata", leaf) if per_fit else _finite("xdata", leaf[0])
    _finite_by_fit("ydata", ys)
    if sigma is not None:
        given = np.asarray(sigma, dtype=np.float64)
        shared = given.ndim <= ys.ndim - 1 or given.shape[0] != len(ys)
        _finite("sigma", given) if shared else _finite_by_fit("sigma", given)


def _omit(x, y, s):
    """Drop the points where ``y``, ``sigma`` or a 1-D ``x`` is not finite."""
    keep = np.isfinite(y).reshape(-1)
    if s is not None and s.ndim == 1:
        keep &= np.isfinite(s)
    leaves = jax.tree_util.tree_leaves(x)
    if not all(leaf.shape == y.shape for leaf in leaves) or y.ndim != 1:
        raise ValueError(
            "nan_policy='omit' needs 1-D ydata and xdata of ydata's shape, point by point"
        )
    for leaf in leaves:
        keep &= np.isfinite(leaf)
    if s is not None and s.ndim == 2:
        if not np.all(np.isfinite(s)):
            raise ValueError("sigma (a covariance matrix) holds non-finite values")
        s = s[np.ix_(keep, keep)]
    elif s is not None:
        s = s[keep]
    if not keep.any():
        raise ValueError("nan_policy='omit' left no finite data point")
    return jax.tree_util.tree_map(lambda a: a[keep], x), y[keep], s


class _Whiten:
    """``L⁻¹ r`` for a covariance ``L Lᵀ`` (scipy's treatment of a 2-D ``sigma``). A pytree
    node, so the factor is an argument of the compiled program."""

    def __init__(self, chol):
        self.chol = chol

    def __call__(self, r):
        return jax.scipy.linalg.solve_triangular(jnp.asarray(self.chol), r, lower=True)


jax.tree_util.register_pytree_node(_Whiten, lambda w: ((w.chol,), None), lambda _, c: _Whiten(*c))


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


class _Held:
    """``f`` over its free parameters, its held ones filled in: a fixed value, or a tie (to
    another parameter by name, or a function of the free and fixed ones by name). Hashed by
    what it computes, so a refit with the same holds reuses its programs."""

    def __init__(self, f, names, fixed: dict, tied: dict):
        self.f, self.names = f, tuple(names)
        self.fixed, self.tied = dict(fixed), dict(tied)
        self.free = tuple(k for k in names if k not in fixed and k not in tied)
        self.keep = np.array([k in self.free for k in names], dtype=bool)
        self.__name__ = _name(f)

    @property
    def model(self):
        """What is fitted: ``f`` itself when nothing is held."""
        return self if self.fixed or self.tied else self.f

    def values(self, free) -> dict:
        """Every parameter by name, from the free ones (scalars, or arrays of one shape)."""
        p = dict(zip(self.free, free, strict=True))
        p.update(self.fixed)
        base = dict(p)
        for name, tie in self.tied.items():
            p[name] = base[tie] if isinstance(tie, str) else tie(base)
        return p

    def __call__(self, x, *free):
        p = self.values(free)
        return self.f(x, *(p[k] for k in self.names))

    def full(self, popt: np.ndarray) -> np.ndarray:
        """``(k, n)`` every parameter from ``(k, n_free)`` free ones."""
        if self.model is self.f:
            return popt
        p = self.values([popt[:, j] for j in range(popt.shape[1])])
        return np.stack(
            [np.broadcast_to(np.asarray(p[k], dtype=np.float64), len(popt)) for k in self.names],
            axis=1,
        )

    def full_cov(self, pcov: np.ndarray, free: np.ndarray) -> np.ndarray:
        """``(k, n, n)``: ``G C Gᵀ`` with ``G`` the Jacobian of every parameter in the free
        ones at ``free`` ``(k, n_free)``: the free parameters' block as it is, a fixed one's
        rows and columns 0, a tied one's propagated through its tie (as lmfit's errors of an
        ``expr`` parameter); ``inf`` everywhere where the covariance could not be estimated,
        as scipy's."""
        if self.model is self.f:
            return pcov
        if not self.tied:
            out = np.zeros((len(pcov), len(self.names), len(self.names)))
            out[np.ix_(np.arange(len(pcov)), self.keep, self.keep)] = pcov
        else:
            g = self.jacobian(free)
            with np.errstate(invalid="ignore", over="ignore"):
                out = g @ pcov @ np.swapaxes(g, 1, 2)
        out[~np.all(np.isfinite(pcov), axis=(1, 2))] = np.inf
        return out

    def jacobian(self, free: np.ndarray) -> np.ndarray:
        """``(k, n, n_free)``: how every parameter moves with the free ones at ``free``: a
        unit row for a free one and for a tie by name, 0 for a fixed one, and a tie
        function's derivatives (JAX)."""
        k, col = len(free), {name: j for j, name in enumerate(self.free)}
        g = np.zeros((k, len(self.names), len(self.free)))
        for i, name in enumerate(self.names):
            j = col.get(name, col.get(self.tied.get(name)))  # type: ignore[arg-type]
            if j is not None:
                g[:, i, j] = 1.0
        calls = [name for name, tie in self.tied.items() if callable(tie)]
        if calls:

            def ties(v):
                p = self.values([v[j] for j in range(len(self.free))])
                return jnp.stack([jnp.asarray(p[name], v.dtype) for name in calls])

            jac = np.asarray(jax.vmap(jax.jacfwd(ties))(jnp.asarray(free, jnp.float64)))
            for r, name in enumerate(calls):
                g[:, self.names.index(name)] = jac[:, r]
        return g

    def words(self) -> dict[str, str]:
        """What holds each held parameter, in words (``"fixed"``, ``"= a1"``, ``"tied"``)."""
        out = {k: "fixed" for k in self.fixed}
        for k, tie in self.tied.items():
            out[k] = f"= {tie}" if isinstance(tie, str) else "tied"
        return out

    def _key(self):
        return (self.f, self.names, tuple(self.fixed.items()), tuple(self.tied.items()))

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, _Held) and self._key() == other._key()


def _hold(f, names, hold: dict, lower, upper) -> _Held:
    """The parameters ``fixed`` and ``tied`` hold (and those with equal bounds), checked."""
    fixed = _fixed_values(_named("fixed", hold.get("fixed"), names), names, lower, upper)
    tied = _named("tied", hold.get("tied"), names)
    for j in np.flatnonzero(lower == upper):
        k = names[j]
        if k in tied:
            raise ValueError(f"{k!r} is tied and has equal bounds (fixed): give one of them")
        fixed.setdefault(k, float(lower[j]))
    for k, tie in tied.items():
        if k in fixed:
            raise ValueError(f"{k!r} is both fixed and tied: give one of them")
        if isinstance(tie, str):
            if tie not in names or tie in tied or tie == k:
                raise ValueError(
                    f"tied[{k!r}] = {tie!r} must name a free or fixed parameter of f "
                    f"({', '.join(n for n in names if n not in tied)})"
                )
        elif not callable(tie):
            raise TypeError(
                f"tied[{k!r}] must be another parameter's name or a function of the free and "
                f"fixed parameters, e.g. tied={{{k!r}: lambda p: 0.3 * p['a1']}}; got {tie!r}"
            )
    held = _Held(f, names, {k: fixed[k] for k in names if k in fixed}, tied)
    if not held.free:
        raise ValueError("fixed and tied hold every parameter of f: leave at least one free")
    return held


def _fixed_values(fixed: dict, names, lower, upper) -> dict[str, float]:
    out = {}
    for k, v in fixed.items():
        try:
            value = float(v)
        except (TypeError, ValueError):
            value = np.nan
        if isinstance(v, bool) or not np.isfinite(value):
            raise ValueError(f"fixed[{k!r}] must be a finite number; got {v!r}")
        j = names.index(k)
        if not lower[j] <= value <= upper[j]:
            raise ValueError(
                f"fixed[{k!r}] = {v!r} lies outside its bounds [{float(lower[j])!r}, "
                f"{float(upper[j])!r}]"
            )
        out[k] = value
    return out


def _warn_if_tied_outside(held: _Held, popt: np.ndarray, lower, upper) -> None:
    """A tied parameter's bounds are not stepped in (its value is the tie's): say where the
    tie took it outside them."""
    out = [
        k
        for j, k in enumerate(held.names)
        if k in held.tied and np.any((popt[:, j] < lower[j]) | (popt[:, j] > upper[j]))
    ]
    if out:
        log.logger.warning(
            "tied parameter(s) %s ended outside their bounds (a tie is not bounded: its value "
            "is the tie's); bound the parameters it is tied to instead",
            ", ".join(out),
        )


def _named(what: str, given, names) -> dict:
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise TypeError(f"{what} must be a dict {{parameter name: ...}}; got {given!r}")
    unknown = [k for k in given if k not in names]
    if unknown:
        raise ValueError(
            f"{what}: {unknown} are not parameters of f (its parameters: {', '.join(names)})"
        )
    return dict(given)


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
    feasible (a start on a bound never moves: its coordinate there is infinite)."""
    span = np.where(np.isfinite(upper - lower), upper - lower, np.maximum(np.abs(p0), 1.0))
    return np.clip(p0, lower + 4 * BOUND_MARGIN * span, upper - 4 * BOUND_MARGIN * span)


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
    if not np.any(np.isinf(lower) & np.isinf(upper)):
        return base
    jac, ssr, _ = _curvature_at(f, names, data, first, stacked=stacked)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.sqrt(ssr)[:, None] / np.linalg.norm(jac, axis=1)
        decade = 10.0 ** np.ceil(np.log10(scale))
    return np.where(np.isfinite(decade) & (decade > 0), np.minimum(decade, base), base)


class _Traced(Replay):
    """``f`` traced once at ``(x, *scalars)``: the shape it returns (``shape``, ``None`` for no
    array), and, called as ``f`` is, its recorded operations replayed (a
    :class:`multistart.common.digest.Replay`), so the covariance program, the spreads and the
    search's step all derive from this one trace of the user's Python. Hashed and compared as
    ``f`` itself, so curve_fit's programs stay keyed by the user's function."""

    def __init__(self, f, x, names):
        args = [jax.ShapeDtypeStruct((), jnp.float64) for _ in names]
        traced = jax.jit(lambda x, *p: f(x, *p)).trace(x, *args)
        super().__init__(traced.jaxpr, traced.in_tree, traced.out_tree, f, _name(f))
        self.shape = getattr(traced.out_info, "shape", None)

    def __hash__(self):
        return hash(self.fn)

    def __eq__(self, other):
        return self.fn == (other.fn if isinstance(other, _Traced) else other)


def _trace(f, x, names) -> _Traced:
    """:class:`_Traced` of ``f`` at ``x``; an exception raised while tracing it names ``f``."""
    try:
        return _Traced(f, x, names)
    except Exception as e:
        hint = tracer_hint(e)  # np.exp on a parameter: use jnp.exp
        fix = (
            ""
            if hint is None
            else "; " + hint.removeprefix("multistart: ").replace("the objective", "f")
        )
        add_note(e, f"multistart: raised while tracing f(xdata, {', '.join(names)}){fix}")
        raise


def _check_output(f, x, names, y_shape, what: str = "ydata's shape") -> _Traced:
    """``f`` traced (:func:`_trace`); ``f(x, *params)`` must have ``y_shape`` (as many values,
    as scipy reads it)."""
    traced = _trace(f, x, names)
    shape = traced.shape
    if shape is None or int(np.prod(shape)) != int(np.prod(y_shape)):
        raise ValueError(
            f"f(xdata, *params) must return {what} {tuple(y_shape)}; it returned "
            f"{shape if shape is not None else 'no array'}"
        )
    return traced


# -- a stack of fits ---------------------------------------------------------------------------

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
    with jax.enable_x64(True):
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
            absolute_sigma=absolute_sigma, n_starts=n_fits * n_starts, **options
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
        pcov, fvec = _batch_covariances(g, names, data, popt, absolute_sigma)
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


def _weights(s: np.ndarray | None, n_fits: int, shape, batched: bool):
    """What multiplies each fit's raw residuals: ``1/sigma`` ``(n_fits, m)``, or a whitening
    by each covariance (scipy's 2-D ``sigma``); a single fit's without the leading axis."""
    m = int(np.prod(shape))
    if s is None:
        w: Any = np.ones((n_fits, m))
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
        w = 1.0 / s
    return w if batched else w[0]


def _is_positive_definite(a: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return False
    return True


def _finite_by_fit(name: str, a: np.ndarray) -> None:
    """Refuse non-finite values, naming the first fit (leading axis) that holds one."""
    bad = ~np.isfinite(a).reshape(len(a), -1).all(axis=1)
    if bad.any():
        first, more = int(np.argmax(bad)), int(bad.sum()) - 1
        others = f" (and {more} other fit{'s' if more > 1 else ''})" if more else ""
        raise ValueError(
            f"{name} of fit {first}{others} holds non-finite values (nan or inf): clean them; "
            "a batch cannot drop points (nan_policy='omit'), so fit those datasets one by one"
        )


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


def _stack_starts(names, first, bounds, space: Space, k: int, options, spread) -> dict:
    """Every fit's ``k`` starts (rows ``i * k ..``): its ``p0``, then the draws a single fit
    with ``start_strategy="band", n_candidates=0`` and the same seed makes in the search's
    ``space`` (:class:`multistart.starts.strategies.StartStream`), each fit's mapped by its own
    priors."""
    n_fits, n = first.shape
    priors = _space(names, first, bounds[0], bounds[1], spread)
    stream = StartStream(space, "band", options.start_band, np.random.default_rng(options.seed))
    out = np.empty((n_fits, k, n))
    out[:, 0] = _inside(first, *bounds)
    for name, q in zip(space.paths, stream.unit_leaves(k - 1), strict=True):
        out[:, 1:, names.index(name)] = np.broadcast_to(
            priors[name].from_unit(q[:, None]), (k - 1, n_fits)
        ).T
    return {name: out[:, :, j].reshape(-1) for j, name in enumerate(names)}


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


# -- curve_fit's pcov --------------------------------------------------------------------------


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
