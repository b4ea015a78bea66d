"""The ``multistart`` logger and its progress lines.

Level: ``MULTISTART_LOG_LEVEL`` (a logging level name or number; default ``INFO``), read when a
search starts, so it can be changed between runs. If neither the ``multistart`` logger nor the
root logger has a handler, one stderr handler is attached to the ``multistart`` logger, so a
plain script shows progress without any logging set-up; an application's own configuration is
left alone.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["logger", "configure", "set_level", "progress_line"]

logger = logging.getLogger("multistart")
_ENV = "MULTISTART_LOG_LEVEL"
_own_handler: logging.Handler | None = None


def _parse_level(value: str | int) -> int:
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    level = logging.getLevelName(text.upper())
    if not isinstance(level, int):
        raise ValueError(
            f"{_ENV} must be a logging level such as DEBUG, INFO, WARNING; got {value!r}"
        )
    return level


def set_level(level: str | int) -> None:
    """Set the ``multistart`` logger's level (``"WARNING"`` silences progress lines)."""
    logger.setLevel(_parse_level(level))


def configure() -> None:
    """Apply ``MULTISTART_LOG_LEVEL`` and make sure log lines reach somebody."""
    global _own_handler
    env = os.environ.get(_ENV)
    if env:
        set_level(env)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if _own_handler is None and not logger.handlers and not logging.getLogger().handlers:
        _own_handler = logging.StreamHandler(sys.stderr)
        _own_handler.setFormatter(
            logging.Formatter("%(asctime)s multistart %(message)s", "%H:%M:%S")
        )
        logger.addHandler(_own_handler)


def progress_line(
    step: int, n_steps: int, best: float, alive: int, converged: int, n: int, evals_per_s: float
) -> str:
    """One progress line, e.g. ``step 100/500  best 12.3456  alive 60/64  converged 3/64``."""
    return (
        f"step {step}/{n_steps}  best {best:.6g}  alive {alive}/{n}  "
        f"converged {converged}/{n}  {evals_per_s:.3g} evals/s"
    )
