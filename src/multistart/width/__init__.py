"""The batch width: what fits in memory, and which width runs fastest.

What fits (no timing):

- :mod:`~multistart.width.widths`: width arithmetic on literal numbers (the line through two
  estimates, the widest width under a budget, balanced widths, caps, the ladders timed).
- :mod:`~multistart.width.env`: ``MULTISTART_MAX_BATCH``, ``MULTISTART_MEMORY_BUDGET_GB``,
  ``MULTISTART_AUTO_WIDTH``, each read at call time and checked with a clear error.
- :mod:`~multistart.width.machine`: usable cores (affinity, cgroup quota), the cgroup's memory
  room, free memory per device, devices sharing one RAM.
- :mod:`~multistart.width.budget`: the chunk step's memory (XLA's ``memory_analysis()``), the
  budget, the one rule a width is checked by (:func:`need`) and the memory-bounded width.

Which width (``batch_size``: explicit, ``"auto"`` or ``"tune"``):

- :mod:`~multistart.width.choice` (:func:`resolve_width`: explicit widths, the memory bound,
  the record, the one memory check a width passes);
- :mod:`~multistart.width.timing` (the two ladders of timed widths and the :class:`Gate` that
  prices timing against its saving);
- :mod:`~multistart.width.record` (the record's key, reading and writing it).

The names are re-exported here (``multistart.width.auto_width`` and so on); a test that
replaces a fact replaces it in the module that reads it (``multistart.width.machine``), and a
test that changes a timing constant changes it in ``timing``. Whether an exception is an
allocation failure is the device's question (:mod:`multistart.device.oom`), re-exported here
as :func:`is_out_of_memory`.

Both words first bound the width by memory (:func:`multistart.width.auto_width`). On an
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
far faster, see :data:`AUTO_WIDTH_ONE_FASTER`); ``"tune"`` times a denser one
(:func:`time_tune`: 1 and every power of two) whatever it costs, because it was asked for.

Either way a width is timed on a bounded number of chunk calls (never every start): a step's
time is predicted as the chunk calls it needs times the median seconds per call, which a
passing spike of load does not move. The timed calls step a copy of the initial population and
are thrown away, so the search gives the same result as a search at the width chosen. Measured
choices persist in the cache folder (:func:`multistart.device.cache.cache_dir`, under ``tuning/``),
one JSON file per key, shared by ``"auto"`` and ``"tune"``, so the next run of the same model
on the same kind of device skips the timing. A width kept without timing is not recorded: it
costs nothing to choose again, and a longer fit of the same model may find timing worth it.

The key is a SHA-256 over:

- the StableHLO text of the *per-start* step (objective, optimiser, guards, convergence rule,
  the data's shapes and dtypes; not the data's values, which are an argument) lowered for one
  start. The chunk step's text would also hold the starts per device and the history length,
  and a longer run of the same model should not retune;
- the backend (``"loop"``/``"scan"``), the platform and device kind (``"cpu"``, ``"NVIDIA
  H100 80GB HBM3"``...), the float dtype, the starts per device rounded up to a power of two,
  and the JAX version.

Lowering is deterministic, so the same model in a second process gets the same key.
"""

from __future__ import annotations

from ..device.oom import is_out_of_memory as is_out_of_memory
from .budget import MEMORY_FRACTION as MEMORY_FRACTION
from .budget import MEMORY_FRACTIONS as MEMORY_FRACTIONS
from .budget import Budget as Budget
from .budget import StepMemory as StepMemory
from .budget import WidthBound as WidthBound
from .budget import auto_width as auto_width
from .budget import memory_budget as memory_budget
from .budget import need as need
from .budget import step_memory as step_memory
from .budget import tree_bytes as tree_bytes
from .choice import Footprint as Footprint
from .choice import WidthChoice as WidthChoice
from .choice import resolve_width as resolve_width
from .env import AUTO_MODES as AUTO_MODES
from .env import ENV_AUTO_WIDTH as ENV_AUTO_WIDTH
from .env import ENV_BUDGET_GB as ENV_BUDGET_GB
from .env import ENV_MAX_BATCH as ENV_MAX_BATCH
from .env import GB as GB
from .env import auto_mode_from_env as auto_mode_from_env
from .env import budget_from_env as budget_from_env
from .env import check_env as check_env
from .env import max_batch_from_env as max_batch_from_env
from .machine import CGROUP_ROOT as CGROUP_ROOT
from .machine import cgroup_cpu_limit as cgroup_cpu_limit
from .machine import cgroup_memory_available as cgroup_memory_available
from .machine import device_free_memory as device_free_memory
from .machine import host_available_memory as host_available_memory
from .machine import parse_cpu_max as parse_cpu_max
from .machine import quota_cores as quota_cores
from .machine import shared_ram_device_count as shared_ram_device_count
from .machine import usable_cpu_count as usable_cpu_count
from .record import tune_key as tune_key
from .timing import AUTO_WIDTH_ONE_FASTER as AUTO_WIDTH_ONE_FASTER
from .timing import CALL_FLOOR_S as CALL_FLOOR_S
from .timing import PRIOR_DECADES as PRIOR_DECADES
from .timing import PRIOR_GAINS as PRIOR_GAINS
from .timing import Gate as Gate
from .timing import Timings as Timings
from .timing import expected_share as expected_share
from .timing import time_auto as time_auto
from .timing import time_tune as time_tune
from .widths import CPU_STARTS_PER_CORE as CPU_STARTS_PER_CORE
from .widths import TPU_AUTO_WIDTH as TPU_AUTO_WIDTH
from .widths import auto_candidates as auto_candidates
from .widths import balanced_width as balanced_width
from .widths import candidate_widths as candidate_widths
from .widths import cap_width as cap_width
from .widths import count_cap as count_cap
from .widths import linear_fit as linear_fit
from .widths import width_for_budget as width_for_budget

__all__ = [
    "AUTO_MODES",
    "AUTO_WIDTH_ONE_FASTER",
    "Budget",
    "CALL_FLOOR_S",
    "CGROUP_ROOT",
    "CPU_STARTS_PER_CORE",
    "TPU_AUTO_WIDTH",
    "ENV_AUTO_WIDTH",
    "ENV_BUDGET_GB",
    "ENV_MAX_BATCH",
    "Footprint",
    "GB",
    "Gate",
    "MEMORY_FRACTION",
    "MEMORY_FRACTIONS",
    "PRIOR_DECADES",
    "PRIOR_GAINS",
    "StepMemory",
    "Timings",
    "WidthBound",
    "WidthChoice",
    "auto_candidates",
    "auto_mode_from_env",
    "auto_width",
    "balanced_width",
    "budget_from_env",
    "candidate_widths",
    "cap_width",
    "cgroup_cpu_limit",
    "cgroup_memory_available",
    "check_env",
    "count_cap",
    "device_free_memory",
    "expected_share",
    "host_available_memory",
    "is_out_of_memory",
    "linear_fit",
    "max_batch_from_env",
    "memory_budget",
    "need",
    "parse_cpu_max",
    "quota_cores",
    "resolve_width",
    "shared_ram_device_count",
    "step_memory",
    "time_auto",
    "time_tune",
    "tree_bytes",
    "tune_key",
    "usable_cpu_count",
    "width_for_budget",
]
