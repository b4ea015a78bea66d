"""MultiStartGradient and the named rules: configuration, and the step loop that runs them."""

from __future__ import annotations

import hashlib
import logging
import math
import numbers
import os
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import log, memory
from .cache import configure_compilation_cache
from .checkpoint import CheckpointError, SearchCheckpoints, SearchInterrupted, require_orbax
from .convergence import Convergence
from .monitor import CompileCounter
from .problem import Problem, as_problem, check_objective
from .result import Result
from .resurrect import REPLACE_NAME, Resurrector
from .starts import (
    StartPlan,
    check_band,
    check_max_candidates,
    check_strategy,
    check_strategy_space,
    plan_starts,
    user_starts,
)
from .status import Status
from .step import PopState, init_population, make_chunk_step, make_start_step
from .sweep import BACKENDS, FILTER_NAME, Sweep
from .tuning import check_batch_size, resolve_width

__all__ = [
    "MultiStartGradient",
    "MultiStartAdam",
    "MultiStartProdigy",
    "MultiStartADABelief",
    "MultiStartLion",
]

_CHUNK_STEP_NAME = "multistart_chunk_step"
DEFAULT_CONVERGENCE = Convergence()
CANDIDATES_PER_START = 10
DEFAULT_FILTER_BATCH_SIZE = 64


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


def _check_backend(backend) -> str:
    if backend not in BACKENDS:
        options = ", ".join(repr(b) for b in BACKENDS)
        raise ValueError(f"backend must be one of {options}; got {backend!r}")
    return backend


