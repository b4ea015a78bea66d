"""What a search fits: a figure of merit ``fom(params, data)``, its space, and its data.

``search.fit(objective, space)`` wraps a plain objective; a model such as
:class:`multistart.FactorGraphModel` provides its own :class:`Problem` through a
``multistart_problem()`` method. Data travels as an argument of the compiled step rather than
as a captured constant, so programs stay small and identical across processes.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import logging
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core

from ..common.digest import Replay
from .priors import Space

__all__ = [
    "Problem",
    "add_note",
    "as_problem",
    "check_call",
    "check_objective",
    "check_scalar",
    "datum",
    "flat_leaves_without_gradient",
    "refuse_space",
    "tracer_hint",
    "ModelTrace",
    "trace_model",
    "traced",
    "traced_key",
]


@dataclass(frozen=True)
class Problem:
    """A figure of merit to minimise over a space.

    Attributes:
      fom: ``fom(params, data) -> scalar``, params physical.
      space: the :class:`multistart.model.priors.Space` of the parameters.
      data: a pytree of arrays passed to ``fom`` (``()`` for a plain objective).
      name: a short name for logs and errors.
      absolute_sigma: the search option of that name (how the covariance is scaled).
      n_data: the number of data points behind the figure of merit (for the reduced χ²).
      rows_per_datum: ``data`` is a stack of datasets (every leaf with a leading axis of
        them) and the search's rows ``i * rows_per_datum`` to ``(i + 1) * rows_per_datum - 1``
        fit dataset ``i`` (``curve_fit(..., batched=True)``); ``None``: every row fits ``data``.
      program_key: a hashable value equal only for problems whose ``fom`` and residuals are
        the same functions of ``(params, data)``: a search then reuses programs compiled for
        data of the same shapes (:mod:`multistart.device.programs`). ``None``: none.
      model: the model the problem came from (a :class:`multistart.FactorGraphModel`), for
        what a Result reads off it (``Result.factor_table``); ``None`` for a plain objective.
      empty_data: with ``rows_per_datum``, ``(n_datasets,)`` bools: the datasets with too few
        points to fit (a batch's fits whose points are all missing): their rows are never
        started and end ``no_data``; ``None``: every dataset is fitted.
    """

    fom: Callable[[Any, Any], jax.Array]
    space: Space
    data: Any = ()
    name: str = "objective"
    absolute_sigma: bool = True
    n_data: int | None = None
    rows_per_datum: int | None = None
    program_key: Any = None
    model_trace: Any = None  # the ModelTrace fom (or a least-squares problem's residuals) replays
    model: Any = None  # the model it came from (a factor graph), for what a Result reads off it
    empty_data: Any = None


def datum(problem: Problem):
    """The data one row of the search sees: ``problem.data``, or for a stack of datasets
    (``rows_per_datum``) one dataset's shapes (``jax.ShapeDtypeStruct``), to trace with."""
    if problem.rows_per_datum is None:
        return problem.data
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], jnp.result_type(a)), problem.data
    )


class ModelTrace(Replay):
    """One trace of a user's model ``fn(params, data)``: its jaxpr and output structure, as
    optimistix keeps ``f_struct``. Called as ``fn`` is, it replays the jaxpr (a
    :class:`multistart.common.digest.Replay`: the user's Python is not run again), so every
    program of a fit derives from this one trace, and the same primitives lower to the same
    program.

    Attributes:
      closed: the ``ClosedJaxpr`` (its consts are the arrays ``fn`` captures, as NumPy).
      out: the output's shapes and dtypes (a pytree of ``jax.ShapeDtypeStruct``).
    """

    def __init__(self, fn, params, data):
        closed, self.out = jax.make_jaxpr(fn, return_shape=True)(params, data)
        in_tree = jax.tree_util.tree_structure(((params, data), {}))
        out_tree = jax.tree_util.tree_structure(self.out)
        super().__init__(closed, in_tree, out_tree, fn, getattr(fn, "__name__", "model"))


def trace_model(fn, problem: Problem, dtype, subject: str) -> ModelTrace:
    """:class:`ModelTrace` of ``fn`` at the problem's example parameters and one row's data;
    an exception raised while tracing it is re-raised with a hint and a note naming
    ``subject``."""
    try:
        return ModelTrace(fn, problem.space.example(dtype), datum(problem))
    except Exception as e:
        _note_tracing(e, problem.space, subject)
        raise


