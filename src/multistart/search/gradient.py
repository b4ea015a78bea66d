"""MultiStartGradient and the named rules: a rule and a checked configuration, which
:meth:`MultiStartGradient.fit` hands to :mod:`multistart.host.driver`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import optax

from ..common import checks
from ..host import driver
from ..host.config import (
    DEFAULT_STEPS,
    ORDER,
    SearchConfig,
    options_doc,
    resolve_absolute_sigma,
    unknown_options,
)
from ..host.schedule import Schedule
from ..result import Result
from ..solvers import LBFGS, LeastSquaresRule, OptaxSolver, Solver, as_solver
from ..solvers.convergence import Convergence

__all__ = [
    "MultiStartGradient",
    "MultiStartAdam",
    "MultiStartProdigy",
    "MultiStartADABelief",
    "MultiStartLion",
    "MultiStartLBFGS",
]

_OPTION_NAMES = frozenset(ORDER)


class MultiStartGradient:
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
    {options}

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
        /,
        *,
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        backend: str = "loop",
        n_steps: int | str = "auto",
        seed: int = 0,
        convergence: Convergence | None | str = "auto",
        max_nonfinite: int = 8,
        schedule: str | Schedule = "all",
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "auto",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | str | None = "auto",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        rediscoveries: int | None = None,
        sync_every: int = 1,
        steps_per_call: int | str = "auto",
        flat: bool = True,
        absolute_sigma: bool | None = None,
        n_data: int | None = None,
        max_history: int = 10_000,
        log_every: int | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        devices: int | Sequence[Any] | None = None,
        dtype: str | None = None,
    ):
        given = _arguments(locals())
        self._hold(as_solver(optimizer), given, optimizer)

    #: The rule every start steps with.
    solver: Solver
    #: The checked options (frozen).
    options: SearchConfig
    _made_with: tuple[tuple, dict[str, Any]]  # what replace() calls the class with

    def _hold(self, solver: Solver, given: dict[str, Any], *args) -> None:
        """Hold ``solver`` and the checked configuration of the options among ``given`` (a
        constructor's keyword arguments; with ``args``, what :meth:`replace` calls it with).
        Each option reads as the search's attribute too (``search.n_starts``)."""
        options = {name: given[name] for name in ORDER}
        _resolve_auto(solver, options)
        config = SearchConfig(**options)
        object.__setattr__(self, "solver", solver)
        object.__setattr__(self, "options", config)
        object.__setattr__(self, "_made_with", (args, given))
        for name in ORDER:
            object.__setattr__(self, name, getattr(config, name))

    def __setattr__(self, name: str, value) -> None:
        if name in _OPTION_NAMES:
            raise AttributeError(
                f"a search's options are fixed once it is made; use "
                f"search.replace({name}={value!r}) for a search with another {name}"
            )
        object.__setattr__(self, name, value)

    def replace(self, **changes) -> MultiStartGradient:
        """A search of the same kind and rule with some options (or hyperparameters) changed.

        Options whose default depends on others (``n_candidates``, ``n_local``, ...) are
        derived again unless given.

        >>> import multistart as ms
        >>> ms.MultiStartAdam(n_starts=8).replace(n_starts=16).options.n_candidates
        160
        """
        args, kwargs = self._made_with
        unknown_options(changes, type(self))
        return type(self)(*args, **{**kwargs, **changes})

    def __repr__(self) -> str:
        options = self.options
        return (
            f"{type(self).__name__}(n_starts={options.n_starts}, "
            f"batch_size={options.batch_size!r}, n_steps={options.n_steps}, seed={options.seed})"
        )

    def config(self) -> dict[str, Any]:
        """The configuration as plain values (recorded in the Result)."""
        return {
            "search": type(self).__name__,
            "rule": self.solver.name,
            **self.options.record(),
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
            when there is none); one of another model or configuration is refused.
          part: ``(i, k)``: run only the ``i``-th (from 0) of ``k`` contiguous blocks of slots
            (as ``np.array_split``) of the whole run's start plan, each start's record the
            whole run's; :meth:`multistart.Result.merge` joins the parts. Not with
            ``resurrect``, ``start_strategy="tiktak"``, ``target_fom`` or ``max_evals``.

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


class MultiStartAdam(MultiStartGradient):
    """Multi-start Adam (``optax.adam``). Unconstrained coordinates are order one, so a
    learning rate of a few hundredths suits most problems."""

    def __init__(
        self,
        *,
        learning_rate: float = 0.05,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        backend: str = "loop",
        n_steps: int | str = "auto",
        seed: int = 0,
        convergence: Convergence | None | str = "auto",
        max_nonfinite: int = 8,
        schedule: str | Schedule = "all",
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "auto",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | str | None = "auto",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        rediscoveries: int | None = None,
        sync_every: int = 1,
        steps_per_call: int | str = "auto",
        flat: bool = True,
        absolute_sigma: bool | None = None,
        n_data: int | None = None,
        max_history: int = 10_000,
        log_every: int | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        devices: int | Sequence[Any] | None = None,
        dtype: str | None = None,
    ):
        given = _arguments(locals())
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.in_unit_interval(b1, "b1")
        checks.in_unit_interval(b2, "b2")
        checks.non_negative(eps, "eps")
        hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2, "eps": eps}
        self._hold(OptaxSolver(optax.adam(**hyper), name="adam", hyperparameters=hyper), given)


