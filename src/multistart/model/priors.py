"""Priors, spaces, and the bijections between physical and unconstrained coordinates.

The optimiser never sees physical values. Each prior maps an unconstrained real ``u`` to a
physical value inside its support (a scaled logistic for a bounded prior, an affine map for a
normal one), so no start can step out of its bounds and die there. Unconstrained coordinates are
order one for every prior, which is what makes one default learning rate sensible for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

__all__ = [
    "Prior",
    "Uniform",
    "LogUniform",
    "Normal",
    "HalfBounded",
    "Fixed",
    "Space",
    "near_bound",
    "BOUND_RTOL",
]

# Unit-cube values are kept this far from 0 and 1 before a logit, so a start on a bound maps to
# a large but finite unconstrained value.
_UNIT_EPS = 1e-12


def _as_param(value, name: str, cls: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{cls}: {name} must be a real number or array; got {value!r}") from e
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{cls}: {name} must be finite; got {value!r}")
    return arr


def _broadcast(cls: str, shape, **params) -> tuple[tuple[int, ...], dict[str, np.ndarray]]:
    try:
        target = np.broadcast_shapes(*(p.shape for p in params.values()))
        if shape is not None:
            shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
            target = np.broadcast_shapes(target, shape)
            if target != shape:
                raise ValueError
    except ValueError:
        shapes = {k: v.shape for k, v in params.items()}
        raise ValueError(
            f"{cls}: parameter shapes {shapes} do not broadcast to shape={shape}"
        ) from None
    return target, {k: np.broadcast_to(v, target) for k, v in params.items()}


# The built-in priors' one map from unconstrained to physical coordinates, elementwise with
# per-element constants ``a, b``: a logistic onto [a, b] (in log x for _LOG_LOGIT), or a + b u.
_LOGIT, _LOG_LOGIT, _AFFINE = 0, 1, 2


def flat_map(kind: np.ndarray, a: np.ndarray, b: np.ndarray, u):
    """JAX: physical values at unconstrained ``u``, elementwise with the constants ``kind``,
    ``a``, ``b`` (NumPy arrays broadcast against ``u``'s trailing axes)."""
    dtype = jnp.result_type(u)
    is_log, is_normal = kind == _LOG_LOGIT, kind == _AFFINE
    if is_normal.all():
        return jnp.asarray(a, dtype) + jnp.asarray(b, dtype) * u
    lo = np.where(is_normal, 0.0, a)
    hi = np.where(is_normal, 1.0, b)
    zl = jnp.asarray(np.where(is_log, np.log(np.where(is_log, lo, 1.0)), lo), dtype)
    zh = jnp.asarray(np.where(is_log, np.log(np.where(is_log, hi, 1.0)), hi), dtype)
    z = zl + (zh - zl) * jax.nn.sigmoid(u)
    # exp only where the prior is log-uniform: exp of a large linear bound would be inf,
    # and inf in the branch where() discards still turns the gradient into nan.
    if is_log.any():
        z = jnp.where(is_log, jnp.exp(jnp.where(is_log, z, 0.0)), z)
    # Rounding can land a hair outside [lower, upper]; the objective must never see that.
    bounded = jnp.clip(z, jnp.asarray(lo, dtype), jnp.asarray(hi, dtype))
    if not is_normal.any():
        return bounded
    normal = jnp.asarray(a, dtype) + jnp.asarray(b, dtype) * u
    return jnp.where(is_normal, normal, bounded)


def _table(prior, a: np.ndarray, b: np.ndarray):
    return np.full(prior.size, prior._KIND), a.ravel(), b.ravel()


def _forward_leaf(prior, u):
    """:func:`flat_map` of one prior's leaf (any leading batch axes), its constants shaped
    as the prior."""
    kind, a, b = (t.reshape(prior.shape) for t in prior.table())
    return flat_map(kind, a, b, u)


#: A parameter this close to a bound, in the bound's unit (:func:`near_bound`), is on it:
#: ``Result.at_bound``, ``BatchFits.at_bound`` and the warnings that name them.
BOUND_RTOL = 1e-4


def near_bound(x, lower, upper, rtol: float = BOUND_RTOL) -> np.ndarray:
    """Elementwise (NumPy, broadcast): finite ``x`` within ``rtol`` of a bound, in the bound's
    unit: where both bounds are finite, ``x``'s place in the box's unit interval,
    ``(x - lower) / (upper - lower)``, within ``rtol`` of 0 or 1; where one is, its distance
    over ``max(|bound|, 1)``; where none is, never. The one bound test: :meth:`Space.near_bound`
    applies it to each bounded prior (in the coordinate it is uniform in), curve_fit to its box.

    >>> near_bound(np.array([0.0, 5e-5, 0.5, 1.0, np.nan]), 0.0, 1.0).tolist()
    [True, True, False, True, False]
    >>> near_bound(np.array([100.005, 100.02, 1e9]), 100.0, np.inf).tolist()
    [True, False, False]
    """
    x, lower, upper = (np.asarray(a, dtype=np.float64) for a in (x, lower, upper))
    if lower.ndim == 0 and upper.ndim == 0:
        return _near_scalar_bounds(x, float(lower), float(upper), rtol)
    if x.ndim and lower.shape == upper.shape == x.shape[-1:]:  # a box per column (curve_fit's)
        # column by column: NumPy broadcasting a short last axis runs a loop of its length
        out = np.empty(x.shape, dtype=bool)
        for j in range(lower.size):
            out[..., j] = _near_scalar_bounds(x[..., j], float(lower[j]), float(upper[j]), rtol)
        return out
    low, high = np.isfinite(lower), np.isfinite(upper)
    boxed = low & high
    lo_unit = np.where(boxed, upper - lower, np.maximum(np.abs(np.where(low, lower, 0.0)), 1.0))
    hi_unit = np.maximum(np.abs(np.where(high, upper, 0.0)), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (x - lower) / lo_unit
        near_hi = np.where(boxed, q >= 1.0 - rtol, high & ((upper - x) / hi_unit <= rtol))
        return ((low & (q <= rtol)) | near_hi) & np.isfinite(x)


def _near_scalar_bounds(x: np.ndarray, lower: float, upper: float, rtol: float) -> np.ndarray:
    """:func:`near_bound` of float64 ``x`` for one ``lower`` and ``upper``: the same operations
    on ``x``, with the bounds' cases decided once (a third of the passes over ``x``)."""
    low, high = np.isfinite(lower), np.isfinite(upper)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if low and high:
            q = (x - lower) / (upper - lower)
            return ((q <= rtol) | (q >= 1.0 - rtol)) & np.isfinite(x)
        if low:
            return ((x - lower) / max(abs(lower), 1.0) <= rtol) & np.isfinite(x)
        if high:
            return ((upper - x) / max(abs(upper), 1.0) <= rtol) & np.isfinite(x)
    return np.zeros(x.shape, dtype=bool)


class Prior:
    """A prior over one (scalar or array-shaped) parameter.

    Subclasses define the unit-cube map (``from_unit``, for start generation), the bijection to
    and from unconstrained coordinates, and the log-density in physical coordinates.
    """

    shape: tuple[int, ...]

    @property
    def lower_bound(self) -> np.ndarray:
        """The smallest value the prior allows (``-inf`` where unbounded), shaped as the prior."""
        raise NotImplementedError

    @property
    def upper_bound(self) -> np.ndarray:
        """The largest value the prior allows (``inf`` where unbounded), shaped as the prior."""
        raise NotImplementedError

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def from_unit(self, q: np.ndarray) -> np.ndarray:
        """Physical values at unit-cube coordinates ``q`` (NumPy, float64)."""
        raise NotImplementedError

    def to_unit(self, x: np.ndarray) -> np.ndarray:
        """Unit-cube coordinates of physical values ``x`` (NumPy, float64)."""
        raise NotImplementedError

    def forward(self, u):
        """Unconstrained to physical (JAX, differentiable)."""
        raise NotImplementedError

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(kind, a, b)`` per element (raveled) where the prior's map is :func:`flat_map`'s,
        else ``None`` (its :meth:`forward` is its own)."""
        return None

    def inverse(self, x: np.ndarray) -> np.ndarray:
        """Physical to unconstrained (NumPy, float64)."""
        raise NotImplementedError

    def log_prob(self, x):
        """Log-density at physical ``x``, summed over the parameter's elements (JAX)."""
        raise NotImplementedError

    def contains(self, x: np.ndarray) -> np.ndarray:
        """Elementwise: is ``x`` inside the support?"""
        x = np.asarray(x, dtype=np.float64)
        return np.isfinite(x) & (x >= self.lower_bound) & (x <= self.upper_bound)


@dataclass(frozen=True, eq=False, init=False, repr=False)
class Uniform(Prior):
    """Uniform on ``[lower, upper]``; stepped in logit coordinates of the unit interval.

    >>> Uniform(0.0, 10.0).shape
    ()
    >>> Uniform(0.0, 1.0, shape=(3,)).shape
    (3,)
    """

    lower: np.ndarray
    upper: np.ndarray
    shape: tuple[int, ...]

    def __init__(self, lower, upper, shape=None):
        cls = type(self).__name__
        lo, hi = _as_param(lower, "lower", cls), _as_param(upper, "upper", cls)
        target, p = _broadcast(cls, shape, lower=lo, upper=hi)
        if np.any(p["lower"] >= p["upper"]):
            raise ValueError(f"{cls}: lower must be < upper; got lower={lower!r}, upper={upper!r}")
        self._check_extra(p)
        object.__setattr__(self, "lower", p["lower"])
        object.__setattr__(self, "upper", p["upper"])
        object.__setattr__(self, "shape", target)

    def _check_extra(self, p):
        pass

    def __repr__(self):
        return _prior_repr(type(self).__name__, self.lower, self.upper, self.shape)

    @property
    def lower_bound(self):
        return self.lower

    @property
    def upper_bound(self):
        return self.upper

    # Bounded priors are linear in some coordinate z(x) (x itself, or log x); the unit cube and
    # the logit bijection are both defined in z.
    def _z(self, x, xp=np):
        return x

    def _z_inv(self, z, xp=np):
        return z

    def from_unit(self, q):
        zl, zh = self._z(self.lower), self._z(self.upper)
        return np.clip(self._z_inv(zl + np.asarray(q) * (zh - zl)), self.lower, self.upper)

    def to_unit(self, x):
        zl, zh = self._z(self.lower), self._z(self.upper)
        return (self._z(np.asarray(x, dtype=np.float64)) - zl) / (zh - zl)

    _KIND = _LOGIT

    def table(self):
        return _table(self, self.lower, self.upper)

    def forward(self, u):
        return _forward_leaf(self, u)

    def inverse(self, x):
        q = np.clip(self.to_unit(x), _UNIT_EPS, 1.0 - _UNIT_EPS)
        return special.logit(q)

    def log_prob(self, x):
        dtype = jnp.result_type(x)
        width = np.log(self._z(self.upper) - self._z(self.lower))
        return -jnp.sum(jnp.broadcast_to(jnp.asarray(width, dtype), jnp.shape(x)))


@dataclass(frozen=True, eq=False, init=False, repr=False)
class LogUniform(Uniform):
    """Log-uniform on ``[lower, upper]`` with ``0 < lower < upper`` (uniform in ``log x``)."""

    _KIND = _LOG_LOGIT

    def _check_extra(self, p):
        if np.any(p["lower"] <= 0):
            raise ValueError(f"LogUniform: lower must be > 0; got {float(p['lower'].min())}")

    def _z(self, x, xp=np):
        return xp.log(x)

    def _z_inv(self, z, xp=np):
        return xp.exp(z)

    def log_prob(self, x):
        dtype = jnp.result_type(x)
        width = jnp.asarray(np.log(np.log(self.upper) - np.log(self.lower)), dtype)
        return -jnp.sum(jnp.log(x) + width)


@dataclass(frozen=True, eq=False, init=False, repr=False)
class Normal(Prior):
    """Normal with ``mean`` and ``sigma``; stepped in standardised coordinates ``(x-mean)/sigma``.

    Unbounded: starts are drawn from its central quantiles, and steps can go anywhere.
    """

    mean: np.ndarray
    sigma: np.ndarray
    shape: tuple[int, ...]

    def __init__(self, mean, sigma, shape=None):
        m, s = _as_param(mean, "mean", "Normal"), _as_param(sigma, "sigma", "Normal")
        target, p = _broadcast("Normal", shape, mean=m, sigma=s)
        if np.any(p["sigma"] <= 0):
            raise ValueError(f"Normal: sigma must be > 0; got {sigma!r}")
        object.__setattr__(self, "mean", p["mean"])
        object.__setattr__(self, "sigma", p["sigma"])
        object.__setattr__(self, "shape", target)

    def __repr__(self):
        return _prior_repr("Normal", self.mean, self.sigma, self.shape)

    @property
    def lower_bound(self):
        return np.full(self.shape, -np.inf)

    @property
    def upper_bound(self):
        return np.full(self.shape, np.inf)

    def from_unit(self, q):
        return self.mean + self.sigma * special.ndtri(np.asarray(q, dtype=np.float64))

    def to_unit(self, x):
        return special.ndtr((np.asarray(x, dtype=np.float64) - self.mean) / self.sigma)

    _KIND = _AFFINE

    def table(self):
        return _table(self, self.mean, self.sigma)

    def forward(self, u):
        return _forward_leaf(self, u)

    def inverse(self, x):
        return (np.asarray(x, dtype=np.float64) - self.mean) / self.sigma

    def log_prob(self, x):
        dtype = jnp.result_type(x)
        m, s = jnp.asarray(self.mean, dtype), jnp.asarray(self.sigma, dtype)
        z = (x - m) / s
        return jnp.sum(-0.5 * z**2 - jnp.log(s) - 0.5 * np.log(2 * np.pi))


@dataclass(frozen=True, eq=False, init=False, repr=False)
class HalfBounded(Prior):
    """A parameter bounded on one side only: ``x >= bound`` (or ``x <= bound`` with
    ``side="upper"``), around a ``typical`` value on the open side.

    Stepped in ``u = log((x - bound) / (typical - bound))``, so no step crosses the bound.
    Starts are drawn log-normally (``u`` a standard normal) around ``typical``'s distance to
    the bound.

    >>> HalfBounded(0.0, 2.0).lower_bound, HalfBounded(1.0, -3.0, side="upper").upper_bound
    (array(0.), array(1.))
    """

    bound: np.ndarray
    typical: np.ndarray
    sign: int  # +1: x >= bound; -1: x <= bound
    shape: tuple[int, ...]

    def __init__(self, bound, typical, side: str = "lower", shape=None):
        if side not in ("lower", "upper"):
            raise ValueError(f"HalfBounded: side must be 'lower' or 'upper'; got {side!r}")
        b, t = (
            _as_param(bound, "bound", "HalfBounded"),
            _as_param(typical, "typical", "HalfBounded"),
        )
        target, p = _broadcast("HalfBounded", shape, bound=b, typical=t)
        sign = 1 if side == "lower" else -1
        if np.any(sign * (p["typical"] - p["bound"]) <= 0):
            raise ValueError(
                f"HalfBounded: typical must be strictly inside the bound ({side} bound "
                f"{bound!r}); got typical={typical!r}"
            )
        object.__setattr__(self, "bound", p["bound"])
        object.__setattr__(self, "typical", p["typical"])
        object.__setattr__(self, "sign", sign)
        object.__setattr__(self, "shape", target)

    def __repr__(self):
        side = "" if self.sign > 0 else ", side='upper'"
        shape = "" if self.shape == () else f", shape={self.shape}"
        return f"HalfBounded({_fmt(self.bound)}, {_fmt(self.typical)}{side}{shape})"

    @property
    def lower_bound(self):
        return self.bound if self.sign > 0 else np.full(self.shape, -np.inf)

    @property
    def upper_bound(self):
        return self.bound if self.sign < 0 else np.full(self.shape, np.inf)

    def from_unit(self, q):
        return self._x(special.ndtri(np.asarray(q, dtype=np.float64)), np)

    def to_unit(self, x):
        return special.ndtr(self.inverse(x))

    def _x(self, u, xp):
        dtype = xp.result_type(u) if xp is jnp else np.float64
        b, t = xp.asarray(self.bound, dtype), xp.asarray(self.typical, dtype)
        return b + (t - b) * xp.exp(u)

    def forward(self, u):
        return self._x(u, jnp)

    def inverse(self, x):
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.log((x - self.bound) / (self.typical - self.bound))
        return np.clip(np.nan_to_num(u, nan=-40.0, neginf=-40.0), -40.0, 40.0)

    def log_prob(self, x):  # log-normal in the distance to the bound, median at typical
        dtype = jnp.result_type(x)
        d = jnp.abs(x - jnp.asarray(self.bound, dtype))
        u = jnp.log(d / jnp.asarray(np.abs(self.typical - self.bound), dtype))
        return jnp.sum(-0.5 * u**2 - jnp.log(d) - 0.5 * np.log(2 * np.pi))


@dataclass(frozen=True, eq=False, init=False, repr=False)
class Fixed(Prior):
    """A parameter held at ``value`` (lmfit's ``vary=False``): never stepped, reported with the
    others (``best_params``, ``params``, the table), with no error of its own.

    A :class:`Space` steps only its other parameters; the model still receives this one, at
    ``value``. Errors and the covariance are over the free parameters only, as lmfit reports
    them (``result.errors`` gives a fixed parameter 0).

    >>> Fixed(1.2).shape, Fixed([1.0, 2.0]).shape
    ((), (2,))
    """

    value: np.ndarray
    shape: tuple[int, ...]

    def __init__(self, value, shape=None):
        if value is None or isinstance(value, bool) or np.asarray(value).dtype == bool:
            raise TypeError(f"Fixed: value must be a real number or array; got {value!r}")
        v = _as_param(value, "value", "Fixed")
        target, p = _broadcast("Fixed", shape, value=v)
        object.__setattr__(self, "value", p["value"])
        object.__setattr__(self, "shape", target)

    def __repr__(self):
        shape = (
            ""
            if self.shape == () or not np.all(self.value == self.value.flat[0])
            else (f", shape={self.shape}")
        )
        return f"Fixed({_fmt(self.value)}{shape})"

    @property
    def lower_bound(self):
        return self.value

    @property
    def upper_bound(self):
        return self.value

    def from_unit(self, q):
        q = np.asarray(q, dtype=np.float64)
        return np.broadcast_to(self.value, q.shape).copy()

    def to_unit(self, x):
        return np.full(np.shape(x), 0.5)

    def forward(self, u):
        dtype = jnp.result_type(u)
        return jnp.broadcast_to(jnp.asarray(self.value, dtype), jnp.shape(u))

    def inverse(self, x):
        return np.zeros(np.shape(x))

    def log_prob(self, x):
        return jnp.zeros((), jnp.result_type(x))

    def contains(self, x):
        return np.asarray(x, dtype=np.float64) == self.value


def _fmt(a: np.ndarray) -> str:
    """A constant array as one number, otherwise a nested list: plain Python literals."""
    if a.size and np.all(a == a.flat[0]):
        return repr(float(a.flat[0]))
    return repr(a.tolist())


def _prior_repr(name: str, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> str:
    """``LogUniform(0.1, 30.0)``; ``shape=`` only where the arguments do not imply it.

    >>> _prior_repr("Uniform", np.array([0.0, 0.0]), np.array([1.0, 2.0]), (2,))
    'Uniform(0.0, [1.0, 2.0])'
    """
    args = f"{_fmt(a)}, {_fmt(b)}"
    implied = any(not (x.size and np.all(x == x.flat[0])) for x in (a, b))
    return f"{name}({args})" if implied or shape == () else f"{name}({args}, shape={shape})"


_BOUNDARY_BLOCK = 8  # an identity product of this size: a dot XLA keeps as a dot


def fusion_boundary(tree):
    """``tree`` unchanged, bit for bit, behind an operation XLA does not fuse into its users.

    XLA's CPU compiler fuses the map to physical parameters (cheap elementwise selects) into
    every consumer, so in the gradient of a model that broadcasts its parameters over pixels
    the whole map is recomputed per element (``profiling/README.md``, "The map to physical
    parameters inside the gradient"); an ``optimization_barrier`` does not stop it on a CPU.
    Each leaf is multiplied, in blocks of 8, by the 8 x 8 identity at full precision: exact for
    every finite normal number, except that ``-0.0`` becomes ``0.0``, a subnormal may become 0
    and a non-finite value makes its block non-finite. Gradients pass through unchanged.
    """

    def one(a):
        a = jnp.asarray(a)
        if a.size == 0 or not jnp.issubdtype(a.dtype, jnp.floating):
            return a
        flat = a.reshape(-1)
        pad = (-flat.size) % _BOUNDARY_BLOCK
        blocks = jnp.pad(flat, (0, pad)).reshape(-1, _BOUNDARY_BLOCK)
        eye = jnp.eye(_BOUNDARY_BLOCK, dtype=a.dtype)
        out = jnp.matmul(blocks, eye, precision=jax.lax.Precision.HIGHEST)
        return out.reshape(-1)[: flat.size].reshape(a.shape)

    return jax.tree_util.tree_map(one, tree)


class Space:
    """A (nested) dict of priors, flattened once; maps whole parameter pytrees.

    Parameters are the same pytree as the space with arrays in place of priors. ``paths`` name
    the leaves that are stepped as dotted strings (``"band_g.sigma"``), which is how errors and
    tables name them; ``priors`` are theirs. A :class:`Fixed` leaf is not among them: ``fixed``
    holds it, :meth:`leaves` leaves it out and :meth:`unflatten` puts its value back, so the
    engine steps only the free parameters and the model and the Result see every one.
    """

    def __init__(self, space: Any, *, argname: str = "space"):
        if isinstance(space, Space):
            space = space.tree
        if not isinstance(space, dict):
            raise TypeError(
                f"{argname} must be a dict (possibly nested) of priors such as "
                f"multistart.Uniform; got {type(space).__name__}"
            )
        flat, treedef = jax.tree_util.tree_flatten_with_path(
            space, is_leaf=lambda x: not isinstance(x, dict)
        )
        if not flat:
            raise ValueError(f"{argname} is empty: give at least one parameter with a prior")
        self.tree: dict = space
        self.treedef: Any = treedef
        self.paths: list[str] = []
        self.priors: list[Prior] = []
        self.fixed: dict[str, Fixed] = {}
        self._free: list[int] = []  # where the free leaves are among all the tree's leaves
        self._all: list[tuple[str, Prior]] = []
        for i, (path, leaf) in enumerate(flat):
            name = ".".join(str(getattr(k, "key", k)) for k in path)
            if not isinstance(leaf, Prior):
                raise TypeError(
                    f"{argname}[{name!r}] must be a prior (Uniform, LogUniform, Normal, "
                    f"HalfBounded, Fixed); got {type(leaf).__name__} {leaf!r}"
                )
            self._all.append((name, leaf))
            if isinstance(leaf, Fixed):
                self.fixed[name] = leaf
            else:
                self.paths.append(name)
                self.priors.append(leaf)
                self._free.append(i)
        if not self.paths:
            raise ValueError(
                f"{argname}: every parameter is multistart.Fixed; leave at least one free"
            )
        # jax.tree_util sorts dict keys; covariances are reported in the order the user wrote
        # the space in (as curve_fit's pcov keeps p0's): ``paths[i]`` for i in this order.
        written = list(_written(space))
        where = {path: i for i, path in enumerate(self.paths)}
        self.written_order: list[int] = [where[path] for path in written if path in where]
        #: every parameter, the fixed ones too, in the order the space was written in
        self.all_paths: list[str] = written

    @property
    def n_dims(self) -> int:
        """Total number of scalar parameters stepped (the free ones)."""
        return sum(p.size for p in self.priors)

    def unflatten(self, leaves, fixed_as=None):
        """The params pytree from the free parameters' leaves (any leading batch axes, NumPy or
        JAX), each fixed one filled in at its value (or at ``fixed_as``), shaped and typed as
        the first free leaf's batch."""
        leaves = list(leaves)
        if not self.fixed:
            return jax.tree_util.tree_unflatten(self.treedef, leaves)
        like, ndim = leaves[0], len(self.priors[0].shape)
        shape = tuple(getattr(like, "shape", np.shape(like)))
        batch = shape[: len(shape) - ndim]
        out: list[Any] = [None] * len(self._all)
        for i, leaf in zip(self._free, leaves, strict=True):
            out[i] = leaf
        for i, (_, prior) in enumerate(self._all):
            if isinstance(prior, Fixed):
                value = prior.value if fixed_as is None else np.full(prior.shape, fixed_as)
                out[i] = _filled(value, batch, like)
        return jax.tree_util.tree_unflatten(self.treedef, out)

    def near_bound(
        self, params, rtol: float = BOUND_RTOL
    ) -> tuple[np.ndarray, dict[int, list[str]]]:
        """Which starts sit within ``rtol`` of a bound (NumPy; ``params`` has a leading axis).

        :func:`near_bound` applied to each bounded prior: a box's in the coordinate it is
        uniform in (``x``, or ``log x``), so distance is measured in its unit interval; a
        one-sided prior's (:class:`HalfBounded`) in ``x``, over ``max(|bound|, 1)``, as
        curve_fit tests a one-sided bound. Unbounded priors never count (see
        ``Result.at_bound`` for what a flag means).

        Returns:
          ``(flags, names)``: a bool per start, and for each start at a bound (by index) the
          names of its parameters there (``"path"`` or ``"path[i]"``).
        """
        n, nears = self._nears(params, rtol)
        flags = np.zeros(n, dtype=bool)
        names: dict[int, list[str]] = {}
        for path, prior, near in nears:
            for i, j in zip(*np.nonzero(near), strict=True):
                names.setdefault(int(i), []).append(path if prior.shape == () else f"{path}[{j}]")
            flags |= near.any(axis=1)
        return flags, names

    def at_bound(self, params, rtol: float = BOUND_RTOL) -> np.ndarray:
        """:meth:`near_bound`'s flags alone (a bool per start), without naming each start's
        parameters there (a batch of 200,000 fits had 6,800 starts at a bound)."""
        n, nears = self._nears(params, rtol)
        flags = np.zeros(n, dtype=bool)
        for _, _, near in nears:
            flags |= near.any(axis=1)
        return flags

    def _nears(self, params, rtol: float):
        """``(n, [(path, prior, near)])``: the starts' count and, for each bounded prior, its
        ``(n, size)`` flags of :func:`near_bound`."""
        leaves = self.leaves(params)
        n = int(np.shape(leaves[0])[0])
        out = []
        for path, prior, x in zip(self.paths, self.priors, leaves, strict=True):
            x = np.asarray(x, dtype=np.float64).reshape((n, *prior.shape))
            if isinstance(prior, Uniform):
                box = prior._z(prior.lower), prior._z(prior.upper)
                near = near_bound(prior._z(x), *box, rtol).reshape(n, -1)
            elif isinstance(prior, HalfBounded):
                near = near_bound(x, prior.lower_bound, prior.upper_bound, rtol).reshape(n, -1)
            else:
                continue
            out.append((path, prior, near))
        return n, out

    def leaves(self, params) -> list:
        """Leaves of a params pytree in space order, checking its structure."""
        leaves, treedef = jax.tree_util.tree_flatten(params)
        if treedef != self.treedef:
            raise ValueError(
                f"params structure {treedef} does not match the space's {self.treedef}"
            )
        return [leaves[i] for i in self._free] if self.fixed else leaves

    def example(self, dtype, batch: tuple[int, ...] = ()):
        """``jax.ShapeDtypeStruct`` of what the model is called with (every parameter, the
        fixed ones too), optionally with leading batch axes: the params pytree
        (:meth:`example_tree`), or where a space hands the model a view of its own (a factor
        graph's stacked factors, :class:`multistart.model.plates.GraphSpace`), that view."""
        return self.example_tree(dtype, batch)

    def example_tree(self, dtype, batch: tuple[int, ...] = ()):
        """``jax.ShapeDtypeStruct`` params pytree (every parameter, the fixed ones too),
        optionally with leading batch axes."""
        return jax.tree_util.tree_unflatten(
            self.treedef, [jax.ShapeDtypeStruct(batch + p.shape, dtype) for _, p in self._all]
        )

    def example_names(self) -> list[str | None]:
        """For each leaf of :meth:`example`'s pytree (``jax.tree_util`` order), the name of
        the parameter it holds; ``None`` for a fixed one."""
        names: list[str | None] = [None] * len(self._all)
        for i, path in zip(self._free, self.paths, strict=True):
            names[i] = path
        return names

    def to_physical(self, u):
        """Unconstrained pytree to physical pytree (JAX, differentiable, one start)."""
        return self.unflatten(
            p.forward(x) for p, x in zip(self.priors, self.leaves(u), strict=True)
        )

    def to_unconstrained(self, x, dtype=np.float64):
        """Physical pytree (any leading batch axes) to unconstrained (NumPy)."""
        return self.unflatten(
            np.asarray(p.inverse(np.asarray(v)), dtype=dtype)
            for p, v in zip(self.priors, self.leaves(x), strict=True)
        )

    # -- the flat representation the engine steps in ----------------------------------------
    #
    # One start's unconstrained parameters are one vector of n_dims values (the leaves raveled
    # in order). The built-in priors then map the whole vector at once, elementwise with
    # per-element constants, so the compiled step has a handful of kernels, not one per leaf.

    def ravel(self, tree, batch_ndim: int = 1) -> np.ndarray:
        """NumPy: a params pytree with ``batch_ndim`` leading axes to ``(*batch, n_dims)``."""
        leaves = [np.asarray(v) for v in self.leaves(tree)]
        batch = leaves[0].shape[:batch_ndim]
        return np.concatenate([v.reshape(*batch, -1) for v in leaves], axis=-1)

    def split_rows(self, rows) -> list[np.ndarray]:
        """NumPy: ``(n, n_dims)`` flat rows as the free priors' leaves, ``(n, *prior.shape)``
        each, in the flat order (:meth:`ravel`'s inverse before :meth:`unflatten`)."""
        rows = np.asarray(rows)
        parts = np.split(rows, np.cumsum([p.size for p in self.priors])[:-1], axis=1)
        return [v.reshape(len(rows), *p.shape) for p, v in zip(self.priors, parts, strict=True)]

    def unravel_rows(self, rows):
        """NumPy: ``(n, n_dims)`` flat rows to the params pytree with a leading ``n`` axis
        (:meth:`ravel`'s inverse; :meth:`unravel` is one start's, in JAX)."""
        return self.unflatten(self.split_rows(rows))

    def logistic_mask(self) -> np.ndarray:
        """NumPy: which coordinates of the flat vector are a bounded prior's logistic ones
        (``Uniform`` and ``LogUniform``), whose bounds a step reaches only asymptotically:
        where a rule saturates them (:func:`multistart.solvers.bounds.saturation`)."""
        return np.concatenate(
            [np.full(p.size, type(p) in (Uniform, LogUniform)) for p in self.priors]
        )

    def unravel(self, vec):
        """JAX: one start's ``(n_dims,)`` physical vector to what the model is called with:
        the params pytree (:meth:`unravel_tree`), or a space's own view of it (see
        :meth:`example`)."""
        return self.unravel_tree(vec)

    def unravel_tree(self, vec):
        """JAX: one start's ``(n_dims,)`` vector to the params pytree."""
        out, i = [], 0
        for p in self.priors:
            out.append(jnp.reshape(vec[i : i + p.size], p.shape))
            i += p.size
        return self.unflatten(out)

    def _tables(self):
        if not hasattr(self, "_tables_cache"):
            tables = [p.table() for p in self.priors]
            self._tables_cache = (
                None
                if any(t is None for t in tables)
                else tuple(np.concatenate(t) for t in zip(*tables, strict=True))
            )
        return self._tables_cache

    def forward_flat(self, u):
        """JAX: one start's unconstrained vector to its physical vector (same layout)."""
        tables = self._tables()
        if tables is None:  # a prior with a map of its own: map leaf by leaf
            leaves = jax.tree_util.tree_leaves(self.to_physical(self.unravel_tree(u)))
            return jnp.concatenate([jnp.ravel(v) for v in leaves])
        kind, a, b = tables
        return flat_map(kind, a, b, u)

    def to_model(self, u):
        """One start's unconstrained parameters to the physical parameters the model is
        evaluated at (:meth:`unravel`'s), behind one :func:`fusion_boundary` (JAX,
        differentiable).

        ``u`` is the flat vector the engine steps (one boundary for the whole vector, not one
        per leaf) or, for ``flat=False``, the unconstrained pytree. The values are
        :meth:`to_physical`'s bit for bit.
        """
        if isinstance(u, dict):
            return self.view(fusion_boundary(self.to_physical(u)))
        return self.unravel(fusion_boundary(self.forward_flat(u)))

    def view(self, params):
        """What the model is called with at one start's params pytree (JAX or NumPy): the
        pytree itself; a space with a view of its own (see :meth:`example`) makes it."""
        return params

    def from_unit(self, q_leaves):
        """Physical pytree from per-leaf unit-cube arrays (NumPy)."""
        return self.unflatten(p.from_unit(q) for p, q in zip(self.priors, q_leaves, strict=True))

    def log_prob(self, x):
        """Sum of the priors' log-densities at physical ``x`` (one start, JAX)."""
        return sum(p.log_prob(v) for p, v in zip(self.priors, self.leaves(x), strict=True))

    def __repr__(self):
        inner = ", ".join(f"{n}: {p!r}" for n, p in self._all)
        return f"Space({inner})"


def _written(tree, prefix=()):
    """The leaves' dotted paths in the order the (nested) dict was written in."""
    for key, sub in tree.items():
        if isinstance(sub, dict):
            yield from _written(sub, (*prefix, key))
        else:
            yield ".".join(str(k) for k in (*prefix, key))


def _filled(value: np.ndarray, batch: tuple[int, ...], like):
    """A fixed parameter's ``value`` with leading ``batch`` axes, of ``like``'s kind: a
    ``jax.ShapeDtypeStruct``, a JAX array (traced or not), a NumPy array, or a Python float."""
    shape = batch + value.shape
    if isinstance(like, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(shape, like.dtype)
    if isinstance(like, jax.Array):  # a tracer is one too
        return jnp.broadcast_to(jnp.asarray(value, like.dtype), shape)
    if isinstance(like, float) and shape == ():
        return float(value)
    return np.broadcast_to(np.asarray(value, dtype=np.result_type(like)), shape).copy()
