"""The driver: one fit, read top to bottom.

:func:`run` is the whole of a fit::

    setup = prepare(...)         # every check that needs no compile
    identity = identify(...)     # the model, rule and options, traced (no compile); a
                                 # checkpoint of another search is refused here
    plan = plan(...)             # the starts (the broad-start filter compiles here)
    engine = build(...)          # the step, the population, the width, refills, checkpoints
    resumed = restore(...)       # from a checkpoint, when resuming
    outcome = Loop(...).run()    # step until every start ended, n_steps, a budget or a signal
    result = assemble(...)       # the Result, its stats gathered in one place

The search object (:mod:`multistart.search`) holds only its rule and its checked options
(:class:`multistart.SearchConfig`); the per-start numerics live in :mod:`multistart.step`, the
rules in :mod:`multistart.solvers`, the host loop in :mod:`multistart.loop` and its decisions in
:mod:`multistart.decide`.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import log, memory
from .assemble import CHUNK_STEP_NAME, assemble
from .backends import BACKENDS, Backend
from .cache import configure_compilation_cache
from .checkpoint import SearchCheckpoints, SearchInterrupted
from .chunking import pad_rows
from .config import SearchConfig
from .decide import Due, Reading, Rules, settle
from .distributed import allgather_bytes, resolve_devices, to_host
from .evaluator import FILTER_NAME
from .identity import SearchIdentity, search_identity, starts_hash
from .loop import Loop, Outcome, signals_to_flag
from .minima import default_tolerances
from .monitor import CompileCounter
from .problem import Problem, as_problem, check_objective
from .refill import Refiller
from .result import Result
from .schedule import Rungs
from .split import Part, check_part, coupling, select_part
from .starts import StartPlan, check_strategy_space, plan_starts, user_starts
from .status import Status
from .step import PopState, init_population, make_chunk_step, make_start_step
from .sweeper import Sweeper
from .tiktak import Discoveries, TikTakQueue
from .tuning import WidthChoice, resolve_width

__all__ = ["run", "CHUNK_STEP_NAME"]

MINIMA_SHOWN = 5  # the end-of-search log line counts the starts of this many best minima


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
    o: SearchConfig = search.options
    part = check_part(part, search.options)
    if resume and o.checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir to be set on the search")
    t_start = time.perf_counter()
    log.configure()
    memory.check_env()
    problem = as_problem(objective, space)
    check_strategy_space(o.start_strategy, problem.space)
    user = None if starts is None else user_starts(problem.space, starts, o.n_starts)
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless x64 is on
    check_objective(problem, dtype, repr(search))
    if o.checkpoint_dir is not None:
        from .checkpoint import Checkpointer

        if jax.process_count() > 1 and part is not None:  # orbax wants global arrays there
            raise ValueError(
                "checkpoint_dir with part= is not supported in a job of several JAX processes "
                "(ms.distributed.initialize): fit without part= (the search then spans the "
                "job's processes and checkpoints as one), or run the parts as independent "
                "tasks (a job array, each with its own checkpoint_dir)"
            )
        Checkpointer.check_folder(o.checkpoint_dir)
    devices = resolve_devices(o.devices, every_process=every_process)
    configure_compilation_cache()
    return Setup(problem, dtype, user, resume, t_start, part, devices)


# -- 2. what the search is, and a checkpoint of another search refused ---------------------------


@dataclass
class Program:
    """The search's step, traced but not compiled, and its identity."""

    to_physical: Any  # one start's unconstrained parameters to the physical pytree
    start_step: Any  # one start's step
    chunk_step: Any  # the compiled chunk's body
    identity: SearchIdentity  # without the plan's starts until build() adds them
    checkpoints: SearchCheckpoints | None


def _to_physical(search, space):
    """One start's unconstrained parameters (the population's layout) to physical ones."""
    if search.options.flat:

        def to_physical(u):
            return space.unravel(space.forward_flat(u))

        return to_physical
    return space.to_physical


