"""MultiStartGradient and the named rules: configuration, and the step loop that runs them."""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from typing import Any

import jax
import optax

from . import checks, driver
from .checkpoint import require_orbax
from .convergence import Convergence
from .distributed import check_devices
from .result import Result
from .solvers import LBFGS, OptaxSolver, Solver, as_solver
from .starts import check_band, check_max_candidates, check_strategy
from .sweep import BACKENDS
from .tuning import check_batch_size

__all__ = [
    "MultiStartGradient",
    "MultiStartAdam",
    "MultiStartProdigy",
    "MultiStartADABelief",
    "MultiStartLion",
    "MultiStartLBFGS",
]

DEFAULT_CONVERGENCE = Convergence()
CANDIDATES_PER_START = 10
DEFAULT_FILTER_BATCH_SIZE = 64
TIKTAK_LOCAL_PER_START = 4  # TikTak's default n_local: this many local searches per slot


_check_int = checks.integer


def _check_real(value, name: str, *, finite=False, positive=False) -> float | None:
    """``None``, or a real number (finite / positive as asked), as a float."""
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    ok = ok and (value == value) and (not finite or abs(value) != float("inf"))
    ok = ok and (not positive or value > 0)
    if not ok:
        kind = "a positive number" if positive else "a finite number"
        raise ValueError(f"{name} must be None or {kind}; got {value!r}")
    return float(value)


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
      optimizer: the local rule: any ``optax.GradientTransformation``, or a
        :class:`multistart.Solver` (such as :class:`multistart.LBFGS`). Optax rules whose
        ``update`` takes ``value``,
        ``grad`` or ``value_fn`` (``optax.lbfgs``) receive them.
      n_starts: number of local searches.
      batch_size: starts per compiled call. ``"auto"`` (the default): the widest width whose
        chunk step fits half the device's free memory (XLA's memory analysis of the compiled
        step); on a CPU, a few widths within that bound are timed on a few chunk calls each
        and the fastest kept, remembered in the cache folder for the next run
        (``MULTISTART_AUTO_WIDTH=memory``: no timing, at most 4 starts per usable core).
        ``"tune"``: time more widths within that memory bound and keep the fastest, remembered
        the same way. ``None``: all starts in one call. An int: that width. ``MULTISTART_MAX_BATCH``
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
        ``"sobol"`` (scrambled Sobol' sequence) or ``"lhs"`` (Latin hypercube); or
        ``"tiktak"``: Sobol' candidates, and whenever a slot's local search ends it gets the
        next filtered candidate blended towards the best point so far (TikTak; see
        :mod:`multistart.tiktak`).
      n_local: TikTak only: local searches in all, the first wave of ``n_starts`` included
        (default ``4 * n_starts``, at most ``n_candidates``).
      local_steps: TikTak only: a local search ends after this many steps (default: only by
        convergence or as non-finite), so its slot is reused.
      max_discoveries: TikTak only: stop once the best minimum has been found this many times
        (optimagic's rule; default: off).
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
        ``result.incarnations`` keeps every replaced start's record. With ``resurrect=k`` a
        start gives up after ``k`` failures, so ``max_nonfinite`` then only bounds ``k``.
      log_every: a progress line in the log every this many steps (0: none). ``None`` (the
        default): one every 30 s, so a short fit logs only what runs and what came out.
      progress: a progress bar (``tqdm.auto``: a widget in a notebook, a line in a terminal)
        with the step, the best figure of merit, the starts alive and evaluations per second.
        ``None`` (the default): shown when the output is interactive (a terminal or a
        notebook), not in a batch job's log; ``True``/``False`` force it.
      sync_every: the host reads which starts ended every this many steps, to drop them from
        the sweep. Results do not depend on it (ended starts are frozen on the device).
      devices: where the starts run. ``None`` (the default): every local device of JAX's
        default backend (one on a CPU unless ``XLA_FLAGS`` makes more). An int: the first that
        many; or a list of ``jax.Device``. On several devices the population is sharded on a
        one-axis mesh, each device sweeps its own chunks of ``batch_size`` starts with the one
        compiled step (``shard_map``), and the result is the one-device result, per start.
        ``batch_size`` is then per device. See ``docs/scale-out.md``.
      max_history: at most this many rows of best-so-far history are kept (evenly strided).
      checkpoint_dir: write checkpoints of the whole search here (needs the ``checkpoint``
        extra, orbax-checkpoint): every ``checkpoint_every`` steps and on Ctrl-C or SIGTERM.
        ``fit(..., resume=True)`` continues from the newest one, giving the result an
        uninterrupted run would have given.
      checkpoint_every: steps between checkpoints.
      target_fom: stop the search once any start's figure of merit is at or below this (the
        running starts are marked ``stopped``; ``result.stats["stop_reason"]`` says why).
      max_evals: stop once this many evaluations of the objective were made in all (every
        start's, line-search trials and replaced starts included).
      max_time_s: stop once this many seconds have passed since ``fit`` was called (compiles
        included). The three are checked at host syncs (every ``sync_every`` steps).
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

    def __init__(
        self,
        optimizer: optax.GradientTransformation | Solver,
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
        log_every: int | None = None,
        progress: bool | None = None,
        sync_every: int = 1,
        max_history: int = 10_000,
        flat: bool = True,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        backend: str = "loop",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | None = None,
        devices: int | Sequence[jax.Device] | None = None,
    ):
        if convergence is not None and not isinstance(convergence, Convergence):
            raise TypeError(
                f"convergence must be a multistart.Convergence or None; got {convergence!r}"
            )
        self.solver = as_solver(optimizer)
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
        self.log_every = None if log_every is None else _check_int(log_every, "log_every", 0)
        if progress is not None and not isinstance(progress, bool):
            raise ValueError(f"progress must be None (automatic), True or False; got {progress!r}")
        self.progress = progress
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
        self.target_fom = _check_real(target_fom, "target_fom", finite=True)
        self.max_evals = None if max_evals is None else _check_int(max_evals, "max_evals", 1)
        self.max_time_s = _check_real(max_time_s, "max_time_s", positive=True)
        self._check_tiktak(n_local, local_steps, max_discoveries)
        self.devices = check_devices(devices)

    def _check_tiktak(self, n_local, local_steps, max_discoveries) -> None:
        tiktak = self.start_strategy == "tiktak"
        given = {"n_local": n_local, "local_steps": local_steps, "max_discoveries": max_discoveries}
        if not tiktak:
            extra = [k for k, v in given.items() if v is not None]
            if extra:
                raise ValueError(
                    f"{', '.join(extra)} only apply with start_strategy='tiktak'; got "
                    f"start_strategy={self.start_strategy!r}"
                )
            self.n_local = self.local_steps = self.max_discoveries = None
            return
        if self.n_candidates == 0:
            raise ValueError(
                "start_strategy='tiktak' hands out the broad-start filter's candidates: "
                "n_candidates must not be 0"
            )
        if self.resurrect:
            raise ValueError(
                "start_strategy='tiktak' already gives every ended start's slot a new start; "
                "drop resurrect"
            )
        self.n_local = (
            min(TIKTAK_LOCAL_PER_START * self.n_starts, self.n_candidates)
            if n_local is None
            else _check_int(n_local, "n_local", self.n_starts)
        )
        if self.n_local > self.n_candidates:
            raise ValueError(
                f"n_local ({self.n_local}) local searches need as many candidates: raise "
                f"n_candidates (now {self.n_candidates})"
            )
        self.local_steps = (
            None if local_steps is None else _check_int(local_steps, "local_steps", 1)
        )
        self.max_discoveries = (
            None if max_discoveries is None else _check_int(max_discoveries, "max_discoveries", 1)
        )

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
            "rule": self.solver.name,
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
            "target_fom": self.target_fom,
            "max_evals": self.max_evals,
            "max_time_s": self.max_time_s,
            "n_local": self.n_local,
            "local_steps": self.local_steps,
            "max_discoveries": self.max_discoveries,
            "hyperparameters": self.solver.hyperparameters(),
        }

    # -- the run ---------------------------------------------------------------------------

    def fit(self, objective, space=None, *, starts=None, resume: bool = False, part=None) -> Result:
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
          part: ``(i, k)``: run only the ``i``-th (from 0) of ``k`` parts of the start plan,
            for schedulers that run parts apart (a Slurm job array, Ray). The whole plan is
            computed as for one run, then only the part's contiguous block of slots runs (as
            ``np.array_split`` splits ``n_starts``); each start's record is the one the whole
            run gives that slot, ``result.stats["part"]`` and ``["slots"]`` say which, and
            :meth:`multistart.Result.merge` joins the ``k`` parts into the whole run's Result.
            Not with ``resurrect``, ``start_strategy="tiktak"``, ``target_fom`` or
            ``max_evals``, which couple the slots.

        Returns:
          A :class:`multistart.Result` (with ``part``, the part's starts only).

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
        return driver.run(self, objective, space, starts=starts, resume=resume, part=part)


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


class MultiStartAdam(MultiStartGradient):
    """Multi-start Adam (``optax.adam``). Unconstrained coordinates are order one, so a
    learning rate of a few hundredths suits most problems."""

    def __init__(self, *, learning_rate: float = 0.05, b1=0.9, b2=0.999, eps=1e-8, **kwargs):
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.in_unit_interval(b1, "b1")
        checks.in_unit_interval(b2, "b2")
        checks.non_negative(eps, "eps")
        hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2, "eps": eps}
        rule = OptaxSolver(optax.adam(**hyper), name="adam", hyperparameters=hyper)
        super().__init__(rule, **kwargs)


