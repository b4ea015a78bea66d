"""The driver: one fit, read top to bottom.

:func:`run` is the whole of a fit::

    setup = prepare(...)        # every check that needs no compile
    plan = plan(...)            # the starts (the broad-start filter compiles here)
    engine = build(...)         # the step, the population, the width, resurrection, checkpoints
    state = restore(...)        # from a checkpoint, when resuming
    outcome = Loop(...).run()   # step until every start ended, n_steps, a budget or a signal
    result = assemble(...)      # the Result, its stats gathered in one place

The search object (:mod:`multistart.search`) holds only the validated configuration; the
per-start numerics live in :mod:`multistart.step` and the rules in :mod:`multistart.solvers`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import log, memory
from .cache import configure_compilation_cache
from .checkpoint import CheckpointError, SearchCheckpoints, SearchInterrupted
from .chunking import pad_rows
from .distributed import agree_max, allgather_bytes, resolve_devices, to_host
from .identity import SearchIdentity, search_identity, starts_hash
from .minima import default_tolerances
from .monitor import CompileCounter
from .parts import Part, best_fit, check_part, coupling
from .parts import select as select_part
from .problem import Problem, as_problem, check_objective
from .progress import Progress, interactive
from .result import Result
from .resurrect import REPLACE_NAME, Discoveries, Resurrector
from .starts import StartPlan, check_strategy_space, plan_starts, user_starts
from .status import Status
from .step import PopState, init_population, make_chunk_step, make_start_step
from .sweep import BACKENDS, FILTER_NAME, Stepper, Sweep
from .tiktak import TikTakQueue
from .tuning import WidthChoice, resolve_width

__all__ = ["run", "CHUNK_STEP_NAME"]

CHUNK_STEP_NAME = "multistart_chunk_step"
MINIMA_SHOWN = 5  # the end-of-search log line counts the starts of this many best minima
BOUND_RTOL = 1e-4  # a best fit this close to a bound (in the prior's unit interval) is flagged
LOG_EVERY_S = 30.0  # a progress line this often with log_every=None (the default)


# -- 1. checks before anything compiles ---------------------------------------------------------


@dataclass
class Setup:
    """What a fit knows before it compiles anything."""

    problem: Problem
    dtype: Any
    user: Any  # the user's starts (physical, leading axis) or None
    resume: bool
    t_start: float
    part: Part | None = None  # fit(..., part=(i, k)): only these slots of the plan run
    devices: list = field(default_factory=list)  # where the starts run (a mesh if several)


def prepare(
    search, objective, space, starts, resume: bool, part=None, *, every_process: bool = False
) -> Setup:
    """Validate the call: every error here is raised before any compile.

    ``every_process``: the search runs on one mesh over every process's devices.
    """
    part = check_part(part, search)
    if resume and search.checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir to be set on the search")
    t_start = time.perf_counter()
    log.configure()
    memory.check_env()
    problem = as_problem(objective, space)
    check_strategy_space(search.start_strategy, problem.space)
    user = None if starts is None else user_starts(problem.space, starts, search.n_starts)
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless x64 is on
    check_objective(problem, dtype, repr(search))
    if search.checkpoint_dir is not None:
        from .checkpoint import Checkpointer

        if jax.process_count() > 1 and part is not None:  # orbax wants global arrays there
            raise ValueError(
                "checkpoint_dir with part= is not supported in a job of several JAX processes "
                "(ms.distributed.initialize): fit without part= (the search then spans the "
                "job's processes and checkpoints as one), or run the parts as independent "
                "tasks (a job array, each with its own checkpoint_dir)"
            )
        Checkpointer.check_folder(search.checkpoint_dir)
    devices = resolve_devices(search.devices, every_process=every_process)
    configure_compilation_cache()
    return Setup(problem, dtype, user, resume, t_start, part, devices)


# -- 2. the starts ------------------------------------------------------------------------------


def plan(search, setup: Setup) -> StartPlan:
    """Every slot's start: the user's, then the strategy's (filtered by default)."""
    with CompileCounter() as compiles:
        start_plan = plan_starts(
            setup.problem,
            setup.dtype,
            n_starts=search.n_starts,
            strategy=search.start_strategy,
            band=search.start_band,
            n_candidates=search.n_candidates,
            max_candidates=search.max_candidates,
            filter_width=search.filter_batch_size,
            seed=search.seed,
            user=setup.user,
        )
    start_plan.stats.update(
        n_filter_compiles=compiles.count(FILTER_NAME),
        n_cache_hits=sum(compiles.cache_hits.values()),
        n_compiles_total=compiles.total,
    )
    return start_plan


