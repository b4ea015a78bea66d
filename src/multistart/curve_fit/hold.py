"""Held parameters: ``fixed`` values and ``tied`` ones (lmfit's ``vary=False`` and ``expr``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..common import log, xla
from ..model.problem import tracer_hint
from .model import _name


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
            p[name] = base[tie] if isinstance(tie, str) else _call_tie(name, tie, base)
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

            # in float64, where a refinement of one fit runs (a TPU's host CPU): a few numbers
            with jax.enable_x64(True), jax.default_device(xla.refine_device()):
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


def _call_tie(name: str, tie, base: dict):
    """``tie(base)``; an exception it raises (traced, the first time) is told as the tie's,
    not ``f``'s: a ``ValueError`` naming it, with the original chained."""
    try:
        return tie(base)
    except Exception as e:
        hint = tracer_hint(e)  # np.exp on a parameter: use jnp.exp
        fix = "" if hint is None else "; " + hint.removeprefix("multistart: ")
        if isinstance(e, KeyError):
            fix = f"; it may read {', '.join(map(repr, base))} (the free and fixed parameters)"
        said = (str(e).splitlines() or [""])[0]
        error = ValueError(
            f"tied[{name!r}] ({_name(tie)}) raised {type(e).__name__}({said}){fix}".replace(
                "the objective", "the tie"
            )
        )
        error.multistart_said = True  # type: ignore[attr-defined]  # not f's: _trace adds nothing
        raise error from e


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
