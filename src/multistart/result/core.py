"""The Result of a search: the best fit, every start's record and what is read off it.

The uncertainties, figure, file and merge live beside it in this package, each behind a method.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..common import status
from ..common.status import Status
from . import factors as per_factor
from . import file, plot, report
from .laplace import Laplace, leaf_paths
from .merge import best_fit, merge
from .minima import cluster_minima, default_tolerances
from .uncertainty import Uncertainty

if TYPE_CHECKING:
    from ..model.problem import Problem

__all__ = ["Result", "Minimum", "best_fit", "warn_if_no_start_improved"]


class Fom(float):
    """A figure of merit as a Python ``float`` that prints with its fit's precision (not a
    float32 fit's ``395.6813049316406``).

    >>> Fom(np.float32(395.6813), np.float32)
    395.6813
    """

    dtype: np.dtype

    def __new__(cls, value, dtype=np.float64):
        self = super().__new__(cls, value)
        self.dtype = np.dtype(dtype)
        return self

    def __repr__(self) -> str:
        return str(self.dtype.type(self)) if self.dtype != np.float64 else float.__repr__(self)

    __str__ = __repr__

    def __reduce__(self):
        return (Fom, (float(self), self.dtype.str))


@dataclass(frozen=True)
class Minimum:
    """One distinct local minimum reached by one or more starts.

    Attributes:
      fom: the best figure of merit among its starts.
      params: the physical parameters of that best start.
      starts: indices of the starts that reached it, best first.
      laplace: the :class:`multistart.result.laplace.Laplace` approximation at ``params``
        (``result.distinct_minima(errors=True)``), else ``None``.
    """

    fom: float
    params: Any
    starts: tuple[int, ...]
    laplace: Laplace | None = field(default=None, compare=False)

    @property
    def n_starts(self) -> int:
        return len(self.starts)

    @property
    def errors(self):
        """1-sigma errors at this minimum (the params pytree)."""
        return self._laplace().errors

    @property
    def covariance(self) -> np.ndarray:
        """Covariance at this minimum, in the order the space was written in (raveled;
        ``minimum.laplace.names`` names each row)."""
        return self._laplace().covariance

    def _laplace(self) -> Laplace:
        if self.laplace is None:
            raise ValueError("this Minimum has no errors: use result.distinct_minima(errors=True)")
        return self.laplace

    def __repr__(self) -> str:
        return f"Minimum(fom={self.fom!r}, n_starts={self.n_starts}, params={_short(self.params)})"


_START_PREFIX = "start:"


@dataclass(frozen=True)
class Result:
    """What a search returns. Figures of merit are always minimised.

    A search, :meth:`merge` and :meth:`load` make a Result with :meth:`of`, which chooses the
    best fit from the records. It is frozen once made: ``dataclasses.replace`` (or
    :meth:`with_stats`) gives a changed copy.

    Attributes:
      best_params: physical parameters of the best start (the same pytree as the space).
      best_fom: the best figure of merit (``inf`` when no start was ever finite).
      best_index: index of the best start (``-1`` when no start was ever finite).
      foms: ``(n_starts,)`` each start's best figure of merit.
      params: each start's best physical parameters (leaves with a leading ``n_starts`` axis).
      start_params: where each start began (physical, leading ``n_starts`` axis).
      status: ``(n_starts,)`` read-only array of :class:`multistart.Status` (made from members,
        their words or their codes; :attr:`status_codes`: the codes).
      n_steps: ``(n_starts,)`` engine steps each start took (one evaluation each).
      n_evals: ``(n_starts,)`` evaluations of the objective each start made: its steps plus
        any its rule made itself (an optax line search's trials).
      at_bound: ``(n_starts,)`` whether a start's best parameters lie within 1e-4 of a bound
        of a bounded prior (in its unit interval; of a one-sided one, over ``max(|bound|,
        1)``): its logit may have saturated, or its optimum lies outside the prior (widen it
        and fit again).
      best_step: ``(n_starts,)`` the step at which each start found its best (``-1``: never).
      history: ``(n_rows, n_starts)`` best-so-far figure of merit per recorded step and start.
      history_steps: ``(n_rows,)`` the step (1-based count of steps taken) of each history row.
      stats: run statistics (``n_compiles``, ``compile_s``, ``wall_s``, ``n_evals``, ...).
      paths: dotted parameter names (a :class:`multistart.Fixed` one too), in the order the
        space was written in (``curve_fit``'s: ``f``'s arguments, ``popt``'s columns), as the
        covariance's rows; the params pytrees' leaves are sorted (``jax.tree_util``'s order).
      config: the search's configuration, for the record.
      resurrections: ``(n_starts,)`` how many times each slot's start was replaced
        (``resurrect``, TikTak, a pruned slot's next start); all zeros without a refill.
      incarnations: with refills, one record (a dict: ``slot``, ``incarnation``, ``fom``,
        ``params``, ``start_params``, ``status``, ``n_steps``, ``best_step``, ``started_at``,
        ``replaced_at``) for every start that ever ran in a refilled slot, the final one
        included (``replaced_at`` is ``None``). The per-slot arrays show each slot's best
        incarnation (the latest on ties or when none was finite); ``history`` is its best so far.
      rung: with ``schedule="halving"``, ``(n_starts,)`` the rungs each start passed (a
        pruned start: the rung that pruned it); ``None`` otherwise.
      uncertainty: (an argument only) what the covariance is computed from, or the one
        computed (:class:`~multistart.result.uncertainty.Uncertainty`); a search attaches its
        problem with :meth:`attach_problem`.
    """

    best_params: Any
    best_fom: float
    best_index: int
    foms: np.ndarray
    params: Any
    start_params: Any
    status: np.ndarray
    n_steps: np.ndarray
    best_step: np.ndarray
    history: np.ndarray
    history_steps: np.ndarray
    stats: dict = field(default_factory=dict)
    paths: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    resurrections: np.ndarray | None = None
    incarnations: list = field(default_factory=list)
    n_evals: np.ndarray | None = None
    at_bound: np.ndarray | None = None
    rung: np.ndarray | None = None
    uncertainty: InitVar[Uncertainty | None] = None
    if TYPE_CHECKING:  # set once by __post_init__ (not a field: a source, not a record)
        _uncertainty: Uncertainty = field(init=False, repr=False, compare=False)
        _status_codes: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self, uncertainty: Uncertainty | None):
        def normalise(name: str, value) -> None:  # a frozen instance's own fields, as made
            object.__setattr__(self, name, value)

        # what the lazy covariance needs (a problem is code: never saved), and the one computed
        normalise("_uncertainty", Uncertainty() if uncertainty is None else uncertainty)
        if self.n_evals is None:
            normalise("n_evals", np.asarray(self.n_steps).copy())
        if self.at_bound is None:
            normalise("at_bound", np.zeros(np.shape(self.foms)[0], dtype=bool))
        if self.resurrections is None:
            normalise("resurrections", np.zeros(np.shape(self.foms)[0], dtype=np.int64))
        normalise("best_fom", Fom(self.best_fom, self.fit_dtype))
        # Members, whatever came in (members, words or codes): NumPy turns a list of these
        # str-enums into a str array. Their codes kept, read-only: no loop over starts to read
        # them again (status_codes).
        codes = status.codes_of(self.status)
        members = status.members(codes)
        codes.flags.writeable = members.flags.writeable = False  # the one record of how each ended
        normalise("status", members)
        normalise("_status_codes", codes)

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a part returned by Ray, Dask or a process pool), as made: its statuses
        read-only (NumPy's pickle gives an array back writable)."""
        self.__dict__.update(state)
        for name in ("status", "_status_codes"):
            if isinstance(state.get(name), np.ndarray):
                state[name].flags.writeable = False

    @classmethod
    def of(cls, *, foms: np.ndarray, params, **records) -> Result:
        """The Result of these per-start records, its best fit chosen: the lowest finite
        figure of merit, the first on ties (``-1``, ``inf`` and nan when none is finite)."""
        best_index, best_fom, best_params = best_fit(foms, params)
        return cls(best_params, best_fom, best_index, foms, params, **records)

    def with_stats(self, **more) -> Result:
        """A copy with ``more`` statistics, the same problem attached (or covariance computed)."""
        return self.replaced(stats={**self.stats, **more})

    def replaced(self, **changes) -> Result:
        """``dataclasses.replace(self, **changes)``, its covariance's source kept unless
        ``uncertainty`` is given, and its statuses passed as their codes (no loop over the
        starts to read the members again)."""
        keep = {"status": self._status_codes, "uncertainty": self._uncertainty}
        return replace(self, **{**keep, **changes})

    @property
    def status_codes(self) -> np.ndarray:
        """``(n_starts,)`` the codes (``int8``, read-only) of :attr:`status`
        (:attr:`multistart.Status.code`)."""
        return self._status_codes

    @property
    def fit_dtype(self) -> np.dtype:
        """The floating-point type the search ran in (that of its parameters)."""
        leaves = [np.asarray(v) for v in jax.tree_util.tree_leaves(self.params)]
        floats = [v.dtype for v in leaves if np.issubdtype(v.dtype, np.floating)]
        return np.result_type(*floats) if floats else np.dtype(np.float64)

    # -- uncertainties ----------------------------------------------------------------------

    def attach_problem(self, objective, space=None) -> Result:
        """A copy of the Result with what its covariance is computed from.

        A search attaches its problem itself; a loaded Result saved without a covariance
        needs it again (``result = Result.load(path).attach_problem(objective, space)``). The
        copy computes its covariance afresh; this Result is unchanged (a Result is a record).

        Raises:
          ValueError: the space's parameters are not the Result's ``paths``.
        """
        return self.replaced(uncertainty=Uncertainty.of(self.paths, objective, space))

    @property
    def problem(self) -> Problem | None:
        """The problem the covariance is computed from (the figure of merit and its space):
        ``None`` for a loaded or hand-made Result without one (:meth:`attach_problem`)."""
        return self._uncertainty.problem

    @property
    def laplace(self) -> Laplace:
        """The :class:`multistart.result.laplace.Laplace` approximation at the best fit.

        Computed on first access (one Hessian compile) and cached; see
        :func:`multistart.laplace` for what it assumes of the figure of merit.
        """
        return self._uncertainty.at_best(self.best_index, self.best_params)

    @property
    def covariance(self) -> np.ndarray:
        """``(n, n)`` covariance at the best fit: ``2 H^-1`` of the figure of merit in physical
        coordinates, or for a least-squares search ``curve_fit``'s ``s² (JᵀJ)⁻¹``
        (``result.laplace.kind``). In the order the space was written in (array parameters
        raveled; ``result.laplace.names`` names each row)."""
        return self.laplace.covariance

    @property
    def errors(self):
        """1-sigma errors at the best fit (the params pytree), from :attr:`covariance`; ``nan``
        where the Hessian is singular or indefinite."""
        return self.laplace.errors

    @property
    def correlation(self) -> np.ndarray:
        """Correlation matrix at the best fit, in the order of :attr:`covariance`."""
        return self.laplace.correlation

    @property
    def n_starts(self) -> int:
        return int(self.foms.shape[0])

    @property
    def best_history(self) -> np.ndarray:
        """Best-so-far over all starts at each history row."""
        h = np.where(np.isnan(self.history), np.inf, self.history)
        return h.min(axis=1) if h.size else h.reshape(0)

    def status_counts(self) -> dict[str, int]:
        return status.counts(self._status_codes)

    def ranked(self) -> np.ndarray:
        """Start indices from best to worst figure of merit (non-finite last)."""
        f = np.where(np.isfinite(self.foms), self.foms, np.inf)
        return np.argsort(f, kind="stable")

    def distinct_minima(
        self,
        xtol: float | None = None,
        ftol: float | None = None,
        *,
        include_nonfinite: bool = False,
        include_unconverged: bool | None = None,
        errors: bool = False,
    ) -> list[Minimum]:
        """Group the converged starts into distinct local minima, best first.

        Two starts share a minimum when their figures of merit agree within ``ftol`` and every
        parameter within ``xtol`` (relative above magnitude 1, absolute below), as in MATLAB's
        MultiStart. Starts stopped as ``nonfinite`` are left out unless ``include_nonfinite``
        (their best finite point, if any, then takes part); starts with no finite figure of
        merit never do.

        Args:
          xtol, ftol: ``None`` (default): as fine as the search resolved its minima, from the
            convergence rule and the float type recorded in the Result
            (:func:`multistart.result.minima.default_tolerances`: ``1e-3`` for the default rule in
            float32 and float64). A number wins.
          include_nonfinite: let ``nonfinite`` starts' best finite points take part.
          include_unconverged: let starts that did not converge (``max_steps``, ``stopped``,
            ``interrupted``; still moving, so not minima) take part. ``None`` (default): only
            when no start converged, so there is still something to group.
          errors: also compute each minimum's Laplace errors (``minimum.errors``,
            ``minimum.covariance``; one Hessian compile for all of them).

        Returns:
          A list of :class:`Minimum` (fom, params, starts), sorted by figure of merit.
        """
        f, labels = self._minimum_labels(xtol, ftol, include_nonfinite, include_unconverged)
        order = np.lexsort((np.arange(f.size), f, labels))
        order = order[labels[order] >= 0]
        bounds = np.flatnonzero(np.diff(labels[order])) + 1
        leaves, treedef = jax.tree_util.tree_flatten(self.params)
        leaves = [np.asarray(a) for a in leaves]
        dtype = self.fit_dtype
        minima = []
        for members in np.split(order, bounds) if order.size else []:
            head = int(members[0])
            params = jax.tree_util.tree_unflatten(treedef, [a[head] for a in leaves])
            fit = self._uncertainty.at(params) if errors else None
            minima.append(Minimum(Fom(f[head], dtype), params, tuple(members.tolist()), fit))
        return minima

    def n_distinct_minima(
        self,
        xtol: float | None = None,
        ftol: float | None = None,
        *,
        include_nonfinite: bool = False,
        include_unconverged: bool | None = None,
    ) -> int:
        """How many minima :meth:`distinct_minima` groups the starts into (the same arguments),
        without making them (a fit records it in ``stats["n_distinct_minima"]``)."""
        labels = self._minimum_labels(xtol, ftol, include_nonfinite, include_unconverged)[1]
        return int(labels.max(initial=-1)) + 1  # a minimum's label is its rank, from 0

    def _minimum_labels(self, xtol, ftol, include_nonfinite: bool, include_unconverged):
        """``(f, labels)``: the figures of merit grouped (``inf`` for the starts left out) and
        each start's minimum (:func:`multistart.result.minima.cluster_minima`)."""
        dx, df = default_tolerances(self.fit_dtype, self.config.get("convergence"))
        xtol, ftol = dx if xtol is None else xtol, df if ftol is None else ftol
        leaves = jax.tree_util.tree_leaves(self.params)
        x = np.concatenate([np.asarray(v).reshape(self.n_starts, -1) for v in leaves], axis=1)
        f = self._grouped_foms(include_nonfinite, include_unconverged)
        return f, cluster_minima(x, f, xtol=xtol, ftol=ftol)

    def _grouped_foms(self, include_nonfinite: bool, include_unconverged: bool | None):
        """Every start's figure of merit, ``inf`` for the starts left out of the grouping."""
        f = np.asarray(self.foms, dtype=np.float64).copy()
        codes = self._status_codes
        nonfinite = codes == Status.NONFINITE.code
        if not include_nonfinite:
            f[nonfinite] = np.inf
        converged = status.settled(codes)
        if include_unconverged is None:
            include_unconverged = not converged.any()
        if not include_unconverged:
            f[~converged & ~nonfinite] = np.inf
        return f

    def minimum_labels(self) -> np.ndarray:
        """``(n_starts,)`` which of :meth:`distinct_minima` (default tolerances) each start
        reached: 0 for the best, 1 for the next, ...; -1 for a start in none of them."""
        labels = np.full(self.n_starts, -1, dtype=np.int64)
        for k, m in enumerate(self.distinct_minima()):
            labels[list(m.starts)] = k
        return labels

    def start(self, i: int) -> dict:
        """One start's record as a dict."""
        return {
            "index": i,
            "fom": float(self.foms[i]),
            "status": self.status[i],
            "n_steps": int(self.n_steps[i]),
            "best_step": int(self.best_step[i]),
            "resurrections": int(np.asarray(self.resurrections)[i]),
            "params": jax.tree_util.tree_map(lambda a: np.asarray(a)[i], self.params),
        }

    def plot(self, *, max_minima: int = 20):
        """Every start's best-so-far figure of merit against step, and the distinct minima.

        Left: one curve per start until it ended (log step axis, and a log figure-of-merit
        axis when every value is positive), coloured by final rank, the best start in red.
        Right, on the same figure-of-merit axis: each of the first ``max_minima`` distinct
        minima (:meth:`distinct_minima` with its defaults), with how many starts reached it.

        Returns:
          The ``matplotlib.figure.Figure`` (made with pyplot, so ``plt.show()`` shows it).

        Raises:
          ImportError: matplotlib is not installed (the ``plots`` extra).
        """
        return plot.plot(self, max_minima=max_minima)

    def plot_factors(
        self, curve, *, x: str, y: str, factors: Sequence[str] | int = 12, ncols: int = 4
    ):
        """A factor graph's fit, factor by factor: each factor's data against its model.

        One panel a factor: its data ``data[y]`` against ``data[x]`` (points), and
        ``curve(params, data, grid)`` (a line) on 200 points across the factor's ``x``, with
        ``params`` the flat dict its log-likelihood gets at the best fit.

        Args:
          curve: ``curve(params, data, x) -> y``, the model's prediction at the points ``x``.
          x, y: the data keys of each factor's abscissa and observations.
          factors: the first this many factors, or a list of factor names.
          ncols: panels a row.

        Returns:
          The ``matplotlib.figure.Figure``.

        Raises:
          ImportError: matplotlib is not installed (the ``plots`` extra).
          ValueError: the Result is not a factor graph's, or has no graph attached
            (``attach_problem(graph)``).
        """
        return per_factor.plot_factors(self, curve, x=x, y=y, factors=factors, ncols=ncols)

    # -- results as data --------------------------------------------------------------------

    def factor_table(self, start: int | None = None, *, errors: bool = True):
        """A factor graph's fit as a table, one row a factor (``pandas.DataFrame``, indexed by
        the factor's name).

        Columns: ``group`` (the kernel that evaluates it: factors of one group are stacked),
        ``log_likelihood``, ``log_prior`` (its own priors), ``fom`` (its contribution to the
        figure of merit, ``-2 (log_likelihood + log_prior)``), each own parameter by name
        (``"eta_cl"``, ``"tilt[1]"``; ``nan`` for a factor without it), and with ``errors``
        its Laplace error as ``error:<name>`` (from the arrow of the Hessian: see
        :class:`multistart.ArrowLaplace`).

        Args:
          start: tabulate this start's best parameters instead of the best fit's.
          errors: add the errors (computed on first use, as :attr:`errors` is).

        Raises:
          ImportError: pandas is not installed (the ``plots`` extra).
          ValueError: the Result is not a factor graph's, or has no graph attached
            (``attach_problem(graph)``).
        """
        return per_factor.factor_table(self, start, errors=errors)

    def to_dataframe(self):
        """One row per start, as a ``pandas.DataFrame``.

        Columns: ``index``, ``fom``, ``status`` (the :class:`multistart.Status` value, e.g.
        ``"converged"``), ``n_steps``, ``n_evals``, ``at_bound``, ``best_step``, ``minimum``
        (:meth:`minimum_labels`), ``rung`` (with ``schedule="halving"``: the rungs the start
        passed, or the one that pruned it), then each parameter at the start's best
        by dotted name (an array parameter expands to ``name[i]`` or ``name[i,j]`` columns),
        then where each start began, as ``start:<column>``.

        Raises:
          ImportError: pandas (the ``plots`` extra) is not installed.
          ValueError: a parameter's column name collides with a record column.
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                f"Result.to_dataframe() needs pandas; install it with {plot.PLOTS_HINT}"
            ) from e
        columns: dict[str, np.ndarray] = {
            "index": np.arange(self.n_starts),
            "fom": np.asarray(self.foms).astype(self.fit_dtype),
            "status": status.words(self._status_codes),
            "n_steps": np.asarray(self.n_steps),
            "n_evals": np.asarray(self.n_evals),
            "at_bound": np.asarray(self.at_bound),
            "best_step": np.asarray(self.best_step),
            "minimum": self.minimum_labels(),
        }
        if self.rung is not None:
            columns["rung"] = np.asarray(self.rung)
        params = _expand_columns(self.paths, self.params)
        for name in params:
            if name in columns:
                raise ValueError(
                    f"parameter column {name!r} collides with the record column {name!r}; "
                    "rename the parameter to tabulate this result"
                )
        columns.update(params)
        starts = _expand_columns(self.paths, self.start_params)
        columns.update({_START_PREFIX + k: v for k, v in starts.items()})
        return pd.DataFrame(columns)

    def save(self, path, *, errors: bool = True) -> None:
        """Write every field to one ``.npz`` file at ``path`` (exactly that path).

        Arrays are NumPy arrays in the archive; the rest (``stats``, ``paths``, ``config``, the
        parameter tree, ...) is JSON in its ``__meta__`` entry; nothing is pickled. The file is
        written whole or not at all. The covariance at the best fit is saved (computed now if
        it can be; if that fails, saved without it, with a warning) unless ``errors=False``; a
        factor graph's (:class:`multistart.ArrowLaplace`) as the blocks of its Hessian's arrow,
        never ``n x n`` (a file of version 2, which multistart before it refuses by name).
        ``stats`` and ``config`` must hold JSON values (NumPy values are converted; tuples come
        back as lists); dict keys in the parameter tree must be ``str`` or ``int``.
        """
        fit = self._uncertainty.for_saving(self.best_index, self.best_params) if errors else None
        file.save(self, path, fit)

    @classmethod
    def merge(cls, parts) -> Result:
        """The Result one run would have given, from the Results of its ``k`` parts.

        Each part is a ``search.fit(..., part=(i, k))`` of the same search, model and start
        plan, given in any order, in memory or as paths that :meth:`save` wrote. Records are
        concatenated in slot order and the best fit chosen again; ``stats`` adds up counts, keeps
        the longest ``wall_s``, says ``n_parts``; ``stats["parts"]`` keeps each part's own.

        Example:
          >>> parts = [search.fit(f, space, part=(i, 3)) for i in range(3)]  # doctest: +SKIP
          >>> whole = ms.Result.merge(parts)  # doctest: +SKIP

        Raises:
          ValueError: a Result that is not a part; parts of different searches, models,
            configurations or start plans (the message says what differs); a part missing
            or given twice; parts of different ``k``.
        """
        return merge(cls, parts)

    @classmethod
    def load(cls, path) -> Result:
        """Read a Result written by :meth:`save` (no pickle is ever loaded).

        Every member of the file is read and checked (its CRC-32) before anything is built.

        Raises:
          FileNotFoundError: no file at ``path``.
          ValueError: the file is not a saved Result: cut short, altered (a changed byte),
            of another kind or of an unknown format version; the message names the file.
        """
        return file.load(cls, path)

    def report(self, *, min_correlation: float = report.MIN_CORRELATION) -> str:
        """The fit in words, as lmfit's ``fit_report``: the best figure of merit, how the starts
        ended, the distinct minima, each parameter's value, error and prior, the correlations
        above ``min_correlation``. Computes the covariance if needed."""
        return report.report(self, min_correlation=min_correlation)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.status_counts().items())
        return (
            f"Result(best_fom={self.best_fom!r}, best_index={self.best_index}, "
            f"n_starts={self.n_starts}, status: {counts}, "
            f"n_compiles={self.stats.get('n_compiles')}, wall_s={self.stats.get('wall_s', 0):.3g})"
        )


def _short(params) -> str:
    """A params pytree printed with each value's own precision (``{'amp': 24.917944}``)."""

    def leaf(v):
        a = np.asarray(v)
        return str(a.dtype.type(a)) if a.ndim == 0 else np.array2string(a, separator=", ")

    if isinstance(params, dict):
        return "{" + ", ".join(f"{k!r}: {_short(v)}" for k, v in params.items()) + "}"
    return leaf(params)


def _expand_columns(paths: list[str], params) -> dict[str, np.ndarray]:
    """``{column: (n_starts,) values}`` in the order of ``paths``; an array parameter gives one
    column per element."""
    leaves = dict(zip(leaf_paths(params), jax.tree_util.tree_leaves(params), strict=True))
    out: dict[str, np.ndarray] = {}
    for name in [p for p in paths if p in leaves] + [p for p in leaves if p not in paths]:
        leaf = leaves[name]
        a = np.asarray(leaf)
        if a.ndim == 1:
            out[name] = a
            continue
        for idx in np.ndindex(a.shape[1:]):
            out[f"{name}[{','.join(str(i) for i in idx)}]"] = a[(slice(None),) + tuple(idx)]
    return out


def warn_if_no_start_improved(result: Result) -> str | None:
    """Warn, and return the message, when no start that stepped improved on its first value.

    A rule that ascends (``optax.sgd(-0.1)``) or always overshoots leaves every start at its
    first point, which the window rule calls converged. Starts that took one step or none, with
    no finite value, or marked ``nonfinite`` are left out.
    """
    foms, best_step = np.asarray(result.foms), np.asarray(result.best_step)
    said = np.isin(result.status_codes, [Status.NONFINITE.code, Status.UNSTARTED.code])
    stepped = np.isfinite(foms) & (np.asarray(result.n_steps) > 1) & ~said
    if not stepped.any() or (best_step[stepped] > 0).any():
        return None
    message = (
        f"no start improved on its first value ({int(stepped.sum())} starts, up to "
        f"{int(np.max(np.asarray(result.n_steps)[stepped]))} steps each): the rule ascends (a "
        "negative learning rate? optax rules take a positive one and minimise) or every step "
        "overshoots, unless every start began at its minimum. Each start's result is where it "
        "began, not a minimum"
    )
    logging.getLogger("multistart").warning("%s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=2)
    return message
