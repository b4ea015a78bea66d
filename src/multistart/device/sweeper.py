"""The sweeper: the chunk step at a chosen width, sweeping the population (one step of every
running start), with the out-of-memory back-off.

:class:`Sweeper` keeps a copy of the population from a recent host sync, so a chunk call that
runs out of memory costs no state: the width is halved, the program recompiled and the steps
since that copy are run again (:meth:`Sweeper.sweep`). It is also where the host reads the
starts' small per-start vectors (:meth:`Sweeper.sync`) and repacks the running rows into full
chunks (:meth:`Sweeper.set_rows`). It holds no population of its own: the run state
(:class:`multistart.host.run_state.RunState`) does; the copy is only where a back-off restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from ..common import log
from ..common.status import Status
from .backends import Backend
from .distributed import to_host
from .oom import is_out_of_memory
from .programs import copy_tree, first_line, retry_narrower
from .step import clock

__all__ = ["Sweeper", "Synced", "BACKOFF_COPY_STEPS"]

# The population is copied after a host sync once this many steps have run since the last
# copy: a copy is one dispatch, as dear as a step of a cheap objective, so copying at every
# sync would slow such a fit down (profiling/README.md, "Batch width"). A back-off replays at
# most this many steps (or one sync interval). The copy is made when the sweep next steps (or
# writes), not at the sync itself: a search's last sync is followed by no step, and its copy
# would be a dispatch and the population's size in device memory for nothing (issue 70: 6 ms
# of the host's in a warm call of 200,000 small fits on a TPU, profiling/experiments/
# call_timeline.py).
BACKOFF_COPY_STEPS = 16


class Synced(NamedTuple):
    """What :meth:`Sweeper.sync` read on the host (NumPy), with the population it read."""

    pop: Any
    status: np.ndarray
    best_fom: np.ndarray
    n_evals: np.ndarray
    n_steps: np.ndarray
    best_step: np.ndarray


class Sweeper:
    """A :class:`~multistart.device.backends.Backend` at a chosen width: steps, reads statuses,
    repacks, backs off. The only object that steps the population.

    Made for the width a search chose (:func:`multistart.width.resolve_width`); see the module
    doc for the copy a back-off restarts from. ``remake()``, where given, makes the initial
    population again: a back-off before the first copy restarts from it, and the first step
    makes no copy.

    Attributes:
      backend: the :class:`~multistart.device.backends.Backend` it steps with.
      width: the current batch width (rows per chunk, per device on several).
      rows: the population rows swept (the running starts).
      chunks: one entry per chunk evaluation a step runs.
      compiled: the program at ``width``.
      compile_s: compile seconds of the program(s) it stepped with.
      backoffs: one record per out-of-memory back-off.
      narrowed: one record per narrowing to a search's tail (:meth:`narrow`).
    """

    def __init__(self, backend: Backend, width: int, remake: Callable[[], Any] | None = None):
        self.backend = backend
        self.rows = backend.rows
        self.chunks: list = []
        self.compile_s = 0.0
        self.backoffs: list[dict[str, Any]] = []
        self.narrowed: list[dict[str, int]] = []
        # the population at a recent host sync; at first, where the search can make its
        # initial population again (``remake``, on a chip: a program there), that recipe
        # instead of a copy (a copy is a dispatch, and on a TPU about 5 ms of its DMA for
        # 200,000 small fits' 48 MB, in an ad-hoc check)
        self._saved: Any = remake
        self._copy_due = False  # a sync asked for a new copy: the next step or write makes it
        # since the copy: (clock, rows) of each call, and the writes between them
        self._replay: list[tuple[np.ndarray, np.ndarray] | Callable[[Any], Any]] = []
        self._n_steps = 0
        self._read: tuple[Any, Synced] | None = None  # a peek's read, for the next sync
        self._args: Any = None
        self._replaying = False  # a back-off is replaying the calls since the copy
        self._set_width(width)

    @property
    def n_devices(self) -> int:
        return self.backend.n_devices

    @property
    def spans_processes(self) -> bool:
        return self.backend.spans_processes

    def place(self, pop):
        """See :meth:`Backend.place <multistart.device.backends.Backend.place>`."""
        return self.backend.place(pop)

    def _set_width(self, width: int) -> None:
        self.compiled = self.backend.compiled_for(width)
        self.width = width
        self.compile_s += self.backend.compile_seconds(width)
        self.set_rows(self.rows)

    def narrow(self, width: int, step: int) -> None:
        """Sweep at ``width`` from now on (the search's tail: few rows are running), its
        program compiled once (or kept from an earlier fit of the model)."""
        self.narrowed.append({"step": step, "from": self.width, "to": width})
        log.logger.info(
            "step %d: %d start(s) running, swept %d a chunk from now on (was %d)",
            step,
            self.rows.size,
            width,
            self.width,
        )
        self._set_width(width)

    def set_rows(self, rows: np.ndarray) -> None:
        """Sweep only ``rows`` from now on (repacked into full chunks)."""
        self.rows = np.asarray(rows)
        self.chunks, self._args = self.backend.chunk_calls(self.rows, self.width)

    def sweep(self, pop, step: int, n: int = 1, until_end: bool = False):
        """``n`` steps of every swept row, ``step`` steps taken before (one call per chunk);
        ``until_end``: or fewer, to the first step at which one of them ends (one chunk only:
        chunks would stop at different steps).

        No host synchronisation: a failure of a call may surface here or only at the next
        :meth:`sync`. Either way, if it is an out-of-memory error, the steps since the
        population was last saved are run again from that copy, at half the width.
        """
        pop = self.backend.place(pop)
        if self._saved is None or self._copy_due:
            self._save(pop)
        steps = clock(step, n, until_end)
        self._replay.append((steps, self.rows))
        self._n_steps += n
        try:
            return self.backend.run(self.compiled, pop, self._args, steps)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return self._back_off(exc)

    def write(self, pop, rows: np.ndarray, u_new):
        """``pop`` with the new starts ``u_new`` written into ``rows`` (a refill: the chunk
        step at the current width, taking no step; see
        :meth:`Backend.write <multistart.device.backends.Backend.write>`)."""
        pop = self.backend.place(pop)
        if self._copy_due:
            self._save(pop)

        def write(pop):
            return self.backend.write(self.compiled, pop, rows, u_new, self.width)

        try:
            return write(pop)
        except Exception as exc:
            if self._replaying or not is_out_of_memory(exc):
                raise  # (a back-off replaying this write halves the width again)
            # the calls since the copy, narrower, then the write, halving until both fit: where
            # those calls hold no write, only the write shows whether the narrower width fits
            return self._back_off(exc, then=write)

    def sync(self, pop) -> Synced:
        """Read the starts' status, best figures of merit, evaluation and step counts and the
        step each best was found at on the host (one transfer; one collective on a mesh over
        several processes).

        The read waits for the steps so far, so it is where an asynchronous failure shows.
        After it, once :data:`BACKOFF_COPY_STEPS` steps have run since the last copy, the
        population is copied (one device program, never per chunk) as the point a later
        back-off restarts from: by the next :meth:`sweep` or :meth:`write`, before it acts
        (until then a back-off restarts from the copy before, replaying the steps since).
        """

        read = self._read
        synced = read[1] if read is not None and read[0] is pop else self.peek(pop)
        self._read = None
        if self._steps_since_copy() >= BACKOFF_COPY_STEPS:
            self._copy_due = True
        return synced

    def done(self) -> None:
        """The search stopped stepping: the copy a back-off would restart from and the calls
        since are dropped, and their device memory with them (a later sweep copies again)."""
        self._saved, self._copy_due = None, False
        self._replay.clear()

    def _save(self, pop) -> None:
        """Copy ``pop`` as the point a back-off restarts from: every call and write before
        it is in the copy, so none is replayed."""
        self._saved = copy_tree(pop)
        self._replay.clear()
        self._copy_due = False

    def peek(self, pop) -> Synced:
        """The read of :meth:`sync` alone (no copy): the next :meth:`sync` of ``pop`` reuses it."""

        def read(pop):
            s = pop.starts
            return Synced(pop, *to_host((s.status, s.best_fom, s.n_evals, s.n_steps, s.best_step)))

        try:
            synced = read(pop)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            synced = read(self._back_off(exc))
        self._read = (synced.pop, synced)
        return synced

    def ended_after(self, n: int) -> None:
        """The last call (``until_end``) took ``n`` steps: a replay takes exactly those."""
        last = self._replay[-1]
        assert not callable(last)  # the call's own entry: nothing was written since
        steps, rows = last
        self._replay[-1] = (clock(int(steps[0]), n), rows)
        self._n_steps += n - int(steps[1])

    def _steps_since_copy(self) -> int:
        return sum(int(entry[0][1]) for entry in self._replay if not callable(entry))

    def rewritten(self, write: Callable[[Any], Any]) -> None:
        """``write(pop) -> pop`` was just applied outside the sweep (a refill's new starts
        written into their rows): a back-off replays it in its place among the steps since
        the copy, so the population need not be copied again (a copy per refill is a
        dispatch as dear as a step of a cheap objective)."""
        self._replay.append(write)

    def rebase(self, pop) -> None:
        """``pop`` changed outside the sweep (rows replaced, a checkpoint restored): make it
        the point a later back-off restarts from, as replaying steps over it would undo it."""
        self._save(self.backend.place(pop))

    def _run(self, pop, steps: np.ndarray):
        """Replay one call: a call to the first step where a start ends, now over several
        chunks (at a narrower width), as one step a call until one of them does."""
        if not steps[2] or len(self.chunks) == 1:
            return self.backend.run(self.compiled, pop, self._args, steps)
        rows, running = self.rows, Status.RUNNING.code

        def left(pop) -> int:
            return int(np.sum(np.asarray(to_host(pop.starts.status))[rows] == running))

        before = left(pop)
        for j in range(int(steps[1])):
            pop = self.backend.run(self.compiled, pop, self._args, clock(int(steps[0]) + j))
            if left(pop) < before:
                break
        return pop

    def _back_off(self, exc: BaseException, then: Callable[[Any], Any] | None = None):
        """Halve the width until the steps since the saved copy run (and ``then(pop)`` after
        them, the call that failed where it is no step); returns their result."""
        if self.backend.spans_processes:
            # One process backing off alone would step other programs than the rest of the
            # job, which waits for it at the next collective: a clear error instead.
            raise RuntimeError(
                f"the chunk step ran out of memory at batch_size {self.width} in a search "
                "spanning several processes, where the width is not halved on the fly; "
                "set a smaller batch_size"
            ) from exc

        def halve(old: int, failure: BaseException) -> int:
            new = old // 2
            steps = self._steps_since_copy()
            self.backoffs.append({"step": self._n_steps, "from": old, "to": new, "replayed": steps})
            log.logger.warning(
                "out of memory at batch_size %d (%s); retrying the last %d step(s) at %d",
                old,
                first_line(failure),
                steps,
                new,
            )
            self.backend.release_width(old)  # the program that did not fit
            self.compiled = None
            self._set_width(new)
            return new

        current = self.rows  # the rows to sweep afterwards (a failed replay may move them)

        def replay():
            pop = self._saved() if callable(self._saved) else copy_tree(self._saved)
            self._replaying = True
            try:
                for entry in self._replay:  # each call with the rows it swept, each write
                    if callable(entry):
                        pop = entry(pop)
                        continue
                    steps, rows = entry
                    if rows is not self.rows:
                        self.set_rows(rows)
                    pop = self._run(pop, steps)
                jax.block_until_ready(pop)  # an asynchronous failure shows here, not later
            finally:
                self._replaying = False
            self.set_rows(current)
            return pop if then is None else jax.block_until_ready(then(pop))

        return retry_narrower(
            replay,
            exc,
            width=self.width,
            halve=halve,
            fatal=(
                f"the chunk step ran out of memory even at batch_size 1 ({self.backend.name} "
                f"backend, after {self._n_steps} steps): one start of this model does not fit "
                "the device; use a device with more memory or a smaller model"
            ),
        )