def _note_tracing(e: Exception, space, subject: str) -> None:
    """Add to ``e``, raised while tracing ``subject``, the hint :func:`tracer_hint` has for it
    and a note naming ``subject``."""
    hint = tracer_hint(e, space)
    if hint:
        add_note(e, hint)
    add_note(e, f"multistart: raised while tracing {subject}")


def traced(problem: Problem, dtype, context: str) -> Problem:
    """``problem`` with its figure of merit traced once (:class:`ModelTrace`) and replayed from
    then on; a problem traced already (a least-squares problem, traced for its residuals) as
    it is."""
    if problem.model_trace is not None:
        return problem
    trace = trace_model(problem.fom, problem, dtype, f"{problem.name!r} for {context}")
    return replace(problem, fom=trace, model_trace=trace)


def refuse_space(model, space) -> None:
    """A model that carries its own space (a factor graph) takes none from ``fit``."""
    if space is not None:
        raise TypeError(
            f"space must not be given when fitting a {type(model).__name__}: "
            "the model carries its own space"
        )


def as_problem(objective, space=None) -> Problem:
    """Turn ``fit``'s arguments into a :class:`Problem`, checking them (no tracing yet)."""
    provider = getattr(objective, "multistart_problem", None)
    if provider is not None:
        refuse_space(objective, space)
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
    check_call(objective, f"the objective {name!r}", "objective(params) -> scalar")

    def fom(params, data):
        out = objective(params)
        # A Python number (`return 3.0`) is a scalar too: the step reads `.dtype` of it.
        return jnp.asarray(out) if isinstance(out, (int, float)) else out

    return Problem(fom=fom, space=Space(space), data=(), name=name)


def check_objective(problem: Problem, dtype, context: str) -> None:
    """Trace the figure of merit (no compile): it must return a real scalar, and depend, through
    differentiable operations, on its parameters.

    An exception raised while tracing is re-raised with a note naming the search.

    Raises:
      TypeError: the figure of merit does not return one real floating-point scalar.
      ValueError: its gradient is zero everywhere, whatever the parameters (see
        :func:`flat_leaves_without_gradient`): every start would stop where it began.

    Warns:
      RuntimeWarning: some parameters (named) have a gradient that is zero everywhere: they
        never move from their starts.
    """
    example = problem.space.example(dtype)
    try:
        out = jax.eval_shape(problem.fom, example, datum(problem))
    except Exception as e:
        _note_tracing(e, problem.space, f"{problem.name!r} for {context}")
        raise
    check_scalar(out, f"objective {problem.name!r}")
    check_gradient(problem, dtype)


_WHY = (
    "no parameter reaches its value through a differentiable operation (jnp.round, "
    "jnp.floor, jnp.argmax, comparisons, integer casts and constants have no gradient)"
)


