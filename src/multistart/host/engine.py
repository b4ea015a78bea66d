"""What a fit is made of: its :class:`Setup` (known before any compile), its :class:`Traced`
step, and the :class:`Engine` built from them: what never changes while the search runs.

:func:`build` makes the engine and the first :class:`multistart.host.run_state.RunState`: the
population on its devices, the sweeper at the batch width chosen for it, what refills ended
starts' slots, the checkpoints and the rules of the syncs. The host loop
(:func:`multistart.host.iterate.iterate`) then threads the state through the engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from ..common import log, xla
from ..common.digest import starts_hash
from ..common.status import Status
from ..device.backends import BACKENDS, Backend
from ..device.chunking import pad_rows
from ..device.layout import Layout, physical_map
from ..device.programs import Programs
from ..device.step import (
    DEVICE_POPULATION_BYTES,
    PopState,
    device_population,
    host_population,
    made_on_device_bytes,
)
from ..device.sweeper import Sweeper
from ..model.problem import Problem
from ..result.minima import default_tolerances
from ..solvers import Solver
from ..starts.refill import Lineage, Refiller
from ..starts.strategies import StartPlan
from ..starts.tiktak import Discoveries, TikTakQueue
from ..width.choice import WidthChoice, resolve_width
from ..width.env import auto_mode_from_env, budget_from_env, max_batch_from_env
from ..width.timing import STACK_RUN_SHARE
from .checkpoint import Checkpointer, SearchCheckpoints
from .config import SearchConfig
from .decide import Rules, TailPrice
from .identity import SearchIdentity, Traces, search_identity
from .parts import Part
from .run_state import RunState

__all__ = ["Setup", "Traced", "Engine", "build"]

# start_strategy="band_tiktak" (L-BFGS's default) starts new local searches only while the ended
# ones took at most this many evaluations on average: short local searches are cheap to repeat
# (scipy's global suite: a median of 8-130 a search), long ones are not (the image fit: hundreds)
TIKTAK_SHORT_SEARCH = 300
# ... and every TIKTAK_EXPLORE_EVERY-th new local search starts, as is, at the next of the
# filter's ranking of band_tiktak's second pool (the driver's TIKTAK_EXPLORE_*): optima near or
# on a bound are reached, which the band's candidates and their blends never come near (issue 41;
# profiling/HISTORY.md)
TIKTAK_EXPLORE_EVERY = 3


@dataclass(frozen=True)
class Setup:
    """What a fit knows before it compiles anything."""

    options: SearchConfig
    solver: Solver
    config: dict  # the search's configuration as plain values (what the Result records)
    problem: Problem
    layout: Layout
    user: Any  # the user's starts (physical, leading axis) or None
    resume: bool
    t_start: float
    part: Part | None  # fit(..., part=(i, k)): only these slots of the plan run
    devices: list  # where the starts run (a mesh if several)
    programs: Programs  # the jitted functions, kept for a refit of the same model

    def identity_config(self, start_plan: StartPlan | None = None) -> dict:
        """The configuration the identity (and so a checkpoint) records."""
        config = dict(self.config)
        if start_plan is not None:
            config["starts"] = starts_hash(start_plan.x0)
        if self.part is not None:  # each part's checkpoints are its own
            config["part"] = [self.part.index, self.part.count]
        if len(self.devices) > 1:  # the population's padded layout is the device count's
            config["n_devices"] = len(self.devices)
        return config


@dataclass(frozen=True)
class Traced:
    """The search's step, traced but not compiled, and where its checkpoints go."""

    start_step: Any  # one start's step
    chunk_step: Any  # the compiled chunk's body
    traces: Traces  # the lowered figure of merit and step: what the identity hashes
    store: Checkpointer | None  # the checkpoint folder (checkpoint_dir), if any
    one_start: Any  # one start's state, its shapes (the host makes the population from them)