def _unconstrained(search, space, x0, dtype):
    """Starts (physical, leading axis) in the population's layout (unconstrained)."""
    u_tree = space.to_unconstrained(x0, dtype=dtype)
    if search.options.flat:
        return jnp.asarray(space.ravel(u_tree), dtype)
    return jax.tree_util.tree_map(jnp.asarray, u_tree)


def to_unconstrained(search, space, dtype):
    """Physical starts (leading axis) to unconstrained NumPy in the population's layout."""
    if search.options.flat:
        return lambda x: space.ravel(space.to_unconstrained(x, dtype=np.dtype(dtype)))
    return lambda x: space.to_unconstrained(x, dtype=np.dtype(dtype))


def identify(search, setup: Setup) -> Program:
    """Trace the step (no compile) for the search's identity, and refuse a checkpoint of
    another model, rule or configuration now, before the filter or the step compiles."""
    o, problem, dtype = search.options, setup.problem, setup.dtype
    to_physical = _to_physical(search, problem.space)
    start_step, chunk_step = _steps(search, problem)
    one = _one_start_state(search, problem, dtype)
    identity = search_identity(problem, dtype, start_step, one, _config(search, setup))
    checkpoints = None
    if o.checkpoint_dir is not None:
        checkpoints = SearchCheckpoints(
            o.checkpoint_dir,
            o.checkpoint_every,
            identity,
            n_steps=o.n_steps,
            stride=o.history_stride,
        )
        if setup.resume:
            checkpoints.check(ignore=("starts",))  # the starts are known once planned
    return Program(to_physical, start_step, chunk_step, identity, checkpoints)


def _steps(search, problem: Problem):
    """``(start_step, chunk_step)``: one start's step and the compiled chunk's body."""
    o = search.options

    def fom_u(u, d):
        # Behind a fusion boundary: XLA must not recompute the map inside the model's loops.
        return problem.fom(problem.space.to_model(u), d)

    residual_u = None
    residuals = getattr(problem, "residuals", None)  # a least-squares problem's
    if residuals is not None:

        def residual_u(u, d):
            return residuals(problem.space.to_model(u), d)

    # With resurrection a start gives up (and is replaced) after `resurrect` failures.
    start_step = make_start_step(
        fom_u,
        search.solver,
        o.convergence,
        o.give_up,
        max_start_steps=o.local_steps,
        residual_u=residual_u,
    )
    chunk_step = make_chunk_step(start_step)
    chunk_step.__name__ = chunk_step.__qualname__ = CHUNK_STEP_NAME
    return start_step, chunk_step


def _one_start_state(search, problem: Problem, dtype):
    """Shapes of one start's state (no device work)."""
    space = problem.space
    if search.options.flat:
        u1 = jax.ShapeDtypeStruct((1, space.n_dims), np.dtype(dtype))
    else:  # the unconstrained pytree has the physical one's shapes
        u1 = space.example(np.dtype(dtype), batch=(1,))
    status = jax.ShapeDtypeStruct((1,), np.int8)
    window = search.options.window
    pop = jax.eval_shape(
        lambda u, st: init_population(search.solver, u, 1, window, status=st), u1, status
    )
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), pop.starts)


def _config(search, setup: Setup, start_plan: StartPlan | None = None) -> dict:
    """The configuration the identity (and so a checkpoint) records."""
    config = search.config()
    if start_plan is not None:
        config["starts"] = starts_hash(start_plan.x0)
    if setup.part is not None:  # each part's checkpoints are its own
        config["part"] = [setup.part.index, setup.part.count]
    if len(setup.devices) > 1:  # the population's padded layout is the device count's
        config["n_devices"] = len(setup.devices)
    return config


# -- 3. the starts ------------------------------------------------------------------------------