class MultiStartProdigy(MultiStartGradient):
    """Multi-start Prodigy (``optax.contrib.prodigy``): learning-rate free Adam. Each start
    estimates its own step size ``d`` (per-start optimiser state)."""

    def __init__(self, *, learning_rate: float = 1.0, betas=(0.9, 0.999), **kwargs):
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.each(checks.in_unit_interval, betas, "betas", length=2)
        rule = OptaxSolver(
            optax.contrib.prodigy(learning_rate, betas=betas),
            name="prodigy",
            hyperparameters={"learning_rate": learning_rate, "betas": list(betas)},
        )
        super().__init__(rule, **kwargs)


class MultiStartADABelief(MultiStartGradient):
    """Multi-start AdaBelief (``optax.adabelief``)."""

    def __init__(self, *, learning_rate: float = 0.05, b1=0.9, b2=0.999, **kwargs):
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.in_unit_interval(b1, "b1")
        checks.in_unit_interval(b2, "b2")
        hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2}
        rule = OptaxSolver(optax.adabelief(**hyper), name="adabelief", hyperparameters=hyper)
        super().__init__(rule, **kwargs)


class MultiStartLion(MultiStartGradient):
    """Multi-start Lion (``optax.lion``): sign updates, so each step moves every unconstrained
    coordinate by about ``learning_rate``."""

    def __init__(self, *, learning_rate: float = 0.01, b1=0.9, b2=0.99, **kwargs):
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.in_unit_interval(b1, "b1")
        checks.in_unit_interval(b2, "b2")
        hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2}
        rule = OptaxSolver(optax.lion(**hyper), name="lion", hyperparameters=hyper)
        super().__init__(rule, **kwargs)


class MultiStartLBFGS(MultiStartGradient):
    """Multi-start L-BFGS: the rule for smooth, deterministic fits.

    Every start keeps its own memory of ``memory`` pairs and its own backtracking line search,
    carried from one engine step to the next, so the objective is evaluated **once per start
    per step** and no start waits for another (see :class:`multistart.solvers.LBFGS`). A start
    converges as scipy's L-BFGS-B does (``gtol`` on the largest gradient component, in the
    unconstrained coordinates the search steps in, or ``ftol`` on the relative decrease of an
    accepted step), or by the window rule of ``convergence``.

    Args:
      memory: pairs kept per start (scipy's ``maxcor``).
      gtol, ftol: scipy L-BFGS-B's stopping tolerances and defaults.
      **kwargs: the search's options (:class:`MultiStartGradient`).
    """

    def __init__(
        self,
        memory: int = 10,
        *,
        gtol: float = 1e-5,
        ftol: float = 2.220446049250313e-09,
        **kwargs,
    ):
        super().__init__(LBFGS(memory, gtol=gtol, ftol=ftol), **kwargs)
