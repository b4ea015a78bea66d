"""The driver: one fit, read top to bottom.

:func:`run` is the whole of a fit, each stage a function of the typed values before it::

    setup = prepare(...)                    # every check that needs no compile
    traced = identify(setup)                # the step traced (no compile); when resuming,
                                            # another search's checkpoint refused
    start_plan = plan(setup)                # the starts (the broad-start filter compiles here)
    engine, state = build(setup, ...)       # what never changes while it runs (the sweeper at
                                            # its width, refills, checkpoints), its first state
    state = restore(setup, engine, state)   # from a checkpoint, when resuming
    state = iterate(engine, state, flag)    # step until it stops (multistart.host.iterate)
    result = assemble(...)                  # the Result (multistart.host.assemble)

The search object (:mod:`multistart.search.core`) holds only its rule and its checked options
(:class:`multistart.SearchConfig`), read once into the :class:`Setup`; the per-start numerics
live in :mod:`multistart.device.step`, the rules in :mod:`multistart.solvers`, the host loop in
:mod:`multistart.host.iterate`, its decisions in :mod:`multistart.host.decide`, parts and
processes in :mod:`multistart.host.parts`.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..common import log, xla
from ..common.digest import replay
from ..common.monitor import CompileCounter
from ..device.cache import configure_compilation_cache
from ..device.distributed import resolve_devices
from ..device.evaluator import FILTER_NAME
from ..device.layout import Layout
from ..device.programs import forget_other_float_types, programs_for
from ..device.step import init_rows, make_chunk_step, make_start_step
from ..model.problem import as_problem, check_objective, traced, traced_key
from ..result import Result
from ..starts.strategies import (
    Explore,
    StartPlan,
    check_strategy_space,
    plan_starts,
    user_starts,
)
from ..width.env import check_env, max_batch_from_env
from ..width.widths import cap_width
from .assemble import CHUNK_STEP_NAME, assemble, log_end
from .checkpoint import Checkpointer, SearchCheckpoints, SearchInterrupted
from .config import SearchConfig, steps_for
from .engine import Engine, Setup, Traced, build, empty_rows
from .identity import programs_key, search_identity, trace_search
from .iterate import iterate, resume, signals_to_flag
from .parts import (
    check_part,
    check_stack,
    first_process_logs,
    merge_over_processes,
    over_processes,
    select_part,
)
from .run_state import RunState

__all__ = ["run"]

#: where a model's programs keep the steps a call reached (``steps_per_call="auto"``)
STEPS_LEARNED = "steps per call"
# band_tiktak's second pool (the engine hands out every TIKTAK_EXPLORE_EVERY-th new local search
# from it): the filter's ranking of TIKTAK_EXPLORE_PER_START x n_starts candidates drawn over
# TIKTAK_EXPLORE_BOX of each prior's unit interval, and TIKTAK_EXPLORE_BOUND_PER_START x n_starts
# more, each bounded coordinate of them on a bound with probability TIKTAK_EXPLORE_ON_BOUND: a
# search that starts there searches that face, so optima on a bound, which a logistic coordinate
# reaches only asymptotically, are found (issue 41; profiling/HISTORY.md)
TIKTAK_EXPLORE_PER_START = 5
TIKTAK_EXPLORE_BOX = (0.01, 0.99)
TIKTAK_EXPLORE_BOUND_PER_START = 2.5
TIKTAK_EXPLORE_ON_BOUND = 0.5


def prepare(search, objective, space, starts, resume, part, *, every_process) -> Setup:
    """Validate the call: every error here is raised before any compile.

    ``every_process``: the search runs on one mesh over every process's devices.
    """
    options: SearchConfig = search.options
    part = check_part(part, options)
    if resume and options.checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir to be set on the search")
    t_start = time.perf_counter()
    log.configure()
    check_env()
    problem = as_problem(objective, space)
    absolute = options.absolute_sigma  # how its covariance is scaled: resolved by the search's rule
    assert absolute is not None  # (config.resolve_absolute_sigma)
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless x64 is on
    forget_other_float_types(dtype)  # before the trace: see there
    problem = traced(problem, dtype, repr(search))  # the one trace every program replays
    # A model with no key of its own is keyed by its trace: a refit reuses its programs.
    key = problem.program_key if problem.program_key is not None else traced_key(problem, dtype)
    problem = dataclasses.replace(
        problem, absolute_sigma=absolute, n_data=options.n_data, program_key=key
    )
    check_strategy_space(options.start_strategy, problem.space)
    user = None if starts is None else user_starts(problem.space, starts, options.n_starts)
    check_stack(problem, options, part)
    programs = programs_for(programs_key(problem, search.solver, options, dtype))
    # the trace's verdict holds for every refit of the same model and data shapes
    programs.get("checked", lambda: check_objective(problem, dtype, repr(search)))
    if options.checkpoint_dir is not None:
        if jax.process_count() > 1 and part is not None:  # orbax wants global arrays there
            raise ValueError(
                "checkpoint_dir with part= is not supported in a job of several JAX processes "
                "(ms.distributed.initialize): fit without part= (the search then spans the "
                "job's processes and checkpoints as one), or run the parts as independent "
                "tasks (a job array, each with its own checkpoint_dir)"
            )
        Checkpointer.check_folder(options.checkpoint_dir)
    devices = resolve_devices(options.devices, every_process=every_process)
    check_stack(problem, options, part, n_devices=len(devices))
    configure_compilation_cache()
    layout = Layout(problem.space, options.flat, dtype)
    config = search.config()
    return Setup(
        options,
        search.solver,
        config,
        problem,
        layout,
        user,
        resume,
        t_start,
        part,
        devices,
        programs,
    )


def identify(setup: Setup) -> Traced:
    """Trace the step (no compile), and when resuming refuse a checkpoint of another model,
    rule or configuration now, before the filter or the step compiles."""
    options, problem = setup.options, setup.problem
    # The step captures the model's functions and space, never the problem (its data): a
    # refit's data are arguments, and kept steps must not keep the first fit's data alive.
    fom, space = problem.fom, problem.space

    def fom_u(u, d):
        # Behind a fusion boundary: XLA must not recompute the map inside the model's loops.
        return fom(space.to_model(u), d)

    residual_u = None
    residuals = getattr(problem, "residuals", None)  # a least-squares problem's
    if residuals is not None:

        def residual_u(u, d):
            return residuals(space.to_model(u), d)

    def steps():
        # With resurrection a start gives up (and is replaced) after `resurrect` failures.
        start_step = make_start_step(
            fom_u,
            setup.solver,
            options.guard,
            options.give_up,
            max_start_steps=options.local_steps,
            residual_u=residual_u,
            bounded=space.logistic_mask(),
        )
        one = setup.layout.one_start_state(setup.solver, options.window)
        traces, traced = trace_search(problem, setup.layout.dtype, start_step, one)
        # the identity's trace of the step, replayed: the step's Python is traced once
        chunk_step = make_chunk_step(
            replay(traced, start_step),
            functools.partial(init_rows, setup.solver, options.window),
            problem.rows_per_datum,
            options.history_stride,
        )
        chunk_step.__name__ = chunk_step.__qualname__ = CHUNK_STEP_NAME
        return start_step, chunk_step, traces, one

    # A refit of the same model reuses its steps (and so its compiled programs) and traces.
    start_step, chunk_step, traces, one = setup.programs.get("steps", steps)
    store = None if options.checkpoint_dir is None else Checkpointer(options.checkpoint_dir)
    if store is not None and setup.resume:
        # the identity less the plan's starts (build() makes the whole one, once they are
        # planned): another search's checkpoint is refused before the filter compiles
        early = search_identity(problem, setup.layout.dtype, traces, setup.identity_config())
        SearchCheckpoints.of(store, early, options).check(ignore=("starts",))
    return Traced(start_step, chunk_step, traces, store, one)


def plan(setup: Setup) -> StartPlan:
    """Every slot's start: the user's, then the strategy's (filtered by default); the whole
    plan, then a part's slots of it."""
    options = setup.options
    assert (
        options.n_candidates is not None and options.filter_batch_size is not None
    )  # resolved by the options
    with CompileCounter() as compiles:
        start_plan = plan_starts(
            setup.problem,
            setup.layout.dtype,
            n_starts=options.n_starts,
            strategy=options.start_strategy,
            band=options.start_band,
            n_candidates=options.n_candidates,
            max_candidates=options.max_candidates,
            # MULTISTART_MAX_BATCH caps the filter's width too: the retry knob after a memory
            # failure
            filter_width=cap_width(
                options.filter_batch_size, options.n_candidates, max_batch_from_env()
            ),
            seed=options.seed,
            user=setup.user,
            programs=setup.programs,
            explore=_explore(options),
        )
    if start_plan.evaluator is not None:  # no second device copy of the data while the search runs
        start_plan.evaluator.release()
    start_plan.stats.update(
        n_filter_compiles=compiles.count(FILTER_NAME),
        n_cache_hits=sum(compiles.cache_hits.values()),
        n_compiles_total=compiles.total,
    )
    return without_empty_data(select_part(start_plan, setup.part), setup.problem)


