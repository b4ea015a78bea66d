"""Checkpoints of a running search, written with orbax-checkpoint.

A checkpoint holds the whole device state of a search (every start's parameters, optimiser
state, bests, counters and history) plus a JSON record of the host's state (the step, the
search's RNG state, anything else the loop needs) and a fingerprint of the model and the
configuration. orbax writes each checkpoint into a temporary folder and renames it only when it
is complete, and keeps the previous one until then, so a search killed while writing loses
nothing. A checkpoint that fails to read falls back to the one before it, never silently to a
fresh start.

orbax-checkpoint is an optional dependency (``pip install multistart[checkpoint]``): a search
without ``checkpoint_dir`` never imports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = [
    "Checkpointer",
    "CheckpointError",
    "CheckpointMismatch",
    "SearchCheckpoints",
    "SearchInterrupted",
    "fingerprint",
    "require_orbax",
]

logger = logging.getLogger("multistart")
_FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none of the existing ones could be read."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint folder holds a search of another model or configuration."""


def require_orbax():
    """Import orbax.checkpoint, or explain how to install it."""
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "checkpoint_dir needs orbax-checkpoint: pip install 'multistart[checkpoint]'"
        ) from e
    return ocp


def _hash_array(h, a) -> None:
    a = np.asarray(a)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def fingerprint(problem, dtype, config: dict) -> dict[str, str]:
    """Fingerprints of the model and of the configuration, stable across processes.

    The model's is a hash of the lowered figure of merit (StableHLO text, which holds no Python
    object addresses), of every array it captures and of its data, and of the space; the
    configuration's is a hash of the search's configuration as JSON.
    """
    example = problem.space.example(dtype)
    h = hashlib.sha256()
    h.update(repr(problem.space).encode())
    h.update(str(np.dtype(dtype)).encode())
    h.update(jax.jit(problem.fom).lower(example, problem.data).as_text().encode())
    for const in jax.make_jaxpr(problem.fom)(example, problem.data).consts:
        _hash_array(h, const)
    for leaf in jax.tree_util.tree_leaves(problem.data):
        _hash_array(h, leaf)
    c = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    return {"model": h.hexdigest()[:32], "config": c.hexdigest()[:32]}


class Checkpointer:
    """Save and restore search checkpoints in one folder, keeping the last ``keep``."""

    def __init__(self, directory, *, keep: int = 2):
        ocp = require_orbax()
        self.directory = Path(directory).expanduser().resolve()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(
                f"checkpoint_dir {str(self.directory)!r} cannot be created: {e}"
            ) from e
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise CheckpointError(f"checkpoint_dir {str(self.directory)!r} is not writable")
        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=False, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, oldest first."""
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
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out.meta)

    def restore_latest(self, target_state, fingerprints: dict[str, str]):
        """The newest readable checkpoint as ``(step, state, meta)``, or ``None`` if none exist.

        ``target_state`` gives the structure, shapes and dtypes to restore into, or is a
        function of the checkpoint's JSON record returning them (when shapes depend on it).
        Checkpoints that fail to read are skipped, newest first, with a warning each.

        Raises:
          CheckpointMismatch: the newest readable checkpoint is of another model or
            configuration.
          CheckpointError: checkpoints exist but none could be read.
        """
        ocp = self._ocp
        steps = self.steps()
        if not steps:
            return None
        failures = []
        for step in reversed(steps):
            try:
                meta = self.read_meta(step)
            except Exception as e:  # noqa: BLE001 - a damaged checkpoint can fail any way
                failures.append(f"step {step}: {type(e).__name__}: {e}")
                logger.warning(
                    "checkpoint of step %d is unreadable (%s); trying the previous", step, e
                )
                continue
            self.check_fingerprints(meta, step, fingerprints)
            try:
                target = target_state(meta) if callable(target_state) else target_state
                abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, target)
                args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
                state = self._manager.restore(step, args=args).state
                jax.block_until_ready(state)
            except Exception as e:  # noqa: BLE001
                failures.append(f"step {step}: {type(e).__name__}: {e}")
                logger.warning(
                    "checkpoint of step %d is unreadable (%s); trying the previous", step, e
                )
                continue
            return step, state, meta
        raise CheckpointError(
            f"none of the checkpoints in {str(self.directory)!r} could be read: "
            + "; ".join(failures)
        )

    def check_fingerprints(self, meta: dict, step: int, fingerprints: dict[str, str]) -> None:
        for what in ("model", "config"):
            if meta.get("fingerprint", {}).get(what) != fingerprints[what]:
                raise CheckpointMismatch(
                    f"the checkpoint in {str(self.directory)!r} (step {step}) is of another "
                    f"{what} than this search; use another checkpoint_dir, or delete it to "
                    "start afresh"
                )

    def close(self) -> None:
        self._manager.close()


class SearchInterrupted(KeyboardInterrupt):
    """A search stopped by Ctrl-C or SIGTERM (or a failed checkpoint), carrying what it had.

    Attributes:
      result: the partial :class:`multistart.Result` (running starts marked ``interrupted``).
      checkpoint: the step of the checkpoint written on the way out, or ``None``.
      reason: why the search stopped (``"SIGINT"``, ``"SIGTERM"``).
    """

    def __init__(self, message: str, *, result=None, checkpoint=None, reason=None):
        super().__init__(message)
        self.result = result
        self.checkpoint = checkpoint
        self.reason = reason


class SearchCheckpoints:
    """A search's checkpoints: what goes in, and how a resumed search continues.

    The device state is the population (``PopState``); the host state is the loop's counters
    and, with resurrection, the resurrector's records and the reserve's takes. Everything else
    a resumed search needs (the starts, the filter's reserve) is replanned from the seed.
    """

    def __init__(self, directory, every: int, fingerprints: dict[str, str]):
        self.store = Checkpointer(directory)
        self.every = every
        self.fingerprints = fingerprints
        self.saved: list[int] = []

    def check(self) -> None:
        """Refuse, before any compile, a folder whose newest checkpoint is of another search."""
        for step in reversed(self.store.steps()):
            try:
                meta = self.store.read_meta(step)
            except Exception:  # noqa: BLE001 - damaged: restore will fall back past it
                continue
            self.store.check_fingerprints(meta, step, self.fingerprints)
            return

    def due(self, steps_run: int) -> bool:
        return steps_run % self.every == 0

    def save(self, steps_run: int, pop, resurrector, loop: dict) -> None:
        state = {"pop": pop}
        meta = {"fingerprint": self.fingerprints, "steps_run": steps_run, "loop": loop}
        if resurrector is not None:
            state["resurrector"], meta["resurrector"] = resurrector.state()
        self.store.save(steps_run, state, meta)
        self.saved.append(steps_run)
        logger.debug("checkpoint of step %d written to %s", steps_run, self.store.directory)

    def restore(self, pop, resurrector):
        """``(pop, steps_run, loop)`` from the newest readable checkpoint, or ``None``."""

        def target(meta):
            state = {"pop": pop}
            if resurrector is not None:
                state["resurrector"] = resurrector.state_like(meta["resurrector"])
            return state

        found = self.store.restore_latest(target, self.fingerprints)
        if found is None:
            return None
        step, state, meta = found
        if resurrector is not None:
            resurrector.restore(state["resurrector"], meta["resurrector"])
        logger.info("resuming from the checkpoint of step %d in %s", step, self.store.directory)
        return state["pop"], int(meta["steps_run"]), dict(meta.get("loop", {}))
