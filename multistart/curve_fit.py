"""``curve_fit``: scipy's interface, many starts, and the data as arguments of the program.

``ms.curve_fit(f, xdata, ydata, p0, sigma, absolute_sigma, bounds)`` means what
``scipy.optimize.curve_fit`` means by each argument, with ``f(x, *params)`` written in
``jax.numpy``. It builds a least-squares problem whose residuals ``(f(x, *p) - y) / sigma``
take ``(x, y, sigma)`` as an argument of the compiled step, not as constants in it, so fitting
new data of the same shapes runs the same program, and fits it with
:class:`multistart.MultiStartLeastSquares` from ``n_starts`` starts.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import Bounds, OptimizeWarning

from .least_squares import MultiStartLeastSquares
from .priors import HalfBounded, Normal, Space, Uniform
from .problem import add_note

__all__ = ["curve_fit"]

N_STARTS = 32  # curve_fit's default number of starts
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
    **options,
):
    """Fit ``f(xdata, *params)`` to ``ydata`` by least squares from many starts.

    Every argument scipy's ``curve_fit`` has means what it means there; ``f`` is traced by JAX
    (``jax.numpy``), ``n_starts`` local searches run (Levenberg-Marquardt by default), in
    float64. ``p0`` is the first start (with ``n_starts=1`` the only one; default: scipy's, ones
    or the middle of a box or 1 inside a one-sided bound); the others are drawn in the finite
    box, log-normally around ``p0`` inside a one-sided bound, normally around it (spread
    ``max(|p0|, 1)``) where unbounded. No step leaves the bounds, whatever ``method``.

    Args:
      f: ``f(x, *params) -> array`` of ``ydata``'s shape, in ``jax.numpy``.
      xdata, ydata: what ``f`` takes as ``x`` (arrays, or a tuple or dict of them); the data.
      p0: the initial parameters (length ``n``); default: from ``f``'s signature, as scipy.
      sigma: standard deviations of ``ydata`` (its shape), or their ``(m, m)`` covariance.
      absolute_sigma: ``pcov`` is ``(JᵀJ)⁻¹`` as it is; ``False`` (default) scales it by the
        reduced chi-squared, as scipy.
      check_finite, nan_policy: refuse non-finite data (default), or ``nan_policy="omit"``
        drops those points.
      bounds: ``(lower, upper)``, scalars or length ``n``, or a ``scipy.optimize.Bounds``.
      method, jac: ``"lm"`` (default), ``"dogleg"`` or ``"gauss-newton"``; ``jac=None``: JAX
        differentiates ``f``.
      full_output: also return the :class:`multistart.Result`.
      n_starts: local searches run at once (default 32).
      **options: the search's options (:class:`multistart.MultiStartLeastSquares`).

    Returns:
      ``(popt, pcov)``, or ``(popt, pcov, result)`` with ``full_output``; ``pcov`` is ``inf``,
      with an ``OptimizeWarning``, where it cannot be estimated, as scipy's.

    Raises:
      ValueError / TypeError: bad arguments, before any compile (docs/curve-fit.md lists them).
    """
    _check_choices(method, jac, absolute_sigma, full_output)
    args = (f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds, nan_policy)
    popt, pcov, result = _fit(*args, n_starts=n_starts, method=_METHODS[method], **options)
    return (popt, pcov, result) if full_output else (popt, pcov)


def _fit(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds, nan_policy, **options):
    """``(popt, pcov, result)`` of one dataset."""
    with jax.enable_x64(True):
        data, names = _data(f, xdata, ydata, sigma, p0, check_finite, nan_policy)
        lower, upper = _bounds(bounds, len(names))
        first = _first_start(None if p0 is None else _vector(p0, len(names), "p0"), lower, upper)
        space = _space(names, first, lower, upper)
        _check_output(f, data, names)
        search = MultiStartLeastSquares(absolute_sigma=absolute_sigma, **options)
        starts = {name: np.array([v]) for name, v in zip(names, first, strict=True)}
        result = search.fit(_CurveModel(f, names, space, data), starts=starts)
        popt = np.array([float(result.best_params[k]) for k in names])
        return popt, _pcov(result, names), result


def _check_choices(method, jac, absolute_sigma, full_output) -> None:
    if jac is not None:
        raise ValueError(
            "jac: the Jacobian comes from JAX's automatic differentiation of f; pass jac=None"
        )
    if method not in _METHODS:
        raise ValueError(
            f"method must be 'lm' (default), 'dogleg' or 'gauss-newton'; got {method!r} "
            "(scipy's 'trf' and 'dogbox' exist to respect bounds: every method here does)"
        )
    for name, value in (("absolute_sigma", absolute_sigma), ("full_output", full_output)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False; got {value!r}")


class _CurveModel:
    """The residuals ``(f(x, *p) - y) / sigma`` with ``(x, y, sigma)`` as the program's data
    (a model carrying its own space, as a factor graph does)."""

    def __init__(self, f, names, space, data):
        self.f, self.names, self.space, self.data = f, names, space, data
        self.__name__ = getattr(f, "__name__", type(f).__name__)

    def multistart_residual_problem(self):
        f, names = self.f, self.names

        def residuals(params, data):
            x, y, weight = data
            r = jnp.ravel(f(x, *(params[k] for k in names)) - y)
            return weight(r) if callable(weight) else r * weight

        return residuals, Space(self.space), self.data, self.__name__


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


def _finite(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise ValueError(
            f"{name} holds {bad} non-finite value(s) (nan or inf): clean them, or pass "
            "nan_policy='omit' to drop those points"
        )


def _data(f, xdata, ydata, sigma, p0, check_finite, nan_policy):
    """``((x, y, weight), names)``: the data as float64 arrays, checked."""
    if nan_policy not in (None, "raise", "omit"):
        raise ValueError(f"nan_policy must be None, 'raise' or 'omit'; got {nan_policy!r}")
    y = np.asarray(ydata, dtype=np.float64)
    if y.size == 0:
        raise ValueError("ydata is empty")
    x = jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float64), xdata)
    s = None if sigma is None else np.asarray(sigma, dtype=np.float64)
    if s is not None and s.shape not in (y.shape, (y.size,), (y.size, y.size)):
        raise ValueError(
            f"sigma must have ydata's shape {y.shape} (standard deviations) or be a "
            f"({y.size}, {y.size}) covariance matrix; got shape {s.shape}"
        )
    x_leaves = jax.tree_util.tree_leaves(x)
    if nan_policy == "omit":
        x, y, s = _omit(x, y, s)
    elif check_finite is not False:
        for leaf in x_leaves:
            _finite("xdata", leaf)
        _finite("ydata", y)
        if s is not None:
            _finite("sigma", s)
    n = None if p0 is None else int(np.size(p0))
    names = _names(f, n)
    return (x, y, _weight(s, y.size)), names


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


def _weight(s: np.ndarray | None, m: int):
    """What multiplies the raw residuals: ``1/sigma``, or a whitening by the covariance."""
    if s is None:
        return np.ones(m)
    if s.ndim == 2 and s.shape == (m, m):
        try:
            chol = np.linalg.cholesky(s)
        except np.linalg.LinAlgError as e:
            raise ValueError("sigma, a covariance matrix, is not positive definite") from e
        return _Whiten(chol)
    s = s.reshape(-1)
    if np.any(s <= 0):
        raise ValueError("sigma must be positive")
    return 1.0 / s


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


def _bounds(bounds, n: int) -> tuple[np.ndarray, np.ndarray]:
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
    if np.any(np.isnan(lo) | np.isnan(hi)) or np.any(lo >= hi):
        raise ValueError(f"bounds: each lower must be below its upper; got {lo} and {hi}")
    return lo, hi


def _first_start(p0, lower, upper) -> np.ndarray:
    """``p0``, checked against the bounds, or scipy's default start."""
    if p0 is not None:
        outside = (p0 < lower) | (p0 > upper)
        if outside.any():
            raise ValueError(f"p0 lies outside bounds at parameter(s) {np.flatnonzero(outside)}")
        return p0
    lo_open, hi_open = np.isinf(lower), np.isinf(upper)
    start = np.ones_like(lower)
    both = ~lo_open & ~hi_open
    start[both] = 0.5 * (lower[both] + upper[both])
    start[~lo_open & hi_open] = lower[~lo_open & hi_open] + 1.0
    start[lo_open & ~hi_open] = upper[lo_open & ~hi_open] - 1.0
    return start


