"""The solver interfaces: per-start pure functions the engine drives, one evaluation a step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from . import small

__all__ = ["JACOBIAN_MODES", "LeastSquaresRule", "Minimiser", "Solver", "SolverStep", "linearize"]

JACOBIAN_MODES = ("auto", "forward", "reverse")


class SolverStep(NamedTuple):
    """What a solver returns from one step of one start.

    Attributes:
      u: the next point the engine evaluates (unconstrained coordinates).
      state: the solver's new state.
      n_evals: evaluations of the objective this step made *besides* the engine's own one
        (an int scalar; 0 for a rule that uses only what it is given).
    """

    u: Any
    state: Any
    n_evals: jax.Array | int = 0


class Solver:
    """What every local rule shares: a rule is a :class:`Minimiser` or a
    :class:`LeastSquaresRule`, a frozen dataclass whose fields are its hyperparameters (checked
    in ``__post_init__``), with :attr:`name`, :meth:`init` and ``step``.

    The engine evaluates a start's point ``u`` once a step and hands the result to ``step``,
    which returns the next point to evaluate: a line search is carried in the state (a
    backtracking trial is just the next point), so no start waits for another in a compiled
    loop. Every method takes and returns one start's values (the engine ``vmap`` s them) and
    must be traceable.

    Attributes:
      name: the rule's name, recorded in the Result's configuration.
      handles_nonfinite: ``True`` when ``step`` copes with a non-finite evaluation itself (a
        line search treats one as a failed trial and backtracks). The engine then only counts
        it towards ``max_nonfinite``. ``False``: the engine rolls the start back to its last
        finite point, calls :meth:`restart` there and halves ``scale``.
      tests_convergence: ``True`` when :meth:`converged` is the rule's own optimality test
        (gradient, step or decrease tests, relative to the scale of the figure of merit).
        A search with such a rule runs no window guard by default (``convergence="auto"``);
        one without gets :class:`multistart.Convergence`, and its starts end ``stalled``.
      projects_to_bounds: ``True`` when ``step`` takes ``bounded=``, a bool per raveled
        coordinate saying which are a bounded prior's logistic coordinates, and projects its
        trials onto those bounds (the batched L-BFGS).
    """

    name = "solver"
    handles_nonfinite = False
    tests_convergence = False
    projects_to_bounds = False

    def __post_init__(self) -> None:
        """Check the hyperparameters (a subclass's own checks call this one)."""

    def hyperparameters(self) -> dict[str, Any]:
        """The rule's settings as plain values (recorded in the configuration): its dataclass
        fields, but for one marked ``metadata={"name": True}`` (recorded as its name)."""
        fields: tuple = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()
        return {f.name: getattr(self, f.name) for f in fields if not f.metadata.get("name")}

    def init(self, u) -> Any:
        """The state of a start about to be evaluated at ``u`` for the first time."""
        raise NotImplementedError

    def restart(self, u, state) -> Any:
        """The state after the engine rolled the start back to ``u`` (default: :meth:`init`)."""
        return self.init(u)

    def converged(self, state) -> jax.Array:
        """Has the rule's own optimality test passed (e.g. a gradient tolerance)? The start
        then ends ``converged``."""
        del state
        return jax.numpy.bool_(False)

    def stalled(self, state) -> jax.Array:
        """Has the rule given up without passing its optimality test (no decrease it can find
        is left)? The start then ends ``stalled``."""
        del state
        return jax.numpy.bool_(False)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyperparameters().items())
        return f"{type(self).__name__}({args})"


def _set(solver: Solver, **values) -> None:
    """Set checked fields of a frozen dataclass in its ``__post_init__``."""
    for key, value in values.items():
        object.__setattr__(solver, key, value)


class Minimiser(Solver):
    """A rule for a scalar figure of merit: each step gets its value and gradient."""

    def step(
        self, value, grad, u, state, *, scale, value_fn: Callable[[Any], jax.Array]
    ) -> SolverStep:
        """The next point to evaluate, given ``value`` and ``grad`` at ``u``.

        Args:
          value, grad: the figure of merit and its gradient at ``u`` (possibly non-finite).
          u: the point just evaluated.
          state: this start's state.
          scale: the engine's step multiplier (1, halved after each rolled-back step).
          value_fn: the figure of merit of one point, for rules that evaluate more (counted
            in :attr:`SolverStep.n_evals`).
        """
        raise NotImplementedError