# -- 3. the engine: the compiled step and the state it runs on ----------------------------------


@dataclass
class Engine:
    """The built search: compiled step, population, sweep at its width, and the extras."""

    pop: PopState  # on several devices, padded to a multiple of their number (inert rows)
    sweep: Stepper  # the sweep at its width
    n: int  # the starts (the population's first n rows)
    u0: Any  # the starts in unconstrained coordinates (the population's layout)
    to_physical: Any  # one start's unconstrained parameters to the physical pytree
    stride: int  # history rows are every `stride` steps
    choice: WidthChoice
    identity: SearchIdentity
    resurrector: Resurrector | None
    checkpoints: SearchCheckpoints | None
    compiles: CompileCounter


def _layout(search, space, x0, dtype):
    """``(u0, to_physical)``: starts in the population's layout and the map back."""
    u_tree = space.to_unconstrained(x0, dtype=dtype)
    if search.flat:

        def to_physical(u):
            return space.unravel(space.forward_flat(u))

        return jnp.asarray(space.ravel(u_tree), dtype), to_physical
    return jax.tree_util.tree_map(jnp.asarray, u_tree), space.to_physical


def to_unconstrained(search, space, dtype):
    """Physical starts (leading axis) to unconstrained NumPy in the population's layout."""
    if search.flat:
        return lambda x: space.ravel(space.to_unconstrained(x, dtype=np.dtype(dtype)))
    return lambda x: space.to_unconstrained(x, dtype=np.dtype(dtype))


def build(search, setup: Setup, start_plan: StartPlan, compiles: CompileCounter) -> Engine:
    """The step, the population, its identity (checked against a checkpoint before any
    compile), the sweep at its chosen width, and resurrection."""
    problem, dtype, n = setup.problem, setup.dtype, start_plan.started.size  # a part's slots
    stride = math.ceil(search.n_steps / search.max_history)
    window = 1 if search.convergence is None else search.convergence.window
    u0, to_physical = _layout(search, problem.space, start_plan.x0, dtype)
    _log_start(search, setup, n)
    start_step, chunk_step = _steps(search, problem)
    n_rows = math.ceil(search.n_steps / stride)
    status0 = np.where(start_plan.started, Status.RUNNING.code, Status.UNSTARTED.code)

    def init(u, st):
        return init_population(search.solver, u, n_rows, window, status=st)

    one = jax.eval_shape(init, _one_row(u0), status0[:1].astype(np.int8)).starts
    one = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), one)
    identity = search_identity(problem, dtype, start_step, one, _config(search, setup, start_plan))
    checkpoints = None
    if search.checkpoint_dir is not None:
        checkpoints = SearchCheckpoints(
            search.checkpoint_dir,
            search.checkpoint_every,
            identity,
            n_steps=search.n_steps,
            stride=stride,
        )
        if setup.resume:
            checkpoints.check()  # another search's checkpoint: refused before any compile
    pop, sweep = _population(search, setup, chunk_step, init, u0, status0)
    n_dev = sweep.n_devices
    choice = resolve_width(
        search.batch_size,
        sweep,
        pop,
        n_starts=math.ceil(n / n_dev),  # per device
        device=next(d for d in setup.devices if d.process_index == jax.process_index()),
        start_step=start_step,
        backend=search.backend,
        program_hash=identity.program,  # lowered once, for the identity
        n_steps=search.n_steps,  # "auto" times widths only where the fit pays for it
    )
    if sweep.spans_processes:  # every process must step the same program: process 0's width
        from jax.experimental import multihost_utils

        width = int(multihost_utils.broadcast_one_to_all(np.int32(choice.width)))
        choice = replace(choice, width=width)
    stepper = sweep.at(choice.width)  # the only object that steps
    log.logger.debug(
        "compiled the chunk step (width %d, %d chunks) in %.2f s",
        choice.width,
        math.ceil(n / n_dev / choice.width),
        stepper.compile_s,
    )
    resurrector = _replacer(
        search, problem, start_plan, choice.width, u0, to_physical, dtype, n_rows=sweep.n_total
    )
    return Engine(
        pop,
        stepper,
        n,
        u0,
        to_physical,
        stride,
        choice,
        identity,
        resurrector,
        checkpoints,
        compiles,
    )


