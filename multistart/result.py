"""The Result of a search: the best fit and every start's record."""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .laplace import Laplace, hessian_function, laplace_problem, unflatten_like
from .minima import cluster_minima, default_tolerances
from .parts import merge as merge_parts
from .problem import Problem, as_problem
from .status import Status

__all__ = ["Result", "Minimum"]


class Fom(float):
    """A figure of merit as a Python ``float`` that prints with its fit's precision.

    A float32 fit's ``395.6813`` is stored exactly as a float, but printing all of
    ``395.6813049316406`` would claim digits the fit never had.

    >>> Fom(np.float32(395.6813), np.float32)
    395.6813
    """

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
      laplace: the :class:`multistart.laplace.Laplace` approximation at ``params``
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
        """Covariance at this minimum, in the order of ``result.paths`` (raveled)."""
        return self._laplace().covariance

    def _laplace(self) -> Laplace:
        if self.laplace is None:
            raise ValueError("this Minimum has no errors: use result.distinct_minima(errors=True)")
        return self.laplace

    def __repr__(self) -> str:
        return f"Minimum(fom={self.fom!r}, n_starts={self.n_starts}, params={_short(self.params)})"


_FORMAT, _VERSION = "multistart.Result", 1
_RECORD_COLUMNS = ("index", "fom", "status", "n_steps", "n_evals", "best_step", "at_bound")
_START_PREFIX = "start:"
_PLOTS_HINT = "pip install 'multistart[plots]'"


