"""Local rules behind one small interface: what a start does with a value and a gradient.

A :class:`Solver` holds only hyperparameters. Its pure functions take and return a per-start
state (``init``, ``step``, ``restart``, ``converged``), and the engine wraps them with
everything rules share: the non-finite guard, the best-so-far, the window convergence rule,
batching, repacking, resurrection and checkpoints (see :mod:`multistart.step`). A new rule is
one subclass; nothing else changes. Least-squares rules (:mod:`.least_squares`) get residuals
and their Jacobian instead of a gradient; optimistix's solvers run through :mod:`.optimistix`.
"""

from .base import Solver as Solver
from .base import SolverStep as SolverStep
from .lbfgs import LBFGS as LBFGS
from .lbfgs import LBFGSState as LBFGSState
from .least_squares import LeastSquaresSolver as LeastSquaresSolver
from .least_squares import LeastSquaresState as LeastSquaresState
from .optax_rule import OptaxSolver as OptaxSolver
from .optax_rule import as_solver as as_solver

__all__ = [
    "LBFGS",
    "LBFGSState",
    "LeastSquaresSolver",
    "LeastSquaresState",
    "OptaxSolver",
    "Solver",
    "SolverStep",
    "as_solver",
]