def _log_start(search, setup: Setup, n: int) -> None:
    n_dev = len(setup.devices)
    log.logger.info(
        "fitting %s: %d starts%s x %d parameters, %s, batch_size %r%s, %s backend%s",
        setup.problem.name,
        n,
        _part_words(setup.part, search.n_starts),
        setup.problem.space.n_dims,
        type(search).__name__,
        search.batch_size,
        " per device" if n_dev > 1 else "",
        search.backend,
        f", {n_dev} {setup.devices[0].platform} devices" if n_dev > 1 else "",
    )


def _steps(search, problem: Problem):
    """``(start_step, chunk_step)``: one start's step and the compiled chunk's body."""

    def fom_u(u, d):
        # Behind a fusion boundary: XLA must not recompute the map inside the model's loops.
        return problem.fom(problem.space.to_model(u), d)

    # With resurrection a start gives up (and is replaced) after `resurrect` failures.
    give_up = search.resurrect or search.max_nonfinite
    start_step = make_start_step(
        fom_u, search.solver, search.convergence, give_up, max_start_steps=search.local_steps
    )
    chunk_step = make_chunk_step(start_step)
    chunk_step.__name__ = chunk_step.__qualname__ = CHUNK_STEP_NAME
    return start_step, chunk_step


def _config(search, setup: Setup, start_plan: StartPlan) -> dict:
    """The configuration the identity (and so a checkpoint) records."""
    config = search.config()
    config["starts"] = starts_hash(start_plan.x0)
    if setup.part is not None:  # each part's checkpoints are its own
        config["part"] = [setup.part.index, setup.part.count]
    if len(setup.devices) > 1:  # the population's padded layout is the device count's
        config["n_devices"] = len(setup.devices)
    return config


def _population(search, setup: Setup, chunk_step, init, u0, status0) -> tuple[PopState, Sweep]:
    """The initial population on the search's devices, and its programs (no width yet).

    On several devices each holds an equal block of rows: the population is padded with inert
    rows (never started, never in the Result).
    """
    n, n_dev = len(status0), len(setup.devices)
    n_pop = n_dev * math.ceil(n / n_dev)
    if n_pop > n:
        u0 = jax.tree_util.tree_map(lambda a: pad_rows(np.asarray(a), n_pop - n), u0)
    status = np.concatenate([status0, np.full(n_pop - n, Status.UNSTARTED.code)]).astype(np.int8)
    pop = jax.jit(init)(u0, status)
    sweep = BACKENDS[search.backend](
        chunk_step,
        n_total=n_pop,
        data=setup.problem.data,  # the sweep places it on its device(s)
        pop=pop,
        rows=np.flatnonzero(status == Status.RUNNING.code),
        devices=setup.devices if n_dev > 1 else None,
    )
    return sweep.place(pop), sweep


def _part_words(part: Part | None, n_total: int) -> str:
    if part is None:
        return ""
    return f" (slots {part.lo}..{part.hi - 1} of {n_total}: part {part.index} of {part.count})"


def _replacer(search, problem, start_plan, width, u0, to_physical, dtype, n_rows):
    """What gives ended starts' slots new starts: resurrection, TikTak, or nothing."""
    tiktak = search.start_strategy == "tiktak"
    if not (search.resurrect or tiktak) or start_plan.reserve is None:
        return None
    window = 1 if search.convergence is None else search.convergence.window
    kw = dict(
        solver=search.solver,
        window=window,
        width=width,
        n_total=search.n_starts,
        n_rows=n_rows,
        to_u=to_unconstrained(search, problem.space, dtype),
        u0=u0,
    )
    if not tiktak:
        return Resurrector(start_plan.reserve, **kw)
    reserve = start_plan.reserve  # the filter's other finite candidates, best first
    queue = TikTakQueue(
        getattr(reserve, "x", None),
        problem.space,
        n_local=search.n_local,
        n_first=int(np.sum(start_plan.started)),
    )
    discoveries = None
    if search.max_discoveries is not None:
        conv = search.config()["convergence"]
        xtol, ftol = default_tolerances(dtype, conv)
        discoveries = Discoveries(search.max_discoveries, xtol=xtol, ftol=ftol)
    return Resurrector(
        queue,
        codes=(Status.NONFINITE, Status.CONVERGED, Status.MAX_STEPS),
        to_x=to_physical,
        discoveries=discoveries,
        **kw,
    )


def _one_row(tree):
    """Shapes of one row of ``tree`` (no device work: an eager slice would be a compile)."""
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((1, *a.shape[1:]), a.dtype), tree)


