"""The host loop: step every running start, and at each sync read, decide, apply.

::

    for each step:
        stepper.step(pop)                     # every running start, on the device
        if a sync is due (Due):
            reading = read()                  # statuses, bests, evaluations, clock, signals
            decision = decide(reading, rules) # pure: multistart.decide
            apply(decision)                   # refill, report, checkpoint, repack, or stop

Results never depend on when the host syncs (a start that ended is frozen on the device),
except for what the host decides at a sync: refilling ended starts' slots happens on the
``sync_every`` schedule alone, so it is deterministic for a seed and independent of
``batch_size``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import jax
import numpy as np

from . import log
from .checkpoint import CheckpointError
from .config import SearchConfig
from .decide import Decision, Due, Reading, Rules, StopReason, decide
from .distributed import agree_max
from .progress import Progress, interactive
from .schedule import Rungs
from .status import Status
from .step import PopState

__all__ = ["Loop", "Outcome", "SignalFlag", "signals_to_flag", "LOG_EVERY_S"]

LOG_EVERY_S = 30.0  # a progress line this often with log_every=None (the default)
_RUNNING = Status.RUNNING.code
_PRUNED = Status.PRUNED.code
_SIGNAL_CODES = {"SIGINT": 1, "SIGTERM": 2}  # agreed across processes as the largest code
_SIGNAL_NAMES = {v: k for k, v in _SIGNAL_CODES.items()}


@dataclass
class Outcome:
    """How the loop ended."""

    pop: PopState  # the final population
    steps_run: int
    n_chunk_calls: int
    first_step_s: float | None
    loop_s: float
    stop_reason: StopReason
    pruned: np.ndarray  # (n_pop,) slots whose start the halving schedule ended (on the host)
    rungs: Rungs | None  # the halving schedule's record
    evals_to_best: int | None  # evaluations made in all when the final best was first seen
    error: CheckpointError | None = None  # a failed checkpoint write stopped the loop
    resumed_from: int | None = None

    @property
    def interrupted(self) -> bool:
        return self.stop_reason.interrupted


class SignalFlag:
    """The first SIGINT/SIGTERM's name, set by the handler (``None`` until one arrives)."""

    def __init__(self) -> None:
        self.name: str | None = None


