"""The Result of a search, as one package.

:class:`Result` (:mod:`~multistart.result.core`) is every start's record and what is read off
it; beside it, each behind a method of the Result: the uncertainties
(:mod:`~multistart.result.uncertainty`), the figure (:mod:`~multistart.result.plot`), the file
(:mod:`~multistart.result.file`) and the merge of a search's parts
(:mod:`~multistart.result.merge`).
"""

from __future__ import annotations

from .core import Fom as Fom
from .core import Minimum as Minimum
from .core import Result as Result
from .core import warn_if_no_start_improved as warn_if_no_start_improved
from .uncertainty import Uncertainty as Uncertainty

__all__ = ["Fom", "Minimum", "Result", "Uncertainty", "warn_if_no_start_improved"]
