"""The ``multistart`` logger and its progress lines.

Level: ``MULTISTART_LOG_LEVEL`` (a logging level name or number; default ``INFO``), read when a
search starts, so it can be changed between runs. During a long compile a heartbeat line
("still compiling the chunk step (30 s)") is logged every ``MULTISTART_COMPILE_HEARTBEAT_S``
seconds (default 30; 0 turns it off), so a cluster job's log never looks dead.

If neither the ``multistart`` logger nor the root logger has a handler, one stderr handler is
attached to the ``multistart`` logger, so a plain script shows progress without any logging
set-up; an application's own configuration is left alone. A bare ``logging.basicConfig()``
handler on the root logger is not taken for an application's: absl installs one the first time
it logs (orbax, behind ``checkpoint_dir``, logs through absl), and lines would then lose their
timestamps and print twice. While that is all the root logger has, ``multistart`` lines go
through its own handler only.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import sys
import threading
import time

__all__ = [
    "logger",
    "configure",
    "set_level",
    "progress_line",
    "batch_progress_line",
    "compile_heartbeat",
    "routine_level",
    "bound_level",
    "quiet",
    "heartbeat_interval",
]

logger = logging.getLogger("multistart")
_ENV = "MULTISTART_LOG_LEVEL"
_HEARTBEAT_ENV = "MULTISTART_COMPILE_HEARTBEAT_S"
_HEARTBEAT_DEFAULT_S = 30.0
_own_handler: logging.Handler | None = None
_ROUTINE: contextvars.ContextVar[int] = contextvars.ContextVar(
    "multistart_routine_level", default=logging.INFO
)
_BOUND: contextvars.ContextVar[int] = contextvars.ContextVar(
    "multistart_bound_level", default=logging.WARNING
)


def routine_level() -> int:
    """The level of a search's routine lines (what it fits, how it ended): ``INFO``, or
    ``DEBUG`` inside :func:`quiet`."""
    return _ROUTINE.get()


def bound_level() -> int:
    """The level of a search's line saying its best fit is on a bound: ``WARNING``, or
    ``DEBUG`` inside :func:`quiet` (``curve_fit`` says it with an ``OptimizeWarning``)."""
    return _BOUND.get()


@contextlib.contextmanager
def quiet():
    """Within the block a search's routine lines are logged at ``DEBUG`` (``curve_fit``, as
    scipy's, prints nothing unless something needs the user; ``MULTISTART_LOG_LEVEL=DEBUG``
    shows them), and so is its line about a best fit on a bound (the caller warns of it with
    an ``OptimizeWarning``). Other warnings, and progress lines of a search long enough to
    log them, stay."""
    token, bound = _ROUTINE.set(logging.DEBUG), _BOUND.set(logging.DEBUG)
    try:
        yield
    finally:
        _ROUTINE.reset(token)
        _BOUND.reset(bound)


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
    root = logging.getLogger()
    rooted = any(not _bare_default(h) for h in root.handlers)
    if _own_handler is not None and rooted:
        # The application configured the root logger since: its handlers now show our lines,
        # and ours would print each of them a second time.
        logger.removeHandler(_own_handler)
        logger.propagate = True
        _own_handler = None
    if _own_handler is None and not logger.handlers and not rooted:
        _own_handler = logging.StreamHandler(sys.stderr)
        _own_handler.setFormatter(
            logging.Formatter("%(asctime)s multistart %(message)s", "%H:%M:%S")
        )
        logger.addHandler(_own_handler)
    if _own_handler is not None:
        # absl's bare root handler would print each line again, in its own format.
        logger.propagate = not root.handlers


def _bare_default(handler: logging.Handler) -> bool:
    """Whether ``handler`` is what a bare ``logging.basicConfig()`` (absl's) installs."""
    fmt = getattr(handler.formatter, "_fmt", None)
    return (
        type(handler) is logging.StreamHandler
        and fmt == logging.BASIC_FORMAT
        and handler.stream in (sys.stderr, sys.__stderr__)
        and handler.level == logging.NOTSET
        and not handler.filters
    )


def progress_line(
    step: int,
    n_steps: int,
    best: float,
    alive: int,
    converged: int,
    n: int,
    evals_per_s: float,
    *,
    stalled: int = 0,
) -> str:
    """One progress line, e.g. ``step 100/500  best 12.3456  running 60/64  converged 3/64``
    (and ``stalled k/64`` once the window guard ended any start)."""
    more = f"  stalled {stalled}/{n}" if stalled else ""
    return (
        f"step {step}/{n_steps}  best {best:.6g}  running {alive}/{n}  "
        f"converged {converged}/{n}{more}  {evals_per_s:.3g} evals/s"
    )


def batch_progress_line(
    step: int, n_steps: int, done: int, fits: int, running: int, evals_per_s: float
) -> str:
    """A batch's progress line, e.g. ``step 100/500  fits done 120/500, left 380  starts
    running 1500``: no best over fits of different datasets."""
    return (
        f"step {step}/{n_steps}  fits done {done}/{fits}, left {fits - done}  "
        f"starts running {running}  {evals_per_s:.3g} evals/s"
    )


def heartbeat_interval() -> float:
    """Seconds between "still compiling" lines: ``MULTISTART_COMPILE_HEARTBEAT_S`` (0: none)."""
    text = os.environ.get(_HEARTBEAT_ENV, "").strip()
    if not text:
        return _HEARTBEAT_DEFAULT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(
            f"{_HEARTBEAT_ENV} must be a number of seconds >= 0 (0 turns the heartbeat off); "
            f"got {text!r}"
        )
    return value


@contextlib.contextmanager
def compile_heartbeat(what: str):
    """Log ``still compiling <what> (N s)`` every few seconds while the block runs.

    A compile is one blocking call that can take minutes to hours on a large model; a daemon
    thread waits on an event with a timeout and logs a line each time it times out, so the
    block itself is untouched and the thread ends as soon as the block does.
    """
    interval = heartbeat_interval()
    if interval == 0:
        yield
        return
    done = threading.Event()
    t0 = time.perf_counter()

    def beat():
        while not done.wait(interval):
            logger.info("still compiling %s (%.0f s)", what, time.perf_counter() - t0)

    thread = threading.Thread(target=beat, name=f"multistart-heartbeat-{what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
