"""multistart: multi-start gradient fitting in JAX.

Many local searches of one model run at once, compiled once and swept in chunks; the result
is the best fit with every start's record.
"""

from . import distributed as distributed
from .cache import cache_dir as cache_dir
from .cache import configure_compilation_cache as configure_compilation_cache
from .checkpoint import CheckpointError as CheckpointError
from .checkpoint import CheckpointMismatch as CheckpointMismatch
from .checkpoint import SearchInterrupted as SearchInterrupted
from .chunking import chunk_slices as chunk_slices
from .config import SearchConfig as SearchConfig
from .convergence import Convergence as Convergence
from .curve_fit import BatchFits as BatchFits
from .curve_fit import curve_fit as curve_fit
from .decide import StopReason as StopReason
from .graph import Factor as Factor
from .graph import FactorGraphModel as FactorGraphModel
from .graph import FactorView as FactorView
from .laplace import Laplace as Laplace
from .laplace import laplace as laplace
from .least_squares import MultiStartLeastSquares as MultiStartLeastSquares
from .log import set_level as set_log_level
from .memory import usable_cpu_count as usable_cpu_count
from .parts import PartsFailed as PartsFailed
from .parts import fit_parts as fit_parts
from .priors import Fixed as Fixed
from .priors import HalfBounded as HalfBounded
from .priors import LogUniform as LogUniform
from .priors import Normal as Normal
from .priors import Prior as Prior
from .priors import Uniform as Uniform
from .result import Minimum as Minimum
from .result import Result as Result
from .schedule import Halving as Halving
from .search import MultiStartADABelief as MultiStartADABelief
from .search import MultiStartAdam as MultiStartAdam
from .search import MultiStartGradient as MultiStartGradient
from .search import MultiStartLBFGS as MultiStartLBFGS
from .search import MultiStartLion as MultiStartLion
from .search import MultiStartProdigy as MultiStartProdigy
from .solvers import LBFGS as LBFGS
from .solvers import LeastSquaresRule as LeastSquaresRule
from .solvers import LeastSquaresSolver as LeastSquaresSolver
from .solvers import Minimiser as Minimiser
from .solvers import OptaxSolver as OptaxSolver
from .solvers import Solver as Solver
from .starts import STRATEGIES as START_STRATEGIES
from .starts import NoFiniteStartsError as NoFiniteStartsError
from .status import Status as Status

__version__ = "0.1.0"

__all__ = [
    "BatchFits",
    "CheckpointError",
    "CheckpointMismatch",
    "Convergence",
    "Factor",
    "FactorGraphModel",
    "FactorView",
    "Fixed",
    "HalfBounded",
    "Halving",
    "Laplace",
    "LogUniform",
    "Minimum",
    "MultiStartADABelief",
    "MultiStartAdam",
    "MultiStartGradient",
    "MultiStartLBFGS",
    "MultiStartLeastSquares",
    "MultiStartLion",
    "MultiStartProdigy",
    "NoFiniteStartsError",
    "Normal",
    "PartsFailed",
    "Prior",
    "Result",
    "LBFGS",
    "LeastSquaresRule",
    "LeastSquaresSolver",
    "Minimiser",
    "OptaxSolver",
    "Solver",
    "START_STRATEGIES",
    "SearchConfig",
    "SearchInterrupted",
    "Status",
    "StopReason",
    "Uniform",
    "cache_dir",
    "chunk_slices",
    "configure_compilation_cache",
    "curve_fit",
    "distributed",
    "fit_parts",
    "laplace",
    "set_log_level",
    "usable_cpu_count",
]