class MultiStartGradient:
    """Many optax local searches of one objective, compiled once and swept in chunks.

    Each start steps in unconstrained coordinates with its own optimiser state. One
    ``jit(vmap(step))`` is compiled for ``batch_size`` starts and a Python loop sweeps the
    chunks each step; starts that converged or died leave the sweep, and the survivors are
    repacked into full chunks (still one compile).

    Args:
      optimizer: any ``optax.GradientTransformation``. Rules whose ``update`` takes ``value``,
        ``grad`` or ``value_fn`` (``optax.lbfgs``) receive them.
      n_starts: number of local searches.
      batch_size: starts per compiled call. ``"auto"`` (the default): the widest width whose
        chunk step fits half the device's free memory (XLA's memory analysis of the compiled
        step), and on a CPU at most 4 starts per usable core, since wide vmaps are slower
        there; compiling the first candidate usually settles it, so it costs no extra compile
        unless memory binds. ``"tune"``: time a few steps at each width within that memory
        bound and keep the fastest; the choice is remembered in the cache folder for the next
        run. ``None``: all starts in one call. An int: that width. ``MULTISTART_MAX_BATCH``
        caps every choice, an int included, and ``MULTISTART_MEMORY_BUDGET_GB`` caps the
        budget. A chunk call that runs out of memory halves the width, recompiles and redoes
        the last few steps from a saved copy of the population (``result.stats["backoffs"]``).
      backend: ``"loop"`` (default): a Python loop calls the compiled chunk step per chunk.
        ``"scan"``: all chunks of a step run in one compiled XLA loop (``lax.map`` over the
        running starts), which saves host dispatch on a GPU; on a CPU prefer ``"loop"``, as a
        scan over a large multi-dataset body can take very long to compile. Same results.
      n_steps: maximum steps per start.
      seed: seeds start generation; the same seed gives a bit-identical result.
      convergence: a :class:`multistart.Convergence` rule, or ``None`` to always run
        ``n_steps``.
      max_nonfinite: a start ends as ``nonfinite`` after this many consecutive non-finite
        evaluations (each one rolls it back to its last finite point with half the step).
      start_band: starts are drawn in this band of each prior's quantiles.
      start_strategy: how starts cover the band: ``"band"`` (independent uniform draws),
        ``"sobol"`` (scrambled Sobol' sequence) or ``"lhs"`` (Latin hypercube).
      n_candidates: the broad-start filter: this many candidates are drawn and only their
        figure of merit is evaluated (batched, one compile); the best finite ones that are not
        within multi-level single linkage's critical distance of a better kept one become the
        starts (:func:`multistart.starts.diverse_candidates`). ``None`` (default) is
        ``10 * n_starts``; ``0`` turns the filter off (the first ``n_starts`` draws are the
        starts).
      max_candidates: while fewer candidates are finite than there are free slots, the filter
        draws further blocks of ``n_candidates`` (same compiled program) until enough are
        finite or this many were drawn in all. ``None`` (default) is
        ``max(100 * n_starts, n_candidates)``; ``n_candidates`` turns the top-up off.
      filter_batch_size: candidates per compiled filter call (default 64, at most
        ``n_candidates``). Fixed rather than tied to ``batch_size``, so the chosen starts, and
        the result, do not depend on ``batch_size``.
      resurrect: ``0`` (default) is off. ``k >= 1``: a start with ``k`` non-finite evaluations
        without improving (``k <= max_nonfinite``) ends and, at the next host sync, its slot
        gets a new start from the filter's unused finite candidates (best first) or, with no
        filter, a fresh draw. ``result.resurrections`` counts them per slot and
        ``result.incarnations`` keeps every replaced start's record.
      log_every: a progress line every this many steps (0: none).
      sync_every: the host reads which starts ended every this many steps, to drop them from
        the sweep. Results do not depend on it (ended starts are frozen on the device).
      max_history: at most this many rows of best-so-far history are kept (evenly strided).
      checkpoint_dir: write checkpoints of the whole search here (needs the ``checkpoint``
        extra, orbax-checkpoint): every ``checkpoint_every`` steps and on Ctrl-C or SIGTERM.
        ``fit(..., resume=True)`` continues from the newest one, giving the result an
        uninterrupted run would have given.
      checkpoint_every: steps between checkpoints.
      flat: step each start's parameters as one flat vector (the default: fewer, larger
        kernels, so faster steps and compiles). optax then sees one vector per start, which
        changes nothing for elementwise rules (Adam, Lion, ...) or whole-vector ones
        (Prodigy, L-BFGS); use ``flat=False`` for a rule keyed to the parameter tree's
        structure (``optax.multi_transform``, ``optax.masked``), which then receives the
        unconstrained params as the space's pytree.

    Example:
      >>> import jax.numpy as jnp, multistart as ms
      >>> space = {"x": ms.Uniform(-5.0, 5.0, shape=(2,))}
      >>> search = ms.MultiStartAdam(n_starts=8, batch_size=4, n_steps=200, seed=0)
      >>> result = search.fit(lambda p: jnp.sum((p["x"] - 1.0) ** 2), space)  # doctest: +SKIP
      >>> result.best_params["x"]  # doctest: +SKIP
      Array([1., 1.], dtype=float32)
    """

    rule = "gradient"

    def __init__(
        self,
        optimizer: optax.GradientTransformation,
        *,
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        n_steps: int = 1000,
        seed: int = 0,
        convergence: Convergence | None = DEFAULT_CONVERGENCE,
        max_nonfinite: int = 8,
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "band",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        log_every: int = 100,
        sync_every: int = 1,
        max_history: int = 10_000,
        flat: bool = True,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        backend: str = "loop",
    ):
        if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
            raise TypeError(
                "optimizer must be an optax.GradientTransformation (with init and update); "
                f"got {type(optimizer).__name__}"
            )
        if convergence is not None and not isinstance(convergence, Convergence):
            raise TypeError(
                f"convergence must be a multistart.Convergence or None; got {convergence!r}"
            )
        self.optimizer = optimizer
        self.n_starts = _check_int(n_starts, "n_starts", 1)
        self.batch_size = check_batch_size(batch_size)
        self.n_steps = _check_int(n_steps, "n_steps", 1)
        self.seed = _check_int(seed, "seed", 0)
        self.convergence = convergence
        self.max_nonfinite = _check_int(max_nonfinite, "max_nonfinite", 1)
        self.start_band = check_band(start_band)
        self.start_strategy = check_strategy(start_strategy)
        self.n_candidates = _check_candidates(n_candidates, self.n_starts)
        self.max_candidates = check_max_candidates(max_candidates, self.n_candidates, self.n_starts)
        if filter_batch_size is not None and self.n_candidates == 0:
            raise ValueError(
                "filter_batch_size has no effect with n_candidates=0 (no filter); drop one"
            )
        self.filter_batch_size = _check_int(
            DEFAULT_FILTER_BATCH_SIZE if filter_batch_size is None else filter_batch_size,
            "filter_batch_size",
            1,
        )
        self.resurrect = _check_int(resurrect, "resurrect", 0)
        if self.resurrect > self.max_nonfinite:
            raise ValueError(
                f"resurrect must be <= max_nonfinite ({self.max_nonfinite}): a start ends, and "
                f"is replaced, after that many non-finite evaluations; got {resurrect}"
            )
        self.log_every = _check_int(log_every, "log_every", 0)
        self.sync_every = _check_int(sync_every, "sync_every", 1)
        self.max_history = _check_int(max_history, "max_history", 1)
        if not isinstance(flat, bool):
            raise ValueError(f"flat must be True or False; got {flat!r}")
        self.flat = flat
        if checkpoint_dir is not None:
            if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
                raise ValueError(f"checkpoint_dir must be a path or None; got {checkpoint_dir!r}")
            require_orbax()
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = _check_int(checkpoint_every, "checkpoint_every", 1)
        self.backend = _check_backend(backend)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_starts={self.n_starts}, batch_size={self.batch_size!r}, "
            f"n_steps={self.n_steps}, seed={self.seed})"
        )

    def config(self) -> dict[str, Any]:
        """The configuration as plain values (recorded in the Result)."""
        conv = self.convergence
        return {
            "search": type(self).__name__,
            "rule": self.rule,
            "n_starts": self.n_starts,
            "batch_size": self.batch_size,
            "n_steps": self.n_steps,
            "seed": self.seed,
            "convergence": None if conv is None else vars(conv).copy(),
            "max_nonfinite": self.max_nonfinite,
            "start_band": list(self.start_band),
            "start_strategy": self.start_strategy,
            "n_candidates": self.n_candidates,
            "max_candidates": self.max_candidates,
            "filter_batch_size": self.filter_batch_size if self.n_candidates else None,
            "resurrect": self.resurrect,
            "sync_every": self.sync_every,
            "flat": self.flat,
            "backend": self.backend,
            "hyperparameters": dict(getattr(self, "hyperparameters", {})),
        }

    # -- the run ---------------------------------------------------------------------------

    def fit(self, objective, space=None, *, starts=None, resume: bool = False) -> Result:
        """Minimise ``objective(params) -> scalar`` over ``space``, or fit a model.

        Args:
          objective: a callable of the physical params pytree returning a real scalar, or a
            :class:`multistart.FactorGraphModel` (then ``space`` is omitted).
          space: a (nested) dict of priors.
          starts: your own starts, used as given in the first slots: a params pytree whose
            leaves have a leading axis of ``k <= n_starts`` starts, or a list of ``k`` params
            dicts. The other ``n_starts - k`` slots are drawn (and filtered) as usual.
          resume: continue from the newest checkpoint in ``checkpoint_dir`` (a fresh start
            when the folder holds none). A checkpoint of another model or configuration is
            refused; a damaged one falls back to the one before it.

        Returns:
          A :class:`multistart.Result`.

        Raises:
          TypeError / ValueError: bad arguments (a user start outside its prior's bounds is
            named by index and parameter), or an objective that does not return a real
            scalar; raised after one trace and before any compile.
          multistart.NoFiniteStartsError: the filter found no candidate with a finite figure
            of merit (and no user start was given); the message names the region tried.
          multistart.SearchInterrupted: Ctrl-C or SIGTERM stopped the search; it carries the
            partial result (``.result``) and, with ``checkpoint_dir``, a checkpoint was written.
          multistart.CheckpointError: a checkpoint could not be written (``.result`` holds the
            search so far; the previous checkpoint is intact) or none could be read.
        """
        if resume and self.checkpoint_dir is None:
            raise ValueError("resume=True needs checkpoint_dir to be set on the search")
        t_start = time.perf_counter()
        log.configure()
        memory.check_env()
        problem = as_problem(objective, space)
        check_strategy_space(self.start_strategy, problem.space)
        user = None if starts is None else user_starts(problem.space, starts, self.n_starts)
        dtype = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless x64 is on
        check_objective(problem, dtype, repr(self))
        configure_compilation_cache()
        with CompileCounter() as compiles:
            plan = plan_starts(
                problem,
                dtype,
                n_starts=self.n_starts,
                strategy=self.start_strategy,
                band=self.start_band,
                n_candidates=self.n_candidates,
                max_candidates=self.max_candidates,
                filter_width=self.filter_batch_size,
                seed=self.seed,
                user=user,
            )
        plan.stats.update(
            n_filter_compiles=compiles.count(FILTER_NAME),
            n_cache_hits=sum(compiles.cache_hits.values()),
            n_compiles_total=compiles.total,
        )
        return self._run(problem, plan.x0, dtype, plan=plan, t_start=t_start, resume=resume)

    def _run(
        self,
        problem: Problem,
        x0,
        dtype,
        *,
        plan: StartPlan | None = None,
        t_start=None,
        resume: bool = False,
    ) -> Result:
        t_start = time.perf_counter() if t_start is None else t_start
        configure_compilation_cache()
        space, n = problem.space, self.n_starts
        stride = math.ceil(self.n_steps / self.max_history)
        window = 1 if self.convergence is None else self.convergence.window
        u_tree = space.to_unconstrained(x0, dtype=dtype)
        if self.flat:
            u0 = jnp.asarray(space.ravel(u_tree), dtype)

            def to_physical(u):
                return space.unravel(space.forward_flat(u))

        else:
            u0 = jax.tree_util.tree_map(jnp.asarray, u_tree)
            to_physical = space.to_physical
        data = jax.device_put(problem.data)
        log.logger.info(
            "fitting %s: %d starts x %d parameters, %s, batch_size %r, %s backend",
            problem.name,
            n,
            space.n_dims,
            type(self).__name__,
            self.batch_size,
            self.backend,
        )

        def fom_u(u, d):
            return problem.fom(to_physical(u), d)

        # With resurrection a start gives up (and is replaced) after `resurrect` failures.
        give_up = self.resurrect or self.max_nonfinite
        start_step = make_start_step(fom_u, self.optimizer, self.convergence, give_up)
        chunk_step = make_chunk_step(start_step)
        chunk_step.__name__ = chunk_step.__qualname__ = _CHUNK_STEP_NAME
        n_rows = math.ceil(self.n_steps / stride)
        started = np.ones(n, bool) if plan is None else plan.started
        status0 = np.where(started, Status.RUNNING.code, Status.UNSTARTED.code).astype(np.int8)

        # Before any compile: an unwritable folder, or a checkpoint of another model or
        # configuration, is an error now rather than after minutes of compiling.
        checkpoints = self._checkpoints(problem, dtype, x0)
        if checkpoints is not None and resume:
            checkpoints.check()
        with CompileCounter() as compiles:
            pop = jax.jit(
                lambda u, st: init_population(self.optimizer, u, n_rows, window, status=st)
            )(u0, status0)
            sweep = BACKENDS[self.backend](chunk_step, n_total=n, data=data)
            if not started.all():
                sweep.set_rows(np.flatnonzero(started))
            device = next(iter(pop.history.devices()))
            choice = resolve_width(
                self.batch_size,
                sweep,
                pop,
                n_starts=n,
                device=device,
                start_step=start_step,
                backend=self.backend,
            )
            width, compile_s = choice.width, sweep.compile_s
            log.logger.info(
                "compiled the chunk step (width %d, %d chunks) in %.2f s",
                width,
                math.ceil(n / width),
                compile_s,
            )
            resurrector = None
            if self.resurrect and plan is not None and plan.reserve is not None:
                resurrector = Resurrector(
                    plan.reserve,
                    optimizer=self.optimizer,
                    window=window,
                    width=width,
                    n_total=n,
                    to_u=self._to_unconstrained(space, dtype),
                    u0=u0,
                )
            start = 0
            if checkpoints is not None and resume:
                restored = checkpoints.restore(pop, resurrector)
                if restored is None:
                    log.logger.info("no checkpoint in %s yet: starting afresh", self.checkpoint_dir)
                else:
                    pop, start, _ = restored
                    sweep.rebase(pop)
                    status = np.asarray(pop.starts.status)
                    sweep.set_rows(np.flatnonzero(status == Status.RUNNING.code))
            with _signals_to_flag() as stop:
                pop, loop_stats = self._loop(
                    sweep, pop, stride, t_start, resurrector, checkpoints, stop, start
                )
            stopped = loop_stats.pop("stopped", None)
            result = self._finish(
                problem, pop, u0, to_physical, loop_stats, stride, resurrector, stopped is not None
            )
        wall_s = time.perf_counter() - t_start
        pre = {} if plan is None else plan.stats
        result.stats.update(pre)
        result.stats.update(
            # the chunk step's compiles for the search itself (a back-off adds one each);
            # widths compiled only to be measured are counted apart
            n_compiles=compiles.count(_CHUNK_STEP_NAME) - choice.n_tune_compiles,
            n_tune_compiles=choice.n_tune_compiles,
            n_compiles_total=compiles.total + pre.get("n_compiles_total", 0),
            n_cache_hits=sum(compiles.cache_hits.values()) + pre.get("n_cache_hits", 0),
            compile_s=sweep.compile_s,
            select_s=choice.select_s,
            wall_s=wall_s,
            batch_size=sweep.width,
            backend=self.backend,
            width=choice.info,
            backoffs=list(sweep.backoffs),
            history_stride=stride,
        )
        if resurrector is not None:
            result.stats.update(
                n_resurrections=resurrector.n_resurrections,
                n_replace_compiles=compiles.count(REPLACE_NAME),
            )
        if checkpoints is not None:
            result.stats["checkpoints"] = list(checkpoints.saved)
        if choice.tuning is not None:
            result.stats["tuning"] = choice.tuning
        self._log_end(result)
        if stopped is not None:
            reason, error = stopped
            if isinstance(error, CheckpointError):
                error.result = result
                raise error
            where = f"; checkpoint of step {checkpoints.saved[-1]}" if checkpoints else ""
            raise SearchInterrupted(
                f"search stopped by {reason} at step {loop_stats['n_steps_run']}{where}; "
                "the partial result is in .result",
                result=result,
                checkpoint=checkpoints.saved[-1] if checkpoints and checkpoints.saved else None,
                reason=reason,
            )
        return result

    def _checkpoints(self, problem, dtype, x0) -> SearchCheckpoints | None:
        if self.checkpoint_dir is None:
            return None
        from .checkpoint import fingerprint

        config = self.config()
        config["starts"] = hashlib.sha256(
            b"".join(np.ascontiguousarray(a).tobytes() for a in jax.tree_util.tree_leaves(x0))
        ).hexdigest()
        return SearchCheckpoints(
            self.checkpoint_dir, self.checkpoint_every, fingerprint(problem, dtype, config)
        )

    def _to_unconstrained(self, space, dtype):
        """Physical starts (leading axis) to unconstrained NumPy in the population's layout."""
        if self.flat:
            return lambda x: space.ravel(space.to_unconstrained(x, dtype=np.dtype(dtype)))
        return lambda x: space.to_unconstrained(x, dtype=np.dtype(dtype))

    def _loop(
        self,
        sweep: Sweep,
        pop: PopState,
        stride: int,
        t_start: float,
        resurrector: Resurrector | None = None,
        checkpoints: SearchCheckpoints | None = None,
        stop: dict | None = None,
        start: int = 0,
    ):
        """Step every running start until all ended or ``n_steps``; sync every few steps.

        Starts at step ``start`` (a resumed search). A signal recorded in ``stop`` ends the
        loop at the next step boundary, after a checkpoint when there are checkpoints.
        """
        n = sweep.n_total
        n_calls, t_first, t_log, evals_since_log = 0, None, time.perf_counter(), 0
        steps_run, stopped = start, None
        for t in range(start, self.n_steps):
            pop = sweep.step(pop, t // stride)
            n_calls += len(sweep.chunks)
            evals_since_log += sweep.rows.size
            steps_run = t + 1
            last = steps_run == self.n_steps
            logging_now = self.log_every and (steps_run % self.log_every == 0 or last)
            checkpoint_now = checkpoints is not None and (checkpoints.due(steps_run) or last)
            stopping = stop is not None and stop.get("reason") is not None
            if not (
                t == start
                or last
                or logging_now
                or checkpoint_now
                or stopping
                or steps_run % self.sync_every == 0
            ):
                continue
            pop, status = sweep.sync(pop)  # where a deferred out-of-memory error shows
            if t == start:
                t_first = time.perf_counter() - t_start
            # Replacements happen on the sync_every schedule only (not at the extra syncs for
            # logs, checkpoints or a resumed first step), so results depend on sync_every alone.
            if (
                resurrector is not None
                and steps_run % self.sync_every == 0
                and not last
                and not stopping
            ):
                before = resurrector.n_resurrections
                pop, status = resurrector(pop, status, steps_run)
                if resurrector.n_resurrections != before:
                    sweep.rebase(pop)  # a back-off must not replay over the replaced rows
            running = np.flatnonzero(status == Status.RUNNING.code)
            if logging_now and log.logger.isEnabledFor(logging.INFO):
                now = time.perf_counter()
                best = np.asarray(pop.starts.best_fom).min()
                conv = int(np.sum(status == Status.CONVERGED.code))
                rate = evals_since_log / max(now - t_log, 1e-12)
                log.logger.info(
                    log.progress_line(steps_run, self.n_steps, best, running.size, conv, n, rate)
                )
                t_log, evals_since_log = now, 0
            done = running.size == 0
            if checkpoints is not None and (checkpoint_now or stopping or done):
                try:
                    checkpoints.save(steps_run, pop, resurrector, {"n_chunk_calls": n_calls})
                except CheckpointError as e:
                    stopped = ("a failed checkpoint", e)
                    break
            if stopping:
                stopped = (stop["reason"], None)
                break
            if done:
                break
            if running.size != sweep.rows.size:
                sweep.set_rows(running)
        jax.block_until_ready(pop)
        stats = {
            "n_steps_run": steps_run,
            "n_chunk_calls": n_calls,
            "first_step_s": t_first,
            "loop_s": time.perf_counter() - t_start,
            "stopped": stopped,
        }
        if start:
            stats["resumed_from"] = start
        return pop, stats

    def _finish(
        self,
        problem,
        pop: PopState,
        u0,
        to_physical,
        loop_stats,
        stride,
        resurrector=None,
        interrupted: bool = False,
    ) -> Result:
        space = problem.space
        to_physical = jax.jit(jax.vmap(to_physical))
        writable = lambda tree: jax.tree_util.tree_map(np.array, jax.device_get(tree))  # noqa: E731
        s = jax.device_get(pop.starts)
        codes = np.asarray(s.status).astype(np.int64)
        still = Status.INTERRUPTED if interrupted else Status.MAX_STEPS
        codes[codes == Status.RUNNING.code] = still.code
        # The history ends when the last start did; the host may have noticed a little later.
        # (With resurrection a slot's incarnations take turns: its last one began later.)
        n_steps_run = int(np.max(s.n_steps))
        if resurrector is not None:
            n_steps_run = int(np.max(resurrector.started_at + np.asarray(s.n_steps)))
        rows = math.ceil(n_steps_run / stride)
        rec = {
            "foms": np.asarray(s.best_fom, dtype=np.float64).copy(),
            "params": writable(to_physical(pop.starts.best_u)),
            "start_params": writable(to_physical(u0)),
            "status": np.array([Status.from_code(c) for c in codes], dtype=object),
            "n_steps": np.asarray(s.n_steps, dtype=np.int64).copy(),
            "best_step": np.asarray(s.best_step, dtype=np.int64).copy(),
            "history": _forward_fill(np.asarray(pop.history)[:rows].astype(np.float64)),
        }
        history_steps = np.minimum((np.arange(rows) + 1) * stride, n_steps_run)
        merged = {} if resurrector is None else resurrector.merge(rec, to_physical)
        foms, best_params, status = rec["foms"], rec["params"], rec["status"]
        finite = np.isfinite(foms)
        if finite.any():
            best_index = int(np.argmin(np.where(finite, foms, np.inf)))
            best = jax.tree_util.tree_map(lambda a: np.asarray(a)[best_index], best_params)
            best_fom = float(foms[best_index])
        else:
            best_index, best_fom = -1, float("inf")
            best = jax.tree_util.tree_map(
                lambda a: np.full(np.shape(a)[1:], np.nan, np.asarray(a).dtype), best_params
            )
            warnings.warn(
                f"every one of the {self.n_starts} starts was non-finite (nan or inf) for "
                f"{problem.name!r}: no fit was found; check the objective and the space",
                RuntimeWarning,
                stacklevel=4,
            )
        stats = dict(loop_stats)
        stats["n_evals"] = int(np.sum(s.n_steps)) + merged.get("n_evals_replaced", 0)
        return Result(
            best_params=best,
            best_fom=best_fom,
            best_index=best_index,
            foms=foms,
            params=best_params,
            start_params=rec["start_params"],
            status=status,
            n_steps=rec["n_steps"],
            best_step=rec["best_step"],
            history=rec["history"],
            history_steps=history_steps,
            stats=stats,
            paths=list(space.paths),
            config=self.config(),
            resurrections=merged.get("resurrections"),
            incarnations=merged.get("incarnations", []),
        )

    def _log_end(self, result: Result) -> None:
        st = result.stats
        counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
        log.logger.info(
            "done in %.2f s (compile %.2f s, %d chunk-step compile%s): best %.6g; %s",
            st["wall_s"],
            st["compile_s"],
            st["n_compiles"],
            "" if st["n_compiles"] == 1 else "s",
            result.best_fom,
            counts,
        )


@contextmanager
def _signals_to_flag():
    """While the loop runs, the first Ctrl-C or SIGTERM only asks it to stop.

    The loop then finishes its step, writes a checkpoint and raises SearchInterrupted with the
    partial result; a second Ctrl-C interrupts at once. Signal handlers can only be set from
    the main thread; elsewhere the default behaviour stays.
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

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _check_candidates(n_candidates, n_starts: int) -> int:
    if n_candidates is None:
        return CANDIDATES_PER_START * n_starts
    if (
        isinstance(n_candidates, bool)
        or not isinstance(n_candidates, numbers.Integral)
        or (n_candidates != 0 and n_candidates < n_starts)
    ):
        raise ValueError(
            f"n_candidates must be None ({CANDIDATES_PER_START} x n_starts), 0 (no filter) or "
            f"an int >= n_starts ({n_starts}); got {n_candidates!r}"
        )
    return int(n_candidates)


def _forward_fill(history: np.ndarray) -> np.ndarray:
    """Carry each start's last recorded best forward over rows where it no longer stepped."""
    out = history.copy()
    for i in range(1, out.shape[0]):
        gap = np.isnan(out[i])
        out[i, gap] = out[i - 1, gap]
    return out


class MultiStartAdam(MultiStartGradient):
    """Multi-start Adam (``optax.adam``). Unconstrained coordinates are order one, so a
    learning rate of a few hundredths suits most problems."""

    rule = "adam"

    def __init__(self, *, learning_rate: float = 0.05, b1=0.9, b2=0.999, eps=1e-8, **kwargs):
        super().__init__(optax.adam(learning_rate, b1=b1, b2=b2, eps=eps), **kwargs)
        self.hyperparameters = {"learning_rate": learning_rate, "b1": b1, "b2": b2, "eps": eps}


class MultiStartProdigy(MultiStartGradient):
    """Multi-start Prodigy (``optax.contrib.prodigy``): learning-rate free Adam. Each start
    estimates its own step size ``d`` (per-start optimiser state)."""

    rule = "prodigy"

    def __init__(self, *, learning_rate: float = 1.0, betas=(0.9, 0.999), **kwargs):
        super().__init__(optax.contrib.prodigy(learning_rate, betas=betas), **kwargs)
        self.hyperparameters = {"learning_rate": learning_rate, "betas": list(betas)}


class MultiStartADABelief(MultiStartGradient):
    """Multi-start AdaBelief (``optax.adabelief``)."""

    rule = "adabelief"

    def __init__(self, *, learning_rate: float = 0.05, b1=0.9, b2=0.999, **kwargs):
        super().__init__(optax.adabelief(learning_rate, b1=b1, b2=b2), **kwargs)
        self.hyperparameters = {"learning_rate": learning_rate, "b1": b1, "b2": b2}


class MultiStartLion(MultiStartGradient):
    """Multi-start Lion (``optax.lion``): sign updates, so each step moves every unconstrained
    coordinate by about ``learning_rate``."""

    rule = "lion"

    def __init__(self, *, learning_rate: float = 0.01, b1=0.9, b2=0.99, **kwargs):
        super().__init__(optax.lion(learning_rate, b1=b1, b2=b2), **kwargs)
        self.hyperparameters = {"learning_rate": learning_rate, "b1": b1, "b2": b2}