@dataclass
class Result:
    """What a search returns. Figures of merit are always minimised.

    Attributes:
      best_params: physical parameters of the best start (the same pytree as the space).
      best_fom: the best figure of merit (``inf`` when no start was ever finite).
      best_index: index of the best start (``-1`` when no start was ever finite).
      foms: ``(n_starts,)`` each start's best figure of merit.
      params: each start's best physical parameters (leaves with a leading ``n_starts`` axis).
      start_params: where each start began (physical, leading ``n_starts`` axis).
      status: ``(n_starts,)`` array of :class:`multistart.Status`.
      n_steps: ``(n_starts,)`` engine steps each start took (one evaluation each).
      n_evals: ``(n_starts,)`` evaluations of the objective each start made: its steps plus
        any its rule made itself (an optax line search's trials).
      at_bound: ``(n_starts,)`` whether a start's best parameters lie within 1e-4 of a bound
        of a bounded prior (in the prior's own unit interval). Such a start may have stopped
        because its logit saturated (the gradient in the unconstrained coordinates vanishes
        there), or its optimum lies outside the prior: widen the prior and fit again.
      best_step: ``(n_starts,)`` the step at which each start found its best (``-1``: never).
      history: ``(n_rows, n_starts)`` best-so-far figure of merit per recorded step and start.
      history_steps: ``(n_rows,)`` the step (1-based count of steps taken) of each history row.
      stats: run statistics: ``n_compiles`` (compiles of the chunk step), ``n_compiles_total``,
        ``compile_s``, ``wall_s``, ``n_evals``, ``batch_size``, ... .
      paths: dotted parameter names, in the order of the space's leaves.
      config: the search's configuration, for the record.
      resurrections: ``(n_starts,)`` how many times each slot's start was replaced
        (``resurrect``); all zeros without resurrection.
      incarnations: with resurrection, one record (a dict: ``slot``, ``incarnation``, ``fom``,
        ``params``, ``start_params``, ``status``, ``n_steps``, ``best_step``, ``started_at``,
        ``replaced_at``) for every start that ever ran in a slot that was resurrected, the final
        one included (``replaced_at`` is ``None``). The per-slot arrays above show each slot's
        best incarnation (lowest finite figure of merit; the latest on ties or when none was
        finite), and ``history`` is the slot's best over its incarnations so far, so a replaced
        start's best point is never lost.
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
    # What the lazy covariance needs; never saved (a figure of merit is code).
    _problem: Problem | None = field(default=None, init=False, repr=False, compare=False)
    _hessian: Any = field(default=None, init=False, repr=False, compare=False)
    _laplace: Laplace | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.n_evals is None:
            self.n_evals = np.asarray(self.n_steps).copy()
        if self.at_bound is None:
            self.at_bound = np.zeros(np.shape(self.foms)[0], dtype=bool)
        if self.resurrections is None:
            self.resurrections = np.zeros(np.shape(self.foms)[0], dtype=np.int64)
        self.best_fom = Fom(self.best_fom, self.fit_dtype)
        # Members, whatever came in: NumPy turns a list of these str-enums into a str array.
        self.status = np.array([Status(s) for s in self.status], dtype=object)

    def __getstate__(self):  # pickle without the problem (closures) or its compiled Hessian
        return dict(self.__dict__, _problem=None, _hessian=None)

    @property
    def fit_dtype(self) -> np.dtype:
        """The floating-point type the search ran in (that of its parameters)."""
        leaves = [np.asarray(v) for v in jax.tree_util.tree_leaves(self.params)]
        floats = [v.dtype for v in leaves if np.issubdtype(v.dtype, np.floating)]
        return np.result_type(*floats) if floats else np.dtype(np.float64)

    # -- uncertainties ----------------------------------------------------------------------

    def attach_problem(self, objective, space=None) -> Result:
        """Give the Result what its covariance is computed from; returns the Result.

        A search attaches its problem itself. A loaded Result that was saved without a
        covariance needs it again: ``Result.load(path).attach_problem(objective, space)``
        (or ``attach_problem(graph)``).

        Raises:
          ValueError: the space's parameters are not the Result's ``paths``.
        """
        problem = objective if isinstance(objective, Problem) else as_problem(objective, space)
        if self.paths and list(problem.space.paths) != list(self.paths):
            raise ValueError(
                f"the problem's parameters {problem.space.paths} are not this Result's "
                f"{list(self.paths)}"
            )
        self._problem, self._hessian = problem, None
        return self

    @property
    def laplace(self) -> Laplace:
        """The :class:`multistart.laplace.Laplace` approximation at the best fit.

        Computed on first access (one Hessian compile) and cached; see
        :func:`multistart.laplace` for what it assumes of the figure of merit.
        """
        if self._laplace is None:
            if self.best_index < 0:
                raise ValueError("no start reached a finite figure of merit: no covariance")
            self._laplace = self._laplace_at(self.best_params)
        return self._laplace

    @property
    def covariance(self) -> np.ndarray:
        """``(n, n)`` covariance at the best fit, ``2 H^-1`` of the figure of merit in
        physical coordinates, in the order of ``paths`` (array parameters raveled;
        ``result.laplace.names`` names each row)."""
        return self.laplace.covariance

    @property
    def errors(self):
        """1-sigma errors at the best fit (the params pytree); ``nan`` where the Hessian is
        singular or indefinite."""
        return self.laplace.errors

    @property
    def correlation(self) -> np.ndarray:
        """Correlation matrix at the best fit, in the order of :attr:`covariance`."""
        return self.laplace.correlation

    def _laplace_at(self, params) -> Laplace:
        if self._problem is None:
            raise ValueError(
                "this Result has no problem to compute a covariance from (it was loaded "
                "without one, or built by hand): call "
                "result.attach_problem(objective, space) or result.attach_problem(graph)"
            )
        if self._hessian is None:
            self._hessian = hessian_function(self._problem)
        return laplace_problem(self._problem, params, self._hessian)

    @property
    def n_starts(self) -> int:
        return int(self.foms.shape[0])

    @property
    def best_history(self) -> np.ndarray:
        """Best-so-far over all starts at each history row."""
        h = np.where(np.isnan(self.history), np.inf, self.history)
        return h.min(axis=1) if h.size else h.reshape(0)

    def status_counts(self) -> dict[str, int]:
        counts = Counter(str(s) for s in self.status)
        return {str(s): counts[str(s)] for s in Status if counts[str(s)]}

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
            (:func:`multistart.minima.default_tolerances`: ``1e-3`` for the default rule in
            float32 and float64). A number wins.
          include_nonfinite: let ``nonfinite`` starts' best finite points take part.
          include_unconverged: let starts that did not converge (``max_steps``, ``stopped``,
            ``interrupted``) take part: they were still moving, so their points are not minima
            (MATLAB's MultiStart, likewise, lists the local solutions with a positive exit
            flag). ``None`` (default): only when no start converged (a search run without a
            convergence rule, or cut short), so there is still something to group.
          errors: also compute each minimum's Laplace errors (``minimum.errors``,
            ``minimum.covariance``; one Hessian compile for all of them).

        Returns:
          A list of :class:`Minimum` (fom, params, starts), sorted by figure of merit.
        """
        dx, df = default_tolerances(self.fit_dtype, self.config.get("convergence"))
        xtol, ftol = dx if xtol is None else xtol, df if ftol is None else ftol
        leaves = jax.tree_util.tree_leaves(self.params)
        x = np.concatenate([np.asarray(v).reshape(self.n_starts, -1) for v in leaves], axis=1)
        f = np.asarray(self.foms, dtype=np.float64).copy()
        if not include_nonfinite:
            f[np.array([s is Status.NONFINITE for s in self.status], dtype=bool)] = np.inf
        converged = np.array([s is Status.CONVERGED for s in self.status], dtype=bool)
        if include_unconverged is None:
            include_unconverged = not converged.any()
        if not include_unconverged:
            moving = ~converged & np.array([s is not Status.NONFINITE for s in self.status])
            f[moving] = np.inf
        labels = cluster_minima(x, f, xtol=xtol, ftol=ftol)
        # Every minimum's starts, best first, from one sort (by label, then f, then index).
        order = np.lexsort((np.arange(f.size), f, labels))
        order = order[labels[order] >= 0]
        bounds = np.flatnonzero(np.diff(labels[order])) + 1
        leaves, treedef = jax.tree_util.tree_flatten(self.params)
        leaves = [np.asarray(a) for a in leaves]
        dtype = self.fit_dtype
        minima = []
        for members in np.split(order, bounds) if order.size else []:
            head = int(members[0])
            params = treedef.unflatten([a[head] for a in leaves])
            fit = self._laplace_at(params) if errors else None
            minima.append(Minimum(Fom(f[head], dtype), params, tuple(members.tolist()), fit))
        return minima

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
            "resurrections": int(self.resurrections[i]),
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
        try:
            import matplotlib as mpl
            import matplotlib.pyplot as plt
            import matplotlib.ticker  # noqa: F401  (mpl.ticker below)
        except ImportError as e:
            raise ImportError(
                f"Result.plot() needs matplotlib; install it with {_PLOTS_HINT}"
            ) from e
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(10, 4), width_ratios=(3, 1), sharey=True, layout="constrained"
        )
        steps, hist = np.asarray(self.history_steps), np.asarray(self.history)
        order = self.ranked()[::-1]  # worst first, so the best curves are drawn on top
        for rank, i in enumerate(order):
            keep = steps <= max(int(self.n_steps[i]), 1)
            colour = mpl.colormaps["viridis"](rank / max(len(order) - 1, 1))
            left.plot(steps[keep], hist[keep, i], color=colour, lw=0.7, alpha=0.6)
        if self.best_index >= 0:
            keep = steps <= max(int(self.n_steps[self.best_index]), 1)
            left.plot(steps[keep], hist[keep, self.best_index], color="crimson", label="best")
            left.legend(loc="upper right", fontsize=8)
        finite = hist[np.isfinite(hist)]
        if finite.size and finite.min() > 0:
            left.set_yscale("log")
        if steps.size and steps.max() > 1:
            left.set_xscale("log")
        left.set(xlabel="step", ylabel="best figure of merit so far")
        left.set_title(f"{self.n_starts} starts (colour: final rank, yellow best)", fontsize=10)
        minima = self.distinct_minima()[:max_minima]
        ranks = np.arange(1, len(minima) + 1)
        counts = np.array([m.n_starts for m in minima])
        right.scatter(ranks, [m.fom for m in minima], s=20 + 180 * counts / max(self.n_starts, 1))
        for r, m in zip(ranks, minima, strict=True):
            right.annotate(str(m.n_starts), (r, m.fom), textcoords="offset points", xytext=(6, 4))
        right.set(xlabel="distinct minimum (best first)")
        right.set_title("minima (label: starts reaching it)", fontsize=10)
        right.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
        if len(minima):
            right.set_xlim(0.5, len(minima) + 0.5)
        return fig

    # -- results as data --------------------------------------------------------------------

    def to_dataframe(self):
        """One row per start, as a ``pandas.DataFrame``.

        Columns: ``index``, ``fom``, ``status`` (the :class:`multistart.Status` value, e.g.
        ``"converged"``), ``n_steps``, ``best_step``, then each parameter at the start's best
        by dotted name (an array parameter expands to ``name[i]`` or ``name[i,j]`` columns),
        then where each start began, as ``start:<column>``.

        pandas is an optional dependency (the ``plots`` extra): a search on a cluster node
        needs only NumPy, and ``save``/``load`` keep every record without it.

        Raises:
          ImportError: pandas is not installed.
          ValueError: a parameter's column name collides with a record column.
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                f"Result.to_dataframe() needs pandas; install it with {_PLOTS_HINT}"
            ) from e
        columns: dict[str, np.ndarray] = {
            "index": np.arange(self.n_starts),
            # in the fit's own precision: a float32 fit's 395.6813, not 395.6813049316406
            "fom": np.asarray(self.foms).astype(self.fit_dtype),
            "status": np.array([str(s) for s in self.status], dtype=object),
            "n_steps": np.asarray(self.n_steps),
            "n_evals": np.asarray(self.n_evals),
            "at_bound": np.asarray(self.at_bound),
            "best_step": np.asarray(self.best_step),
            "minimum": self.minimum_labels(),
        }
        params = _expand_columns(self.paths, jax.tree_util.tree_leaves(self.params))
        for name in params:
            if name in columns:
                raise ValueError(
                    f"parameter column {name!r} collides with the record column {name!r}; "
                    "rename the parameter to tabulate this result"
                )
        columns.update(params)
        starts = _expand_columns(self.paths, jax.tree_util.tree_leaves(self.start_params))
        columns.update({_START_PREFIX + k: v for k, v in starts.items()})
        return pd.DataFrame(columns)

    def save(self, path) -> None:
        """Write every field to one ``.npz`` file at ``path`` (exactly that path).

        Arrays (figures of merit, statuses, steps, history, every start's parameters) are NumPy
        arrays in the archive; the rest (``best_fom``, ``best_index``, ``stats``, ``paths``,
        ``config``, the parameter tree) is JSON in its ``__meta__`` entry. Nothing is
        pickled. The covariance at the best fit is saved when it was computed or can be (the
        search's problem is attached): that computes it now if it was not yet; if that fails,
        the Result is saved without it, with a warning. ``stats`` and ``config`` must hold
        JSON values (NumPy scalars and arrays are converted; tuples come back as lists); dict
        keys in the parameter tree must be ``str`` or ``int``.
        """
        leaves = {
            kind: jax.tree_util.tree_leaves(getattr(self, kind))
            for kind in ("params", "start_params", "best_params")
        }
        meta = {
            "format": _FORMAT,
            "version": _VERSION,
            "best_fom": float(self.best_fom),
            "best_index": int(self.best_index),
            "stats": self.stats,
            "paths": list(self.paths),
            "config": self.config,
            "tree": _encode_tree(self.params),
            "n_leaves": len(leaves["params"]),
            "incarnations": [
                {k: (str(v) if k == "status" else v) for k, v in r.items() if "params" not in k}
                for r in self.incarnations
            ],
            "incarnation_keys": list(self.incarnations[0]) if self.incarnations else [],
        }
        fit = self._laplace_for_saving()
        if fit is not None:
            meta["laplace"] = {"scale": fit.scale, "names": list(fit.names)}
        text = json.dumps(meta, default=_json_default, allow_nan=True)
        arrays = {
            "__meta__": np.frombuffer(text.encode("utf-8"), dtype=np.uint8),
            "foms": np.asarray(self.foms),
            "status": np.array([str(s) for s in self.status], dtype=str),
            "n_steps": np.asarray(self.n_steps),
            "n_evals": np.asarray(self.n_evals),
            "at_bound": np.asarray(self.at_bound),
            "best_step": np.asarray(self.best_step),
            "history": np.asarray(self.history),
            "history_steps": np.asarray(self.history_steps),
        }
        for kind, kind_leaves in leaves.items():
            for i, leaf in enumerate(kind_leaves):
                arrays[f"{kind}/{i}"] = np.asarray(leaf)
        arrays["resurrections"] = np.asarray(self.resurrections)
        for kind in ("params", "start_params"):
            per_record = [jax.tree_util.tree_leaves(r[kind]) for r in self.incarnations]
            for i, column in enumerate(zip(*per_record, strict=True)):
                arrays[f"incarnations/{kind}/{i}"] = np.stack([np.asarray(v) for v in column])
        if fit is not None:
            arrays["laplace/covariance"] = fit.covariance
            arrays["laplace/hessian"] = fit.hessian
        with open(os.fspath(path), "wb") as f:
            np.savez_compressed(f, **arrays)

    def _laplace_for_saving(self) -> Laplace | None:
        if self._laplace is not None or self._problem is None or self.best_index < 0:
            return self._laplace
        try:
            # Saving is not the place to warn about nan errors (a short fit is rarely at a
            # minimum): the warning is logged, and the nan errors are saved as they are.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)
                fit = self.laplace
            for w in caught:
                logging.getLogger("multistart").info("Result.save: %s", w.message)
            return fit
        except Exception as e:  # a long fit's record must be saved whatever the Hessian does
            warnings.warn(
                f"Result.save: the covariance could not be computed ({type(e).__name__}: {e}); "
                "saved without it",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    @classmethod
    def merge(cls, parts) -> Result:
        """The Result one run would have given, from the Results of its ``k`` parts.

        Each part is a ``search.fit(..., part=(i, k))`` of the same search, model and start
        plan, given in any order, in memory or as paths that :meth:`save` wrote. Per-start
        records are concatenated in slot order, histories joined (a part that ended sooner
        carries its last row forward, as a whole run does for a start that ended), the best fit
        chosen again; ``stats`` adds up counts (``n_evals``, compiles), keeps the longest time
        (``wall_s``) and says ``n_parts``, and ``stats["parts"]`` keeps each part's own figures.

        Example:
          >>> parts = [search.fit(f, space, part=(i, 3)) for i in range(3)]  # doctest: +SKIP
          >>> whole = ms.Result.merge(parts)  # doctest: +SKIP

        Raises:
          ValueError: a Result that is not a part; parts of different searches, models,
            configurations or start plans (the message says what differs); a part missing
            or given twice; parts of different ``k``.
        """
        return merge_parts(cls, parts)

    @classmethod
    def load(cls, path) -> Result:
        """Read a Result written by :meth:`save` (no pickle is ever loaded)."""
        with np.load(os.fspath(path), allow_pickle=False) as z:
            if "__meta__" not in z.files:
                raise ValueError(f"{os.fspath(path)!r} is not a saved multistart Result")
            meta = json.loads(z["__meta__"].tobytes().decode("utf-8"))
            if meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
                raise ValueError(
                    f"{os.fspath(path)!r}: unknown format {meta.get('format')!r} version "
                    f"{meta.get('version')!r}; this multistart reads {_FORMAT} {_VERSION}"
                )
            n = meta["n_leaves"]

            def tree(kind, scalars=False):
                leaves = [z[f"{kind}/{i}"] for i in range(n)]
                if scalars:  # best_params leaves are per-start values: 0-d back to scalars
                    leaves = [a[()] if a.ndim == 0 else a for a in leaves]
                return _decode_tree(meta["tree"], leaves)

            incarnations = []
            for j, r in enumerate(meta.get("incarnations", [])):
                values = dict(r, status=Status(r["status"]))
                for kind in ("params", "start_params"):
                    leaves = [z[f"incarnations/{kind}/{i}"][j] for i in range(n)]
                    leaves = [a[()] if a.ndim == 0 else a for a in leaves]
                    values[kind] = _decode_tree(meta["tree"], leaves)
                incarnations.append({k: values[k] for k in meta["incarnation_keys"]})
            result = cls(
                best_params=tree("best_params", scalars=True),
                best_fom=float(meta["best_fom"]),
                best_index=int(meta["best_index"]),
                foms=z["foms"],
                params=tree("params"),
                start_params=tree("start_params"),
                status=np.array([Status(s) for s in z["status"]], dtype=object),
                n_steps=z["n_steps"],
                best_step=z["best_step"],
                history=z["history"],
                history_steps=z["history_steps"],
                stats=meta["stats"],
                paths=meta["paths"],
                config=meta["config"],
                resurrections=z["resurrections"],
                incarnations=incarnations,
                n_evals=z["n_evals"] if "n_evals" in z.files else None,
                at_bound=z["at_bound"] if "at_bound" in z.files else None,
            )
            if "laplace" in meta:
                cov = z["laplace/covariance"]
                result._laplace = Laplace(
                    params=result.best_params,
                    covariance=cov,
                    names=tuple(meta["laplace"]["names"]),
                    hessian=z["laplace/hessian"],
                    scale=float(meta["laplace"]["scale"]),
                    errors=unflatten_like(result.best_params, np.sqrt(np.diag(cov))),
                )
            return result

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


def _expand_columns(paths: list[str], leaves: list) -> dict[str, np.ndarray]:
    """``{column: (n_starts,) values}``; an array parameter gives one column per element."""
    out: dict[str, np.ndarray] = {}
    for name, leaf in zip(paths, leaves, strict=True):
        a = np.asarray(leaf)
        if a.ndim == 1:
            out[name] = a
            continue
        for idx in np.ndindex(a.shape[1:]):
            out[f"{name}[{','.join(str(i) for i in idx)}]"] = a[(slice(None), *idx)]
    return out


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"Result.save: {type(x).__name__} {x!r} is not JSON-serialisable")


def _encode_tree(tree, counter=None):
    """A params pytree (nested dicts of arrays) as JSON: dicts as key/value pairs, leaves as
    their index in ``jax.tree_util`` order (which sorts dict keys, as this does)."""
    counter = [0] if counter is None else counter
    if isinstance(tree, dict):
        items = []
        for key in sorted(tree):
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"Result.save: parameter keys must be str or int; got {key!r}")
            items.append([key, _encode_tree(tree[key], counter)])
        return {"dict": items}
    counter[0] += 1
    return {"leaf": counter[0] - 1}


def _decode_tree(code, leaves):
    if "dict" in code:
        return {key: _decode_tree(sub, leaves) for key, sub in code["dict"]}
    return leaves[code["leaf"]]