@contextmanager
def signals_to_flag() -> Iterator[SignalFlag]:
    """While the loop runs, the first Ctrl-C or SIGTERM only asks it to stop.

    The loop then finishes its step, writes a checkpoint and raises SearchInterrupted with the
    partial result; a second Ctrl-C interrupts at once. Signal handlers can only be set from
    the main thread; elsewhere the default behaviour stays. A signal the process ignores (a
    job started in the background or under ``nohup``) stays ignored.
    """
    flag = SignalFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if flag.name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.name = name
        log.logger.warning("%s: stopping after this step (again to stop at once)", name)

    previous = {
        sig: signal.signal(sig, handler)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Loop:
    """Step every running start until all ended, ``n_steps``, a budget, or a signal.

    Args:
      options: the search's options.
      engine: the built search (:class:`multistart.driver.Engine`).
      t_start: when ``fit`` was called (``time.perf_counter``).
      step: the step to start at (a resumed search's).
      n_chunk_calls: chunk calls made before (a resumed search's).
      pruned: slots whose start the halving schedule ended (a resumed search's).
      rungs: the halving schedule's record (a resumed search's; ``None`` without it).
      best_seen: the best so far and the evaluations made when it was first seen (a resumed
        search's).
      flag: where the signal handler notes a signal.
    """

    def __init__(
        self,
        options: SearchConfig,
        engine,
        t_start: float,
        *,
        step: int = 0,
        n_chunk_calls: int = 0,
        pruned: np.ndarray | None = None,
        rungs: Rungs | None = None,
        best_seen: tuple[float, int | None] = (np.inf, None),
        flag: SignalFlag | None = None,
    ):
        self.options = options
        self.engine = engine
        self.stepper = engine.stepper
        self.refiller = engine.refiller
        self.checkpoints = engine.checkpoints
        self.t_start = t_start
        self.start = step
        self.flag = SignalFlag() if flag is None else flag
        self.rules = Rules(
            target_fom=options.target_fom,
            max_evals=options.max_evals,
            refills=frozenset() if engine.refiller is None else engine.refills,
            checkpoints=engine.checkpoints is not None,
            halving=options.halving,
        )
        # On a mesh over several processes every process must sync at the same steps (a sync
        # is a collective): no clock and no signal decides when, only the step count.
        self.together = self.stepper.spans_processes
        self.pop = engine.pop
        n_pop = self.stepper.n_total
        self.pruned = np.zeros(n_pop, bool) if pruned is None else np.asarray(pruned, bool)
        self.rungs = rungs if rungs is not None or options.halving is None else Rungs.start(n_pop)
        self.best_seen, self.evals_to_best = best_seen
        self.n_calls = n_chunk_calls
        self.evals = 0  # evaluations stepped by this run (for the rate shown)
        self.t_first: float | None = None
        self.error: CheckpointError | None = None
        self.log_rate = _RateLog(options.log_every, options.n_steps, engine.n)
        shown = interactive() if options.progress is None else options.progress
        self.progress = Progress(
            shown and jax.process_index() == 0,
            total=options.n_steps,
            initial=step,
            n=engine.n,
        )

    def run(self) -> Outcome:
        try:
            steps_run, reason = self._steps()
        finally:
            self.progress.close()
        jax.block_until_ready(self.pop)
        return Outcome(
            pop=self.pop,
            steps_run=steps_run,
            n_chunk_calls=self.n_calls,
            first_step_s=self.t_first,
            loop_s=time.perf_counter() - self.t_start,
            stop_reason=reason,
            pruned=self.pruned,
            rungs=self.rungs,
            evals_to_best=self.evals_to_best,
            error=self.error,
            resumed_from=self.start or None,
        )

    def _steps(self) -> tuple[int, StopReason]:
        steps_run, n_steps = self.start, self.options.n_steps
        for t in range(self.start, n_steps):
            self.pop = self.stepper.sweep(self.pop, t // self.options.history_stride)
            self.n_calls += len(self.stepper.chunks)
            self.evals += self.stepper.rows.size
            steps_run = t + 1
            due = self._due(steps_run)
            if due.sync:
                reading = self.read(steps_run, due)
                decision = self.apply(decide(reading, self.rules), reading)
                if decision.stop is not None:
                    return steps_run, decision.stop
        return steps_run, StopReason.N_STEPS  # (a resumed search already at n_steps)

    def _due(self, steps_run: int) -> Due:
        o, last = self.options, steps_run == self.options.n_steps
        checkpoints = self.checkpoints
        if self.together:
            logging_due, drawing, signalled = (
                self.log_rate.due_by_steps(steps_run, last),
                False,
                False,
            )
        else:
            logging_due = self.log_rate.due(steps_run, last)
            drawing = self.progress.due() or last
            signalled = self.flag.name is not None
        return Due(
            first=steps_run == self.start + 1,
            last=last,
            logging=logging_due,
            drawing=drawing,
            checkpoint=checkpoints is not None and (checkpoints.due(steps_run) or last),
            signalled=signalled,
            on_schedule=steps_run % o.sync_every == 0,
        )

    # -- read -> decide -> apply ----------------------------------------------------------------

    def read(self, steps_run: int, due: Due) -> Reading:
        """What the host knows now: one transfer of the small per-start vectors (where a
        deferred out-of-memory error shows), the clock and any signal (agreed by every
        process on a mesh over several)."""
        synced = self.stepper.sync(self.pop)
        self.pop = synced.pop
        now = time.perf_counter() - self.t_start
        if due.first:
            self.t_first = now
        limit = self.options.max_time_s
        out_of_time = limit is not None and now >= limit
        signal_name = self.flag.name
        if self.together:  # what any process saw, every process acts on
            code, late = agree_max([_SIGNAL_CODES.get(signal_name or "", 0), out_of_time])
            signal_name, out_of_time = _SIGNAL_NAMES.get(code), bool(late)
        refiller = self.refiller
        reading = Reading(
            step=steps_run,
            status=np.where(self.pruned, _PRUNED, np.asarray(synced.status)).astype(np.int8),
            best_fom=np.asarray(synced.best_fom),
            n_evals=np.asarray(synced.n_evals),
            due=due,
            evals_replaced=0 if refiller is None else refiller.evals_replaced,
            n_swept=self.stepper.rows.size,
            signal=signal_name,
            out_of_time=out_of_time,
            available=0 if refiller is None else refiller.queue.available(),
            rungs=self.rungs,
        )
        self._note_best(reading)
        return reading

    def _note_best(self, r: Reading) -> None:
        """The evaluations made in all when the best so far was first seen (at this sync)."""
        best = float(np.min(r.best_fom, initial=np.inf))
        if best < self.best_seen:
            self.best_seen = best
            self.evals_to_best = int(r.n_evals.sum()) + r.evals_replaced

    def apply(self, d: Decision, r: Reading) -> Decision:
        """Carry out ``d``; returns it, with a stop added if applying it found one (TikTak's
        rediscovery rule, a failed checkpoint)."""
        self.pruned[d.prune] = True
        self.rungs = d.rungs
        if self.refiller is not None and (d.refill.size or d.short):
            pruned_now = np.where(self.pruned, _PRUNED, r.status).astype(np.int8)
            self.pop = self.refiller.refill(self.pop, d.refill, d.short, r.step, pruned_now)
            self.pruned[d.refill] = False
            if d.refill.size:
                self.stepper.rebase(self.pop)  # a back-off must not replay over the new starts
            reason = self.refiller.queue.stop_reason
            if reason is not None:
                d = d.stopping(StopReason(reason), self.rules)
        if d.report or self.together:
            self._report(r, d.status)
        if d.checkpoint:
            record = {
                "n_chunk_calls": self.n_calls,
                "pending": d.pending,
                "pruned": np.flatnonzero(self.pruned).tolist(),
                "rungs": None if self.rungs is None else self.rungs.to_json(),
                "best_seen": [repr(float(self.best_seen)), self.evals_to_best],
            }
            try:
                self.checkpoints.save(r.step, self.pop, self.refiller, record)
            except CheckpointError as exc:
                self.error = exc
                return replace(d, stop=StopReason.CHECKPOINT_FAILED, rows=None)
        if d.rows is not None:
            self.stepper.set_rows(d.rows)
        return d

    def _report(self, r: Reading, status: np.ndarray) -> None:
        best = float(r.best_fom.min())  # the best so far, replaced starts' included
        extra = "" if self.rungs is None else self.rungs.occupancy(status)
        self.log_rate.log(r.step, best, status, self.evals, extra)
        alive = int(np.sum(status == _RUNNING))
        self.progress.update(r.step, best, alive, self.evals, extra)


class _RateLog:
    """Progress lines in the log: every ``log_every`` steps, or with ``log_every=None`` every
    ``LOG_EVERY_S`` seconds (so a short fit logs none and a long cluster job's log never
    looks dead)."""

    def __init__(self, log_every: int | None, n_steps: int, n: int):
        self.every, self.n_steps, self.n = log_every, n_steps, n
        self.t_last = time.perf_counter()
        self.evals_last = 0

    def due(self, steps_run: int, last: bool) -> bool:
        if self.every is None:
            return time.perf_counter() - self.t_last >= LOG_EVERY_S
        return self.due_by_steps(steps_run, last)

    def due_by_steps(self, steps_run: int, last: bool) -> bool:
        """Due by the step count alone (never, with the clock-driven ``log_every=None``)."""
        every = self.every
        return every is not None and every > 0 and (steps_run % every == 0 or last)

    def log(
        self, steps_run: int, best: float, status: np.ndarray, evals: int, extra: str = ""
    ) -> None:
        """A progress line if one is due; ``extra`` is added to it (the rungs' occupancy)."""
        if not self.due(steps_run, steps_run == self.n_steps):
            return
        now = time.perf_counter()
        if log.logger.isEnabledFor(logging.INFO):
            rate = (evals - self.evals_last) / max(now - self.t_last, 1e-12)
            alive = int(np.sum(status == Status.RUNNING.code))
            conv = int(np.sum(status == Status.CONVERGED.code))
            line = log.progress_line(steps_run, self.n_steps, best, alive, conv, self.n, rate)
            log.logger.info(f"{line}  {extra}" if extra else line)
        self.t_last, self.evals_last = now, evals
