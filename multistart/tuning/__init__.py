"""Choosing the batch width: explicit, ``"auto"`` or ``"tune"``.

Three modules: :mod:`~multistart.tuning.choice` (:func:`resolve_width`: explicit widths, the
memory bound, the record, the one memory check a width passes), :mod:`~multistart.tuning.timing`
(the two ladders of timed widths and the :class:`Gate` that prices timing against its saving),
:mod:`~multistart.tuning.record` (the record's key, reading and writing it). Their names are
re-exported here; a test that changes a timing constant changes it in ``timing``.

Both words first bound the width by memory (:func:`multistart.memory.auto_width`). On an
accelerator ``"auto"`` takes that bound. On a CPU, where the best width depends on the model
(XLA's batched code can cost several times the unbatched body per start, while a cheap
objective needs wide chunks to amortise the dispatch), ``"auto"`` may time other widths, but
only where timing pays for itself (:class:`Gate`): one chunk call of the bound's program
(compiled for the bound anyway) prices the fit, ``n_steps`` x calls a step x seconds a call,
and the bound's compile prices each further width; a width is timed when the seconds it is
expected to save the fit exceed that price, the saving expected from what other widths gained
on models whose starts cost about as much (:data:`PRIOR_GAINS`, this device's records, the
widths timed so far). Otherwise the bound is kept, and the fit pays one compile. The widths
``"auto"`` times are a sparse ladder (:func:`time_auto`: the bound, 1, narrower by factors of
8, one width between the best and its better neighbour; only the bound and 1 when width 1 is
far faster, see :data:`AUTO_UNBATCHED_WINS`); ``"tune"`` times a denser one
(:func:`time_tune`: 1 and every power of two) whatever it costs, because it was asked for.

Either way a width is timed on a bounded number of chunk calls (never every start): a step's
time is predicted as the chunk calls it needs times the median seconds per call, which a
passing spike of load does not move. The timed calls step a copy of the initial population and
are thrown away, so the search gives the same result as a search at the width chosen. Measured
choices persist in the cache folder (:func:`multistart.cache.cache_dir`, under ``tuning/``),
one JSON file per key, shared by ``"auto"`` and ``"tune"``, so the next run of the same model
on the same kind of device skips the timing. A width kept without timing is not recorded: it
costs nothing to choose again, and a longer fit of the same model may find timing worth it.

The key is a SHA-256 over:

- the StableHLO text of the *per-start* step (objective, optimiser, guards, convergence rule,
  the data's shapes and dtypes; not the data's values, which are an argument) lowered for one
  start. The chunk step's text would also hold ``n_starts`` and the history length, and a
  longer run of the same model should not retune;
- the backend (``"loop"``/``"scan"``), the platform and device kind (``"cpu"``, ``"NVIDIA
  H100 80GB HBM3"``...), the float dtype, ``n_starts`` rounded up to a power of two, and the
  JAX version.

Lowering is deterministic, so the same model in a second process gets the same key.
"""

from __future__ import annotations

from .choice import Footprint as Footprint
from .choice import WidthChoice as WidthChoice
from .choice import resolve_width as resolve_width
from .record import tune_key as tune_key
from .timing import AUTO_UNBATCHED_WINS as AUTO_UNBATCHED_WINS
from .timing import CALL_FLOOR_S as CALL_FLOOR_S
from .timing import PRIOR_DECADES as PRIOR_DECADES
from .timing import PRIOR_GAINS as PRIOR_GAINS
from .timing import Gate as Gate
from .timing import Timings as Timings
from .timing import expected_share as expected_share
from .timing import time_auto as time_auto
from .timing import time_tune as time_tune

__all__ = [
    "AUTO_UNBATCHED_WINS",
    "CALL_FLOOR_S",
    "Footprint",
    "Gate",
    "PRIOR_DECADES",
    "PRIOR_GAINS",
    "Timings",
    "WidthChoice",
    "expected_share",
    "resolve_width",
    "time_auto",
    "time_tune",
    "tune_key",
]