def without_empty_data(start_plan: StartPlan, problem) -> StartPlan:
    """``start_plan`` with no start in the rows of a stack's datasets that have no data to
    fit (``problem.empty_data``): those slots stay unstarted (``build`` marks them
    ``no_data``), their starts ``nan``, as a slot the filter left empty."""
    rows = empty_rows(problem)
    if rows is None:
        return start_plan
    x0 = jax.tree_util.tree_map(
        lambda a: np.where(rows.reshape(-1, *[1] * (np.ndim(a) - 1)), np.nan, a), start_plan.x0
    )
    return dataclasses.replace(start_plan, x0=x0, started=start_plan.started & ~rows)


def _explore(options: SearchConfig) -> Explore | None:
    """band_tiktak's second pool: the candidates over the box the filter also ranks."""
    if options.start_strategy != "band_tiktak":
        return None
    n_bound = int(TIKTAK_EXPLORE_BOUND_PER_START * options.n_starts)
    n = TIKTAK_EXPLORE_PER_START * options.n_starts
    return Explore(n, TIKTAK_EXPLORE_BOX, n_bound, TIKTAK_EXPLORE_ON_BOUND)


def restore(setup: Setup, engine: Engine, state: RunState) -> RunState:
    """The newest checkpoint's state when resuming, made ready to step; else ``state``."""
    if engine.checkpoints is None or not setup.resume:
        return state
    restored = engine.checkpoints.restore(state)
    if restored is None:
        log.logger.info("no checkpoint in %s yet: starting afresh", setup.options.checkpoint_dir)
        return state
    return resume(engine, restored)


