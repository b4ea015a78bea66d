"""multistart: multi-start gradient fitting in JAX.

Many local searches of one model run at once, compiled once and swept in chunks; the result
is the best fit with every start's record.
"""

import sys as _sys

from .common.log import set_level as set_log_level
from .common.status import Status as Status
from .curve_fit import BatchFits as BatchFits
from .curve_fit import curve_fit as curve_fit
from .device import distributed as distributed
from .device.cache import cache_dir as cache_dir
from .device.cache import configure_compilation_cache as configure_compilation_cache
from .device.chunking import chunk_slices as chunk_slices
from .host.checkpoint import CheckpointError as CheckpointError
from .host.checkpoint import CheckpointMismatch as CheckpointMismatch
from .host.checkpoint import SearchInterrupted as SearchInterrupted
from .host.config import SearchConfig as SearchConfig
from .host.decide import StopReason as StopReason
from .host.parts import PartsFailed as PartsFailed
from .host.parts import fit_parts as fit_parts
from .host.schedule import Halving as Halving
from .model.graph import Factor as Factor
from .model.graph import FactorGraphModel as FactorGraphModel
from .model.graph import FactorView as FactorView
from .model.priors import Fixed as Fixed
from .model.priors import HalfBounded as HalfBounded
from .model.priors import LogUniform as LogUniform
from .model.priors import Normal as Normal
from .model.priors import Prior as Prior
from .model.priors import Uniform as Uniform
from .result import Minimum as Minimum
from .result import Result as Result
from .result.batch import load_fits as load_fits
from .result.laplace import ArrowLaplace as ArrowLaplace
from .result.laplace import Laplace as Laplace
from .result.laplace import laplace as laplace
from .search.gradient import MultiStartADABelief as MultiStartADABelief
from .search.gradient import MultiStartAdam as MultiStartAdam
from .search.gradient import MultiStartGradient as MultiStartGradient
from .search.gradient import MultiStartLBFGS as MultiStartLBFGS
from .search.gradient import MultiStartLion as MultiStartLion
from .search.gradient import MultiStartProdigy as MultiStartProdigy
from .search.least_squares import MultiStartLeastSquares as MultiStartLeastSquares
from .solvers import LBFGS as LBFGS
from .solvers import LeastSquaresRule as LeastSquaresRule
from .solvers import LeastSquaresSolver as LeastSquaresSolver
from .solvers import Minimiser as Minimiser
from .solvers import OptaxSolver as OptaxSolver
from .solvers import Solver as Solver
from .solvers.convergence import Convergence as Convergence
from .starts.strategies import STRATEGIES as START_STRATEGIES
from .starts.strategies import NoFiniteStartsError as NoFiniteStartsError
from .width.machine import usable_cpu_count as usable_cpu_count

# ``import multistart.distributed`` and ``multistart.distributed.initialize()``, as documented:
# the module lives in the device package
_sys.modules[__name__ + ".distributed"] = distributed

__version__ = "0.1.0"

__all__ = [
    "ArrowLaplace",
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
    "load_fits",
    "set_log_level",
    "usable_cpu_count",
]
