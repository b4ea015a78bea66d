"""The solver interface: per-start pure functions the engine drives, one evaluation a step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

__all__ = ["Solver", "SolverStep"]


class SolverStep(NamedTuple):
    """What a solver returns from one step of one start.

    Attributes:
      u: the next point the engine evaluates (unconstrained coordinates).
      state: the solver's new state.
      n_evals: evaluations of the objective this step made *besides* the engine's own one
        (an int scalar; 0 for a rule that uses only the value and gradient it is given).
    """

    u: Any
    state: Any
    n_evals: jax.Array | int = 0


class Solver:
    """A local rule, driven by the engine one evaluation of the objective at a time.

    The engine evaluates the figure of merit and its gradient at the start's current point
    ``u`` and hands both to :meth:`step`, which returns the next point to evaluate. A rule
    with a line search therefore carries its search from one engine step to the next in its
    state (a backtracking trial is just the next point), so no start ever waits for another
    inside a compiled loop.

    Subclasses set :attr:`name`, hold their hyperparameters as attributes, list them in
    :meth:`hyperparameters`, and implement :meth:`init` and :meth:`step`; every method takes
    and returns one start's values (the engine ``vmap`` s them) and must be traceable.

    Attributes:
      name: the rule's name, recorded in the Result's configuration.
      handles_nonfinite: ``True`` when :meth:`step` copes with a non-finite value or gradient
        itself (a line search treats one as a failed trial and backtracks). The engine then
        only counts it towards ``max_nonfinite``. ``False``: the engine rolls the start back
        to its last finite point, calls :meth:`restart` there and halves ``scale``.
      uses_residuals: ``True`` for a least-squares rule. The figure of merit is then the sum
        of squares of a residual vector, and the engine's one evaluation of a step is
        :meth:`linearize` of the residuals instead of a value and gradient: :meth:`step`
        also receives ``residuals`` (``r``, one vector) and ``jacobian`` (``J``, ``(m, n)``
        over the raveled parameters), with ``value = ‖r‖²`` and ``grad = 2 Jᵀr``. Such a rule
        runs only where the search has residuals (``multistart.MultiStartLeastSquares``).
      tests_convergence: ``True`` when :meth:`converged` is the rule's own optimality test
        (gradient, step or decrease tests, relative to the scale of the figure of merit).
        A search with such a rule runs no window guard by default (``convergence="auto"``);
        one without gets :class:`multistart.Convergence`, and its starts end ``stalled``.
    """

    name = "solver"
    handles_nonfinite = False
    uses_residuals = False
    tests_convergence = False

    def hyperparameters(self) -> dict[str, Any]:
        """The rule's settings as plain values (recorded in the configuration)."""
        return {}

    def init(self, u) -> Any:
        """The state of a start about to be evaluated at ``u`` for the first time."""
        raise NotImplementedError

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

    def linearize(self, residual_fn, u) -> tuple[jax.Array, jax.Array, int]:
        """``(r, J, cost)`` at ``u`` for a rule that :attr:`uses_residuals`: the residual
        vector, its ``(m, n)`` Jacobian, and the evaluations that cost (a Python int, counted
        in ``n_evals`` in place of the one a value and gradient counts)."""
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
