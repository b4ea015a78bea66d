"""Local rules behind two small interfaces: what a start does with one evaluation.

A :class:`Solver` is a frozen dataclass of its hyperparameters. Its pure functions take and
return a per-start state (``init``, ``step``, ``restart``, ``converged``), and the engine wraps
them with everything rules share: the non-finite guard, the best-so-far, the window
convergence rule, batching, repacking, resurrection and checkpoints (see
:mod:`multistart.device.step`). A :class:`Minimiser`'s step gets a value and a gradient, a
:class:`LeastSquaresRule`'s (:mod:`.least_squares`) the residuals and their Jacobian; a new
rule is one subclass of either. optimistix's solvers run through :mod:`.optimistix`.
"""

from .base import LeastSquaresRule as LeastSquaresRule
from .base import Minimiser as Minimiser
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
    "LeastSquaresRule",
    "LeastSquaresSolver",
    "LeastSquaresState",
    "Minimiser",
    "OptaxSolver",
    "Solver",
    "SolverStep",
    "as_solver",
]