@dataclass(frozen=True)
class Engine:
    """What never changes while a search runs: how it steps, refills, checkpoints and decides.

    Attributes:
      sweeper: the only object that steps the population (one sweep: every running start).
      layout: the parameters' layout in the population.
      u0: the starts, unconstrained, in that layout (the population's first ``n`` rows).
      n: the starts (rows of the population past ``n`` pad it for a mesh of devices).
      rules: the rules of the syncs' decisions.
      refiller: what gives freed slots new starts (``None``: none do).
      checkpoints: the search's checkpoints (``None``: it writes none).
      identity: the search's identity (model, rule, configuration).
      choice: the batch width and how it was chosen.
      options: the search's options (``n_steps``, ``sync_every``, the budgets, the display).
      t_start: when ``fit`` was called (``time.perf_counter``).
      physical: the population's rows (leading axis) to physical params, NumPy
        (:func:`multistart.device.layout.physical_map`: the filter's program, if it ran).
    """

    sweeper: Sweeper
    layout: Layout
    u0: Any
    n: int
    rules: Rules
    refiller: Refiller | None
    checkpoints: SearchCheckpoints | None
    identity: SearchIdentity
    choice: WidthChoice
    options: SearchConfig
    t_start: float
    physical: Callable[[Any], Any]

    @property
    def together(self) -> bool:
        """On a mesh over several processes every process must sync at the same steps (a sync
        is a collective): no clock and no signal decides when, only the step count."""
        return self.sweeper.spans_processes


def build(setup: Setup, start_plan: StartPlan, traced: Traced) -> tuple[Engine, RunState]:
    """The engine (the population's sweeper at its chosen width, what refills ended starts,
    the checkpoints) and the state before the first step."""
    options, layout = setup.options, setup.layout
    n = start_plan.started.size  # a part's slots
    # the search's identity, made once its starts are planned (checkpoints, tuning record)
    identity = search_identity(
        setup.problem,
        layout.dtype,
        traced.traces,
        setup.identity_config(start_plan),
        later=traced.store is None,  # (a checkpoint records it at once)
    )
    checkpoints = None
    if traced.store is not None:
        checkpoints = SearchCheckpoints.of(traced.store, identity, options)
        if setup.resume:
            checkpoints.check()  # other starts (user starts=) than the checkpoint's
    u0 = layout.starts(start_plan.x0)
    status0 = np.where(start_plan.started, Status.RUNNING.code, Status.UNSTARTED.code)
    empty = empty_rows(setup.problem)
    if empty is not None:  # a stack's fits with no data: never started, and said so
        status0 = np.where(empty, Status.NO_DATA.code, status0)
    pop, backend, remake = _population(setup, traced, u0, status0)
    choice = _width(setup, backend, pop, traced, n, identity.program)
    sweeper = Sweeper(backend, choice.width, remake=remake)
    _log_start(setup, n, choice, sweeper)
    points = None
    if start_plan.evaluator is not None:  # its map of rows evaluates on the steps' data copy
        start_plan.evaluator.share(setup.problem.data, backend.data)
        points = start_plan.evaluator.points
    physical = physical_map(layout, n, setup.programs, points)  # the filter's program maps
    refiller = _refiller(setup, start_plan, sweeper.write, physical)
    rules = _rules(setup, refiller, checkpoints is not None, choice)
    engine = Engine(
        sweeper,
        layout,
        u0,
        n,
        rules,
        refiller,
        checkpoints,
        identity,
        choice,
        options,
        setup.t_start,
        physical,
    )
    lineage = None if refiller is None else Lineage.start(u0)
    return engine, RunState.start(pop, options.halving, lineage)


def empty_rows(problem) -> np.ndarray | None:
    """``(n_rows,)`` the rows of a stack's datasets with no data to fit
    (``problem.empty_data``), or ``None`` where there are none."""
    empty = problem.empty_data
    if problem.rows_per_datum is None or empty is None or not np.any(empty):
        return None
    return np.repeat(np.asarray(empty, dtype=bool), problem.rows_per_datum)


