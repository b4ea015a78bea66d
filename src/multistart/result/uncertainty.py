"""A Result's uncertainties: the Laplace approximation at its best fit and at its minima.

A search attaches its problem (the figure of merit and its space) to the Result it returns;
nothing is computed until ``errors``, ``covariance`` or ``correlation`` is first read (one
Hessian compile, then cached). A problem is code, so it is never saved: a loaded Result keeps
the covariance saved with it, and needs ``attach_problem`` for anything else.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import jax
import numpy as np

from ..model.problem import Problem, as_problem
from .laplace import Laplace, hessian_function, laplace_problem

__all__ = ["Uncertainty"]


class Uncertainty:
    """What a Result's covariance is computed from, and the covariance once computed.

    Attributes:
      problem: the figure of merit and its space (``None``: a loaded or hand-made Result).
      laplace: the Laplace approximation at the best fit, once computed or loaded.
    """

    def __init__(
        self, problem: Problem | None = None, laplace: Laplace | None = None, hessian: Any = None
    ):
        self.problem = problem
        self.laplace = laplace
        # the problem's Hessian (hessian_function), compiled once for every point; a search
        # hands over the one it keeps with the fit's programs, so a refit compiles nothing
        self._hessian: Any = hessian

    @classmethod
    def of(cls, paths, objective, space=None) -> Uncertainty:
        """For a Result of parameters ``paths`` (see :meth:`multistart.Result.attach_problem`)."""
        problem = objective if isinstance(objective, Problem) else as_problem(objective, space)
        # any order: a Result saved before paths kept the space's written order has them sorted
        if paths and sorted(problem.space.all_paths) != sorted(paths):
            raise ValueError(
                f"the problem's parameters {problem.space.all_paths} are not this Result's "
                f"{list(paths)}"
            )
        return cls(problem)

    def __getstate__(self):  # pickled without the problem (closures) or its compiled Hessian
        return {"problem": None, "laplace": self.laplace, "_hessian": None}

    def at_best(self, best_index: int, best_params, *, warn: bool = True) -> Laplace:
        """The Laplace approximation at the best fit, computed once and cached; a
        ``RuntimeWarning`` names any parameter of the best fit on a bound of its prior, and
        any it does not determine (``warn=False``: none, for a caller that says it its own
        way, as ``curve_fit``)."""
        if self.laplace is None:
            if best_index < 0:
                raise ValueError("no start reached a finite figure of merit: no covariance")
            self.laplace = self.at(best_params, warn=warn)
            if warn:
                self._warn_at_bound(best_params)
        return self.laplace

    def _warn_at_bound(self, params) -> None:
        assert self.problem is not None  # at() needed it
        space = self.problem.space
        one = jax.tree_util.tree_map(lambda a: np.asarray(a)[None], params)
        _, names = space.near_bound(one)
        if names:
            warnings.warn(
                f"the best fit has {', '.join(names[0])} on a bound of its prior: the error "
                "there is the curvature at the bound, not a Gaussian error (the likelihood is "
                "cut by the bound); widen the prior, or profile that parameter",
                RuntimeWarning,
                stacklevel=4,
            )

    def at(self, params, *, warn: bool = True) -> Laplace:
        """The Laplace approximation at ``params``, with the problem's one compiled Hessian."""
        if self.problem is None:
            raise ValueError(
                "this Result has no problem to compute a covariance from (it was loaded "
                "without one, or built by hand): call "
                "result.attach_problem(objective, space) or result.attach_problem(graph)"
            )
        if self._hessian is None:
            self._hessian = hessian_function(self.problem)
        return laplace_problem(self.problem, params, self._hessian, warn=warn)

    def for_saving(self, best_index: int, best_params) -> Laplace | None:
        """The covariance to save: computed now when it can be, else ``None``."""
        if self.laplace is not None or self.problem is None or best_index < 0:
            return self.laplace
        try:
            # Saving is not the place to warn about nan errors (a short fit is rarely at a
            # minimum): the warning is logged, and the nan errors are saved as they are.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)
                fit = self.at_best(best_index, best_params)
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
