"""Least squares, per start: residual problems and the search that fits them.

``MultiStartLeastSquares().fit(residuals, space)`` minimises ``‖residuals(params)‖²`` with a
Gauss-Newton-type rule per start (:mod:`multistart.solvers.least_squares`) inside the engine
every rule shares; its errors are curve_fit's (:func:`multistart.result.laplace.residual_laplace`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from ..common import xla
from ..device.programs import forget_other_float_types
from ..model.priors import Space
from ..model.problem import ModelTrace, Problem, add_note, datum, refuse_space, tracer_hint
from ..result import Result
from ..solvers import Solver
from ..solvers.least_squares import METHODS, LeastSquaresSolver
from .core import Search

__all__ = [
    "LeastSquaresSearch",
    "ResidualProblem",
    "COVARIANCES",
    "sum_of_squares",
    "residual_rule",
]

#: ``"gauss-newton"``: curve_fit's ``(JᵀJ)⁻¹``; ``"hessian"``: the full Hessian of ``‖r‖²``.
COVARIANCES = ("gauss-newton", "hessian")


def sum_of_squares(residuals):
    """``‖r‖²`` over every leaf of a residual pytree."""
    flat, _ = ravel_pytree(residuals)
    return jnp.vdot(flat, flat)


@dataclass(frozen=True)
class ResidualProblem(Problem):
    """A least-squares problem: residuals over a space; the figure of merit is ``‖r‖²``.

    Attributes:
      residuals: ``residuals(params, data) -> array or pytree of arrays``, params physical.
      absolute_sigma: the residuals are normalised by known standard deviations
        (``(model - data) / sigma``), so the covariance is ``(JᵀJ)⁻¹`` as it is; otherwise it is
        scaled by the reduced χ² ``‖r‖² / (m - n)`` (``scipy.optimize.curve_fit``'s
        ``absolute_sigma``, whose default is also ``False``).
      covariance: ``"gauss-newton"`` (curve_fit's ``(JᵀJ)⁻¹``) or ``"hessian"`` (the full
        Hessian of ``‖r‖²``, the Laplace approximation), scaled the same way.
    """

    residuals: Callable[[Any, Any], Any] | None = None
    absolute_sigma: bool = False
    covariance: str = "gauss-newton"

    def multistart_problem(self) -> ResidualProblem:
        """The problem itself: a search, ``laplace`` or ``Result.attach_problem`` take it."""
        return self


def residual_problem(
    residuals, space=None, *, absolute_sigma: bool = False, covariance: str = "gauss-newton"
) -> ResidualProblem:
    """A :class:`ResidualProblem` from ``residuals(params)`` and its space, or from a factor
    graph whose factors give residuals (``Factor.from_residuals``); checked by one trace."""
    if not isinstance(absolute_sigma, bool):
        raise TypeError(f"absolute_sigma must be True or False; got {absolute_sigma!r}")
    if covariance not in COVARIANCES:
        raise ValueError(
            f"covariance must be one of {', '.join(map(repr, COVARIANCES))}; got {covariance!r}"
        )
    provider = getattr(residuals, "multistart_residual_problem", None)
    extra: dict[str, Any] = {}
    if provider is not None:
        refuse_space(residuals, space)
        # (residuals, space, data, name), and optionally Problem's rows_per_datum, program_key
        fn, space, data, name, *more = provider()
        extra = more[0] if more else {}
    elif callable(residuals) and not isinstance(residuals, Problem):
        if space is None:
            raise TypeError("space is required with a residual function: fit(residuals, space)")
        fn, space, data = _plain(residuals), Space(space), ()
        name = getattr(residuals, "__name__", type(residuals).__name__)
    else:
        raise TypeError(
            "residuals must be a callable residuals(params) -> array (or pytree of arrays) or a "
            f"multistart.FactorGraphModel of residual factors; got {type(residuals).__name__}"
        )

    problem = ResidualProblem(
        fn,  # the figure of merit is made from the traced residuals below
        space,
        data,
        name,
        residuals=fn,
        absolute_sigma=absolute_sigma,
        covariance=covariance,
        **extra,
    )
    # The one trace of the user's function: every program replays it (ModelTrace).
    trace = check_residuals(problem, jax.dtypes.canonicalize_dtype(jnp.float64))

    def fom(params, d):
        return sum_of_squares(trace(params, d))

    return replace(problem, fom=fom, residuals=trace, model_trace=trace)


def _plain(residuals):
    def fn(params, data):
        return residuals(params)

    return fn


def check_residuals(problem: ResidualProblem, dtype) -> ModelTrace:
    """Trace the residuals once (no compile): a floating array or pytree of them, not a scalar.
    Returns the trace (:class:`multistart.model.problem.ModelTrace`)."""
    subject = f"residuals {problem.name!r}"
    assert problem.residuals is not None  # a ResidualProblem is made with its residuals
    try:
        trace = ModelTrace(problem.residuals, problem.space.example(dtype), datum(problem))
    except Exception as e:
        hint = tracer_hint(e)
        if hint:
            add_note(e, hint.replace("the objective", "the residual function"))
        add_note(e, f"multistart: raised while tracing {subject}")
        raise
    out = trace.out
    leaves = jax.tree_util.tree_leaves(out)
    if not leaves or not all(hasattr(x, "shape") for x in leaves):
        raise TypeError(f"{subject} must return an array (or a pytree of arrays); got {out!r}")
    for x in leaves:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{subject} must return real floating-point arrays; got {x.dtype}")
    if len(leaves) == 1 and leaves[0].shape == ():
        raise TypeError(
            f"{subject} returned a scalar: a least-squares search needs the vector of residuals "
            "(model - data) / sigma, not their sum of squares; return shape (1,) for a single "
            "residual, or fit a scalar objective with MultiStartLBFGS"
        )
    if sum(x.size for x in leaves) == 0:
        raise TypeError(f"{subject} returned no residuals (every array is empty)")
    return trace


def least_squares_rule(method, *, ftol, xtol, gtol, jacobian) -> Solver:
    """The rule behind ``method``: a name, or an optimistix least-squares solver (adapted)."""
    tolerances = {"ftol": ftol, "xtol": xtol, "gtol": gtol, "jacobian": jacobian}
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(
                f"method must be one of {', '.join(map(repr, METHODS))} or an optimistix "
                f"least-squares solver; got {method!r}"
            )
        given = {k: v for k, v in tolerances.items() if v is not None}
        return LeastSquaresSolver(method, **given)
    from ..solvers.optimistix import as_least_squares_solver

    named = [k for k, v in tolerances.items() if v is not None and k != "jacobian"]
    if named:
        raise ValueError(
            f"{', '.join(named)} apply to the built-in methods ({', '.join(METHODS)}); an "
            "optimistix solver carries its own rtol and atol"
        )
    return as_least_squares_solver(method, jacobian=jacobian or "auto")


def residual_rule(
    *,
    method="lm",
    ftol: float | None = None,
    xtol: float | None = None,
    gtol: float | None = None,
    jacobian: str | None = None,
    covariance: str = "gauss-newton",
) -> Solver:
    """:class:`multistart.MultiStartLeastSquares`'s rule: :func:`least_squares_rule`, with the
    ``covariance`` its errors take checked (the search keeps it)."""
    rule = least_squares_rule(method, ftol=ftol, xtol=xtol, gtol=gtol, jacobian=jacobian)
    if covariance not in COVARIANCES:
        options = ", ".join(map(repr, COVARIANCES))
        raise ValueError(f"covariance must be one of {options}; got {covariance!r}")
    return rule


class LeastSquaresSearch(Search):
    """What :class:`multistart.MultiStartLeastSquares` adds to a search: residuals in, the
    covariance its errors take, the problem it fits."""

    @property
    def covariance(self) -> str:
        """``"gauss-newton"`` or ``"hessian"``: how ``result.errors`` are computed."""
        return self._made_with[1]["covariance"]

    def config(self) -> dict[str, Any]:
        config = super().config()
        config.update(covariance=self.covariance)
        return config

    def problem(self, residuals, space=None) -> ResidualProblem:
        """The :class:`ResidualProblem` :meth:`fit` fits (for ``Result.attach_problem`` after
        ``Result.load``, or ``multistart.laplace``)."""
        return residual_problem(
            residuals,
            space,
            absolute_sigma=bool(self.options.absolute_sigma),  # resolved by the rule
            covariance=self.covariance,
        )

    def fit(  # type: ignore[override]  # residuals, not a scalar objective
        self, residuals, space=None, *, starts=None, resume: bool = False, part=None
    ) -> Result:
        """Minimise ``‖residuals(params)‖²`` over ``space``, or fit a graph of residual factors.

        Args:
          residuals: ``residuals(params) -> array`` (or a pytree of arrays), ``params`` the
            physical parameters; or a :class:`multistart.FactorGraphModel` whose factors give
            residuals (then ``space`` is omitted).
          space: a (nested) dict of priors: the bounds and the start distribution.
          starts, resume, part: as :meth:`MultiStartGradient.fit`.

        Raises:
          TypeError: ``residuals`` returns a scalar (pass the residual vector, not its sum of
            squares), a non-float or empty output; raised after one trace, before any compile.
        """
        with xla.precision(self.options.dtype):  # the residuals traced in the search's type
            forget_other_float_types(jax.dtypes.canonicalize_dtype(jnp.float64))
            problem = self.problem(residuals, space)
            search = self
            bind = getattr(self.solver, "bind", None)  # optimistix's states hold the residuals
            if bind is not None:  # a copy of the search with the rule bound: fit changes none
                search = copy.copy(self)
                object.__setattr__(search, "solver", bind(residual_size(problem)))
            fit = Search.fit
            return fit(search, problem, None, starts=starts, resume=resume, part=part)


def residual_size(problem: ResidualProblem) -> int:
    """The number of residuals (from the problem's trace, else one trace; no compile)."""
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
    assert problem.residuals is not None  # a ResidualProblem is made with its residuals
    out = getattr(problem.model_trace, "out", None)
    if out is None:
        out = jax.eval_shape(problem.residuals, problem.space.example(dtype), datum(problem))
    return int(sum(x.size for x in jax.tree_util.tree_leaves(out)))