def check_gradient(problem: Problem, dtype) -> None:
    """Raise if the gradient is zero everywhere; warn naming parameters that never move."""
    unused = flat_leaves_without_gradient(problem, dtype)
    if not unused:
        return
    if len(unused) == sum(name is not None for name in problem.space.example_names()):
        raise ValueError(
            f"the figure of merit {problem.name!r} has a gradient that is zero everywhere: "
            f"{_WHY}, so every start would stop where it began and be reported as a minimum. "
            "Make the model differentiable in its parameters (e.g. a softmax-weighted sum "
            "instead of argmax, a smooth step instead of round)"
        )
    message = (
        f"the gradient of {problem.name!r} is zero everywhere along {', '.join(unused)}: "
        f"{_WHY.replace('no parameter', 'none of them')}, so they stay where each start put "
        "them; make the model depend on them differentiably, or leave them out of the space"
    )
    logging.getLogger("multistart").warning("%s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def flat_leaves_without_gradient(problem: Problem, dtype) -> list[str]:
    """The paths of parameters whose gradient is zero everywhere, found by tracing (no compile).

    The figure of merit's forward derivative (``jax.jvp``) is traced with one tangent per
    parameter leaf of what the model is called with
    (:meth:`multistart.model.priors.Space.example`: a factor graph's stacked factors share a
    leaf a parameter, named for all of them); a parameter whose tangent never reaches the
    output tangent through the traced program has a zero derivative at every point (JAX's
    symbolic zeros: ``round``, ``floor``, ``argmax``, comparisons, integer casts). Calls (an
    inner ``jit``) are followed exactly; control flow (``cond``, ``while``, ``scan``) is taken
    to mix all its inputs, so a parameter is never named by mistake. A figure of merit that
    cannot be traced forward (a ``jax.custom_vjp`` function) is not checked: ``[]``.
    """
    space = problem.space
    example = space.example(dtype)

    def tangent(params, tangents, data):
        return jax.jvp(lambda p: problem.fom(p, data), (params,), (tangents,))[1]

    try:
        closed = jax.make_jaxpr(tangent)(example, example, datum(problem))
    except Exception:  # noqa: BLE001 - cannot be traced forward: nothing to say
        return []
    names = space.example_names()
    free = [j for j, name in enumerate(names) if name is not None]  # a fixed one: not asked
    n = len(names)
    tangents = closed.jaxpr.invars[n : 2 * n]
    masks = {tangents[j]: 1 << i for i, j in enumerate(free)}
    (out,) = _reach(closed.jaxpr, masks)
    return [str(names[j]) for i, j in enumerate(free) if not out >> i & 1]


def _reach(jaxpr, masks: dict) -> list[int]:
    """For each output of ``jaxpr``, the bitmask of the inputs (``masks``) it depends on."""
    masks = dict(masks)

    def of(var) -> int:
        return 0 if isinstance(var, jax_core.Literal) else masks.get(var, 0)

    for eqn in jaxpr.eqns:
        inner = _call_jaxpr(eqn)
        if inner is not None:  # a call: follow its inputs to its outputs exactly
            outs = _reach(inner, {v: of(x) for v, x in zip(inner.invars, eqn.invars, strict=True)})
        else:  # any other primitive (control flow included): every output on every input
            mixed = 0
            for x in eqn.invars:
                mixed |= of(x)
            outs = [mixed] * len(eqn.outvars)
        for var, m in zip(eqn.outvars, outs, strict=True):
            masks[var] = m
    return [of(v) for v in jaxpr.outvars]


# Primitives that call a body once, its inputs and outputs the equation's one to one.
_CALLS = {"jit", "pjit", "closed_call", "core_call", "remat", "checkpoint"}


def _call_jaxpr(eqn):
    """The body of a call (an inner ``jit``, a ``remat``), else ``None``."""
    if eqn.primitive.name not in _CALLS:
        return None
    for value in eqn.params.values():
        body = getattr(value, "jaxpr", value)  # a ClosedJaxpr's own jaxpr
        if (
            isinstance(body, jax_core.Jaxpr)
            and len(body.invars) == len(eqn.invars)
            and len(body.outvars) == len(eqn.outvars)
        ):
            return body
    return None


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


def tracer_hint(error: BaseException, space: Space | None = None) -> str | None:
    """The hint for an error raised while tracing a user's objective, else ``None``.

    JAX's tracer errors get the fix (``jnp.where``, ``jnp.exp``); given the ``space``, a
    ``KeyError`` for a name that is not a parameter (``p["A"]`` in a space of ``"amp"``) gets
    the space's names and the closest of them; a function that needs more arguments than the
    params (``f(x, a, tau)``) gets the call a search makes.
    """
    for kind, hint in _TRACER_HINTS:
        if isinstance(error, kind):
            return hint
    if space is not None and isinstance(error, KeyError) and len(error.args) == 1:
        return _key_hint(error.args[0], space)
    if isinstance(error, TypeError) and _MISSING_ARGUMENTS.search(str(error)):
        return _CALL_HINT
    return None


# A function written as scipy's curve_fit takes it, f(x, a, tau), called with the params alone
# (where check_call could not look first).
_MISSING_ARGUMENTS = re.compile(r"missing \d+ required positional argument")
_CALL_HINT = (
    "multistart: a search calls your function with one argument, the dict of the space's "
    "parameters (p['name']); a model f(x, *params), as scipy's curve_fit takes it, goes inside "
    "it: residuals = lambda p: (f(x, p['a'], p['b']) - ydata) / sigma, or to "
    "ms.curve_fit(f, xdata, ydata, p0, sigma), which takes f(x, *params)"
)


def _key_hint(key, space: Space) -> str | None:
    """The space's parameter names, for a lookup of ``key`` that is none of them."""
    names = {part for path in space.paths for part in path.split(".")}
    if not isinstance(key, str) or key in names:
        return None  # a name of the space (a data dict's key, or a nested level): not ours
    close = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.5)
    if not close:  # a different case is the commonest slip ('A' for 'a'), and difflib's
        close = [n for n in sorted(names) if n.lower() == key.lower()][:1]  # ratio misses it
    mean = f"; did you mean {close[0]!r}?" if close else ""
    return (
        f"multistart: {key!r} is not a parameter of the space, whose parameters are "
        f"{', '.join(repr(space.paths[i]) for i in space.written_order)} (params[name]; a "
        "nested space's as "
        f"params[group][name]){mean}"
    )


