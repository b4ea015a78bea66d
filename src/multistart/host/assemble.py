"""The Result of a fit: per-start records from the final run state, the run's statistics.

:func:`assemble` is the one place a fit's :class:`multistart.Result` is made, from the engine
and the final :class:`multistart.host.run_state.RunState`: each slot's record (replaced
starts folded
in), the best fit, and every statistic, gathered here.
"""

from __future__ import annotations

import time
import warnings
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np

from ..common import log, status
from ..common.monitor import CompileCounter
from ..common.status import Status
from ..device.distributed import to_host
from ..result import Result, Uncertainty, warn_if_no_start_improved
from ..result.laplace import hessian_function
from ..starts.strategies import StartPlan
from ..starts.tiktak import TikTakQueue
from .decide import STILL_RUNNING
from .engine import Engine, Setup
from .identity import config_hash
from .run_state import RunState

__all__ = ["assemble", "log_end", "CHUNK_STEP_NAME"]

CHUNK_STEP_NAME = "multistart_chunk_step"
MINIMA_SHOWN = 5  # the end-of-search log line counts the starts of this many best minima


def _forward_fill(history: np.ndarray) -> np.ndarray:
    """Carry each start's last recorded best forward over rows where it no longer stepped."""
    out = history.copy()
    for i in range(1, out.shape[0]):
        gap = np.isnan(out[i])
        out[i, gap] = out[i - 1, gap]
    return out


#: The fields of the population a record reads.
_RECORDED = ("status", "best_fom", "best_u", "n_steps", "n_evals", "best_step")