def plan(search, setup: Setup) -> StartPlan:
    """Every slot's start: the user's, then the strategy's (filtered by default)."""
    o = search.options
    with CompileCounter() as compiles:
        start_plan = plan_starts(
            setup.problem,
            setup.dtype,
            n_starts=o.n_starts,
            strategy=o.start_strategy,
            band=o.start_band,
            n_candidates=o.n_candidates,
            max_candidates=o.max_candidates,
            filter_width=o.filter_batch_size,
            seed=o.seed,
            user=setup.user,
        )
    start_plan.stats.update(
        n_filter_compiles=compiles.count(FILTER_NAME),
        n_cache_hits=sum(compiles.cache_hits.values()),
        n_compiles_total=compiles.total,
    )
    return start_plan


# -- 4. the engine: the compiled step and the state it runs on ----------------------------------


@dataclass
class Engine:
    """The built search: population, the stepper at its width, refills and checkpoints."""

    pop: PopState  # on several devices, padded to a multiple of their number (inert rows)
    stepper: Sweeper  # the only object that steps
    n: int  # the starts (the population's first n rows)
    u0: Any  # the starts in unconstrained coordinates (the population's layout)
    to_physical: Any  # one start's unconstrained parameters to the physical pytree
    stride: int  # history rows are every `stride` steps
    choice: WidthChoice
    identity: SearchIdentity
    refiller: Refiller | None
    refills: frozenset[int]  # the statuses whose slots the refiller gives new starts
    checkpoints: SearchCheckpoints | None
    compiles: CompileCounter


def build(
    search, setup: Setup, start_plan: StartPlan, program: Program, compiles: CompileCounter
) -> Engine:
    """The population, the stepper at its chosen width, and what refills ended starts."""
    o, problem, dtype = search.options, setup.problem, setup.dtype
    n = start_plan.started.size  # a part's slots
    identity = program.identity.with_config(_config(search, setup, start_plan))
    if program.checkpoints is not None:
        program.checkpoints.identity = identity
        if setup.resume:
            program.checkpoints.check()  # other starts (user starts=) than the checkpoint's
    u0 = _unconstrained(search, problem.space, start_plan.x0, dtype)
    status0 = np.where(start_plan.started, Status.RUNNING.code, Status.UNSTARTED.code)
    pop, backend = _population(search, setup, program.chunk_step, u0, status0)
    choice = _width(search, setup, backend, pop, program, n)
    stepper = Sweeper(backend, choice.width)
    _log_start(search, setup, n, choice)
    log.logger.debug(
        "compiled the chunk step (width %d, %d chunks) in %.2f s",
        choice.width,
        math.ceil(n / backend.n_devices / choice.width),
        stepper.compile_s,
    )
    refiller, refills = _refiller(
        search, setup, start_plan, choice.width, u0, program.to_physical, backend.n_total
    )
    return Engine(
        pop,
        stepper,
        n,
        u0,
        program.to_physical,
        o.history_stride,
        choice,
        identity,
        refiller,
        refills,
        program.checkpoints,
        compiles,
    )


def _population(search, setup: Setup, chunk_step, u0, status0) -> tuple[PopState, Backend]:
    """The initial population on the search's devices, and its backend (no width yet).

    On several devices each holds an equal block of rows: the population is padded with inert
    rows (never started, never in the Result).
    """
    o = search.options
    n, n_dev = len(status0), len(setup.devices)
    n_pop = n_dev * math.ceil(n / n_dev)
    if n_pop > n:
        u0 = jax.tree_util.tree_map(lambda a: pad_rows(np.asarray(a), n_pop - n), u0)
    status = np.concatenate([status0, np.full(n_pop - n, Status.UNSTARTED.code)]).astype(np.int8)
    n_rows = math.ceil(o.n_steps / o.history_stride)  # of history
    pop = jax.jit(lambda u, st: init_population(search.solver, u, n_rows, o.window, status=st))(
        u0, status
    )
    backend = BACKENDS[o.backend](
        chunk_step,
        n_total=n_pop,
        data=setup.problem.data,  # the backend places it on its device(s)
        pop=pop,
        rows=np.flatnonzero(status == Status.RUNNING.code),
        devices=setup.devices if n_dev > 1 else None,
    )
    return backend.place(pop), backend


