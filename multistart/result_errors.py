"""A Result's uncertainties: the Laplace approximation at its best fit and at its minima.

A search attaches its problem (the figure of merit and its space) to the Result it returns;
nothing is computed until ``errors``, ``covariance`` or ``correlation`` is first read (one
Hessian compile, then cached). A problem is code, so it is never saved: a loaded Result keeps
the covariance saved with it, and needs ``attach_problem`` for anything else.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

from .laplace import Laplace, hessian_function, laplace_problem
from .problem import Problem, as_problem

if TYPE_CHECKING:  # pragma: no cover
    from .result import Result

__all__ = ["attach", "at_best", "at", "for_saving"]


def attach(result: Result, objective, space=None) -> Result:
    """See :meth:`multistart.Result.attach_problem`."""
    problem = objective if isinstance(objective, Problem) else as_problem(objective, space)
    if result.paths and list(problem.space.paths) != list(result.paths):
        raise ValueError(
            f"the problem's parameters {problem.space.paths} are not this Result's "
            f"{list(result.paths)}"
        )
    # the covariance is now this problem's: one computed (or loaded) before is dropped
    result._problem, result._hessian, result._laplace = problem, None, None
    return result


def at_best(result: Result) -> Laplace:
    """The Laplace approximation at the best fit, computed once and cached on ``result``."""
    if result._laplace is None:
        if result.best_index < 0:
            raise ValueError("no start reached a finite figure of merit: no covariance")
        result._laplace = at(result, result.best_params)
    return result._laplace


def at(result: Result, params) -> Laplace:
    """The Laplace approximation at ``params``, with the Result's problem and its one
    compiled Hessian."""
    if result._problem is None:
        raise ValueError(
            "this Result has no problem to compute a covariance from (it was loaded "
            "without one, or built by hand): call "
            "result.attach_problem(objective, space) or result.attach_problem(graph)"
        )
    if result._hessian is None:
        result._hessian = hessian_function(result._problem)
    return laplace_problem(result._problem, params, result._hessian)


def for_saving(result: Result) -> Laplace | None:
    """The covariance to save with ``result``: computed now when it can be, else ``None``."""
    if result._laplace is not None or result._problem is None or result.best_index < 0:
        return result._laplace
    try:
        # Saving is not the place to warn about nan errors (a short fit is rarely at a
        # minimum): the warning is logged, and the nan errors are saved as they are.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            fit = at_best(result)
        for w in caught:
            logging.getLogger("multistart").info("Result.save: %s", w.message)
        return fit
    except Exception as e:  # a long fit's record must be saved whatever the Hessian does
        warnings.warn(
            f"Result.save: the covariance could not be computed ({type(e).__name__}: {e}); "
            "saved without it",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