def run(search, objective, space=None, *, starts=None, resume: bool = False, part=None) -> Result:
    """One fit of ``search`` (see :meth:`multistart.MultiStartGradient.fit`).

    In a job of several JAX processes (:func:`multistart.device.distributed.initialize`) a fit
    without ``part=`` either runs part ``(process_index, process_count)`` in each process and
    merges them, or runs on one mesh over every process's devices
    (:func:`multistart.host.parts.over_processes`); either way every process returns the
    whole Result.
    """
    search = _sized(search, objective, space)
    mode, why = over_processes(search.options) if part is None else (None, None)
    if mode == "split":
        part = (jax.process_index(), jax.process_count())
    with xla.precision(search.options.dtype), first_process_logs():
        mesh = mode == "mesh"
        setup = prepare(search, objective, space, starts, resume, part, every_process=mesh)
        if mesh:
            log.logger.info(
                "a job of %d processes: the search runs on one mesh over every process's "
                "devices, as %s",
                jax.process_count(),
                why,
            )
        traced = identify(setup)
        start_plan = plan(setup)
        with CompileCounter() as compiles:
            engine, state = build(setup, start_plan, traced)
            state = restore(setup, engine, state)
            with signals_to_flag() as flag:
                state = iterate(engine, state, flag, setup.programs.get(STEPS_LEARNED, dict))
            result = assemble(setup, start_plan, engine, state, compiles)
        if mode == "split":
            result = merge_over_processes(result, setup.problem)
        elif mesh:
            result = result.with_stats(n_processes=jax.process_count())
        log_end(result)
    _raise_if_stopped_early(state, result)
    return result


#: ``MultiStartLBFGS(diagonal="auto")`` is on for a factor graph whose factors own parameters
#: past this many parameters in all (issue 74: a cohort of 3,000 patients, 9,005 parameters, fits
#: in 3,987 evaluations instead of 42,672, 0.86x scipy's L-BFGS-B loop where a scalar initial
#: Hessian takes 3.6x; profiling/cohort.py). Below it every fit keeps what it had; off a graph a
#: secant a coordinate costs steps where coordinates are coupled (docs/rules.md).
DIAGONAL_FROM_DIMS = 500


def _sized(search, objective, space):
    """The search with ``n_steps="auto"`` resolved for the problem's number of parameters
    (:func:`multistart.host.config.steps_for`) and L-BFGS's ``diagonal="auto"``
    (:func:`diagonal_for`: a plain objective is never a graph, so its problem is not built for
    it); any other search as it is."""
    steps = search.options.n_steps == "auto"
    diagonal = search.left_auto("diagonal") and hasattr(objective, "multistart_problem")
    if not (steps or diagonal):
        return search
    space = as_problem(objective, space).space
    changes: dict = {"n_steps": steps_for(space.n_dims)} if steps else {}
    if diagonal and diagonal_for(space):
        changes["diagonal"] = True
    return search.replace(**changes) if changes else search


def diagonal_for(space) -> bool:
    """``diagonal="auto"`` for a problem's space: on for a factor graph whose factors own
    parameters (its Hessian an arrow, :meth:`multistart.model.plates.GraphSpace.arrow`) past
    :data:`DIAGONAL_FROM_DIMS` parameters."""
    arrow = getattr(space, "arrow", None)
    if not callable(arrow) or space.n_dims <= DIAGONAL_FROM_DIMS:
        return False
    return bool(arrow().blocks)


def _raise_if_stopped_early(state: RunState, result: Result) -> None:
    """A failed checkpoint or a signal stopped the search: raise, with the result so far."""
    if state.error is not None:
        state.error.result = result  # type: ignore[attr-defined]  # a CheckpointError's
        raise state.error
    if state.stop is not None and state.stop.interrupted:
        where = f"; checkpoint of step {state.saved[-1]}" if state.saved else ""
        raise SearchInterrupted(
            f"search stopped by {state.stop} at step {state.step}{where}; "
            "the partial result is in .result",
            result=result,
            checkpoint=state.saved[-1] if state.saved else None,
            reason=state.stop.value,
        )
