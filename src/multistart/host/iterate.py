"""The host loop: one run state threaded through every step, and every sync's decision applied.

::

    while state.stop is None:
        state = sweep(engine, state, n)             # every running start, n steps a call (Calls)
        if a sync is due (Due):
            state, reading = read(engine, state)    # statuses, bests, evaluations, clock, signals
            state = apply(engine, state, decide(reading, engine.rules))  # pure (decide.py)

:class:`RunState` (:mod:`multistart.host.run_state`) is everything that changes while the search
runs; the :class:`Engine` is everything that does not. A search resumed from a checkpoint
makes the pruning and refills its run left pending through the same :func:`apply`
(:func:`resume`).

Results never depend on when the host syncs (a start that ended is frozen on the device),
except for what the host decides at a sync: pruning and refilling happen on the
``sync_every`` schedule alone, so they are deterministic for a seed and independent of
``batch_size``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import jax
import numpy as np

from ..common import log, xla
from ..common.status import Status
from ..common.tolerance import lowest_finite
from ..device.distributed import agree_max, to_host
from .checkpoint import CheckpointError
from .decide import (
    TAIL_EVERY,
    TAIL_MIN_WIDTH,
    TAIL_RATIO,
    Decision,
    Due,
    Reading,
    StopReason,
    decide,
    resumed,
)
from .engine import Engine
from .progress import Display
from .run_state import RunState

__all__ = ["iterate", "sweep", "Calls", "read", "apply", "resume", "SignalFlag", "signals_to_flag"]

# rediscoveries (issue 38): at the steps that are multiples of REFOUND_EVERY the host ends the
# running starts of every fit whose best minimum that many settled starts found. By the step
# count alone, so results are deterministic for a seed and independent of the width.
REFOUND_EVERY = 16
#: ``steps_per_call="auto"``: a call (with its sync) under this many seconds takes twice the
#: steps next time, up to :data:`AUTO_MAX_STEPS`: the host's few hundred microseconds of
#: dispatch, read and decision per call are then a few per cent of the call.
AUTO_CALL_S = 0.02
AUTO_MAX_STEPS = 256
#: ...and a call that is not that cheap doubles while doubling pays: the last doubling cut a
#: step's share of the call (its time over its steps) below this fraction of the share before,
#: so the call's own cost (dispatch, sync, the host's reading of every row) is still a part
#: of it worth halving: it ends between 2 and 4 % of the call. A chip's sync and reading of a
#: wide batch cost tens of its steps (issue 70: 200,000 small fits on a TPU, about 20 ms a call
#: against 6 ms a step), and a chip idles while the host reads a call and sends the next (1,024
#: L-BFGS starts of an image fit: 2.5 ms a call against 3 ms a step; at 0.9, calls of 8 steps
#: took 1.11x the wall of one call of all 100); a CPU's, a few hundred microseconds. Not past
#: :data:`AUTO_LATENCY_S` a call, so the host still hears of the search (progress, a signal)
#: that often. A longer call than needed costs nothing: a chunk's loop stops once its starts
#: have all ended.
AUTO_GAIN = 0.98
AUTO_LATENCY_S = 0.5

_PRUNED = Status.PRUNED.code
_SIGNAL_CODES = {"SIGINT": 1, "SIGTERM": 2}  # agreed across processes as the largest code
_SIGNAL_NAMES = {v: k for k, v in _SIGNAL_CODES.items()}


def iterate(
    engine: Engine, state: RunState, flag: SignalFlag, learned: dict | None = None
) -> RunState:
    """Step until every start ended, ``n_steps``, a budget or a signal; the state returned says
    why it stopped (``state.stop``). ``flag`` is where the signal handler notes a signal;
    ``learned``, where ``steps_per_call="auto"`` keeps the steps a call reached for the next
    fit of the model (:class:`Calls`)."""
    display = Display(engine.options, n=engine.n, initial=state.step)
    calls, first = Calls(engine, learned), True
    try:
        while state.stop is None and state.step < engine.options.steps:
            t_call, (asked, until_end), before = (
                time.perf_counter(),
                calls.next(state.step),
                state.step,
            )
            state = sweep(engine, state, asked, until_end)
            n = state.step - before  # the steps the call took
            display.swept(engine.sweeper.rows.size * n)
            due = _due(engine, state.step, first, display, flag)
            if due.sync:
                state, reading = read(engine, state, due, flag, steps=n)
                state = apply(engine, state, decide(reading, engine.rules), display)
            calls.took(asked, n, time.perf_counter() - t_call, synced=due.sync)
            first = False
    finally:
        display.close()
    jax.block_until_ready(state.pop)
    engine.sweeper.done()  # no back-off after the loop: its copy's device memory goes now
    return state if state.stop is not None else state._replace(stop=StopReason.N_STEPS)


def sweep(engine: Engine, state: RunState, n: int = 1, until_end: bool = False) -> RunState:
    """``n`` steps of every running start, one call per chunk (no host synchronisation); with
    ``until_end`` (one chunk, a refilled search), fewer if one of them ends sooner: the host
    then reads how many the call took (a sync, which the refill's reading makes anyway)."""
    sweeper = engine.sweeper
    pop = sweeper.sweep(state.pop, state.step, n, until_end)
    if until_end and n > 1:
        synced = sweeper.peek(pop)  # the read the sync after it reuses
        pop, n = synced.pop, _steps_taken(state, sweeper.rows, synced.n_steps, n)
        sweeper.ended_after(n)
    calls = state.n_chunk_calls + len(sweeper.chunks)
    return state._replace(pop=pop, step=state.step + n, n_chunk_calls=calls)


def _steps_taken(state: RunState, rows: np.ndarray, n_steps: np.ndarray, n: int) -> int:
    """Steps a call of at most ``n`` took that stopped where a start ended: a start running
    through it has taken every one of them (it began at ``started_at``); one that ended in it
    took no more than they did."""
    assert state.lineage is not None  # a refilled search
    ends = state.lineage.started_at[rows] + np.asarray(n_steps)[rows]
    return int(min(n, max(1, int(ends.max(initial=0)) - state.step)))


class Calls:
    """How many steps each call takes (the search's ``steps_per_call``).

    A call ends at every step where the host must look: the end of ``n_steps``, each
    ``checkpoint_every`` and ``log_every`` step, and, where a sync decides something that
    shapes the trajectories (refills, the halving schedule, a ``target_fom`` or ``max_evals``
    budget, or the processes of a mesh agreeing when to sync), each ``sync_every`` step, each
    ``REFOUND_EVERY``-th step under ``rediscoveries`` (where that rule ends starts); with
    refills alone and ``sync_every=1``, a call of one chunk on one device ends instead at the
    first step where one of its starts ends (what a refill acts on: the same steps as a call a
    step, in fewer calls), until the queue has no start left to hand out (it never has one
    again: TikTak's rules and the reserves only close), from when the calls are a search's
    without refills. In between it takes ``k`` steps: the option's, or under ``"auto"``
    from 1, doubled after each call that took under :data:`AUTO_CALL_S` with its sync (at the
    pace of ``k`` steps), or while doubling pays (:data:`AUTO_GAIN`, :data:`AUTO_LATENCY_S`),
    to at most :data:`AUTO_MAX_STEPS`, and a call that would leave a short one (at most half
    ``k``) before the next end takes those steps too (:func:`_absorbed`). Where the calls end
    changes no result (an ended start is frozen, and a call's body is the one step), only when
    the host learns of it.

    ``learned`` (a dict kept with the model's programs, :func:`multistart.device.programs.
    programs_for`): a fit of the same model at the same width and chunks starts from the ``k``
    the fits before it reached, not from 1 again (the same program at the same pace), and
    weighs its first call against the step's share at half that ``k``, so it may double again
    where a fit before it stopped (a noisy call had stopped an image fit's at 32 steps).
    """

    def __init__(self, engine: Engine, learned: dict | None = None):
        options = engine.options
        self.auto = options.steps_per_call == "auto" and not engine.together  # no clock on a mesh
        self.k = 1 if options.steps_per_call == "auto" else int(options.steps_per_call)
        self._learned = learned if self.auto else None
        # what sets a call's pace: its width and how many chunks a step runs
        self._pace = (engine.sweeper.width, len(engine.sweeper.chunks))
        self._last: tuple[int, float] | None = None  # the last call's ``k`` and step's share
        if self._learned is not None and self._pace in self._learned:
            # the k reached, and the step's share of the call at half of it, which the first
            # call here is weighed against (a fit of the model may double again)
            self.k, self._last = self._learned[self._pace]
        others = options.halving is not None or engine.together
        others = others or options.target_fom is not None or options.max_evals is not None
        # Refills alone, at every step: a call of one chunk on one device ends at the first
        # step where one of its starts ends (what the refill acts on), not after every step.
        self.until_end = engine.refiller is not None and options.sync_every == 1 and not others
        self._queue = engine.refiller.queue if self.until_end and engine.refiller else None
        self._sweeper = engine.sweeper
        self._engine = engine
        decides = engine.refiller is not None or others
        self.periods = [options.steps] + (
            [options.sync_every] if decides and not self.until_end else []
        )
        if engine.checkpoints is not None:
            self.periods.append(options.checkpoint_every)
        if options.log_every:  # a line every that many steps
            self.periods.append(options.log_every)
        if options.rediscoveries is not None:  # the rule ends starts at these steps
            self.periods.append(REFOUND_EVERY)

    def next(self, step: int) -> tuple[int, bool]:
        """The steps the call after ``step`` steps takes, and whether it ends sooner, at the
        first step where one of its starts ends."""
        periods = self.periods + [TAIL_EVERY] * self._narrows()
        n = min([self.k] + [p - step % p for p in periods])
        if self.auto:  # a short call left before the next end is taken in this one
            n = _absorbed(n, self.k, min(p - step % p for p in periods))
        if self._queue is None or self._queue.available() == 0:
            return n, False  # no refill to act on (none, or none left): k steps a call
        one = len(self._sweeper.chunks) == 1 and self._sweeper.n_devices == 1
        return (n, True) if one else (1, False)  # several chunks: a sync every step

    def _narrows(self) -> bool:
        return _narrows(self._engine)

    def took(self, asked: int, n: int, seconds: float, *, synced: bool) -> None:
        """A call asked for ``asked`` steps took ``n`` (fewer where a start ended) and, with its
        sync, ``seconds``: grow ``k`` if ``k`` steps at that pace would have been cheap, or if
        the last doubling paid (:data:`AUTO_GAIN`) and twice the steps stay within
        :data:`AUTO_LATENCY_S` (a call of one step tries two, to learn whether it pays)."""
        if not (self.auto and synced and asked == self.k and n > 0):
            return
        share = seconds / n  # a step's share of the call, its own cost included
        last, self._last = self._last, (self.k, share)
        before = last[1] if last is not None and 2 * last[0] == self.k else None
        cheap = share * self.k < AUTO_CALL_S
        paying = share < AUTO_GAIN * before if before is not None else self.k == 1
        if cheap or (paying and 2 * self.k * share <= AUTO_LATENCY_S):
            self.k = min(2 * self.k, AUTO_MAX_STEPS)
            if self._learned is not None:
                self._learned[self._pace] = (self.k, self._last)


def _absorbed(n: int, k: int, to_end: int) -> int:
    """The steps of a call under ``steps_per_call="auto"`` that would take ``n`` of its ``k``
    with ``to_end`` left before the next step where the host must look: all of them where the
    call after it would take at most half of ``k``. A call's own cost (a sync, the chip idle
    between calls) is paid once, not again for a few steps: 1,024 L-BFGS starts of an image fit
    on a TPU ran 100 steps as calls of 32, 32, 32 and 4, each call about 4.5 ms of the host's
    with the chip idle (issue 70, profiling/experiments/call_timeline.py). At most 1.5 ``k``
    steps, within :data:`AUTO_LATENCY_S` as ``k`` is.

    >>> _absorbed(32, 32, 36), _absorbed(32, 32, 49), _absorbed(4, 32, 4), _absorbed(1, 1, 2)
    (36, 32, 4, 1)
    """
    return to_end if n == k and to_end <= k + k // 2 else n


def _narrows(engine: Engine) -> bool:
    """Can the sweep still narrow to its tail (one device, one process, a width at least
    ``TAIL_RATIO`` times the narrowest, and on a chip a price to weigh it on)? Its tail
    decisions are then due every ``TAIL_EVERY`` steps
    (:func:`multistart.host.decide.tail_width`). A chip's compile costs seconds to a minute
    where a CPU's costs one (issue 70: 26 s for a TPU's narrower program that saved under a
    second) and a step of a wide chunk little more than a narrow one's, so a chip narrows
    only where its width choice priced the tail (:class:`multistart.host.decide.TailPrice`)."""
    sweeper = engine.sweeper
    wide = sweeper.width >= TAIL_RATIO * TAIL_MIN_WIDTH
    priced = engine.rules.tail is not None or xla.platform() == "cpu"
    return wide and priced and sweeper.n_devices == 1 and not sweeper.spans_processes


def _due(engine: Engine, step: int, first: bool, display: Display, flag: SignalFlag) -> Due:
    last = step == engine.options.steps
    logging_due, drawing = display.due(step, last, engine.together)
    checkpoints = engine.checkpoints
    return Due(
        first=first,
        last=last,
        logging=logging_due,
        drawing=drawing,
        checkpoint=checkpoints is not None and (checkpoints.due(step) or last),
        signalled=flag.name is not None and not engine.together,
        on_schedule=step % engine.options.sync_every == 0,
        tail=step % TAIL_EVERY == 0 and _narrows(engine),
        refound=engine.options.rediscoveries is not None and step % REFOUND_EVERY == 0,
    )


def read(
    engine: Engine, state: RunState, due: Due, flag: SignalFlag, steps: int = 1
) -> tuple[RunState, Reading]:
    """What the host knows now, ``steps`` after the call before: one transfer of the small
    per-start vectors (where a deferred out-of-memory error shows), the clock and any signal
    (agreed by every process on a mesh over several). The state comes back with the best so
    far noted."""
    synced = engine.sweeper.sync(state.pop)
    now = time.perf_counter() - engine.t_start
    limit = engine.options.max_time_s
    out_of_time, signal_name = limit is not None and now >= limit, flag.name
    if engine.together:  # what any process saw, every process acts on
        code, late = agree_max([_SIGNAL_CODES.get(signal_name or "", 0), out_of_time])
        signal_name, out_of_time = _SIGNAL_NAMES.get(code), bool(late)
    reading = _reading(engine, state, synced, due, signal=signal_name, out_of_time=out_of_time)
    best_seen, evals_to_best = state.best_seen, state.evals_to_best
    best = float(np.min(reading.best_fom, initial=np.inf))
    if best < best_seen:
        best_seen = best
        evals_to_best = int(reading.n_evals.sum()) + reading.evals_replaced
        if steps > 1:  # found in one of the call's steps: count to that one
            evals_to_best = _evals_to_best(engine, state, synced, reading)
    state = state._replace(
        pop=synced.pop,
        best_seen=best_seen,
        evals_to_best=evals_to_best,
        first_step_s=now if due.first else state.first_step_s,
    )
    return state, reading


def _evals_to_best(engine: Engine, state: RunState, synced, reading: Reading) -> int:
    """The evaluations made when the best so far was found, at the step it was found (not at
    the end of the call that found it): every start's now, less its steps after that one at
    its mean evaluations a step (exact for a rule whose steps cost alike, as Adam's one or
    least squares' Jacobian; for a line search's trials an estimate within one call), and
    the replaced starts'."""
    n = engine.n
    best = int(lowest_finite(reading.best_fom[:n]))
    best_step, n_steps = synced.best_step[:n], synced.n_steps[:n]  # (the sync's one transfer)
    started = np.zeros(n, np.int64) if state.lineage is None else state.lineage.started_at[:n]
    found = int(started[best]) + int(best_step[best]) + 1  # steps of the search by then
    after = np.maximum(0, n_steps - (found - started))
    evals = reading.n_evals[:n].astype(np.int64)
    per_step = evals // np.maximum(n_steps, 1)  # exact where every step costs the same
    return int(np.maximum(0, evals - after * per_step).sum()) + reading.evals_replaced


def _reading(engine: Engine, state: RunState, synced, due: Due, **seen) -> Reading:
    refiller, lineage = engine.refiller, state.lineage
    if due.refound:  # the rediscovery rule compares the settled starts' points
        leaves = jax.tree_util.tree_leaves(to_host(synced.pop.starts.best_u))
        n_pop = synced.status.shape[0]
        seen["best_u"] = np.concatenate([np.reshape(a, (n_pop, -1)) for a in leaves], axis=1)
    return Reading(
        step=state.step,
        status=np.where(state.pruned, _PRUNED, np.asarray(synced.status)).astype(np.int8),
        best_fom=np.asarray(synced.best_fom),
        n_evals=np.asarray(synced.n_evals),
        due=due,
        evals_replaced=0 if lineage is None else lineage.evals_replaced,
        n_swept=engine.sweeper.rows.size,
        available=0 if refiller is None else refiller.queue.available(),
        refill_pruned=refiller is None or refiller.queue.refills_pruned,
        rungs=state.rungs,
        width=engine.sweeper.width,
        tail_since=state.tail_since,
        **seen,
    )


def apply(engine: Engine, state: RunState, d: Decision, display: Display | None = None) -> RunState:
    """Carry out ``d``: prune, refill, report, checkpoint, repack. A search whose every start
    ended after its queue's own rule stopped handing out starts (TikTak's rediscovery rule)
    stopped for that rule; a failed checkpoint is the state's ``stop`` too."""
    pruned = state.pruned
    if d.prune.size or d.refill.size:
        pruned = pruned.copy()
        pruned[d.prune] = True
    pop, lineage, refiller = state.pop, state.lineage, engine.refiller
    if refiller is not None and lineage is not None and (d.refill.size or d.short):
        pop, lineage, write = refiller.refill(pop, lineage, d.refill, d.short, state.step, d.ended)
        pruned[d.refill] = False
        if write is not None:
            engine.sweeper.rewritten(write)  # a back-off replays it among the steps
    if d.stop is StopReason.ALL_ENDED and refiller is not None:
        reason = refiller.queue.stop_reason  # the rule that stopped its hand-outs, if one did
        if reason is not None:
            d = d.stopping(StopReason(reason))
    state = state._replace(
        pop=pop, pruned=pruned, lineage=lineage, rungs=d.rungs, pending=d.pending, stop=d.stop
    )
    state = state._replace(width=d.width or state.width, tail_since=d.tail_since)
    if display is not None and (d.report or engine.together):
        extra = "" if state.rungs is None else state.rungs.occupancy(d.status)
        display.report(state.step, state.best_seen, d.status, extra)
    if d.checkpoint and engine.checkpoints is not None:
        try:
            engine.checkpoints.save(state)
        except CheckpointError as exc:
            return state._replace(stop=StopReason.CHECKPOINT_FAILED, error=exc)
        state = state._replace(saved=(*state.saved, state.step))
    _resweep(engine, d, state.step)
    return state


def _resweep(engine: Engine, d: Decision, step: int) -> None:
    """Repack the sweep to the decision's running rows, then narrow it to its tail."""
    if d.rows is not None:
        engine.sweeper.set_rows(d.rows)
    if d.width is not None:
        engine.sweeper.narrow(d.width, step)


def resume(engine: Engine, state: RunState) -> RunState:
    """A state restored from a checkpoint, made ready to step: on the devices, the queue where
    it stood, the pruning and refills its run left pending made now (:func:`apply`, as the
    uninterrupted run made them), and the running starts swept."""
    pop = engine.sweeper.place(state.pop)
    engine.sweeper.rebase(pop)
    if 0 < state.width < engine.sweeper.width:  # its tail was swept narrower: as the one run's
        engine.sweeper.narrow(state.width, state.step)
    state = state._replace(pop=pop)
    if engine.refiller is not None and state.lineage is not None:
        engine.refiller.resume(state.lineage)
    reading = _reading(engine, state, engine.sweeper.sync(pop), Due(on_schedule=True))
    return apply(engine, state, resumed(reading, engine.rules, state.pending))


# -- signals ------------------------------------------------------------------------------------


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
        log.logger.warning("%s: stopping after this call's steps (again to stop at once)", name)

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
