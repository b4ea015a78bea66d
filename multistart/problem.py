"""What a search fits: a figure of merit ``fom(params, data)``, its space, and its data.

``search.fit(objective, space)`` wraps a plain objective; a model such as
:class:`multistart.FactorGraphModel` provides its own :class:`Problem` through a
``multistart_problem()`` method. Data travels as an argument of the compiled step rather than
as a captured constant, so programs stay small and identical across processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from .priors import Space

__all__ = ["Problem", "as_problem", "check_objective", "check_scalar"]


@dataclass(frozen=True)
class Problem:
    """A figure of merit to minimise over a space.

    Attributes:
      fom: ``fom(params, data) -> scalar``, params physical.
      space: the :class:`multistart.priors.Space` of the parameters.
      data: a pytree of arrays passed to ``fom`` (``()`` for a plain objective).
      name: a short name for logs and errors.
    """

    fom: Callable[[Any, Any], jax.Array]
    space: Space
    data: Any = ()
    name: str = "objective"


def as_problem(objective, space=None) -> Problem:
    """Turn ``fit``'s arguments into a :class:`Problem`, checking them (no tracing yet)."""
    provider = getattr(objective, "multistart_problem", None)
    if provider is not None:
        if space is not None:
            raise TypeError(
                f"space must not be given when fitting a {type(objective).__name__}: "
                "the model carries its own space"
            )
        problem = provider()
        if not isinstance(problem, Problem):
            raise TypeError(
                f"{type(objective).__name__}.multistart_problem() must return a Problem"
            )
        return problem
    if not callable(objective):
        raise TypeError(
            "objective must be a callable objective(params) -> scalar or a "
            f"multistart.FactorGraphModel; got {type(objective).__name__}"
        )
    if space is None:
        raise TypeError("space is required with a plain objective: fit(objective, space)")
    name = getattr(objective, "__name__", type(objective).__name__)

    def fom(params, data):
        return objective(params)

    return Problem(fom=fom, space=Space(space), data=(), name=name)


def check_objective(problem: Problem, dtype, context: str) -> None:
    """Trace the figure of merit once (no compile) and check it returns a real scalar.

    An exception raised while tracing is re-raised as is, with a note naming the search.
    """
    example = problem.space.example(dtype)
    try:
        out = jax.eval_shape(problem.fom, example, problem.data)
    except Exception as e:
        e.add_note(f"multistart: raised while tracing {problem.name!r} for {context}")
        raise
    check_scalar(out, f"objective {problem.name!r}")


def check_scalar(out, subject: str) -> None:
    """Raise a TypeError naming ``subject`` unless ``out`` is one real floating-point scalar."""
    leaves = jax.tree_util.tree_leaves(out)
    if len(leaves) != 1 or not hasattr(leaves[0], "shape"):
        raise TypeError(f"{subject} must return a single scalar array; got {out!r}")
    (leaf,) = leaves
    if leaf.shape != ():
        raise TypeError(
            f"{subject} must return a scalar; got shape {leaf.shape} (reduce it, e.g. with jnp.sum)"
        )
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
        raise TypeError(
            f"{subject} must return a real floating-point scalar; got dtype {leaf.dtype}"
        )