def _space(names, first, lower, upper) -> dict[str, Any]:
    """Each parameter's prior: its box, its one open side, or a normal around its start."""
    space: dict[str, Any] = {}
    for name, x0, lo, hi in zip(names, first, lower, upper, strict=True):
        if np.isfinite(lo) and np.isfinite(hi):
            space[name] = Uniform(lo, hi)
        elif np.isfinite(lo) or np.isfinite(hi):
            bound, side = (lo, "lower") if np.isfinite(lo) else (hi, "upper")
            typical = x0 if x0 != bound else bound + (1.0 if side == "lower" else -1.0)
            space[name] = HalfBounded(bound, typical, side=side)
        else:
            space[name] = Normal(x0, max(abs(x0), 1.0))
    return space


def _check_output(f, data, names) -> None:
    """One trace of ``f`` (no compile): its output must have ``ydata``'s shape."""
    x, y, _ = data
    args = [jax.ShapeDtypeStruct((), jnp.float64) for _ in names]
    try:
        out = jax.eval_shape(lambda x, *p: f(x, *p), x, *args)
    except Exception as e:
        add_note(e, f"multistart: raised while tracing f(xdata, {', '.join(names)})")
        raise
    shape = getattr(out, "shape", None)
    if shape is None or int(np.prod(shape)) != y.size:
        raise ValueError(
            f"f(xdata, *params) must return ydata's shape {y.shape}; it returned "
            f"{shape if shape is not None else type(out).__name__}"
        )


def _pcov(result, names) -> np.ndarray:
    """curve_fit's ``pcov`` in ``names``' order: ``inf`` with an OptimizeWarning where the
    covariance cannot be estimated, as scipy's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        laplace = result.laplace
    index = [laplace.names.index(k) for k in names]
    pcov = np.asarray(laplace.covariance, np.float64)[np.ix_(index, index)]
    if not np.all(np.isfinite(pcov)):
        warnings.warn(
            "Covariance of the parameters could not be estimated", OptimizeWarning, stacklevel=3
        )
        pcov = np.full_like(pcov, np.inf)
    return pcov