def _width(search, setup: Setup, backend: Backend, pop, program: Program, n: int) -> WidthChoice:
    """The batch width (per device), the same in every process of a job."""
    choice = resolve_width(
        search.options.batch_size,
        backend,
        pop,
        n_starts=math.ceil(n / backend.n_devices),  # per device
        device=next(d for d in setup.devices if d.process_index == jax.process_index()),
        start_step=program.start_step,
        backend_name=search.options.backend,
        program_hash=program.identity.program,  # lowered once, for the identity
        n_steps=search.options.n_steps,  # "auto" times widths only where the fit pays for it
    )
    if backend.spans_processes:  # every process must step the same program: process 0's width
        from jax.experimental import multihost_utils

        width = int(multihost_utils.broadcast_one_to_all(np.int32(choice.width)))
        choice = replace(choice, width=width)
    return choice


def _log_start(search, setup: Setup, n: int, choice: WidthChoice) -> None:
    o, n_dev = search.options, len(setup.devices)
    how = "" if choice.info.get("selected_by") == "explicit" else f" ({o.batch_size})"
    log.logger.info(
        "fitting %s: %d starts%s x %d parameters, %s, batch_size %d%s%s, %s backend%s",
        setup.problem.name,
        n,
        _part_words(setup.part, o.n_starts),
        setup.problem.space.n_dims,
        type(search).__name__,
        choice.width,
        how,
        " per device" if n_dev > 1 else "",
        o.backend,
        f", {n_dev} {setup.devices[0].platform} devices" if n_dev > 1 else "",
    )


def _part_words(part: Part | None, n_total: int) -> str:
    if part is None:
        return ""
    return f" (slots {part.lo}..{part.hi - 1} of {n_total}: part {part.index} of {part.count})"


def _refiller(search, setup: Setup, start_plan, width, u0, to_physical, n_rows):
    """``(refiller, statuses)``: what gives ended starts' slots new starts (resurrection,
    TikTak, or nothing), and the statuses whose slots it refills."""
    o, problem, dtype = search.options, setup.problem, setup.dtype
    reserve = start_plan.reserve
    if not (o.resurrect or o.tiktak) or reserve is None:
        return None, frozenset()
    kw = dict(
        solver=search.solver,
        window=o.window,
        width=width,
        n_total=o.n_starts,
        n_rows=n_rows,
        to_u=to_unconstrained(search, problem.space, dtype),
        u0=u0,
    )
    if not o.tiktak:
        return Refiller(reserve, **kw), frozenset({Status.NONFINITE.code})
    discoveries = None
    if o.max_discoveries is not None:
        xtol, ftol = default_tolerances(dtype, search.config()["convergence"])
        discoveries = Discoveries(o.max_discoveries, xtol=xtol, ftol=ftol)
    queue = TikTakQueue(  # the filter's other finite candidates, best first, blended
        getattr(reserve, "x", None),
        problem.space,
        n_local=o.n_local,
        n_first=int(np.sum(start_plan.started)),
        discoveries=discoveries,
    )
    ended = (Status.NONFINITE, Status.CONVERGED, Status.MAX_STEPS)
    return Refiller(queue, to_x=to_physical, **kw), frozenset(s.code for s in ended)


# -- 5. a checkpoint to continue from -----------------------------------------------------------


@dataclass
class Resumed:
    step: int = 0  # the step the loop starts at
    loop: dict = field(default_factory=dict)  # the checkpoint's loop record
    pruned: np.ndarray | None = None  # slots the halving schedule ended
    rungs: Rungs | None = None  # the halving schedule's record
    best_seen: tuple[float, int | None] = (np.inf, None)  # and the evaluations to reach it