def check_call(fn, subject: str, expected: str) -> None:
    """Refuse, before any trace, a callable that cannot take a single argument (the params).

    A model written as scipy's ``curve_fit`` takes it, ``f(x, a, tau)``, would otherwise fail
    at tracing with "missing 2 required positional arguments" and no word of the call a search
    makes. A callable whose signature cannot be read is left to the trace.

    Raises:
      TypeError: naming the call expected, ``ms.curve_fit`` for a model ``f(x, *params)``, and
        the objective written for this one.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None)
    except TypeError:
        pass
    else:
        return
    names = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    curve_fit = ""
    if len(names) >= 2:
        call = f"f({names[0]}, {', '.join(f'p[{n!r}]' for n in names[1:])})"
        curve_fit = (
            ". For a model f(x, *params), as scipy's curve_fit takes it, use "
            "ms.curve_fit(f, xdata, ydata, p0, sigma), which takes f(x, *params); or write the "
            f"objective around it: lambda p: jnp.sum((({call} - ydata) / sigma) ** 2), over a "
            f"space of {', '.join(map(repr, names[1:]))}"
        )
    raise TypeError(
        f"{subject} takes {signature}, but multistart calls {expected}: one argument, the dict "
        f"of the space's parameters (p['name']){curve_fit}"
    )


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


def traced_key(problem: Problem, dtype) -> Any:
    """A ``program_key`` for a problem that has none, from one trace of its model: equal only
    for models that lower to the same program with the same captured arrays, so a second fit
    of the same function (or of a new closure over the same arrays) reuses the first fit's
    programs, and one over changed data (a global rebound, a new array) does not.

    The residuals are traced for a least-squares problem (its figure of merit is made from
    them), else the figure of merit. A function the program calls but does not print (a
    callback, a custom derivative rule) is part of the key as the object itself, so two
    different ones never share programs. ``None`` where the trace fails (the checks that follow
    say why) or a part of it cannot be hashed.
    """
    try:
        trace = problem.model_trace
        if trace is None:
            fn = getattr(problem, "residuals", None) or problem.fom
            trace = ModelTrace(fn, problem.space.example(dtype), datum(problem))
        closed, out = trace.closed, trace.out
        digest = hashlib.sha256()
        opaque: list = []
        _fingerprint(closed, digest, opaque)
        digest.update(str(jax.tree_util.tree_structure(out)).encode())
        key = ("traced", digest.hexdigest(), tuple(opaque))
        hash(key)
    except Exception:  # noqa: BLE001 - the checks trace it again and raise with a hint
        return None
    return key


def _fingerprint(closed, digest, opaque: list) -> None:
    """Feed ``closed`` (a ClosedJaxpr) into ``digest``: its text, its captured arrays' bytes;
    the functions its equations hold (which the text does not show) go to ``opaque``."""
    digest.update(str(closed.jaxpr).encode())
    for const in closed.consts:
        a = np.asarray(const)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    stack = list(closed.jaxpr.eqns)
    while stack:
        eqn = stack.pop()
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, jax_core.ClosedJaxpr):
                    _fingerprint(v, digest, opaque)
                elif isinstance(v, jax_core.Jaxpr):
                    stack.extend(v.eqns)
                elif callable(v) and not isinstance(v, type):
                    opaque.append(v)