class MultiStartProdigy(MultiStartGradient):
    """Multi-start Prodigy (``optax.contrib.prodigy``): learning-rate free Adam. Each start
    estimates its own step size ``d`` (per-start optimiser state)."""

    def __init__(
        self,
        *,
        learning_rate: float = 1.0,
        betas=(0.9, 0.999),
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        backend: str = "loop",
        n_steps: int | str = "auto",
        seed: int = 0,
        convergence: Convergence | None | str = "auto",
        max_nonfinite: int = 8,
        schedule: str | Schedule = "all",
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "auto",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | str | None = "auto",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        rediscoveries: int | None = None,
        sync_every: int = 1,
        steps_per_call: int | str = "auto",
        flat: bool = True,
        absolute_sigma: bool | None = None,
        n_data: int | None = None,
        max_history: int = 10_000,
        log_every: int | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        devices: int | Sequence[Any] | None = None,
        dtype: str | None = None,
    ):
        given = _arguments(locals())
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.each(checks.in_unit_interval, betas, "betas", length=2)
        rule = OptaxSolver(
            optax.contrib.prodigy(learning_rate, betas=betas),
            name="prodigy",
            hyperparameters={"learning_rate": learning_rate, "betas": list(betas)},
        )
        self._hold(rule, given)


class MultiStartADABelief(MultiStartGradient):
    """Multi-start AdaBelief (``optax.adabelief``)."""

    def __init__(
        self,
        *,
        learning_rate: float = 0.05,
        b1=0.9,
        b2=0.999,
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        backend: str = "loop",
        n_steps: int | str = "auto",
        seed: int = 0,
        convergence: Convergence | None | str = "auto",
        max_nonfinite: int = 8,
        schedule: str | Schedule = "all",
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "auto",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | str | None = "auto",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        rediscoveries: int | None = None,
        sync_every: int = 1,
        steps_per_call: int | str = "auto",
        flat: bool = True,
        absolute_sigma: bool | None = None,
        n_data: int | None = None,
        max_history: int = 10_000,
        log_every: int | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        devices: int | Sequence[Any] | None = None,
        dtype: str | None = None,
    ):
        given = _arguments(locals())
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.in_unit_interval(b1, "b1")
        checks.in_unit_interval(b2, "b2")
        hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2}
        rule = OptaxSolver(optax.adabelief(**hyper), name="adabelief", hyperparameters=hyper)
        self._hold(rule, given)