def _rules(
    setup: Setup, refiller: Refiller | None, checkpoints: bool, choice: WidthChoice
) -> Rules:
    """The search's rules for its syncs, from its options and its width choice's prices."""
    options = setup.options
    xtol, ftol = default_tolerances(setup.layout.dtype, setup.config["convergence"])
    return Rules(
        target_fom=options.target_fom,
        max_evals=options.max_evals,
        refills=frozenset() if refiller is None else refiller.refills,
        checkpoints=checkpoints,
        halving=options.halving,
        rediscoveries=options.rediscoveries,
        group=setup.problem.rows_per_datum or 0,  # a stack of fits: each fit's own starts
        xtol=xtol,
        ftol=ftol,
        tail=TailPrice.of(choice.tuning, options.steps),
    )


def _population(
    setup: Setup, traced: Traced, u0, status0
) -> tuple[PopState, Backend, Callable[[], PopState] | None]:
    """The initial population on the search's devices, its backend (no width yet), and where
    the population is made on a chip, how to make it again (a back-off before the first
    copy restarts from it: :class:`~multistart.device.sweeper.Sweeper`'s ``remake``).

    On several devices each holds an equal block of rows: the population is padded with inert
    rows (never started, never in the Result).
    """
    options = setup.options
    n, n_dev = len(status0), len(setup.devices)
    n_pop = n_dev * math.ceil(n / n_dev)
    if n_pop > n:
        u0 = jax.tree_util.tree_map(lambda a: pad_rows(np.asarray(a), n_pop - n), u0)
    status = np.concatenate([status0, np.full(n_pop - n, Status.UNSTARTED.code)]).astype(np.int8)
    n_rows = math.ceil(options.steps / options.history_stride)  # of history

    # each running row's state is set by its first chunk call: made on the host, no program,
    # or on a chip, where that is large, by one program of its own there (only the starts sent)
    opt_state, window = traced.one_start.opt_state, options.window
    remake = None
    if n_dev > 1:  # (a mesh's backend places it)
        pop = host_population(opt_state, u0, n_rows, window, status)
    elif xla.on_chip() and _large(opt_state, u0, n_rows, window):

        def remake() -> PopState:
            return device_population(opt_state, u0, n_rows, window, status)

        pop = remake()
    else:
        pop = jax.device_put(host_population(opt_state, u0, n_rows, window, status))
    backend = BACKENDS[options.backend](
        traced.chunk_step,
        n_total=n_pop,
        data=setup.problem.data,  # the backend places it on its device(s)
        pop=pop,
        rows=np.flatnonzero(status == Status.RUNNING.code),
        devices=setup.devices if n_dev > 1 else None,
        programs=setup.programs,
    )
    return backend.place(pop), backend, remake


def _large(opt_state, u0, n_rows: int, window: int) -> bool:
    """Is what a chip would make of the population itself worth its program
    (:data:`~multistart.device.step.DEVICE_POPULATION_BYTES`)?"""
    leaf = jax.tree_util.tree_leaves(u0)[0]
    made = made_on_device_bytes(opt_state, len(leaf), n_rows, window, leaf.dtype)
    return made >= DEVICE_POPULATION_BYTES


def _width(
    setup: Setup, backend: Backend, pop, traced: Traced, n: int, program_hash: str
) -> WidthChoice:
    """The batch width (per device), the same in every process of a job."""
    options = setup.options
    starts_per_device = math.ceil(n / backend.n_devices)
    device = next(d for d in setup.devices if d.process_index == jax.process_index())
    env = (max_batch_from_env(), budget_from_env(), auto_mode_from_env())
    made: list[bool] = []  # resolve_width ran in this fit

    def choose() -> WidthChoice:
        made.append(True)
        return resolve_width(
            options.batch_size,
            backend,
            pop,
            starts_per_device=starts_per_device,
            device=device,
            start_step=traced.start_step,
            backend_name=options.backend,
            program_hash=program_hash,  # the step lowered once, for the identity
            n_steps=options.steps,  # "auto" times widths only where the fit pays for it
            # a stack's small fits end early: priced at the share of n_steps they run
            run_share=STACK_RUN_SHARE if setup.problem.rows_per_datum else 1.0,
        )

    first = setup.programs.get(
        ("width", options.batch_size, starts_per_device, str(device), env), choose
    )
    # A refit of the same model keeps the width its first fit chose (and so its program).
    choice = first if made else _kept(first)
    if backend.spans_processes:  # every process must step the same program: process 0's width
        from jax.experimental import multihost_utils

        width = int(multihost_utils.broadcast_one_to_all(np.int32(choice.width)))
        choice = replace(choice, width=width)
    return choice


