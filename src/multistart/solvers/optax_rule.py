"""Any optax gradient transformation as a :class:`~multistart.solvers.Solver`."""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import optax

from .base import Minimiser, Solver, SolverStep

__all__ = ["OptaxSolver", "as_solver", "update_kwargs"]

_EXTRA = ("value", "grad", "value_fn")


def update_kwargs(optimizer: optax.GradientTransformation) -> frozenset[str]:
    """Which of ``value``, ``grad``, ``value_fn`` the optimizer's ``update`` accepts.

    optax rules that need the objective inside their update (``optax.lbfgs`` and its line
    search) take them as keyword arguments; a rule that declares no such parameter gets none.
    """
    try:
        params = inspect.signature(optimizer.update).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return frozenset(_EXTRA)
    return frozenset(p.name for p in params) & set(_EXTRA)


def linesearch_evals(state) -> jax.Array:
    """Evaluations an optax line search made this update, read from its state.

    optax's line searches (zoom and backtracking) record ``num_linesearch_steps``, one
    evaluation of ``value_fn`` each, in their state's ``info``; a rule without one has none.
    """
    total = jnp.int32(0)
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if path and getattr(path[-1], "name", None) == "num_linesearch_steps":
            total = total + jnp.asarray(leaf).astype(jnp.int32)
    return total


class OptaxSolver(Minimiser):
    """An optax ``GradientTransformation`` stepping one start: ``u + scale * update``.

    Rules whose ``update`` takes ``value``, ``grad`` or ``value_fn`` (``optax.lbfgs``)
    receive them; their line-search evaluations are counted from the state optax returns.

    Args:
      optimizer: the transformation.
      name: the rule's name in the configuration.
      hyperparameters: its settings as plain values, for the configuration (the search's
        identity does not rely on them: it hashes the lowered step, constants included).
    """

    def __init__(
        self,
        optimizer: optax.GradientTransformation,
        *,
        name: str = "gradient",
        hyperparameters: dict[str, Any] | None = None,
    ):
        if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
            raise TypeError(
                "optimizer must be an optax.GradientTransformation (with init and update); "
                f"got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        self.name = name
        self._hyperparameters = dict(hyperparameters or {})
        self._extra = update_kwargs(optimizer)

    def hyperparameters(self) -> dict[str, Any]:
        return dict(self._hyperparameters)

    def init(self, u):
        return self.optimizer.init(u)

    def step(self, value, grad, u, state, *, scale, value_fn) -> SolverStep:
        kwargs = {"value": value, "grad": grad, "value_fn": value_fn}
        kwargs = {k: v for k, v in kwargs.items() if k in self._extra}
        updates, new_state = self.optimizer.update(grad, state, u, **kwargs)
        updates = jax.tree_util.tree_map(lambda g: (scale * g).astype(g.dtype), updates)
        n_evals = linesearch_evals(new_state) if "value_fn" in self._extra else 0
        return SolverStep(optax.apply_updates(u, updates), new_state, n_evals)


def as_solver(rule) -> Solver:
    """A :class:`Solver` as it is, an optimistix minimiser adapted
    (:func:`multistart.solvers.optimistix.as_minimiser`: refused, saying why, when it cannot
    keep one evaluation per start per step), or an optax transformation in
    :class:`OptaxSolver`."""
    if isinstance(rule, Solver):
        return rule
    from .optimistix import as_minimiser, is_optimistix  # optimistix itself only if used

    if is_optimistix(rule):
        return as_minimiser(rule)
    return OptaxSolver(rule)
