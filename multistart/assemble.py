"""The Result of a fit: per-start records from the final population, the run's statistics.

:func:`assemble` is the one place a fit's :class:`multistart.Result` is made from the engine
and the loop's :class:`multistart.loop.Outcome`: each slot's record (replaced starts folded
in), the best fit, and every statistic, gathered here.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import jax
import numpy as np

from . import log
from .decide import STILL_RUNNING
from .distributed import to_host
from .loop import Outcome
from .monitor import CompileCounter
from .problem import Problem
from .refill import REPLACE_NAME
from .result import Result, warn_if_no_start_improved
from .starts import StartPlan
from .status import Status
from .tiktak import TikTakQueue

__all__ = ["assemble", "CHUNK_STEP_NAME", "BOUND_RTOL"]

CHUNK_STEP_NAME = "multistart_chunk_step"
BOUND_RTOL = 1e-4  # a best fit this close to a bound (in the prior's unit interval) is flagged


def _forward_fill(history: np.ndarray) -> np.ndarray:
    """Carry each start's last recorded best forward over rows where it no longer stepped."""
    out = history.copy()
    for i in range(1, out.shape[0]):
        gap = np.isnan(out[i])
        out[i, gap] = out[i - 1, gap]
    return out


def records(problem: Problem, engine, outcome: Outcome) -> tuple[dict, int, list]:
    """Per-start records from the final population (refilled slots' earlier starts folded
    in); the evaluations of the replaced starts; each start's parameters at a bound, by name."""
    pop, stride, refiller = outcome.pop, engine.stride, engine.refiller
    to_physical = jax.jit(jax.vmap(engine.to_physical))
    writable = lambda tree: jax.tree_util.tree_map(np.array, jax.device_get(tree))  # noqa: E731
    n = engine.n  # the population's rows past n pad it for a mesh of devices
    starts, history = to_host((pop.starts, pop.history))  # gathered if over processes
    s = jax.tree_util.tree_map(lambda a: a[:n], starts)
    codes = np.asarray(s.status).astype(np.int64)
    codes[outcome.pruned[:n]] = Status.PRUNED.code  # ended by the host, running on the device
    still = STILL_RUNNING.get(outcome.stop_reason, Status.INTERRUPTED)
    codes[codes == Status.RUNNING.code] = still.code
    # The history ends when the last start did; the host may have noticed a little later.
    # (In a refilled slot the starts take turns: its last one began later.)
    n_steps_run = int(np.max(s.n_steps))
    if refiller is not None:
        n_steps_run = int(np.max(refiller.started_at + np.asarray(s.n_steps)))
    rows = -(-n_steps_run // stride)
    rec: dict[str, Any] = {
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
    incarnations: list[dict] = []
    resurrections, replaced = None, 0
    if refiller is not None:
        rec, incarnations = refiller.merge(rec, to_physical)
        resurrections, replaced = refiller.count.copy(), refiller.evals_replaced
    at_bound, bound_names = problem.space.near_bound(rec["params"], BOUND_RTOL)
    out = dict(
        rec,
        at_bound=at_bound,
        resurrections=resurrections,
        incarnations=incarnations,
        rung=None if outcome.rungs is None else outcome.rungs.rung_of()[:n],
    )
    return out, replaced, bound_names


def _warn_if_none_finite(foms: np.ndarray, name: str) -> None:
    if not np.isfinite(foms).any():
        warnings.warn(
            f"every one of the {foms.size} starts was non-finite (nan or inf) for {name!r}: no "
            "fit was found; check the objective and the space",
            RuntimeWarning,
            stacklevel=5,
        )


def stats(
    search,
    start_plan: StartPlan,
    engine,
    outcome: Outcome,
    rec: dict,
    n_evals_replaced: int,
    t_start: float,
) -> dict[str, Any]:
    """Every run statistic, gathered in one place."""
    pre, choice, stepper = start_plan.stats, engine.choice, engine.stepper
    compiles: CompileCounter = engine.compiles
    out = dict(pre)
    out.update(
        n_steps_run=outcome.steps_run,
        n_chunk_calls=outcome.n_chunk_calls,
        first_step_s=outcome.first_step_s,
        loop_s=outcome.loop_s,
        stop_reason=outcome.stop_reason.value,
        n_evals=int(np.sum(np.asarray(rec["n_evals"]))) + n_evals_replaced,
        # the chunk step's compiles for the search itself (a back-off adds one each);
        # widths compiled only to be measured are counted apart
        n_compiles=compiles.count(CHUNK_STEP_NAME) - choice.n_tune_compiles,
        n_tune_compiles=choice.n_tune_compiles,
        n_compiles_total=compiles.total + pre.get("n_compiles_total", 0),
        n_cache_hits=sum(compiles.cache_hits.values()) + pre.get("n_cache_hits", 0),
        compile_s=stepper.compile_s,
        select_s=choice.select_s,
        wall_s=time.perf_counter() - t_start,
        batch_size=stepper.width,  # the width the search ran at (per device)
        n_devices=stepper.n_devices,
        backend=search.options.backend,
        width_choice=choice.info,  # how that width was chosen
        backoffs=list(stepper.backoffs),
        history_stride=engine.stride,
        identity=engine.identity.hashes(),
    )
    out["evals_to_best"] = outcome.evals_to_best
    if outcome.resumed_from:
        out["resumed_from"] = outcome.resumed_from
    out.update(_rung_stats(search, outcome))
    out.update(_refill_stats(search, start_plan, engine))
    if engine.checkpoints is not None:
        out["checkpoints"] = list(engine.checkpoints.saved)
    if choice.tuning is not None:
        out["tuning"] = choice.tuning
    return out


def _rung_stats(search, outcome: Outcome) -> dict[str, Any]:
    """The halving schedule's rungs: where they stood, how many reached and were pruned."""
    halving = search.options.halving
    if halving is None or outcome.rungs is None:
        return {}
    pruned = list(outcome.rungs.pruned)
    rungs = {
        "evals": [halving.rung(k) for k in range(len(pruned))],
        "reached": [len(r) for r in outcome.rungs.reached],
        "pruned": pruned,
    }
    return {"rungs": rungs, "n_pruned": int(sum(pruned))}


def _refill_stats(search, start_plan: StartPlan, engine) -> dict[str, Any]:
    """Resurrection's and TikTak's counts, when freed slots were refilled."""
    refiller = engine.refiller
    if refiller is None:
        return {}
    out: dict[str, Any] = {
        "n_resurrections": refiller.n_resurrections,
        "n_replace_compiles": engine.compiles.count(REPLACE_NAME),
    }
    if search.options.tiktak:
        out["n_local"] = int(np.sum(start_plan.started)) + refiller.n_resurrections
        queue = refiller.queue
        if isinstance(queue, TikTakQueue) and queue.discoveries is not None:
            out["discoveries"] = queue.discoveries.count
    return out


def assemble(search, setup, start_plan: StartPlan, engine, outcome: Outcome) -> Result:
    """The fit's Result (its problem attached, for the lazy covariance)."""
    rec, n_evals_replaced, bound_names = records(setup.problem, engine, outcome)
    _warn_if_none_finite(rec["foms"], setup.problem.name)
    result = Result.of(
        **rec,
        stats=stats(search, start_plan, engine, outcome, rec, n_evals_replaced, setup.t_start),
        paths=list(setup.problem.space.paths),
        config=search.config(),
    )
    result.stats["n_distinct_minima"] = len(result.distinct_minima())
    best = result.best_index
    if best >= 0 and np.asarray(result.at_bound)[best]:
        log.logger.warning(
            "the best fit has %s at a bound of its prior: the optimum may lie outside the "
            "prior (widen it), or the start stopped where its logit saturated",
            ", ".join(bound_names[best]),
        )
    warn_if_no_start_improved(result)
    return result.attach_problem(setup.problem)  # for the lazy covariance (computes nothing)
