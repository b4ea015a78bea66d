"""What fits in memory, and the machine facts behind it, in four small modules.

- :mod:`~multistart.memory.widths`: width arithmetic on literal numbers (the line through two
  estimates, the widest width under a budget, balanced widths, caps, the ladders timed).
- :mod:`~multistart.memory.env`: ``MULTISTART_MAX_BATCH``, ``MULTISTART_MEMORY_BUDGET_GB``,
  ``MULTISTART_AUTO_WIDTH``, each read at call time and checked with a clear error.
- :mod:`~multistart.memory.machine`: usable cores (affinity, cgroup quota), the cgroup's memory
  room, free memory per device, devices sharing one RAM.
- :mod:`~multistart.memory.budget`: the chunk step's memory (XLA's ``memory_analysis()``), the
  budget, the one rule a width is checked by (:func:`need`) and the memory-bounded width.
- :mod:`~multistart.memory.oom`: is an exception an allocation failure?

The names are re-exported here (``multistart.memory.auto_width`` and so on); a test that
replaces a fact replaces it in the module that reads it (``multistart.memory.machine``).
"""

from __future__ import annotations

from .budget import MEMORY_FRACTION as MEMORY_FRACTION
from .budget import Budget as Budget
from .budget import StepMemory as StepMemory
from .budget import WidthBound as WidthBound
from .budget import auto_width as auto_width
from .budget import memory_budget as memory_budget
from .budget import need as need
from .budget import step_memory as step_memory
from .budget import tree_bytes as tree_bytes
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
from .oom import is_out_of_memory as is_out_of_memory
from .widths import CPU_STARTS_PER_CORE as CPU_STARTS_PER_CORE
from .widths import auto_candidates as auto_candidates
from .widths import balanced_width as balanced_width
from .widths import candidate_widths as candidate_widths
from .widths import cap_width as cap_width
from .widths import count_cap as count_cap
from .widths import linear_fit as linear_fit
from .widths import width_for_budget as width_for_budget

__all__ = [
    "AUTO_MODES",
    "Budget",
    "CGROUP_ROOT",
    "CPU_STARTS_PER_CORE",
    "ENV_AUTO_WIDTH",
    "ENV_BUDGET_GB",
    "ENV_MAX_BATCH",
    "GB",
    "MEMORY_FRACTION",
    "StepMemory",
    "WidthBound",
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
    "host_available_memory",
    "is_out_of_memory",
    "linear_fit",
    "max_batch_from_env",
    "memory_budget",
    "need",
    "parse_cpu_max",
    "quota_cores",
    "shared_ram_device_count",
    "step_memory",
    "tree_bytes",
    "usable_cpu_count",
    "width_for_budget",
]
