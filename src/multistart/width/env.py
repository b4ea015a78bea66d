"""The environment knobs of the width choice, read at call time so a change between runs counts.

``MULTISTART_MAX_BATCH`` caps every width, ``MULTISTART_MEMORY_BUDGET_GB`` caps the memory
budget, ``MULTISTART_AUTO_WIDTH`` says whether ``"auto"`` times widths on a CPU. A bad value
raises a ``ValueError`` naming the variable and what it accepts (:func:`check_env`, before any
compile).
"""

from __future__ import annotations

import math
import os

__all__ = [
    "AUTO_MODES",
    "ENV_AUTO_WIDTH",
    "ENV_BUDGET_GB",
    "ENV_MAX_BATCH",
    "GB",
    "auto_mode_from_env",
    "budget_from_env",
    "check_env",
    "max_batch_from_env",
]

ENV_MAX_BATCH = "MULTISTART_MAX_BATCH"
ENV_BUDGET_GB = "MULTISTART_MEMORY_BUDGET_GB"
ENV_AUTO_WIDTH = "MULTISTART_AUTO_WIDTH"
AUTO_MODES = ("measure", "memory")
GB = 2**30  # the budget variable counts GiB


def max_batch_from_env() -> int | None:
    """``MULTISTART_MAX_BATCH``: the widest chunk allowed, whatever ``batch_size`` asks for.

    It also caps an explicit int, so a run that failed for memory can be retried narrower
    without a code change. Unset or empty: no cap.

    Raises:
      ValueError: the variable is set to anything but a positive int.
    """
    text = os.environ.get(ENV_MAX_BATCH, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{ENV_MAX_BATCH} must be a positive int (the widest batch allowed) or unset; "
            f"got {text!r}"
        )
    return value


def budget_from_env() -> int | None:
    """``MULTISTART_MEMORY_BUDGET_GB`` in bytes (GiB, fractions allowed); None when unset.

    Raises:
      ValueError: the variable is set to anything but a positive number.
    """
    text = os.environ.get(ENV_BUDGET_GB, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(
            f"{ENV_BUDGET_GB} must be a positive number of GiB (e.g. 0.5) or unset; got {text!r}"
        )
    return int(value * GB)


def auto_mode_from_env() -> str:
    """``MULTISTART_AUTO_WIDTH``: how ``"auto"`` chooses on a CPU.

    ``"measure"`` (the default): time a few widths within the memory bound and remember the
    choice. ``"memory"``: the widest width that fits, at most 4 starts per usable core, with no
    timing (the same width in every run, whatever the load).

    Raises:
      ValueError: the variable is set to anything else.
    """
    text = os.environ.get(ENV_AUTO_WIDTH, "").strip()
    if not text:
        return AUTO_MODES[0]
    if text not in AUTO_MODES:
        raise ValueError(
            f"{ENV_AUTO_WIDTH} must be one of {', '.join(map(repr, AUTO_MODES))} or unset; "
            f"got {text!r}"
        )
    return text


def check_env() -> None:
    """Read every width variable, so a bad value fails before anything is compiled even when
    this run would not have used it."""
    max_batch_from_env()
    budget_from_env()
    auto_mode_from_env()