# -- 4. a checkpoint to continue from -----------------------------------------------------------


@dataclass
class Resumed:
    step: int = 0  # the step the loop starts at
    loop: dict = field(default_factory=dict)  # the checkpoint's loop record


def restore(search, engine: Engine, resume: bool) -> Resumed:
    """Continue from the newest checkpoint when resuming (the population is replaced)."""
    if engine.checkpoints is None or not resume:
        return Resumed()
    restored = engine.checkpoints.restore(engine.pop, engine.resurrector)
    if restored is None:
        log.logger.info("no checkpoint in %s yet: starting afresh", search.checkpoint_dir)
        return Resumed()
    pop, step, loop_meta = restored
    pop = engine.pop = engine.sweep.place(pop)
    engine.sweep.rebase(pop)
    status = to_host(pop.starts.status)
    if engine.resurrector is not None and loop_meta.get("resurrect_pending"):
        # The run that wrote this checkpoint stopped on a step where replacements were due
        # (its last step, or a signal): make them now, as an uninterrupted run would have.
        engine.pop, status = engine.resurrector(engine.pop, status, step)
        engine.sweep.rebase(engine.pop)
    engine.sweep.set_rows(np.flatnonzero(status == Status.RUNNING.code))
    return Resumed(step, loop_meta)


# -- 5. the loop --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """How the loop ended."""

    pop: PopState
    steps_run: int
    n_chunk_calls: int
    first_step_s: float | None
    loop_s: float
    stop_reason: str  # "all ended", "n_steps", "target_fom", "max_evals", "max_time_s", a signal
    error: CheckpointError | None = None  # a failed checkpoint write stopped the loop
    resumed_from: int | None = None

    @property
    def interrupted(self) -> bool:
        return self.stop_reason in ("SIGINT", "SIGTERM") or self.error is not None


@dataclass(frozen=True)
class _Due:
    """What the end of a step asks of the host; any of it means a sync (a status read)."""

    first: bool  # the first step of this run (its time is reported)
    last: bool  # n_steps reached
    logging: bool  # a progress line is due
    drawing: bool  # the progress bar is due
    checkpoint: bool  # a checkpoint is due
    signalled: bool  # SIGINT/SIGTERM arrived
    on_schedule: bool  # the sync_every schedule (the only time replacements are made)

    @property
    def sync(self) -> bool:
        return any(vars(self).values())


