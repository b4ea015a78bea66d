"""optimistix's solvers as :class:`~multistart.solvers.Solver` s: one evaluation a step.

An optimistix solver (``init / step / terminate``) evaluates its function once per ``step``,
at the point its state asks for (``state.y_eval``): line searches and trust regions are
already state machines carried from step to step, which is the engine's own contract. The
adapter hands ``step`` a stand-in for the function that is exact at that point and costs
nothing: the first-order expansion ``f(u) + ∇f(u)·(y - u)`` (a minimiser: its value and
gradient at ``u``), or ``r(u) + J(u)(y - u)`` (a least-squares solver: its residuals and
Jacobian), built from the engine's one evaluation at ``u``. Tracing ``step`` checks that the
solver calls the function exactly once; the solvers admitted are those whose ``step`` calls it
at ``state.y_eval`` only (:data:`MINIMISERS`, :data:`LEAST_SQUARES`, checked by class).

State: optimistix keeps jaxprs (a linear operator's function) in some states, which cannot
leave a compiled program. The adapter keeps a start's state as the tuple of its arrays and
the rest (its structure, the jaxprs) once on the adapter, from an abstract ``init``.

optimistix is an optional dependency: ``pip install optimistix`` (or ``multistart[optimistix]``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .base import LeastSquaresRule, Minimiser, Solver, SolverStep, _set

__all__ = [
    "OptimistixLeastSquares",
    "OptimistixMinimiser",
    "as_least_squares_solver",
    "as_minimiser",
    "is_optimistix",
    "LEAST_SQUARES",
    "MINIMISERS",
]

#: Abstract optimistix classes whose ``step`` evaluates the function once, at ``state.y_eval``.
MINIMISERS = ("AbstractQuasiNewton", "AbstractGradientDescent")
LEAST_SQUARES = ("AbstractGaussNewton",)
_REFUSED = {  # why other optimistix solvers are refused
    "NelderMead": "it evaluates a whole simplex, and several trial points, in one step",
    "OptaxMinimiser": "pass the optax transformation itself (multistart runs optax rules)",
    "BestSoFarMinimiser": "the engine keeps every start's best so far: pass the solver inside",
    "BestSoFarLeastSquares": "the engine keeps every start's best so far: pass the solver inside",
}
_NONFINITE_SEARCHES = ("BacktrackingArmijo", "ClassicalTrustRegion", "LinearTrustRegion")


def is_optimistix(rule) -> bool:
    """Is ``rule`` an optimistix solver (checked without importing optimistix)?"""
    return any(c.__module__.split(".")[0] == "optimistix" for c in type(rule).__mro__)


def _optx():
    try:
        import optimistix
    except ImportError as e:  # pragma: no cover - the extra is installed in the test env
        raise ImportError(
            "an optimistix solver needs optimistix: pip install optimistix "
            "(or pip install 'multistart[optimistix]')"
        ) from e
    return optimistix


def _admitted(rule, names: tuple[str, ...]) -> bool:
    optx = _optx()
    return any(isinstance(rule, getattr(optx, n)) for n in names)


def as_minimiser(rule) -> OptimistixMinimiser:
    """An optimistix minimiser as a rule for ``MultiStartGradient``, or a ValueError saying
    why it cannot keep one evaluation per start per step."""
    name = type(rule).__name__
    if name in _REFUSED:
        raise ValueError(f"optimistix's {name} cannot run in the engine: {_REFUSED[name]}")
    if _admitted(rule, LEAST_SQUARES):
        raise ValueError(
            f"optimistix's {name} is a least-squares solver: fit residuals with "
            f"multistart.MultiStartLeastSquares(method=optx.{name}(...))"
        )
    if not _admitted(rule, MINIMISERS):
        raise ValueError(
            f"optimistix's {name} is not known to evaluate its function once per step at the "
            "point it asks for (the engine's contract); admitted: subclasses of "
            f"optimistix.{', optimistix.'.join(MINIMISERS)} (BFGS, DFP, LBFGS, GradientDescent, "
            "NonlinearCG)"
        )
    return OptimistixMinimiser(rule)


def as_least_squares_solver(rule, *, jacobian: str = "auto") -> OptimistixLeastSquares:
    """An optimistix least-squares solver as a rule for ``MultiStartLeastSquares``."""
    name = type(rule).__name__
    if not is_optimistix(rule):
        raise TypeError(
            "method must be 'lm', 'dogleg', 'gauss-newton' or an optimistix least-squares "
            f"solver; got {name}"
        )
    if name in _REFUSED:
        raise ValueError(f"optimistix's {name} cannot run in the engine: {_REFUSED[name]}")
    if not _admitted(rule, LEAST_SQUARES):
        raise ValueError(
            f"method=optx.{name}(...): optimistix's {name} is not a Gauss-Newton-type "
            "least-squares solver (admitted as method: subclasses of "
            "optimistix.AbstractGaussNewton: LevenbergMarquardt, IndirectLevenbergMarquardt, "
            "GaussNewton, Dogleg); a minimiser fits a scalar objective: "
            f"MultiStartGradient(optx.{name}(...))"
        )
    return OptimistixLeastSquares(rule, jacobian)


@dataclass(frozen=True, eq=False, repr=False)
class _Adapter(Solver):
    """An optimistix solver stepping one start from the engine's one evaluation a step."""

    solver: Any
    _templates: dict = field(default_factory=dict, init=False)

    tests_convergence = True  # optimistix's own terminate (its rtol and atol)

    def __post_init__(self):
        super().__post_init__()
        # a search that compares values rejects a non-finite trial and shortens the next
        search = type(getattr(self.solver, "search", None)).__name__
        _set(
            self,
            name=f"optimistix.{type(self.solver).__name__}",
            handles_nonfinite=search in _NONFINITE_SEARCHES,
        )

    def hyperparameters(self) -> dict[str, Any]:
        out: dict[str, Any] = {"solver": type(self.solver).__name__}
        out |= {key: float(getattr(self.solver, key)) for key in ("rtol", "atol")}
        parts = [part for part in ("search", "descent") if hasattr(self.solver, part)]
        return out | {part: type(getattr(self.solver, part)).__name__ for part in parts}

    # -- optimistix's calls, through the stand-in function -----------------------------------

    def _standin(self, u, f0, slope, calls: list):
        """``f0 + slope (y - u)``: a value and gradient, or residuals and their Jacobian."""
        u_flat, _ = ravel_pytree(u)

        def fn(y, args):
            calls.append(1)
            step = ravel_pytree(y)[0] - u_flat
            return f0 + (jnp.vdot(slope, step) if slope.ndim == 1 else slope @ step), None

        return fn

    def _f_struct(self, u) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((), ravel_pytree(u)[0].dtype)

    _options = {"autodiff_mode": "bwd"}

    def _optx_init(self, u):
        u_flat, _ = ravel_pytree(u)
        f = self._f_struct(u)
        slope = jnp.zeros((*f.shape, u_flat.shape[0]), f.dtype)
        fn = self._standin(u, jnp.zeros(f.shape, f.dtype), slope, [])
        return self.solver.init(fn, u, None, self._options, f, None, frozenset())

    def _template(self, u):
        """``(treedef, static)``: the state's array structure and everything else (jaxprs)."""
        import equinox as eqx

        key = (
            jax.tree_util.tree_structure(u),
            tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree_util.tree_leaves(u)),
        )
        if key not in self._templates:
            abstract = eqx.filter_eval_shape(self._optx_init, u)
            dynamic, static = eqx.partition(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
            self._templates[key] = (jax.tree_util.tree_structure(dynamic), static)
        return self._templates[key]

    def _pack(self, state, u) -> tuple:
        import equinox as eqx

        treedef, _ = self._template(u)
        leaves, structure = jax.tree_util.tree_flatten(eqx.filter(state, eqx.is_array))
        if structure != treedef:
            raise TypeError(
                f"{self.name}: its state changes structure between steps, which a state kept "
                "on the device cannot do; this solver is not supported"
            )
        return tuple(leaves)

    def _unpack(self, leaves, u):
        import equinox as eqx

        treedef, static = self._template(u)
        return eqx.combine(jax.tree_util.tree_unflatten(treedef, list(leaves)), static)

    # -- the Solver interface ----------------------------------------------------------------

    def init(self, u):
        return u, self._pack(self._optx_init(u), u)

    def _step(self, f0, slope, u, state, scale) -> SolverStep:
        y, packed = state
        calls: list = []
        fn = self._standin(u, f0, slope, calls)
        optx_state = self._unpack(packed, u)
        y_new, new, _ = self.solver.step(fn, y, None, self._options, optx_state, frozenset())
        if len(calls) != 1:
            raise TypeError(
                f"{self.name} evaluated its function {len(calls)} times in one step; the engine "
                "runs solvers that evaluate it once per step"
            )
        # The engine's step multiplier (halved after a rolled-back step) shortens the move.
        u_next = jax.tree_util.tree_map(
            lambda a, b: jnp.where(scale == 1, b, a + scale * (b - a)), y_new, new.y_eval
        )
        new = _replace_y_eval(new, u_next)
        return SolverStep(u_next, (y_new, self._pack(new, u)), 0)

    def converged(self, state) -> jax.Array:
        y, packed = state
        done, _ = self.solver.terminate(
            None, y, None, self._options, self._unpack(packed, y), frozenset()
        )
        return done


@dataclass(frozen=True, eq=False, repr=False)
class OptimistixMinimiser(_Adapter, Minimiser):
    """An optimistix minimiser stepping one start (see :func:`as_minimiser`)."""

    def step(self, value, grad, u, state, *, scale, value_fn) -> SolverStep:
        del value_fn  # one evaluation a step: the engine's
        return self._step(value, ravel_pytree(grad)[0], u, state, scale)


@dataclass(frozen=True, eq=False, repr=False)
class OptimistixLeastSquares(_Adapter, LeastSquaresRule):
    """An optimistix Gauss-Newton-type solver stepping one start (see
    :func:`as_least_squares_solver`).

    ``residual_size``: optimistix keeps the residuals and their Jacobian in its state, so
    their number is part of it; ``MultiStartLeastSquares.fit`` sets it (:meth:`bind`).
    """

    jacobian: str = "auto"
    residual_size: int | None = None

    def hyperparameters(self) -> dict[str, Any]:
        return {**super().hyperparameters(), "jacobian": self.jacobian}

    def bind(self, residual_size: int) -> OptimistixLeastSquares:
        """This adapter for ``residual_size`` residuals."""
        same = residual_size == self.residual_size
        return self if same else dataclasses.replace(self, residual_size=residual_size)

    def _f_struct(self, u) -> jax.ShapeDtypeStruct:
        if self.residual_size is None:
            raise TypeError(
                f"{self.name}: the number of residuals is not known; the adapter runs inside "
                "MultiStartLeastSquares.fit, which sets it"
            )
        return jax.ShapeDtypeStruct((self.residual_size,), ravel_pytree(u)[0].dtype)

    _options = {"jac": "fwd"}  # forward mode for the stand-in: a product with the J given

    def step(self, residuals, jacobian, u, state, *, value, scale, value_fn) -> SolverStep:
        del value, value_fn  # one evaluation a step: the engine's
        return self._step(residuals, jacobian, u, state, scale)


def _replace_y_eval(state, y_eval):
    import equinox as eqx

    return eqx.tree_at(lambda s: s.y_eval, state, y_eval)