def _kept(choice: WidthChoice) -> WidthChoice:
    """``choice``, made by an earlier fit of the same model, as this fit's: nothing timed or
    compiled to choose it."""
    info = {**choice.info, "selected_by": f"{choice.info.get('selected_by')} (earlier fit)"}
    return replace(choice, info={**info, "decide_s": 0.0}, n_tune_compiles=0, select_s=0.0)


def _log_start(setup: Setup, n: int, choice: WidthChoice, sweeper: Sweeper) -> None:
    options, n_dev = setup.options, len(setup.devices)
    how = (
        ""
        if choice.info.get("selected_by") == "explicit"
        else f" (batch_size={options.batch_size!r})"
    )
    log.logger.log(
        log.routine_level(),
        "fitting %s: %d starts%s x %d parameters, %s, %d starts a chunk%s%s%s%s",
        setup.problem.name,
        n,
        "" if setup.part is None else setup.part.words(options.n_starts),
        setup.problem.space.n_dims,
        setup.config["search"],
        choice.width,
        how,
        " per device" if n_dev > 1 else "",
        ", scan backend" if options.backend == "scan" else "",
        f", {n_dev} {setup.devices[0].platform} devices" if n_dev > 1 else "",
    )
    log.logger.debug(
        "compiled the chunk step (width %d, %d chunks) in %.2f s",
        choice.width,
        math.ceil(n / sweeper.n_devices / choice.width),
        sweeper.compile_s,
    )


def _refiller(setup: Setup, start_plan: StartPlan, write, physical) -> Refiller | None:
    """What gives ended starts' slots new starts: resurrection's reserve, TikTak's queue, or
    nothing. A slot the halving schedule pruned takes the next start too."""
    options, layout = setup.options, setup.layout
    reserve = start_plan.reserve
    if not (options.resurrect or options.tiktak) or reserve is None:
        return None
    kw: dict[str, Any] = dict(write=write, to_u=layout.to_unconstrained, to_x=physical)
    ended = {Status.NONFINITE.code, Status.PRUNED.code}
    if not options.tiktak:
        return Refiller(reserve, ended, **kw)
    discoveries = None
    if options.max_discoveries is not None:
        xtol, ftol = default_tolerances(layout.dtype, setup.config["convergence"])
        discoveries = Discoveries(
            int(options.max_discoveries), xtol=xtol, ftol=ftol
        )  # "auto" resolved
    band = options.start_strategy == "band_tiktak"
    queue = TikTakQueue(  # the filter's other finite candidates, best first, blended
        getattr(reserve, "x", None),
        layout.space,
        n_local=options.n_local or 0,  # resolved with start_strategy="tiktak"
        n_first=int(np.sum(start_plan.started)),
        discoveries=discoveries,
        short=TIKTAK_SHORT_SEARCH if band else None,
        explore=start_plan.explore,  # band_tiktak's ranking over the box (None otherwise)
        explore_every=TIKTAK_EXPLORE_EVERY,
        cycle=options.tiktak_cycle,  # band_tiktak: the weights restart every round
    )
    local_search_ended = {Status.CONVERGED.code, Status.STALLED.code, Status.MAX_STEPS.code}
    return Refiller(queue, ended | local_search_ended, **kw)