class Loop:
    """Step every running start until all ended, ``n_steps``, a budget, or a signal.

    The host syncs (reads the status vector) on the ``sync_every`` schedule and whenever it
    logs, checkpoints or checks a budget; results never depend on when it does, except that
    resurrection replaces dead starts on the ``sync_every`` schedule alone.
    """

    def __init__(self, search, engine: Engine, t_start: float):
        self.search = search
        self.engine = engine
        self.t_start = t_start

    def run(self, resumed: Resumed, stop: dict) -> Outcome:
        s, e = self.search, self.engine
        progress = Progress(
            (interactive() if s.progress is None else s.progress) and jax.process_index() == 0,
            total=s.n_steps,
            initial=resumed.step,
            n=e.n,
        )
        try:
            return self._run(resumed, stop, progress)
        finally:
            progress.close()

    def _run(self, resumed: Resumed, stop: dict, progress: Progress) -> Outcome:
        s, e = self.search, self.engine
        # On a mesh over several processes every process must sync at the same steps (a sync
        # is a collective): no clock and no signal decides when, only the step count.
        together = e.sweep.spans_processes
        self.pop, start = e.pop, resumed.step
        self.n_calls = int(resumed.loop.get("n_chunk_calls", 0))
        self.t_first, self.evals = None, 0
        self.log_rate = _RateLog(s.log_every, s.n_steps, e.n)
        steps_run, reason, error = start, "n_steps", None
        for t in range(start, s.n_steps):
            self.pop = e.sweep.step(self.pop, t // e.stride)
            self.n_calls += len(e.sweep.chunks)
            self.evals += e.sweep.rows.size
            steps_run = t + 1
            due = _Due(
                first=t == start,
                last=steps_run == s.n_steps,
                logging=self.log_rate.due(steps_run, steps_run == s.n_steps),
                drawing=progress.due() or steps_run == s.n_steps,
                checkpoint=e.checkpoints is not None
                and (e.checkpoints.due(steps_run) or steps_run == s.n_steps),
                signalled=stop.get("reason") is not None,
                on_schedule=steps_run % s.sync_every == 0,
            )
            if together:
                due = replace(
                    due,
                    logging=self.log_rate.due_by_steps(steps_run, steps_run == s.n_steps),
                    drawing=False,
                    signalled=False,
                )
            if due.sync:
                ended, error = self._sync_point(steps_run, due, stop, progress)
                if ended is not None:
                    reason = ended
                    break
        jax.block_until_ready(self.pop)
        return Outcome(
            pop=self.pop,
            steps_run=steps_run,
            n_chunk_calls=self.n_calls,
            first_step_s=self.t_first,
            loop_s=time.perf_counter() - self.t_start,
            stop_reason=reason,
            error=error,
            resumed_from=start or None,
        )

    def _sync_point(self, steps_run: int, due: _Due, stop: dict, progress: Progress):
        """Read the statuses; replace ended starts, log, checkpoint, repack.

        Returns ``(reason, error)``: why the loop ends here (``None`` to go on), and the
        checkpoint error that ended it, if one did.
        """
        e = self.engine
        sweep, resurrector, checkpoints = e.sweep, e.resurrector, e.checkpoints
        synced = sweep.sync(self.pop)  # where a deferred out-of-memory error shows
        pop, status = synced.pop, synced.status
        if due.first:
            self.t_first = time.perf_counter() - self.t_start
        out_of_time = (
            self.search.max_time_s is not None
            and time.perf_counter() - self.t_start >= self.search.max_time_s
        )
        signalled = due.signalled
        if sweep.spans_processes:  # what any process saw, every process acts on
            code, late = agree_max([_SIGNAL_CODES.get(stop.get("reason"), 0), out_of_time])
            signalled, out_of_time = code > 0, bool(late)
            if signalled and stop.get("reason") is None:
                stop["reason"] = _SIGNAL_NAMES[code]
        budget = self._budget(synced, resurrector, out_of_time)
        stopping = signalled or budget is not None
        # Replacements are due on the sync_every schedule; a run that stops here (its last
        # step, a signal, a budget) leaves them to the run that resumes from its checkpoint.
        replace_due = resurrector is not None and due.on_schedule
        replaced = replace_due and not (due.last or stopping)
        if replaced:
            before = resurrector.n_resurrections
            pop, status = resurrector(pop, status, steps_run)
            if resurrector.n_resurrections != before:
                sweep.rebase(pop)  # a back-off must not replay over the replaced rows
            if resurrector.stop_reason is not None:  # TikTak re-found its best enough
                stopping, budget = True, resurrector.stop_reason
        self.pop = pop
        running = np.flatnonzero(status == Status.RUNNING.code)
        if due.logging or due.drawing or sweep.spans_processes:
            best = float(synced.best_fom.min())  # the best so far, replaced starts' included
            self.log_rate.log(steps_run, best, status, self.evals)
            progress.update(steps_run, best, running.size, self.evals)
        done = running.size == 0
        if checkpoints is not None and (due.checkpoint or stopping or done):
            record = {
                "n_chunk_calls": self.n_calls,
                "resurrect_pending": bool(replace_due and not replaced),
            }
            try:
                checkpoints.save(steps_run, pop, resurrector, record)
            except CheckpointError as exc:
                return "a failed checkpoint", exc
        if stopping:
            return (stop["reason"] if signalled else budget), None
        if done:
            return "all ended", None
        if running.size != sweep.rows.size:
            sweep.set_rows(running)
        return None, None

    def _budget(self, synced, resurrector, out_of_time: bool) -> str | None:
        """The first budget or target that is met, by name, or ``None``."""
        s = self.search
        if out_of_time:
            return "max_time_s"
        # NumPy on the host: an eager jnp reduction would be one more compile.
        if s.target_fom is not None and synced.best_fom.min() <= s.target_fom:
            return "target_fom"
        if s.max_evals is not None:
            evals = int(synced.n_evals.sum())
            if resurrector is not None:
                evals += sum(r.n_evals for r in resurrector.records)
            if evals >= s.max_evals:
                return "max_evals"
        return None


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
        return bool(self.every) and (steps_run % self.every == 0 or last)

    def log(self, steps_run: int, best: float, status: np.ndarray, evals: int) -> None:
        if not self.due(steps_run, steps_run == self.n_steps):
            return
        now = time.perf_counter()
        if log.logger.isEnabledFor(logging.INFO):
            rate = (evals - self.evals_last) / max(now - self.t_last, 1e-12)
            alive = int(np.sum(status == Status.RUNNING.code))
            conv = int(np.sum(status == Status.CONVERGED.code))
            log.logger.info(
                log.progress_line(steps_run, self.n_steps, best, alive, conv, self.n, rate)
            )
        self.t_last, self.evals_last = now, evals


_SIGNAL_CODES = {"SIGINT": 1, "SIGTERM": 2}  # agreed across processes as the largest code
_SIGNAL_NAMES = {v: k for k, v in _SIGNAL_CODES.items()}


@contextmanager
def signals_to_flag():
    """While the loop runs, the first Ctrl-C or SIGTERM only asks it to stop.

    The loop then finishes its step, writes a checkpoint and raises SearchInterrupted with the
    partial result; a second Ctrl-C interrupts at once. Signal handlers can only be set from
    the main thread; elsewhere the default behaviour stays. A signal the process ignores (a
    job started in the background or under ``nohup``) stays ignored.
    """
    stop: dict = {"reason": None}
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if stop["reason"] is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop["reason"] = name
        log.logger.warning("%s: stopping after this step (again to stop at once)", name)

    previous = {
        sig: signal.signal(sig, handler)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# -- 6. the Result ------------------------------------------------------------------------------


def _forward_fill(history: np.ndarray) -> np.ndarray:
    """Carry each start's last recorded best forward over rows where it no longer stepped."""
    out = history.copy()
    for i in range(1, out.shape[0]):
        gap = np.isnan(out[i])
        out[i, gap] = out[i - 1, gap]
    return out


_STILL_RUNNING = {  # what a start still running when the loop ended is marked
    "n_steps": Status.MAX_STEPS,
    "all ended": Status.MAX_STEPS,
    "target_fom": Status.STOPPED,
    "max_evals": Status.STOPPED,
    "max_time_s": Status.STOPPED,
    "max_discoveries": Status.STOPPED,
}


def records(search, problem: Problem, engine: Engine, outcome: Outcome) -> dict:
    """Per-start records from the final population (resurrected slots folded in)."""
    pop, stride, resurrector = outcome.pop, engine.stride, engine.resurrector
    to_physical = jax.jit(jax.vmap(engine.to_physical))
    writable = lambda tree: jax.tree_util.tree_map(np.array, jax.device_get(tree))  # noqa: E731
    n = engine.n  # the population's rows past n pad it for a mesh of devices
    starts, history = to_host((pop.starts, pop.history))  # gathered if over processes
    s = jax.tree_util.tree_map(lambda a: a[:n], starts)
    codes = np.asarray(s.status).astype(np.int64)
    still = _STILL_RUNNING.get(outcome.stop_reason, Status.INTERRUPTED)
    codes[codes == Status.RUNNING.code] = still.code
    # The history ends when the last start did; the host may have noticed a little later.
    # (With resurrection a slot's incarnations take turns: its last one began later.)
    n_steps_run = int(np.max(s.n_steps))
    if resurrector is not None:
        n_steps_run = int(np.max(resurrector.started_at + np.asarray(s.n_steps)))
    rows = math.ceil(n_steps_run / stride)
    rec = {
        "foms": np.asarray(s.best_fom, dtype=np.float64).copy(),
        "params": writable(to_physical(s.best_u)),
        "start_params": writable(to_physical(engine.u0)),
        "status": np.array([Status.from_code(c) for c in codes], dtype=object),
        "n_steps": np.asarray(s.n_steps, dtype=np.int64).copy(),
        "n_evals": np.asarray(s.n_evals, dtype=np.int64).copy(),
        "best_step": np.asarray(s.best_step, dtype=np.int64).copy(),
        "history": _forward_fill(history[:rows, :n].astype(np.float64)),
        "history_steps": np.minimum((np.arange(rows) + 1) * stride, n_steps_run),
    }
    merged = {} if resurrector is None else resurrector.merge(rec, to_physical)
    rec["resurrections"] = merged.get("resurrections")
    rec["incarnations"] = merged.get("incarnations", [])
    rec["n_evals_replaced"] = merged.get("n_evals_replaced", 0)
    rec["at_bound"], rec["bound_names"] = problem.space.near_bound(rec["params"], BOUND_RTOL)
    return rec


def _best(rec: dict, n_starts: int, name: str):
    """``(best_index, best_fom, best_params)``; warns when no start was ever finite."""
    best = best_fit(rec["foms"], rec["params"])
    if best[0] < 0:
        warnings.warn(
            f"every one of the {n_starts} starts was non-finite (nan or inf) for {name!r}: no "
            "fit was found; check the objective and the space",
            RuntimeWarning,
            stacklevel=5,
        )
    return best


def stats(search, start_plan: StartPlan, engine: Engine, outcome: Outcome, rec, t_start) -> dict:
    """Every run statistic, gathered in one place."""
    pre, compiles, choice, sweep = start_plan.stats, engine.compiles, engine.choice, engine.sweep
    out = dict(pre)
    out.update(
        n_steps_run=outcome.steps_run,
        n_chunk_calls=outcome.n_chunk_calls,
        first_step_s=outcome.first_step_s,
        loop_s=outcome.loop_s,
        stop_reason=outcome.stop_reason,
        n_evals=int(np.sum(rec["n_evals"])) + rec["n_evals_replaced"],
        # the chunk step's compiles for the search itself (a back-off adds one each);
        # widths compiled only to be measured are counted apart
        n_compiles=compiles.count(CHUNK_STEP_NAME) - choice.n_tune_compiles,
        n_tune_compiles=choice.n_tune_compiles,
        n_compiles_total=compiles.total + pre.get("n_compiles_total", 0),
        n_cache_hits=sum(compiles.cache_hits.values()) + pre.get("n_cache_hits", 0),
        compile_s=sweep.compile_s,
        select_s=choice.select_s,
        wall_s=time.perf_counter() - t_start,
        batch_size=sweep.width,  # the width the search ran at (per device)
        n_devices=sweep.n_devices,
        backend=search.backend,
        width_choice=choice.info,  # how that width was chosen
        backoffs=list(sweep.backoffs),
        history_stride=engine.stride,
        identity=engine.identity.hashes(),
    )
    if outcome.resumed_from:
        out["resumed_from"] = outcome.resumed_from
    if engine.resurrector is not None:
        out.update(
            n_resurrections=engine.resurrector.n_resurrections,
            n_replace_compiles=compiles.count(REPLACE_NAME),
        )
        if search.start_strategy == "tiktak":
            out["n_local"] = int(np.sum(start_plan.started)) + engine.resurrector.n_resurrections
            d = engine.resurrector.discoveries
            if d is not None:
                out["discoveries"] = d.count
    if engine.checkpoints is not None:
        out["checkpoints"] = list(engine.checkpoints.saved)
    if choice.tuning is not None:
        out["tuning"] = choice.tuning
    return out


def assemble(search, setup: Setup, start_plan, engine: Engine, outcome: Outcome) -> Result:
    rec = records(search, setup.problem, engine, outcome)
    best_index, best_fom, best_params = _best(rec, rec["foms"].size, setup.problem.name)
    result = Result(
        best_params=best_params,
        best_fom=best_fom,
        best_index=best_index,
        foms=rec["foms"],
        params=rec["params"],
        start_params=rec["start_params"],
        status=rec["status"],
        n_steps=rec["n_steps"],
        best_step=rec["best_step"],
        history=rec["history"],
        history_steps=rec["history_steps"],
        stats=stats(search, start_plan, engine, outcome, rec, setup.t_start),
        paths=list(setup.problem.space.paths),
        config=search.config(),
        resurrections=rec["resurrections"],
        incarnations=rec["incarnations"],
        n_evals=rec["n_evals"],
        at_bound=rec["at_bound"],
    )
    if best_index >= 0 and rec["at_bound"][best_index]:
        log.logger.warning(
            "the best fit has %s at a bound of its prior: the optimum may lie outside the "
            "prior (widen it), or the start stopped where its logit saturated",
            ", ".join(rec["bound_names"][best_index]),
        )
    return result.attach_problem(setup.problem)  # for the lazy covariance (computes nothing)


def _log_end(result: Result) -> None:
    st = result.stats
    counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
    minima = result.distinct_minima()
    st["n_distinct_minima"] = len(minima)
    found = ", ".join(str(m.n_starts) for m in minima[:MINIMA_SHOWN])
    more = ", ..." if len(minima) > MINIMA_SHOWN else ""
    log.logger.info(
        "done in %.2f s (width %d, compile %.2f s, %d chunk-step compile%s; stopped: %s): "
        "best %.6g; %d distinct minim%s (starts each, best first: %s%s); %s",
        st["wall_s"],
        st["batch_size"],
        st["compile_s"],
        st["n_compiles"],
        "" if st["n_compiles"] == 1 else "s",
        st["stop_reason"],
        result.best_fom,
        len(minima),
        "um" if len(minima) == 1 else "a",
        found,
        more,
        counts,
    )


def _raise_if_interrupted(engine: Engine, outcome: Outcome, result: Result) -> None:
    if outcome.error is not None:
        outcome.error.result = result
        raise outcome.error
    if outcome.interrupted:
        saved = engine.checkpoints.saved if engine.checkpoints else []
        where = f"; checkpoint of step {saved[-1]}" if saved else ""
        raise SearchInterrupted(
            f"search stopped by {outcome.stop_reason} at step {outcome.steps_run}{where}; "
            "the partial result is in .result",
            result=result,
            checkpoint=saved[-1] if saved else None,
            reason=outcome.stop_reason,
        )


# -- the whole fit ------------------------------------------------------------------------------


def run(search, objective, space=None, *, starts=None, resume: bool = False, part=None) -> Result:
    """One fit of ``search`` (see :meth:`multistart.MultiStartGradient.fit`).

    In a job of several JAX processes (:func:`multistart.distributed.initialize`) a fit
    without ``part=`` either runs part ``(process_index, process_count)`` in each process and
    merges them, or runs on one mesh over every process's devices (see :func:`_over_processes`);
    either way every process returns the whole Result.
    """
    mode, why = _over_processes(search) if part is None else (None, None)
    if mode == "split":
        part = (jax.process_index(), jax.process_count())
    with _first_process_logs():
        mesh = mode == "mesh"
        setup = prepare(search, objective, space, starts, resume, part, every_process=mesh)
        if mesh:
            log.logger.info(
                "a job of %d processes: the search runs on one mesh over every process's "
                "devices, as %s",
                jax.process_count(),
                why,
            )
        start_plan = select_part(plan(search, setup), setup.part)  # the whole plan, then a part
        with CompileCounter() as compiles:
            engine = build(search, setup, start_plan, compiles)
            resumed = restore(search, engine, resume)
            with signals_to_flag() as stop:
                outcome = Loop(search, engine, setup.t_start).run(resumed, stop)
            result = assemble(search, setup, start_plan, engine, outcome)
        if mode == "split":
            result = _merge_over_processes(result, setup.problem)
        elif mode == "mesh":
            result.stats["n_processes"] = jax.process_count()
        _log_end(result)
    _raise_if_interrupted(engine, outcome, result)
    return result


# -- several processes --------------------------------------------------------------------------


def _over_processes(search) -> tuple[str | None, str | None]:
    """How a fit without ``part=`` runs in a job of several processes, and why: ``(None,
    None)`` in a job of one.

    ``"split"``: part ``(process_index, process_count)`` in each process, on its own devices,
    the parts merged at the end (no traffic between processes until then). ``"mesh"``: one
    search on a mesh over every process's devices, when a part could not give the whole run's
    records (resurrection, TikTak, ``target_fom``, ``max_evals`` couple the slots), when the
    search checkpoints (one checkpoint of the whole search, with orbax's multi-host saves), or
    when there are fewer starts than processes.
    """
    k = jax.process_count()
    if k == 1:
        return None, None
    why = coupling(search)
    if why is None and search.checkpoint_dir is not None:
        why = "it checkpoints"
    if why is None and search.n_starts < k:
        why = f"n_starts ({search.n_starts}) is below the number of processes ({k})"
    return ("split", None) if why is None else ("mesh", why)


def _merge_over_processes(result: Result, problem: Problem) -> Result:
    """Every process's part, exchanged through JAX's runtime and merged, in every process."""
    k = jax.process_count()
    result._problem = None  # saving would compute the covariance; the merge gets it lazily
    with tempfile.TemporaryDirectory(prefix="multistart-parts-") as folder:
        mine = os.path.join(folder, "mine.npz")
        result.save(mine)
        with open(mine, "rb") as f:
            blobs = allgather_bytes(f.read())
        paths = []
        for i, blob in enumerate(blobs):
            paths.append(os.path.join(folder, f"part-{i}-of-{k}.npz"))
            with open(paths[-1], "wb") as f:
                f.write(blob)
        merged = Result.merge(paths)
    merged.stats["n_processes"] = k
    return merged.attach_problem(problem)


@contextmanager
def _first_process_logs():
    """Only process 0 of a job logs below WARNING (and draws the progress bar)."""
    if jax.process_count() == 1 or jax.process_index() == 0:
        yield
        return
    quiet = _BelowWarning()
    log.logger.addFilter(quiet)
    try:
        yield
    finally:
        log.logger.removeFilter(quiet)


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING
