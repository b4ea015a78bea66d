"""The gradient searches a user makes: :class:`MultiStartGradient` (any optax rule or
:class:`multistart.Solver`) and the named rules, each a rule's factory
(:mod:`multistart.search.rules`) and the options (:class:`multistart.SearchConfig`), which
:mod:`multistart.search.core` makes into the class's signature. ``gradient.pyi`` states the
signatures for static tools (written by ``tests/api_snapshot.py``, checked by the suite)."""

from __future__ import annotations

from . import rules
from .core import Search

__all__ = [
    "MultiStartGradient",
    "MultiStartAdam",
    "MultiStartProdigy",
    "MultiStartADABelief",
    "MultiStartLion",
    "MultiStartLBFGS",
]


class MultiStartGradient(Search, rule=rules.given):
    """Many optax local searches of one objective, compiled once and swept in chunks.

    Each start steps in unconstrained coordinates with its own optimiser state. One
    ``jit(vmap(step))`` is compiled for ``batch_size`` starts and a Python loop sweeps the
    chunks each step; starts that converged or died leave the sweep, and the survivors are
    repacked into full chunks (still one compile).

    Every option is keyword-only and checked here, before anything is traced; they are
    :attr:`options` (``search.n_starts`` reads them too); :meth:`replace` changes some.

    Args:
      optimizer: the local rule: any ``optax.GradientTransformation``, or a
        :class:`multistart.Solver` (such as :class:`multistart.LBFGS`). Optax rules whose
        ``update`` takes ``value``, ``grad`` or ``value_fn`` (``optax.lbfgs``) receive them.
      n_starts: number of local searches.
      batch_size: starts per compiled call. ``"auto"`` (the default): the widest width whose
        chunk step fits half the device's free memory; on a CPU, a few widths within that bound
        are timed where it pays and the fastest kept, remembered for the next run. ``"tune"``:
        time more widths. ``None``: all starts in one call. An int: that width.
        ``MULTISTART_MAX_BATCH`` caps every choice. A chunk call that runs out of memory halves
        the width and redoes the last few steps. See ``docs/batch-width.md``.
      backend: ``"loop"`` (default): a Python loop calls the compiled chunk step per chunk.
        ``"scan"``: all chunks of a step run in one compiled program, which saves host dispatch
        on a GPU (on a CPU prefer ``"loop"``: it compiles faster). Same results.
      n_steps: maximum steps per start. ``"auto"`` (default): 1000; for L-BFGS, sized by the
        number of free parameters ``n`` when the fit starts, ``max(1000, min(15000, 2 n))``
        (1000 up to 500 parameters, scipy's ``maxfun`` of 15000 from 7500).
      seed: seeds start generation; the same seed gives a bit-identical result.
      convergence: the window guard: a :class:`multistart.Convergence`, or ``None`` for none (a
        start then ends by its rule's own tests, or at ``n_steps``). ``"auto"`` (default): none
        for rules with optimality tests of their own (L-BFGS, least squares, optimistix),
        ``Convergence()`` for the others (the optax rules), whose starts then end ``stalled``.
      max_nonfinite: a start ends as ``nonfinite`` after this many consecutive non-finite
        evaluations (each one rolls it back to its last finite point with half the step).
      schedule: which local searches run to their end. ``"all"`` (the default): every start runs
        until it converges, dies or reaches ``n_steps``. ``"halving"`` (or a
        :class:`multistart.Halving`): asynchronous successive halving; at each rung a start
        ranked below the best and not improving fast enough ends as ``pruned``. See
        ``docs/schedule.md``.
      start_band: starts are drawn in this band of each prior's quantiles.
      start_strategy: how starts cover the band: ``"band"`` (independent uniform draws),
        ``"sobol"`` (scrambled Sobol' sequence) or ``"lhs"`` (Latin hypercube); or ``"tiktak"``:
        Sobol' candidates, and whenever a slot's local search ends it gets the next filtered
        candidate blended towards the best point so far (TikTak; see
        :mod:`multistart.starts.tiktak`); or ``"band_tiktak"``: the band draws (the first wave
        is the band starts) handed out as TikTak's while the ended local searches took at most
        300 evaluations on average (short ones are cheap to repeat; after a longer average no
        new local search starts), every third of them at the next of the filter's ranking of 5 x
        ``n_starts`` further candidates drawn over 1-99 % of each prior's quantiles and 2.5 x
        ``n_starts`` more with about half their bounded coordinates on a bound (for optima near
        or on a bound). ``"auto"`` (default): ``"tiktak"`` for the least-squares rules,
        ``"band_tiktak"`` for L-BFGS, ``"band"`` for the others and wherever TikTak cannot run
        (``n_candidates=0``, ``resurrect``).
      n_candidates: the broad-start filter: this many candidates are drawn and only their figure
        of merit is evaluated (batched, one compile); the best finite ones that are not within
        multi-level single linkage's critical distance of a better kept one become the starts
        (:func:`multistart.starts.strategies.diverse_candidates`). ``None`` (default) is ``10 *
        n_starts`` (``"band_tiktak"``: ``15 * n_starts``); ``0`` turns the filter off (the first
        ``n_starts`` draws are the starts).
      max_candidates: while fewer candidates are finite than there are free slots, the filter
        draws further blocks of ``n_candidates`` (same compiled program) until enough are finite
        or this many were drawn in all. ``None`` (default) is ``max(100 * n_starts,
        n_candidates)``; ``n_candidates`` turns the top-up off.
      filter_batch_size: candidates per compiled filter call (default 64, at most
        ``n_candidates``). Fixed rather than tied to ``batch_size``, so the chosen starts, and
        the result, do not depend on ``batch_size``.
      resurrect: ``0`` (default) is off. ``k >= 1``: a start with ``k`` non-finite evaluations
        without improving (``k <= max_nonfinite``) ends and, at the next host sync, its slot
        gets a new start from the filter's unused finite candidates (best first) or, with no
        filter, a fresh draw. ``result.resurrections`` counts them per slot and
        ``result.incarnations`` keeps every replaced start's record.
      n_local: TikTak only: local searches in all, the first wave of ``n_starts`` included
        (default ``4 * n_starts``; ``"band_tiktak"``: ``12 * n_starts``, TikTak's weights run 3
        times over ``4 * n_starts`` each; at most ``n_candidates``).
      local_steps: TikTak only: a local search ends after this many steps (default: only by
        convergence or as non-finite), so its slot is reused.
      max_discoveries: TikTak only: once the best minimum has been found this many times, start
        no new local search; those running run to their ends (optimagic's rule). ``"auto"``
        (default): 4 under TikTak, so a search whose local searches keep re-finding one minimum
        ends early and one whose minima are many runs all ``n_local``; ``None``: off.
      target_fom: stop the search once any start's figure of merit is at or below this (the
        running starts are marked ``stopped``; ``result.stats["stop_reason"]`` says why).
      max_evals: stop once this many evaluations of the objective were made in all (every
        start's, line-search trials and replaced starts included).
      max_time_s: stop once this many seconds have passed since ``fit`` was called (compiles
        included). The three budgets are checked at host syncs (every ``sync_every`` steps).
      rediscoveries: end the starts still running once this many settled starts (converged or
        stalled, the best's own included) found the best minimum so far, within the tolerances
        of ``Result.distinct_minima()``: a running start not already below it ends as
        ``refound`` (its best is kept). Checked every 16 steps. In a stack of fits
        (``curve_fit(batched=True)``, where it is 3 by default) each fit's starts on their own.
        ``None`` (the default): every start runs to its end. Not with refills (TikTak,
        ``resurrect``) or ``schedule='halving'``.
      sync_every: the host reads which starts ended every this many steps (at the end of a call
        that reaches such a step: ``steps_per_call``), to drop them from the sweep. Results do
        not depend on it (ended starts are frozen on the device), except where the host decides
        something at a sync: resurrection and TikTak replace ended starts, and the halving
        schedule prunes, on this schedule.
      steps_per_call: steps a compiled call takes before the host reads the starts again.
        ``"auto"`` (the default): from 1, doubled while a call takes under 20 ms (at most 256; a
        refit of the same model starts where the fit before it reached), so the host's dispatch
        and read stay a few per cent of a cheap objective's time and cost an expensive one
        nothing; an int ``k >= 1``: ``k``. A call stops early once every start in it has ended,
        and ends wherever the host decides something (each ``sync_every`` step with refills, or
        with ``sync_every=1`` and the running starts in one chunk the first step where one ends;
        the halving schedule or a budget; ``checkpoint_every``; ``log_every``), so results do
        not depend on it.
      flat: step each start's parameters as one flat vector (the default: faster steps and
        compiles); ``flat=False`` for a rule keyed to the parameter tree's structure
        (``optax.multi_transform``, ``optax.masked``).
      absolute_sigma: how the covariance (``result.errors``) is scaled. ``True``: as it is (a χ²
        with the data's own errors). ``False``: by the reduced χ² ``f / (n_data - n)``, as
        ``scipy.optimize.curve_fit``'s default. ``None`` (default): ``False`` for the least-
        squares rules, ``True`` for the others.
      n_data: the number of data points behind a scalar figure of merit: its reduced χ² is ``f /
        (n_data - n)`` (needed by ``absolute_sigma=False``, shown by ``result.report()``). A
        least-squares fit counts its residuals itself.
      max_history: at most this many rows of best-so-far history are kept (evenly strided).
      log_every: a progress line in the log every this many steps (0: none). ``None`` (the
        default): one every 30 s, so a short fit logs only what runs and what came out.
      progress: a progress bar (``tqdm.auto``). ``None`` (the default): shown when the output is
        interactive (a terminal or a notebook); ``True``/``False`` force it.
      checkpoint_dir: write checkpoints of the whole search here (needs the ``checkpoint``
        extra, orbax-checkpoint): every ``checkpoint_every`` steps and on Ctrl-C or SIGTERM.
        ``fit(..., resume=True)`` continues from the newest one, giving the result an
        uninterrupted run would have given.
      checkpoint_every: steps between checkpoints.
      devices: where the starts run. ``None`` (the default): every local device of JAX's default
        backend (one on a CPU unless ``XLA_FLAGS`` makes more). An int: the first that many; or
        a list of ``jax.Device``. On several, each device sweeps its own chunks of
        ``batch_size`` starts, and the result is the one-device result. See ``docs/scale-
        out.md``.
      dtype: the floating-point type the starts step in: ``"float32"`` or ``"float64"``;
        ``None`` (the default) JAX's default, float32 unless ``jax_enable_x64`` is on. The
        search runs in it whatever the process's default. A chip without float64 arithmetic (a
        TPU) emulates float64 at several times float32's cost: see ``docs/accelerators.md``.

    Example:
      >>> import jax.numpy as jnp, multistart as ms
      >>> space = {"x": ms.Uniform(-5.0, 5.0, shape=(2,))}
      >>> search = ms.MultiStartAdam(n_starts=8, batch_size=4, n_steps=200, seed=0)
      >>> result = search.fit(lambda p: jnp.sum((p["x"] - 1.0) ** 2), space)  # doctest: +SKIP
      >>> result.best_params["x"]  # doctest: +SKIP
      Array([1., 1.], dtype=float32)
    """


class MultiStartAdam(MultiStartGradient, rule=rules.adam):
    """Multi-start Adam (``optax.adam``). Unconstrained coordinates are order one, so a
    learning rate of a few hundredths suits most problems."""


class MultiStartProdigy(MultiStartGradient, rule=rules.prodigy):
    """Multi-start Prodigy (``optax.contrib.prodigy``): learning-rate free Adam. Each start
    estimates its own step size ``d`` (per-start optimiser state)."""


class MultiStartADABelief(MultiStartGradient, rule=rules.adabelief):
    """Multi-start AdaBelief (``optax.adabelief``)."""


class MultiStartLion(MultiStartGradient, rule=rules.lion):
    """Multi-start Lion (``optax.lion``): sign updates, so each step moves every unconstrained
    coordinate by about ``learning_rate``."""


class MultiStartLBFGS(MultiStartGradient, rule=rules.lbfgs):
    """Multi-start L-BFGS: the rule for smooth, deterministic fits.

    Every start keeps its own memory and line search, evaluating the objective **once per
    start per step** (:class:`multistart.solvers.LBFGS`). A start ends ``converged`` by
    relative tests (``rtol``, ``xtol``), so the fit of ``c * f`` ends where that of ``f`` does.
    It takes every option of :class:`MultiStartGradient` too, keyword-only.

    Args:
      memory: pairs kept per start (scipy's ``maxcor``).
      rtol: the predicted decrease, relative to ``|f|`` (default ``100 * eps`` of the float
        type).
      xtol: the first trial step of a line search, accepted, relative to the point's norm
        (default ``sqrt(eps)``).
      ftol: end a start ``stalled`` when an accepted step lowered ``f`` by at most this,
        relative (scipy's ``ftol``; default ``0``, off).
      diagonal: the initial inverse Hessian a scale a coordinate (each coordinate's secant
        over the memory) instead of one scalar: for a Hessian nearly diagonal whose diagonal
        spans orders of magnitude, such as a cohort's factor graph. ``"auto"`` (default): on
        for a factor graph whose factors own parameters, past 500 parameters in all; else
        off.
    """