def records(setup: Setup, engine: Engine, state: RunState) -> dict[str, Any]:
    """Every start's record (the Result's per-start fields; refilled slots' earlier starts
    folded in)."""
    writable = lambda tree: jax.tree_util.tree_map(np.array, tree)  # noqa: E731
    n, lineage = engine.n, state.lineage  # the population's rows past n pad it for a mesh
    stride = engine.options.history_stride
    # only the fields a record holds are read (gathered if over processes): not the solver's
    # state, most of the population (31 of 48 MB for 200,000 fits of 4 parameters, issue 70)
    read = {k: getattr(state.pop.starts, k) for k in _RECORDED}
    fields, history = to_host((read, state.pop.history))
    s = SimpleNamespace(**jax.tree_util.tree_map(lambda a: a[:n], fields))
    codes = np.asarray(s.status).astype(np.int64)
    # ended by the host, running on the device: the halving schedule or (never with it) the
    # rediscovery rule, which a resumed search may turn off (the schedule it may not)
    ended = Status.PRUNED if engine.options.halving is not None else Status.REFOUND
    codes[state.pruned[:n]] = ended.code
    assert state.stop is not None  # the loop ended
    still = STILL_RUNNING.get(state.stop, Status.INTERRUPTED)
    codes[codes == Status.RUNNING.code] = still.code
    # The history ends when the last start did; the host may have noticed a little later.
    # (In a refilled slot the starts take turns: its last one began later.)
    n_steps_run = int(np.max(s.n_steps))
    if lineage is not None:
        n_steps_run = int(np.max(lineage.started_at + np.asarray(s.n_steps)))
    rows = -(-n_steps_run // stride)
    rec: dict[str, Any] = {
        "foms": np.asarray(s.best_fom, dtype=np.float64).copy(),
        "params": writable(engine.physical(s.best_u)),
        "start_params": writable(engine.physical(jax.device_get(engine.u0))),
        "status": codes.astype(np.int8),  # (the Result keeps the codes, and makes members)
        "n_steps": np.asarray(s.n_steps, dtype=np.int64).copy(),
        "n_evals": np.asarray(s.n_evals, dtype=np.int64).copy(),
        "best_step": np.asarray(s.best_step, dtype=np.int64).copy(),
        "history": _forward_fill(history[:rows, :n].astype(np.float64)),
        "history_steps": np.minimum((np.arange(rows) + 1) * stride, n_steps_run),
    }
    if engine.refiller is not None and lineage is not None:
        rec, incarnations = engine.refiller.fold(rec, lineage)
        rec.update(incarnations=incarnations, resurrections=lineage.count.copy())
    rec["at_bound"] = setup.problem.space.at_bound(rec["params"])
    rec["rung"] = None if state.rungs is None else state.rungs.rung_of()[:n]
    return rec


def _warn_if_none_finite(foms: np.ndarray, name: str) -> None:
    if not np.isfinite(foms).any():
        warnings.warn(
            f"every one of the {foms.size} starts was non-finite (nan or inf) for {name!r}: no "
            "fit was found; check the objective and the space",
            RuntimeWarning,
            stacklevel=5,
        )


def stats(
    setup: Setup,
    start_plan: StartPlan,
    engine: Engine,
    state: RunState,
    rec: dict[str, Any],
    compiles: CompileCounter,
    loop_s: float,
) -> dict[str, Any]:
    """Every run statistic, gathered in one place."""
    pre, choice, sweeper = start_plan.stats, engine.choice, engine.sweeper
    replaced = 0 if state.lineage is None else state.lineage.evals_replaced
    out = dict(pre)
    ran = rec["history_steps"]  # the last start's steps: a call may end after it did
    out.update(
        n_steps_run=int(ran[-1]) if np.size(ran) else 0,
        n_chunk_calls=state.n_chunk_calls,
        first_step_s=state.first_step_s,
        loop_s=loop_s,
        stop_reason=str(state.stop),
        n_evals=int(np.sum(np.asarray(rec["n_evals"]))) + replaced,
        # the chunk step's compiles for the search itself (a back-off adds one each);
        # widths compiled only to be measured are counted apart
        n_compiles=compiles.count(CHUNK_STEP_NAME) - choice.n_tune_compiles,
        n_tune_compiles=choice.n_tune_compiles,
        n_compiles_total=compiles.total + pre.get("n_compiles_total", 0),
        n_cache_hits=sum(compiles.cache_hits.values()) + pre.get("n_cache_hits", 0),
        compile_s=sweeper.compile_s,
        select_s=choice.select_s,
        wall_s=time.perf_counter() - setup.t_start,
        # the width the search ran at (per device), its tail's narrower ones apart
        batch_size=sweeper.narrowed[0]["from"] if sweeper.narrowed else sweeper.width,
        n_devices=sweeper.n_devices,
        backend=setup.options.backend,
        width_choice=choice.info,  # how that width was chosen
        backoffs=list(sweeper.backoffs),
        history_stride=engine.options.history_stride,
        identity=dict(engine.identity.hashes),
    )
    if "plan" in start_plan.stats:  # a part: the whole run's configuration hash, for the merge
        out["whole_config"] = config_hash({**setup.config, "starts": start_plan.stats["plan"]})
    out["evals_to_best"] = state.evals_to_best
    if sweeper.narrowed:  # the tail swept narrower: from which step, at which width
        out["narrowed"] = list(sweeper.narrowed)
    if state.resumed_from:
        out["resumed_from"] = state.resumed_from
    out.update(_rung_stats(setup, state))
    out.update(_refill_stats(setup, start_plan, engine, state))
    if engine.checkpoints is not None:
        out["checkpoints"] = list(state.saved)
    if choice.tuning is not None:
        out["tuning"] = choice.tuning
    return out


def _rung_stats(setup: Setup, state: RunState) -> dict[str, Any]:
    """The halving schedule's rungs: where they stood, how many reached and were pruned."""
    halving = setup.options.halving
    if halving is None or state.rungs is None:
        return {}
    pruned = list(state.rungs.pruned)
    rungs = {
        "evals": [halving.rung(k) for k in range(len(pruned))],
        "reached": [len(r) for r in state.rungs.reached],
        "pruned": pruned,
    }
    return {"rungs": rungs, "n_pruned": int(sum(pruned))}


def _refill_stats(setup, start_plan, engine: Engine, state: RunState) -> dict[str, Any]:
    """Resurrection's and TikTak's counts, when freed slots were refilled."""
    refiller, lineage = engine.refiller, state.lineage
    if refiller is None or lineage is None:
        return {}
    n_replaced = len(lineage.records)
    out: dict[str, Any] = {"n_resurrections": n_replaced}
    if setup.options.tiktak:
        out["n_local"] = int(np.sum(start_plan.started)) + n_replaced
        queue = refiller.queue
        if isinstance(queue, TikTakQueue):
            if queue.discoveries is not None:
                out["discoveries"] = queue.discoveries.count
            if queue.short is not None:
                out["short_searches"] = queue.short_searches  # False: no new local search
    return out


def assemble(
    setup: Setup, start_plan: StartPlan, engine: Engine, state: RunState, compiles
) -> Result:
    """The fit's Result (its problem attached, for the lazy covariance), made whole: nothing
    changes it afterwards."""
    loop_s = time.perf_counter() - setup.t_start
    rec = records(setup, engine, state)
    _warn_if_none_finite(rec["foms"], setup.problem.name)
    result = Result.of(
        **rec,
        stats=stats(setup, start_plan, engine, state, rec, compiles, loop_s),
        paths=list(setup.problem.space.all_paths),
        config=setup.config,
    )
    if setup.problem.rows_per_datum is not None:  # a stack of independent fits
        # minima across datasets mean nothing, nor one covariance of them all
        return result.with_stats(rows_per_datum=setup.problem.rows_per_datum)
    result = result.with_stats(n_distinct_minima=result.n_distinct_minima())
    best = result.best_index
    if best >= 0 and np.asarray(result.at_bound)[best]:
        one = jax.tree_util.tree_map(lambda a: np.asarray(a)[best : best + 1], result.params)
        bound_names = setup.problem.space.near_bound(one)[1][0]
        log.logger.log(
            log.bound_level(),
            "the best fit has %s at a bound of its prior: the optimum may lie outside the "
            "prior (widen it), or the start stopped where the bound flattens the gradient",
            ", ".join(bound_names),
        )
    warn_if_no_start_improved(result)
    # for the lazy covariance (computes nothing): the problem, and its Hessian's function kept
    # with the fit's programs, so a refit of new data of the same shapes compiles nothing
    problem = setup.problem
    kind = ("hessian", getattr(problem, "covariance", None))
    hessian = setup.programs.get(kind, lambda: hessian_function(problem))
    return result.replaced(uncertainty=Uncertainty(problem, hessian=hessian))


def log_end(result: Result) -> None:
    """The end-of-search log line: the time, the width, the compiles, the best and the minima
    (for a stack of fits, how many: their minima are not one search's; where no start
    converged, that, and the statuses say how they stopped)."""
    st = result.stats
    counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
    if "rows_per_datum" in st:
        k = st["rows_per_datum"]
        found = f"{len(result.foms) // k} datasets x {k} starts"
    elif not status.settled(result.status_codes).any():
        # no start ended by a test: their last points are not minima, however many differ
        found = f"best figure of merit {result.best_fom:.6g}; no start converged"
    else:
        minima = result.distinct_minima()
        each = ", ".join(str(m.n_starts) for m in minima[:MINIMA_SHOWN])
        more = ", ..." if len(minima) > MINIMA_SHOWN else ""
        s = "um" if len(minima) == 1 else "a"
        found = (
            f"best figure of merit {result.best_fom:.6g}; {len(minima)} distinct minim{s} (starts "
            f"each, best first: {each}{more})"
        )
    log.logger.log(
        log.routine_level(),
        "done in %.2f s (%d starts a chunk, compile %.2f s, %d compile%s of the step; stopped: "
        "%s): %s; %s",
        st["wall_s"],
        st["batch_size"],
        st["compile_s"],
        st["n_compiles"],
        "" if st["n_compiles"] == 1 else "s",
        st["stop_reason"],
        found,
        counts,
    )