class LeastSquaresRule(Solver):
    """A rule for a sum of squares ``‖r‖²``: each step gets the residual vector ``r`` and its
    Jacobian, from :meth:`linearize`. It runs only where the search has residuals
    (``multistart.MultiStartLeastSquares``)."""

    jacobian = "auto"  # the Jacobian's mode: "auto", "forward" or "reverse" (see linearize)

    def __post_init__(self) -> None:
        if self.jacobian not in JACOBIAN_MODES:
            modes = ", ".join(map(repr, JACOBIAN_MODES))
            raise ValueError(f"jacobian must be one of {modes}; got {self.jacobian!r}")

    def linearize(self, residual_fn, u) -> tuple[jax.Array, jax.Array, int]:
        """The engine's one evaluation of a step: :func:`linearize` in the ``jacobian`` mode."""
        return linearize(residual_fn, u, self.jacobian)

    def step(
        self, residuals, jacobian, u, state, *, value, scale, value_fn: Callable[[Any], jax.Array]
    ) -> SolverStep:
        """The next point to evaluate, given the residuals and their Jacobian at ``u``.

        Args:
          residuals, jacobian: ``r`` (one vector) and ``J`` (``(m, n)``) at ``u``.
          value: ``‖r‖²``, the figure of merit the engine's guard and best-so-far read.
          u, state, scale, value_fn: as :meth:`Minimiser.step`'s.
        """
        raise NotImplementedError


def linearize(residual_fn, u, mode: str = "auto"):
    """``(r, J, cost)``: the residuals at ``u`` as one vector, their Jacobian, and its cost.

    ``u`` may be a pytree; ``J`` is ``(m, n)`` over its raveled leaves. The Jacobian is built
    from ``n`` forward-mode products (one ``vmap`` of ``jax.jvp`` over the basis) when
    ``n <= m`` and ``mode`` is ``"auto"`` or ``"forward"``, else from ``m`` reverse-mode
    products; the residuals come with it, not from another evaluation. ``cost`` (a Python
    int) is the number of those products: the evaluations the engine counts for the step,
    as it counts one value-and-gradient (itself one reverse-mode product) as one.
    """
    u_flat, unravel = ravel_pytree(u)
    n = u_flat.shape[0]

    def flat(v):
        return ravel_pytree(residual_fn(unravel(v)))[0]

    m = jax.eval_shape(flat, u_flat).shape[0]
    if mode == "forward" or (mode == "auto" and n <= m):
        if small.entrywise(n):
            # on a chip, a column a product of one linearisation: every column feeds its dot
            # products directly (small.gram), where the vmap's (m, n) array was written whole
            # to memory with m on the lanes, a third of a 200,000-fit step (issue 70)
            r, lin = jax.linearize(flat, u_flat)
            basis = jnp.eye(n, dtype=u_flat.dtype)
            axes = tuple(jax.sharding.get_abstract_mesh().manual_axes)
            if axes:  # under shard_map (a mesh of devices) a tangent varies over it, as u does
                basis = jax.lax.pcast(basis, axes, to="varying")
            return r, jnp.stack([lin(basis[j]) for j in range(n)], axis=1), n
        # one vmap of jvp over the basis (the residuals computed once, unbatched): the same
        # values as jax.linearize's, a third cheaper under the chunk step's vmap on a CPU
        # (profiling/HISTORY.md, "Least squares near a bound")
        basis = jnp.eye(n, dtype=u_flat.dtype)
        r, jac = jax.vmap(lambda t: jax.jvp(flat, (u_flat,), (t,)), out_axes=(None, 1))(basis)
        return r, jac, n
    r, pullback = jax.vjp(flat, u_flat)
    (jac,) = jax.vmap(pullback)(jnp.eye(m, dtype=r.dtype))
    return r, jac, m