class MultiStartLion(MultiStartGradient):
    """Multi-start Lion (``optax.lion``): sign updates, so each step moves every unconstrained
    coordinate by about ``learning_rate``."""

    def __init__(
        self,
        *,
        learning_rate: float = 0.01,
        b1=0.9,
        b2=0.99,
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        backend: str = "loop",
        n_steps: int | str = "auto",
        seed: int = 0,
        convergence: Convergence | None | str = "auto",
        max_nonfinite: int = 8,
        schedule: str | Schedule = "all",
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "auto",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | str | None = "auto",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        rediscoveries: int | None = None,
        sync_every: int = 1,
        steps_per_call: int | str = "auto",
        flat: bool = True,
        absolute_sigma: bool | None = None,
        n_data: int | None = None,
        max_history: int = 10_000,
        log_every: int | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        devices: int | Sequence[Any] | None = None,
        dtype: str | None = None,
    ):
        given = _arguments(locals())
        checks.positive(learning_rate, "learning_rate", schedule=True)
        checks.in_unit_interval(b1, "b1")
        checks.in_unit_interval(b2, "b2")
        hyper = {"learning_rate": learning_rate, "b1": b1, "b2": b2}
        self._hold(OptaxSolver(optax.lion(**hyper), name="lion", hyperparameters=hyper), given)


class MultiStartLBFGS(MultiStartGradient):
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
    """

    def __init__(
        self,
        *,
        memory: int = 10,
        rtol: float | None = None,
        xtol: float | None = None,
        ftol: float = 0.0,
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        backend: str = "loop",
        n_steps: int | str = "auto",
        seed: int = 0,
        convergence: Convergence | None | str = "auto",
        max_nonfinite: int = 8,
        schedule: str | Schedule = "all",
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "auto",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | str | None = "auto",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        rediscoveries: int | None = None,
        sync_every: int = 1,
        steps_per_call: int | str = "auto",
        flat: bool = True,
        absolute_sigma: bool | None = None,
        n_data: int | None = None,
        max_history: int = 10_000,
        log_every: int | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        devices: int | Sequence[Any] | None = None,
        dtype: str | None = None,
    ):
        given = _arguments(locals())
        self._hold(LBFGS(memory, rtol=rtol, xtol=xtol, ftol=ftol), given)


def _is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def _resolve_auto(solver: Solver, options: dict) -> None:
    """The options whose default depends on the rule, resolved in ``options``.

    ``convergence``: no window guard where the rule has optimality tests of its own.
    ``start_strategy``: TikTak for the least-squares rules (where it can run), whose local
    searches are short and end by their own tests (``profiling/README.md``); for L-BFGS the
    band's starts, refilled as TikTak's while the local searches are short (``"band_tiktak"``:
    its first wave is the band's, and a fit whose local searches are long runs as the band's);
    the band for the others, whose local searches can be long.
    """
    if _is_auto(options.get("convergence", "auto")):
        options["convergence"] = None if solver.tests_convergence else Convergence()
    if _is_auto(options.get("start_strategy", "auto")):
        can = options.get("n_candidates") != 0 and not options.get("resurrect")
        if can and isinstance(solver, LeastSquaresRule):
            options["start_strategy"] = "tiktak"
        elif can and isinstance(solver, LBFGS):
            options["start_strategy"] = "band_tiktak"
        else:
            options["start_strategy"] = "band"
    if _is_auto(options.get("n_steps", "auto")) and not isinstance(solver, LBFGS):
        options["n_steps"] = DEFAULT_STEPS  # L-BFGS's is sized by the problem when it is fitted
    options["absolute_sigma"] = resolve_absolute_sigma(
        options.get("absolute_sigma"),
        least_squares=isinstance(solver, LeastSquaresRule),
        n_data=options.get("n_data"),
    )


def _arguments(given: dict[str, Any]) -> dict[str, Any]:
    """A constructor's keyword arguments, from its ``locals()`` taken first thing."""
    return {k: v for k, v in given.items() if k not in ("self", "__class__", "optimizer")}


MultiStartGradient.__doc__ = (MultiStartGradient.__doc__ or "").replace("{options}", options_doc())
