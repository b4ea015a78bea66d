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

__all__ = ["Problem", "add_note", "as_problem", "check_objective", "check_scalar", "tracer_hint"]


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
        hint = tracer_hint(e)
        if hint:
            add_note(e, hint)
        add_note(e, f"multistart: raised while tracing {problem.name!r} for {context}")
        raise
    check_scalar(out, f"objective {problem.name!r}")


# The objective is traced with abstract parameters: Python control flow on a parameter, or a
# NumPy function applied to one, needs a concrete value and fails with these errors.
_TRACER_HINTS = (
    (
        jax.errors.TracerBoolConversionError,
        "multistart: the objective uses a parameter in Python control flow (`if`, `while`, "
        "`and`/`or`, `bool()`) while JAX traces it; write the choice with jnp.where(cond, a, b) "
        "(or jax.lax.cond), e.g. `jnp.where(p['x'] > 0, f(p), g(p))` instead of `if p['x'] > 0:`",
    ),
    (
        jax.errors.TracerArrayConversionError,
        "multistart: the objective passes a parameter to NumPy (np.exp, np.sum, np.asarray, ...)"
        " while JAX traces it; use the jax.numpy equivalent (`import jax.numpy as jnp`, "
        "jnp.exp, jnp.sum)",
    ),
    (
        jax.errors.TracerIntegerConversionError,
        "multistart: the objective uses a parameter as a Python int (an index, a range, a "
        "shape) while JAX traces it; parameters are traced arrays, so index with "
        "jnp.take / jax.lax.dynamic_slice or keep shapes fixed",
    ),
    (
        jax.errors.ConcretizationTypeError,
        "multistart: the objective needs a concrete value of a parameter (float(), a shape, "
        "Python control flow) while JAX traces it; use jax.numpy functions and "
        "jnp.where instead of `if`",
    ),
)


def tracer_hint(error: BaseException) -> str | None:
    """The hint for a JAX tracer error raised by a user's objective, else ``None``."""
    for kind, hint in _TRACER_HINTS:
        if isinstance(error, kind):
            return hint
    return None


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``; on Python 3.10 (no notes) the note joins the message."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    elif error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{note}", *error.args[1:])
    else:
        error.args = (*error.args, note)


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