def restore(search, engine: Engine, resume: bool) -> Resumed:
    """Continue from the newest checkpoint when resuming (the population is replaced)."""
    if engine.checkpoints is None or not resume:
        return Resumed()
    restored = engine.checkpoints.restore(engine.pop, engine.refiller)
    if restored is None:
        log.logger.info("no checkpoint in %s yet: starting afresh", search.options.checkpoint_dir)
        return Resumed()
    pop, step, meta = restored
    pop = engine.pop = engine.stepper.place(pop)
    engine.stepper.rebase(pop)
    pruned = np.zeros(engine.stepper.n_total, bool)
    pruned[np.asarray(meta.get("pruned", []), np.int64)] = True
    rungs = None if meta.get("rungs") is None else Rungs.from_json(meta["rungs"])
    s = pop.starts
    status, best, evals = (np.asarray(a) for a in to_host((s.status, s.best_fom, s.n_evals)))
    status = np.where(pruned, Status.PRUNED.code, status).astype(np.int8)
    if meta.get("pending", meta.get("resurrect_pending")):
        # The run that wrote this checkpoint stopped on a sync where pruning or refills were
        # due (its last step, a signal, a budget): make them now, as an uninterrupted run did.
        status, rungs = _settle_pending(search, engine, step, status, best, evals, rungs, pruned)
    engine.stepper.set_rows(np.flatnonzero(status == Status.RUNNING.code))
    best_seen, evals_to_best = meta.get("best_seen", ["inf", None])
    return Resumed(step, meta, pruned, rungs, (float(best_seen), evals_to_best))


def _settle_pending(search, engine: Engine, step, status, best, evals, rungs, pruned):
    """The pruning and refills a stopped run left to this one (:func:`multistart.decide.settle`);
    ``pruned`` is updated in place. Returns ``(status, rungs)``."""
    refiller = engine.refiller
    rules = Rules(
        refills=engine.refills if refiller is not None else frozenset(),
        halving=search.options.halving,
    )
    reading = Reading(
        step=step,
        status=status,
        best_fom=best,
        n_evals=evals,
        due=Due(on_schedule=True),
        available=0 if refiller is None else refiller.queue.available(),
        rungs=rungs,
    )
    settled = settle(reading, rules)
    pruned[settled.prune] = True
    if refiller is not None and (settled.refill.size or settled.short):
        before = np.where(pruned, Status.PRUNED.code, status).astype(np.int8)
        engine.pop = refiller.refill(engine.pop, settled.refill, settled.short, step, before)
        engine.stepper.rebase(engine.pop)
        pruned[settled.refill] = False
    return settled.status, settled.rungs


# -- 6. the end ---------------------------------------------------------------------------------


def _log_end(result: Result) -> None:
    st = result.stats
    counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
    minima = result.distinct_minima()
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
            reason=outcome.stop_reason.value,
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
        program = identify(search, setup)
        start_plan = select_part(plan(search, setup), setup.part)  # the whole plan, then a part
        with CompileCounter() as compiles:
            engine = build(search, setup, start_plan, program, compiles)
            resumed = restore(search, engine, resume)
            with signals_to_flag() as flag:
                loop = Loop(
                    search.options,
                    engine,
                    setup.t_start,
                    step=resumed.step,
                    n_chunk_calls=int(resumed.loop.get("n_chunk_calls", 0)),
                    pruned=resumed.pruned,
                    rungs=resumed.rungs,
                    best_seen=resumed.best_seen,
                    flag=flag,
                )
                outcome = loop.run()
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
    o = search.options
    why = coupling(o)
    if why is None and o.checkpoint_dir is not None:
        why = "it checkpoints"
    if why is None and o.n_starts < k:
        why = f"n_starts ({o.n_starts}) is below the number of processes ({k})"
    return ("split", None) if why is None else ("mesh", why)


def _merge_over_processes(result: Result, problem: Problem) -> Result:
    """Every process's part, exchanged through JAX's runtime and merged, in every process."""
    k = jax.process_count()
    with tempfile.TemporaryDirectory(prefix="multistart-parts-") as folder:
        mine = os.path.join(folder, "mine.npz")
        result.save(mine, errors=False)  # the merge computes the covariance when asked
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
