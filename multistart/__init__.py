"""multistart: multi-start gradient fitting in JAX.

Many optax local searches of one model run at once, compiled once and swept in chunks; the
result is the best fit with every start's record.
"""

from .chunking import chunk_slices as chunk_slices
from .convergence import Convergence as Convergence
from .graph import Factor as Factor
from .graph import FactorGraphModel as FactorGraphModel
from .graph import FactorView as FactorView
from .log import set_level as set_log_level
from .priors import LogUniform as LogUniform
from .priors import Normal as Normal
from .priors import Prior as Prior
from .priors import Uniform as Uniform
from .result import Minimum as Minimum
from .result import Result as Result
from .search import MultiStartADABelief as MultiStartADABelief
from .search import MultiStartAdam as MultiStartAdam
from .search import MultiStartGradient as MultiStartGradient
from .search import MultiStartLion as MultiStartLion
from .search import MultiStartProdigy as MultiStartProdigy
from .status import Status as Status

__version__ = "0.1.0"

__all__ = [
    "Convergence",
    "Factor",
    "FactorGraphModel",
    "FactorView",
    "LogUniform",
    "Minimum",
    "MultiStartADABelief",
    "MultiStartAdam",
    "MultiStartGradient",
    "MultiStartLion",
    "MultiStartProdigy",
    "Normal",
    "Prior",
    "Result",
    "Status",
    "Uniform",
    "chunk_slices",
    "set_log_level",
]
