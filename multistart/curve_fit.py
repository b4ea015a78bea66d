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

    Every argument scipy's ``curve_fit`` has means what it means there. The differences: ``f``
    is traced by JAX (write it with ``jax.numpy``), the fit runs ``n_starts`` local searches
    (Levenberg-Marquardt by default, each with its own damping) and returns the best, and it
    computes in float64, as scipy does.

    Where the starts are: with finite ``bounds`` on a parameter, uniformly in its box; with a
    one-sided bound, log-normally around ``p0`` (or 1 away from the bound); unbounded, normally
    around ``p0`` with a spread of ``max(|p0|, 1)``. ``p0`` is always the first start, and
    with ``n_starts=1`` the only one. Without ``p0`` the first start is scipy's default:
    ones, or the middle of a finite box, or 1 inside a one-sided bound. Bounds are kept by the
    search's unconstrained coordinates: no step ever leaves them, whatever ``method``.

    Args:
      f: ``f(x, *params) -> array`` of ``ydata``'s shape, in ``jax.numpy``.
      xdata: what ``f`` takes as ``x``: an array, or a tuple or dict of arrays.
      ydata: the data, an array.
      p0: the initial parameters (length ``n``); default: from ``f``'s signature, as scipy.
      sigma: the data's standard deviations (``ydata``'s shape), or their covariance matrix
        (``(m, m)``, whitened by its Cholesky factor, as scipy does); default 1.
      absolute_sigma: ``sigma`` is in the data's units, so ``pcov`` is ``(JᵀJ)⁻¹`` as it is;
        ``False`` (default) scales it by the reduced chi-squared, as scipy.
      check_finite: refuse non-finite ``xdata``, ``ydata`` or ``sigma`` (default ``True``
        unless ``nan_policy`` says otherwise).
      bounds: ``(lower, upper)``, each a scalar or of length ``n``, or a
        ``scipy.optimize.Bounds``; ``-inf``/``inf`` where a side is open.
      method: ``"lm"`` (default), ``"dogleg"`` or ``"gauss-newton"``: the local rule
        (:class:`multistart.MultiStartLeastSquares`). scipy's ``"trf"`` and ``"dogbox"`` exist
        to respect bounds; here every method does.
      jac: ``None``: the Jacobian comes from JAX's automatic differentiation.
      full_output: also return the :class:`multistart.Result` (every start's record).
      nan_policy: ``None`` or ``"raise"`` (refuse non-finite data), or ``"omit"`` (drop the
        points where ``ydata``, ``sigma`` or a 1-D ``xdata`` is not finite).
      n_starts: local searches run at once (default 32).
      **options: the search's options (:class:`multistart.MultiStartLeastSquares`: ``seed``,
        ``n_steps``, ``start_strategy``, ``checkpoint_dir``, ...).

    Returns:
      ``(popt, pcov)``: the best fit's parameters ``(n,)`` and their covariance ``(n, n)``
      (``inf`` everywhere, with an ``OptimizeWarning``, where it cannot be estimated, as
      scipy's); ``(popt, pcov, result)`` with ``full_output=True``.

    Raises:
      ValueError / TypeError: bad arguments (mismatched lengths, ``p0`` or bounds of the wrong
        length, ``f``'s output not of ``ydata``'s shape, non-finite data), before any compile.

    Example:
      >>> import jax.numpy as jnp, numpy as np, multistart as ms
      >>> def decay(x, a, tau, c):
      ...     return a * jnp.exp(-x / tau) + c
      >>> x = np.linspace(0.0, 5.0, 50)
      >>> y = decay(x, 3.0, 1.5, 0.2) + np.random.default_rng(0).normal(0.0, 0.05, 50)
      >>> popt, pcov = ms.curve_fit(decay, x, y, bounds=(0.0, 10.0))  # doctest: +SKIP
    """
    if jac is not None:
        raise ValueError(
            "jac: the Jacobian comes from JAX's automatic differentiation of f; pass jac=None"
        )
    if method not in _METHODS:
        raise ValueError(
            f"method must be 'lm' (default), 'dogleg' or 'gauss-newton'; got {method!r} "
            "(scipy's 'trf' and 'dogbox' exist to respect bounds: every method here does)"
        )
    if not isinstance(absolute_sigma, bool):
        raise TypeError(f"absolute_sigma must be True or False; got {absolute_sigma!r}")
    if not isinstance(full_output, bool):
        raise TypeError(f"full_output must be True or False; got {full_output!r}")
    with jax.enable_x64(True):
        data, names = _data(f, xdata, ydata, sigma, p0, check_finite, nan_policy)
        n = len(names)
        p0_arr = None if p0 is None else _vector(p0, n, "p0")
        lower, upper = _bounds(bounds, n)
        first = _first_start(p0_arr, lower, upper)
        space = _space(names, first, lower, upper)
        _check_output(f, data, names, first)
        search = MultiStartLeastSquares(
            method=_METHODS[method], absolute_sigma=absolute_sigma, n_starts=n_starts, **options
        )
        model = _CurveModel(f, names, space, data)
        starts = {name: np.array([v]) for name, v in zip(names, first, strict=True)}
        result = search.fit(model, starts=starts)
        popt = np.array([float(result.best_params[k]) for k in names])
        pcov = _pcov(result, names)
    return (popt, pcov, result) if full_output else (popt, pcov)


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


def _check_output(f, data, names, first) -> None:
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
