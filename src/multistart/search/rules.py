"""The rules of the named searches: each a factory of its own hyperparameters, checked, as optax
builds ``adam`` from its parts. A search class names its factory (:mod:`multistart.search.core`),
whose parameters open the class's signature."""

from __future__ import annotations

import numpy as np
import optax

from ..common import checks
from ..solvers import LBFGS, OptaxSolver, Solver, as_solver

__all__ = ["given", "adam", "prodigy", "adabelief", "lion", "lbfgs"]


def given(optimizer: optax.GradientTransformation | Solver, /) -> Solver:
    """The rule as given (:class:`multistart.MultiStartGradient`'s): any optax transformation,
    or a :class:`multistart.Solver`."""
    return as_solver(optimizer)


def adam(*, learning_rate: float = 0.05, b1=0.9, b2=0.999, eps=1e-8) -> Solver:
    """``optax.adam``."""
    checks.positive(learning_rate, "learning_rate", schedule=True)
    checks.in_unit_interval(b1, "b1")
    checks.in_unit_interval(b2, "b2")
    checks.non_negative(eps, "eps")
    hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2, "eps": eps}
    return OptaxSolver(optax.adam(**hyper), name="adam", hyperparameters=hyper)


def prodigy(*, learning_rate: float = 1.0, betas=(0.9, 0.999)) -> Solver:
    """``optax.contrib.prodigy``."""
    checks.positive(learning_rate, "learning_rate", schedule=True)
    checks.each(checks.in_unit_interval, betas, "betas", length=2)
    return OptaxSolver(
        optax.contrib.prodigy(learning_rate, betas=betas),
        name="prodigy",
        hyperparameters={"learning_rate": learning_rate, "betas": list(betas)},
    )


def adabelief(*, learning_rate: float = 0.05, b1=0.9, b2=0.999) -> Solver:
    """``optax.adabelief``."""
    checks.positive(learning_rate, "learning_rate", schedule=True)
    checks.in_unit_interval(b1, "b1")
    checks.in_unit_interval(b2, "b2")
    hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2}
    return OptaxSolver(optax.adabelief(**hyper), name="adabelief", hyperparameters=hyper)


def lion(*, learning_rate: float = 0.01, b1=0.9, b2=0.99) -> Solver:
    """``optax.lion``."""
    checks.positive(learning_rate, "learning_rate", schedule=True)
    checks.in_unit_interval(b1, "b1")
    checks.in_unit_interval(b2, "b2")
    hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2}
    return OptaxSolver(optax.lion(**hyper), name="lion", hyperparameters=hyper)


def lbfgs(
    *,
    memory: int = 10,
    rtol: float | None = None,
    xtol: float | None = None,
    ftol: float = 0.0,
    diagonal: bool | str = "auto",
) -> Solver:
    """:class:`multistart.solvers.LBFGS`; ``diagonal="auto"`` is off here and resolved when a
    fit starts (:func:`multistart.host.driver.diagonal_for`)."""
    if diagonal != "auto" and not isinstance(diagonal, bool | np.bool_):
        raise ValueError(f"diagonal must be True, False or 'auto'; got {diagonal!r}")
    return LBFGS(memory, rtol=rtol, xtol=xtol, ftol=ftol, diagonal=diagonal is True)
