"""Checkpoints of a running search, written with orbax-checkpoint.

A checkpoint holds one run state (:class:`multistart.host.run_state.RunState`) with a fingerprint
of the model and the configuration. orbax writes it whole or not at all, so a search killed
while writing loses nothing. One that fails to read falls back to the one before it, never
silently to a fresh start, and is moved aside into ``<checkpoint_dir>/damaged/``. A search
without ``checkpoint_dir`` never imports orbax-checkpoint (the ``checkpoint`` extra).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from .config import SearchConfig, require_orbax
from .identity import SearchIdentity, describe_difference

__all__ = [
    "Checkpointer",
    "CheckpointError",
    "CheckpointMismatch",
    "SearchCheckpoints",
    "SearchInterrupted",
]

logger = logging.getLogger("multistart")
_FORMAT = 1
DAMAGED = "damaged"  # the sub-folder damaged checkpoints are moved into


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none of the existing ones could be read.

    Attributes:
      result: when a write failed during a search, the search so far (a
        :class:`multistart.Result`); ``None`` otherwise.
    """

    result: Any = None


class CheckpointMismatch(CheckpointError):
    """The checkpoint folder holds a search of another model or configuration."""


class _OrbaxReadNoise(logging.Filter):
    """Drops the errors absl logs while orbax reads a damaged checkpoint's JSON files: the
    failure reaches this module as an exception, and is reported once, naming the step."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to json parse")


@contextlib.contextmanager
def _quiet_damaged_reads():
    absl = logging.getLogger("absl")
    noise = _OrbaxReadNoise()
    absl.addFilter(noise)
    try:
        yield
    finally:
        absl.removeFilter(noise)


class _Collect(logging.Filter):
    def __init__(self, into: list[str]):
        super().__init__()
        self.into = into

    def filter(self, record: logging.LogRecord) -> bool:
        self.into.append(record.getMessage().splitlines()[0])
        return False


@contextlib.contextmanager
def _background_failures(damaged: list[int]):
    """While checkpoints are read: when a read fails, orbax's background reads of the same
    checkpoint fail after it, in tasks, coroutines and threads nobody waits for any more, and
    Python would print each one's traceback ("Exception ignored in", asyncio's "Task exception
    was never retrieved", "Event loop is closed"). They are the failure the read raised, which
    the caller reports once, naming the step: here they are only logged at DEBUG, naming the
    ``damaged`` steps (filled in by the caller)."""
    caught: list[str] = []
    asyncio_log, collect = logging.getLogger("asyncio"), _Collect(caught)
    hooks = sys.unraisablehook, threading.excepthook

    def note(u: Any) -> None:  # a hook's argument: the exception is u.exc_value
        caught.append(f"{type(u.exc_value).__name__}: {u.exc_value}".splitlines()[0])

    asyncio_log.addFilter(collect)
    sys.unraisablehook = threading.excepthook = note
    try:
        yield
    finally:
        if damaged:  # what a failed read left behind is finalised now, not later
            gc.collect()
        sys.unraisablehook, threading.excepthook = hooks
        asyncio_log.removeFilter(collect)
        for what in caught:
            logger.debug("reading the damaged checkpoint of step %s: %s", damaged, what)


class Checkpointer:
    """Save and restore search checkpoints in one folder, keeping the last ``keep``."""

    def __init__(self, directory, *, keep: int = 2):
        ocp = require_orbax()
        self.directory = self.check_folder(directory)
        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=False, create=True
        )
        with _quiet_damaged_reads():
            self._manager = ocp.CheckpointManager(self.directory, options=options)

    @staticmethod
    def check_folder(directory) -> Path:
        """Create ``directory`` if needed and check it is writable (no orbax needed)."""
        path = Path(directory).expanduser().resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"checkpoint_dir {str(path)!r} cannot be created: {e}") from e
        if not os.access(path, os.W_OK | os.X_OK):
            raise CheckpointError(f"checkpoint_dir {str(path)!r} is not writable")
        return path

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, oldest first."""
        with _quiet_damaged_reads():
            self._manager.reload()
            return sorted(self._manager.all_steps())

    def save(self, step: int, state, meta: dict[str, Any]) -> None:
        """Write a checkpoint for ``step`` (the device state and a JSON-able host record).

        Raises:
          CheckpointError: the folder is not writable or the disk is full; the previous
            checkpoint and the running search are untouched.
        """
        ocp = self._ocp
        meta = {"format": _FORMAT, **meta}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        try:
            self._manager.save(step, args=args, force=True)
            self._manager.wait_until_finished()
        except Exception as e:
            raise CheckpointError(
                f"could not write a checkpoint of step {step} to {str(self.directory)!r}: "
                f"{type(e).__name__}: {e}"
            ) from e

    def read_meta(self, step: int) -> dict:
        ocp = self._ocp
        with _quiet_damaged_reads():
            args = ocp.args.Composite(meta=ocp.args.JsonRestore())
            out = self._manager.restore(step, args=args)
        return dict(out.meta)

    def restore_latest(self, target_state, check):
        """The newest readable checkpoint as ``(step, state, meta)``, or ``None`` if none exist.

        ``target_state`` gives the structure, shapes and dtypes to restore into, or is a
        function of the checkpoint's JSON record returning them (when shapes depend on it).
        Checkpoints that fail to read are skipped, newest first, with a warning each.
        ``check(meta, step)`` vets the newest readable checkpoint's record (and raises).

        Raises:
          CheckpointMismatch: the newest readable checkpoint is of another model or
            configuration.
          CheckpointError: checkpoints exist but none could be read.
        """
        steps = self.steps()
        if not steps:
            return None
        failures: list[str] = []
        damaged: list[int] = []
        with _background_failures(damaged):
            for step in reversed(steps):
                found = self._read(step, target_state, check)
                if not isinstance(found, str):
                    self.set_aside(damaged)
                    return (step, *found)
                failures.append(f"step {step}: {found}")
                damaged.append(step)
                why = "checkpoint of step %d is unreadable (%s); trying the previous"
                logger.warning(why, step, found)
        raise CheckpointError(
            f"none of the checkpoints in {str(self.directory)!r} could be read: "
            + "; ".join(failures)
        )

    def _read(self, step: int, target_state, check) -> tuple[Any, dict] | str:
        """``(state, meta)`` of ``step``, or why it could not be read (in words)."""
        try:
            meta = self.read_meta(step)
        except Exception as e:  # noqa: BLE001 - a damaged checkpoint can fail any way
            return f"{type(e).__name__}: {e}"
        check(meta, step)
        try:
            return self._restore_state(step, target_state, meta), meta
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"

    def _restore_state(self, step: int, target_state, meta: dict):
        ocp = self._ocp
        target = target_state(meta) if callable(target_state) else target_state
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, target)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        with _quiet_damaged_reads():
            state = self._manager.restore(step, args=args).state
        jax.block_until_ready(state)
        return state

    def set_aside(self, steps: list[int]) -> None:
        """Move the folders of damaged checkpoints into ``<directory>/damaged/``.

        The resumed search writes those steps again, which orbax refuses while a folder of that
        step exists; the files are kept. Process 0 moves them and every process waits for it.
        """
        if not steps:
            return
        if jax.process_index() == 0:
            for step in steps:
                source = self.directory / str(step)
                target = self.directory / DAMAGED / str(step)
                for k in range(1, 1000):
                    if not target.exists():
                        break
                    target = self.directory / DAMAGED / f"{step}.{k}"
                target.parent.mkdir(exist_ok=True)
                source.rename(target)
                logger.warning("moved the damaged checkpoint of step %d to %s", step, target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("multistart: damaged checkpoints set aside")
        with _quiet_damaged_reads():
            self._manager.reload()

    def close(self) -> None:
        self._manager.close()


class SearchInterrupted(KeyboardInterrupt):
    """A search stopped by Ctrl-C or SIGTERM (or a failed checkpoint), carrying what it had.

    Attributes:
      result: the partial :class:`multistart.Result` (running starts marked ``interrupted``).
      checkpoint: the step of the checkpoint written on the way out, or ``None``.
      reason: why the search stopped (``"SIGINT"``, ``"SIGTERM"``).
      fits: from ``curve_fit(batched=True)``, the :class:`multistart.BatchFits` so far: the
        fits that ended with their results, those still running marked ``interrupted`` (with
        their best so far); else ``None``.
    """

    def __init__(self, message: str, *, result=None, checkpoint=None, reason=None, fits=None):
        super().__init__(message)
        self.result = result
        self.checkpoint = checkpoint
        self.reason = reason
        self.fits = fits


@dataclass(frozen=True)
class SearchCheckpoints:
    """A search's checkpoints: what goes in, and how a resumed search continues.

    Everything a resumed search needs beyond the :class:`multistart.host.run_state.RunState` (the
    starts, the filter's reserve) is replanned from the seed. A checkpoint of another search
    identity (:mod:`multistart.host.identity`) is refused, naming what differs; ``n_steps`` may grow
    but not shrink.
    """

    store: Checkpointer
    every: int
    identity: SearchIdentity
    n_steps: int
    stride: int

    @classmethod
    def of(cls, store: Checkpointer, identity: SearchIdentity, options: SearchConfig):
        """The checkpoints in ``store`` of the search of ``identity`` under ``options``."""
        every, stride = options.checkpoint_every, options.history_stride
        return cls(store, every, identity, options.steps, stride)

    def vet(self, meta: dict, step: int, ignore=()) -> None:
        """Raise :class:`CheckpointMismatch` unless this search may continue ``meta``'s
        (``ignore``: configuration keys not compared yet)."""
        where = f"the checkpoint in {str(self.store.directory)!r} (step {step})"
        what = describe_difference(meta.get("identity", {}), self.identity, ignore)
        if what is not None:
            raise CheckpointMismatch(
                f"{where} is of {what}; use another checkpoint_dir, or delete it to start afresh"
            )
        old_n = int(meta.get("n_steps", self.n_steps))
        if self.n_steps < old_n:
            raise CheckpointMismatch(
                f"{where} was written by a search with n_steps={old_n}; resume with n_steps >= "
                f"{old_n} (got {self.n_steps})"
            )
        if int(meta.get("stride", self.stride)) != self.stride:
            raise CheckpointMismatch(
                f"{where} records history every {meta['stride']} steps, and n_steps="
                f"{self.n_steps} with this max_history records it every {self.stride}; raise "
                "max_history so the stride stays the same"
            )

    def check(self, ignore=()) -> None:
        """Refuse, before any compile, a folder whose newest checkpoint is of another search
        (``ignore``: configuration keys not compared yet, such as the plan's starts)."""
        for step in reversed(self.store.steps()):
            try:
                meta = self.store.read_meta(step)
            except Exception:  # noqa: BLE001 - damaged: restore will fall back past it
                continue
            self.vet(meta, step, ignore)
            return

    def due(self, steps_run: int) -> bool:
        return steps_run % self.every == 0

    def save(self, state) -> None:
        """Write a checkpoint of ``state`` (a RunState) at its step."""
        arrays, record = state.to_checkpoint()
        meta = {
            "identity": self.identity.record(),
            "n_steps": self.n_steps,
            "stride": self.stride,
            **record,
        }
        self.store.save(state.step, arrays, meta)
        logger.debug("checkpoint of step %d written to %s", state.step, self.store.directory)

    def restore(self, fresh):
        """``fresh`` (a RunState before its first step) continued from the newest readable
        checkpoint, or ``None`` when there is none."""
        found = self.store.restore_latest(fresh.checkpoint_like, self.vet)
        if found is None:
            return None
        step, arrays, meta = found
        logger.info("resuming from the checkpoint of step %d in %s", step, self.store.directory)
        return fresh.restored(arrays, meta)
