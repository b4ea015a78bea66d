"""multistart: multi-start gradient fitting in JAX.

Many optax local searches of one model run at once, compiled once and swept in chunks; the
result is the best fit with every start's record.
"""

from .chunking import chunk_slices as chunk_slices
from .convergence import Convergence as Convergence
from .log import set_level as set_log_level
from .memory import usable_cpu_count as usable_cpu_count
from .priors import LogUniform as LogUniform
from .priors import Normal as Normal
from .priors import Prior as Prior
from .priors import Uniform as Uniform
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
    "LogUniform",
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
    "usable_cpu_count",
]
