"""Factor graphs: one model fitted to several datasets, each dataset its own likelihood term.

A :class:`Factor` is a log-likelihood, its data and (optionally) parameters of its own. A
:class:`FactorGraphModel` joins factors under shared parameters. Each distinct data shape is its
own computation in the compiled program; padded to one grid and stacked under one ``vmap``,
factors compile as one (the figures: ``profiling/README.md``, "Graph padding"), and their own
parameters reach the model stacked too (:mod:`multistart.model.plates`), so the program does not
grow with the number of factors of one kind (``docs/factor-graphs.md``, "Cohorts").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..common import xla
from .plates import GraphParams, GraphSpace, Plate, prior_kind
from .priors import Prior, Space
from .problem import Problem, add_note, check_scalar

__all__ = ["Factor", "FactorGraphModel", "FactorView"]


def _leaf_name(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path) or "<root>"


def _as_data(data, owner: str):
    """The data pytree with every leaf a NumPy array (checked, never copied needlessly)."""

    def convert(path, leaf):
        try:
            arr = np.asarray(leaf)
        except Exception as e:  # noqa: BLE001 - any failure means "not an array"
            raise TypeError(f"{owner}: data leaf {_leaf_name(path)!r} is not an array") from e
        if arr.dtype == object or not (
            np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
        ):
            raise TypeError(
                f"{owner}: data leaf {_leaf_name(path)!r} must be a numeric array; "
                f"got {type(leaf).__name__} of dtype {arr.dtype}"
            )
        return arr

    return jax.tree_util.tree_map_with_path(convert, data)


class _GaussianLogLikelihood:
    """``-½ ‖residuals(params, data)‖²``; equal for equal residual functions, so factors with one
    residual function group (and stack) as factors with one log-likelihood do."""

    def __init__(self, residuals: Callable):
        self.residuals = residuals
        self.__name__ = getattr(residuals, "__name__", type(residuals).__name__)

    def __call__(self, params, data):
        flat, _ = ravel_pytree(self.residuals(params, data))
        return -0.5 * jnp.vdot(flat, flat)

    def __eq__(self, other):
        return isinstance(other, _GaussianLogLikelihood) and _fn_key(other.residuals) == _fn_key(
            self.residuals
        )

    def __hash__(self):
        return hash(("gaussian", _fn_key(self.residuals)))


class Factor:
    """One dataset and its log-likelihood, a term of a :class:`FactorGraphModel`.

    The log-likelihood is called as ``log_likelihood(params, data)`` where ``params`` is ONE
    flat dict, the graph's shared parameters merged with this factor's own, and ``data`` is
    this factor's data (zero-padded when the graph pads). It returns a real scalar, in
    ``jax.numpy``.

    Args:
      log_likelihood: ``log_likelihood(params, data) -> scalar``.
      data: a pytree of arrays (a dict of arrays is usual); it is passed to the compiled
        step as an argument, never baked into the program.
      space: this factor's own parameters, a (nested) dict of priors, or ``None``. In the
        graph's parameters they live under the factor's name: ``best_params[name][param]``.
      name: unique within a graph; defaults to ``"factor_<i>"`` (its position in the graph).

    Raises:
      TypeError: ``log_likelihood`` is not callable, a data leaf is not a numeric array, or
        ``name`` is not a non-empty string.
    """

    def __init__(self, log_likelihood: Callable, data: Any, *, space=None, name=None):
        label = "Factor" if name is None else f"Factor {name!r}"
        if not callable(log_likelihood):
            raise TypeError(
                f"{label}: log_likelihood must be callable as log_likelihood(params, data) "
                f"-> scalar; got {type(log_likelihood).__name__}"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"Factor: name must be a non-empty str or None; got {name!r}")
        if space is not None and not isinstance(space, (dict, Space)):
            raise TypeError(
                f"{label}: space must be a dict of priors or None; got {type(space).__name__}"
            )
        self.log_likelihood = log_likelihood
        self.data = _as_data(data, label)
        self.space = Space(space, argname=f"{label} space") if space else None
        self.name = name
        #: ``residuals(params, data)`` for a factor made by :meth:`from_residuals`, else None
        self.residuals = (
            log_likelihood.residuals if isinstance(log_likelihood, _GaussianLogLikelihood) else None
        )

    @classmethod
    def from_residuals(cls, residuals: Callable, data: Any, *, space=None, name=None) -> Factor:
        """A factor given by its residuals ``residuals(params, data) -> array`` (or pytree).

        Its log-likelihood is the Gaussian ``-½ ‖r‖²`` of ``r = (model - data) / sigma``. A
        graph of such factors is also a least-squares problem
        (:class:`multistart.MultiStartLeastSquares` fits ``Σ ‖r‖²``, the priors being the
        bounds). Padding: a zero-padded entry must give a zero residual.

        Args:
          residuals: ``residuals(params, data)``, ``params`` as a log-likelihood gets them.
          data, space, name: as for :class:`Factor`.
        """
        if not callable(residuals):
            raise TypeError(
                "residuals must be callable as residuals(params, data) -> array; got "
                f"{type(residuals).__name__}"
            )
        return cls(_GaussianLogLikelihood(residuals), data, space=space, name=name)

    def __repr__(self) -> str:
        shapes = [np.shape(x) for x in jax.tree_util.tree_leaves(self.data)]
        own = self.space.paths if self.space else []
        fn = getattr(self.log_likelihood, "__name__", type(self.log_likelihood).__name__)
        return f"Factor({fn}, data shapes {shapes}, own params {own}, name={self.name!r})"


@dataclass(frozen=True)
class FactorView:
    """One factor seen at one fit: what its log-likelihood saw and returned.

    Attributes:
      name: the factor's name.
      params: the flat dict the log-likelihood is called with (shared merged with own).
      own_params: this factor's own parameters (``{}`` if it has none).
      log_likelihood: its log-likelihood there, on its own (unpadded) data.
      data: its own (unpadded) data.
      factor: the :class:`Factor`.
    """

    name: str
    params: dict
    own_params: dict
    log_likelihood: float
    data: Any = field(repr=False)
    factor: Factor = field(repr=False)


@dataclass(frozen=True)
class _Group:
    """Factors evaluated together: one log-likelihood, one data layout (after any padding)."""

    fn: Callable
    names: tuple[str, ...]
    own: bool  # whether these factors have their own parameters
    stacked: bool  # data stacked on a leading factor axis; the log-likelihood vmapped over it


class FactorGraphModel:
    """A model of several datasets: factors joined by shared parameters.

    The figure of merit minimised by ``search.fit(graph)`` is
    ``-2 * (sum_f log_likelihood_f + log_prior)``, with ``log_prior`` the sum of every prior's
    ``log_prob`` (shared and per-factor) at the physical parameters. Parameters are one pytree:
    the shared space's entries at the top level and each factor's own under its name,
    ``{"x0": ..., "g": {"flux": ...}, "r": {"flux": ...}}``.

    Args:
      factors: a non-empty sequence of :class:`Factor`; their data may differ in shape.
      space: the shared parameters, a (nested) dict of priors, or ``None``.
      pad_to_common_shape: zero-pad the data of factors that share a ``log_likelihood``
        object, a data layout (pytree structure, leaf ranks and dtypes) and an own-parameter
        layout, at the end of every axis to the largest size in the group, so the group
        compiles as one kernel. Exact only if a zero-padded entry contributes nothing: carry a
        weight, inverse-sigma or mask array in the data and multiply by it
        (:meth:`check_padding` checks).
      vmap_factors: stack each group of two or more factors with identical layouts (after any
        padding), their own parameters as one array a parameter with a factor axis, and
        ``jax.vmap`` the log-likelihood over it: the same to rounding, and a program whose size
        does not grow with the number of factors in the group.
      name: a short name for logs and errors.

    Raises:
      ValueError / TypeError: an empty graph, a non-Factor entry, duplicate factor names, a
        factor name or own parameter colliding with a shared parameter, a graph with no
        parameters, or a log-likelihood that does not return a real scalar (found by tracing
        with ``jax.eval_shape``; nothing is compiled).

    Example:
      >>> import jax.numpy as jnp, numpy as np, multistart as ms
      >>> def loglike(p, d):
      ...     return -0.5 * jnp.sum(((d["y"] - p["a"] * d["x"] - p["b"]) / d["sigma"]) ** 2)
      >>> bands = [ms.Factor(loglike, {"x": np.arange(n, dtype=float),
      ...                              "y": 2.0 * np.arange(n) + 1.0,
      ...                              "sigma": np.ones(n)},
      ...                    space={"b": ms.Uniform(-5.0, 5.0)}, name=f"band{n}")
      ...          for n in (8, 12)]
      >>> graph = ms.FactorGraphModel(bands, space={"a": ms.Uniform(0.0, 5.0)})
      >>> result = ms.MultiStartAdam(n_starts=8, n_steps=300).fit(graph)  # doctest: +SKIP
      >>> result.best_params["band8"]["b"]  # doctest: +SKIP
      >>> graph.factor_views(result)["band8"].log_likelihood  # doctest: +SKIP
    """

    def __init__(
        self,
        factors: Sequence[Factor],
        space=None,
        *,
        pad_to_common_shape: bool = False,
        vmap_factors: bool = True,
        name: str = "factor graph",
    ):
        self.factors = _check_factors(factors)
        self.names = tuple(_factor_names(self.factors))
        self.shared = Space(space, argname="space") if space else None
        self.pad_to_common_shape = _check_flag(pad_to_common_shape, "pad_to_common_shape")
        self.vmap_factors = _check_flag(vmap_factors, "vmap_factors")
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str; got {name!r}")
        self.name = name
        self._by_name = dict(zip(self.names, self.factors, strict=True))
        self._groups, self._data = _build_groups(
            self.factors, self.names, self.pad_to_common_shape, self.vmap_factors
        )
        plates = [Plate(g.names, g.own, g.stacked) for g in self._groups]
        shared = tuple(self.shared.tree) if self.shared else ()
        self.space = GraphSpace(
            self._graph_space_tree(), shared, plates, argname="the graph's parameters"
        )
        self._check_log_likelihoods(jax.dtypes.canonicalize_dtype(jnp.float64))  # no array made
        self._jitted: dict[Any, Callable] = {}

    # -- construction checks -------------------------------------------------------------

    def _graph_space_tree(self) -> dict:
        shared = dict(self.shared.tree) if self.shared else {}
        tree = dict(shared)
        for i, (name, f) in enumerate(zip(self.names, self.factors, strict=True)):
            if name in shared:
                raise ValueError(
                    f"factors[{i}] is named {name!r}, which is also a shared parameter in "
                    "space: per-factor parameters live under the factor's name, so rename one"
                )
            if f.space is None:
                continue
            for key in f.space.tree:
                if key in shared:
                    raise ValueError(
                        f"factors[{i}] ({name!r}): its own parameter {key!r} collides with "
                        f"the shared parameter {key!r}; the log-likelihood sees shared and own "
                        "parameters in one dict, so rename one"
                    )
            tree[name] = f.space.tree
        if not tree:
            raise ValueError(
                "FactorGraphModel has no parameters: give shared priors with space= or a "
                "factor its own with Factor(..., space=)"
            )
        return tree

    def _check_log_likelihoods(self, dtype) -> None:
        example = self.space.example_tree(dtype)
        for name, f in zip(self.names, self.factors, strict=True):
            params = self.factor_params(example, name)
            try:
                out = jax.eval_shape(f.log_likelihood, params, f.data)
            except Exception as e:
                add_note(
                    e, f"multistart: raised while tracing the log_likelihood of factor {name!r}"
                )
                raise
            check_scalar(out, f"factor {name!r}: log_likelihood")

    # -- the problem the search fits ------------------------------------------------------

    def multistart_problem(self) -> Problem:
        """The :class:`multistart.model.problem.Problem` a search fits (data as an argument)."""
        return Problem(fom=self._fom, space=self.space, data=self._data, name=self.name, model=self)

    def _fom(self, params, data):
        params = self.space.view(params)
        return -2.0 * (self._total_log_likelihood(params, data) + self.space.log_prob(params))

    def _total_log_likelihood(self, params, data):
        total: Any = 0.0
        for term in self._terms(params, data, lambda group: group.fn):
            total = total + jnp.sum(term)
        return total

    def multistart_residual_problem(self):
        """``(residuals, space, data, name)`` for a least-squares search: every factor's
        residuals, as one tuple (padded and stacked as the log-likelihoods are).

        Raises:
          TypeError: a factor was not made with :meth:`Factor.from_residuals`.
        """
        plain = [n for n, f in zip(self.names, self.factors, strict=True) if f.residuals is None]
        if plain:
            raise TypeError(
                f"a least-squares fit of a graph needs residuals from every factor; "
                f"{', '.join(map(repr, plain))} give a log-likelihood only: make them with "
                "Factor.from_residuals(residuals, data, ...)"
            )
        return self._all_residuals, self.space, self._data, self.name

    def _all_residuals(self, params, data):
        return tuple(self._terms(params, data, lambda group: group.fn.residuals))

    def _terms(self, params, data, fn_of: Callable) -> list:
        """``fn_of(group)`` of each factor (one vmapped term for a stacked group), in order;
        ``params`` the params pytree or its :class:`GraphParams`."""
        params = self.space.view(params)
        if isinstance(params, GraphParams):
            return self._stacked_terms(params, data, fn_of)
        shared = self._shared_params(params)
        out = []
        for group, gdata in zip(self._groups, data, strict=True):
            fn = fn_of(group)
            if group.stacked:
                own = _stack([params[n] for n in group.names]) if group.own else {}

                def one(o, d, fn=fn):
                    return fn({**shared, **o}, d)

                out.append(jax.vmap(one)(own, gdata))
            else:
                for n, d in zip(group.names, gdata, strict=True):
                    out.append(fn({**shared, **(params[n] if group.own else {})}, d))
        return out

    def _stacked_terms(self, params: GraphParams, data, fn_of: Callable) -> list:
        """:meth:`_terms` at the model's view: a stacked group's own parameters arrive
        stacked, so its term is one ``vmap`` whatever the number of its factors."""
        shared, out = params.shared, []
        for group, own, gdata in zip(self._groups, params.own, data, strict=True):
            fn = fn_of(group)
            if group.stacked:

                def one(o, d, fn=fn):
                    return fn({**shared, **o}, d)

                out.append(jax.vmap(one)(own, gdata))
            else:
                for o, d in zip(own, gdata, strict=True):
                    out.append(fn({**shared, **o}, d))
        return out

    def _shared_params(self, params) -> dict:
        return {k: params[k] for k in self.shared.tree} if self.shared else {}

    # -- evaluating at a fit ---------------------------------------------------------------

    def factor_params(self, params, name: str) -> dict:
        """The flat dict factor ``name``'s log-likelihood is called with at graph ``params``."""
        factor = self._factor(name)
        own = params[name] if factor.space is not None else {}
        return {**self._shared_params(params), **own}

    def log_likelihoods(self, params) -> dict[str, float]:
        """Each factor's log-likelihood at graph ``params``, on its own (unpadded) data."""
        return {
            name: float(self._jit(f.log_likelihood)(self.factor_params(params, name), f.data))
            for name, f in zip(self.names, self.factors, strict=True)
        }

    def log_prior(self, params) -> float:
        """Sum of every prior's ``log_prob`` at graph ``params`` (physical)."""
        return float(self._jit(self.space.log_prob)(self.space.view(params)))

    def fom(self, params) -> float:
        """The figure of merit a search minimises, at graph ``params``, as the search sees it
        (padded and stacked as configured)."""
        return float(self._jit(self._fom)(self.space.view(params), self._data))

    def factor_views(
        self, fit, start: int | None = None, *, names: Sequence[str] | None = None
    ) -> dict[str, FactorView]:
        """Per-factor views of a fit: each factor's parameters and log-likelihood.

        Args:
          fit: a :class:`multistart.Result` of this graph, or a graph params pytree.
          start: with a Result, view this start's best parameters instead of the best fit.
          names: only these factors (default: every one; a cohort's thousands take a call
            each).

        Returns:
          ``{factor name: FactorView}`` in graph order (or in the order of ``names``).
        """
        params = _params_of(fit, start)
        out = {}
        for name in self.names if names is None else names:
            f = self._factor(name)
            p = self.factor_params(params, name)
            out[name] = FactorView(
                name=name,
                params=p,
                own_params=params[name] if f.space is not None else {},
                log_likelihood=float(self._jit(f.log_likelihood)(p, f.data)),
                data=f.data,
                factor=f,
            )
        return out

    def factor_rows(self, params) -> dict[str, np.ndarray]:
        """Each factor's row of a table at graph ``params``, as columns in graph order.

        Columns: ``factor`` (the name), ``group`` (which of the graph's kernels evaluates it,
        0, 1, ...: factors of one group were stacked), ``log_likelihood`` (on the data as the
        search sees it, padded: equal to :meth:`log_likelihoods` where the padding is exact,
        :meth:`check_padding`), ``log_prior`` (its own parameters' priors), ``fom`` (its
        contribution to the figure of merit, ``-2 (log_likelihood + log_prior)``: the column
        sums to the figure of merit less ``-2`` times the shared priors' log-density), then each
        own parameter by name (``"flux"``, ``"tilt[1]"``; ``nan`` for a factor without it).
        One compiled call a kind of factor (and one a distinct own prior): no per-factor loop
        on the device.
        """
        view = self.space.view(jax.tree_util.tree_map(np.asarray, params))
        terms = self._jit(self._term_list)(view, self._data)
        ll, group = {}, {}
        for g, (grp, term) in enumerate(zip(self._groups, terms, strict=True)):
            values = np.atleast_1d(np.asarray(term, dtype=np.float64))
            for n, v in zip(grp.names, values, strict=True):
                ll[n], group[n] = float(v), g
        prior = self._own_log_priors(params)
        names = list(self.names)
        rows: dict[str, Any] = {
            "factor": np.array(names, dtype=object),
            "group": np.array([group[n] for n in names]),
            "log_likelihood": np.array([ll[n] for n in names]),
            "log_prior": np.array([prior.get(n, 0.0) for n in names]),
        }
        rows["fom"] = -2.0 * (rows["log_likelihood"] + rows["log_prior"])
        own: dict[str, dict[str, float]] = {}
        for n, f in zip(names, self.factors, strict=True):
            if f.space is not None:
                own[n] = _flat_dict(params[n])
        columns = list(dict.fromkeys(c for values in own.values() for c in values))
        for c in columns:
            if c in rows:
                raise ValueError(
                    f"own parameter {c!r} collides with the table's column {c!r}; rename the "
                    "parameter to tabulate this graph"
                )
            rows[c] = np.array([own.get(n, {}).get(c, np.nan) for n in names])
        return rows

    def _term_list(self, params, data):
        return self._terms(params, data, lambda group: group.fn)

    def _own_log_priors(self, params) -> dict[str, float]:
        """Each factor's own priors' log-density at ``params``: one ``vmap`` a distinct prior
        (a cohort's thousands of ``Normal(0, 0.3)`` are one call)."""
        calls: dict[Any, tuple[Prior, list[str], list]] = {}
        for n, f in zip(self.names, self.factors, strict=True):
            if f.space is None:
                continue
            for path, prior, leaf in zip(
                f.space.paths, f.space.priors, f.space.leaves(params[n]), strict=True
            ):
                key = (type(prior), repr(prior), path)
                calls.setdefault(key, (prior, [], []))
                calls[key][1].append(n)
                calls[key][2].append(np.asarray(leaf, dtype=np.float64))
        out: dict[str, float] = {}
        for key, (prior, names, values) in calls.items():
            if ("log_prior", key) not in self._jitted:
                self._jitted["log_prior", key] = xla.jit(jax.vmap(prior.log_prob))
            got = np.asarray(self._jitted["log_prior", key](np.stack(values)), dtype=np.float64)
            for n, v in zip(names, got, strict=True):
                out[n] = out.get(n, 0.0) + float(v)
        return out

    def check_padding(self, params=None, *, rtol: float = 1e-5, atol: float = 1e-6) -> float:
        """Check that padding leaves each factor's log-likelihood unchanged.

        Evaluates every factor on its own and its padded data at ``params`` (default: every
        prior's centre); returns the largest absolute difference (``0.0`` when the graph does
        not pad). Compiles each factor twice: call it once, not in a loop.

        Raises:
          ValueError: naming the first factor whose log-likelihood changed under padding.
        """
        if not self.pad_to_common_shape:
            return 0.0
        if params is None:
            params = self.space.from_unit([np.full(p.shape, 0.5) for p in self.space.priors])
        worst = 0.0
        for group, gdata in zip(self._groups, self._data, strict=True):
            for i, n in enumerate(group.names):
                d = (
                    jax.tree_util.tree_map(lambda a, i=i: a[i], gdata)
                    if group.stacked
                    else gdata[i]
                )
                p = self.factor_params(params, n)
                padded = float(self._jit(group.fn)(p, d))
                own = float(self._jit(group.fn)(p, self._by_name[n].data))
                diff = abs(padded - own)
                if not diff <= atol + rtol * abs(own):
                    raise ValueError(
                        f"factor {n!r}: log-likelihood {padded!r} on padded data differs from "
                        f"{own!r} on its own data; zero-padded entries must contribute nothing "
                        "(multiply by a weight or mask array carried in the data)"
                    )
                worst = max(worst, diff)
        return worst

    def _factor(self, name: str) -> Factor:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no factor named {name!r}; factors are {list(self.names)}") from None

    def _jit(self, fn: Callable) -> Callable:
        key = _fn_key(fn)
        if key not in self._jitted:
            self._jitted[key] = xla.jit(fn)
        return self._jitted[key]

    def __repr__(self) -> str:
        groups = ", ".join(
            f"{'stacked ' if g.stacked else ''}{list(g.names)}" for g in self._groups
        )
        return (
            f"FactorGraphModel({len(self.factors)} factors, {self.space.n_dims} parameters, "
            f"groups: {groups})"
        )


# -- helpers ---------------------------------------------------------------------------------


def _check_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return value


def _check_factors(factors) -> list[Factor]:
    if isinstance(factors, Factor) or not isinstance(factors, Sequence):
        raise TypeError(
            f"factors must be a list of multistart.Factor; got {type(factors).__name__}"
        )
    if not factors:
        raise ValueError("factors is empty: a FactorGraphModel needs at least one Factor")
    for i, f in enumerate(factors):
        if not isinstance(f, Factor):
            raise TypeError(f"factors[{i}] must be a multistart.Factor; got {type(f).__name__}")
    return list(factors)


def _factor_names(factors: list[Factor]) -> list[str]:
    names: list[str] = []
    for i, f in enumerate(factors):
        name = f.name if f.name is not None else f"factor_{i}"
        if name in names:
            raise ValueError(
                f"factors[{i}] is named {name!r}, like factors[{names.index(name)}]: "
                "factor names must be unique (give each Factor its own name=)"
            )
        names.append(name)
    return names


def _layout_key(f: Factor, exact_shapes: bool):
    """Factors with equal keys can share a kernel (after padding when ``exact_shapes`` is off):
    one log-likelihood, one data layout, and own parameters of one structure whose priors are
    of one kind, parameter by parameter (so that they stack: :func:`prior_kind`)."""
    leaves, treedef = jax.tree_util.tree_flatten(f.data)
    data = tuple((a.shape if exact_shapes else a.ndim, a.dtype.str) for a in leaves)
    own = None
    if f.space is not None:
        priors = jax.tree_util.tree_leaves(f.space.tree, is_leaf=lambda x: isinstance(x, Prior))
        own = (f.space.treedef, tuple(prior_kind(p) for p in priors))
    return (_fn_key(f.log_likelihood), treedef, data, own)


def _fn_key(fn: Callable):
    """A dict key for a callable: itself when hashable (``obj.method`` twice is one key), else
    its identity."""
    try:
        hash(fn)
    except TypeError:
        return ("id", id(fn))
    return fn


def _pad_to(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if arr.shape == shape:
        return arr
    return np.pad(arr, [(0, t - s) for s, t in zip(arr.shape, shape, strict=True)])


def _pad_group(datas: list) -> list:
    """Zero-pad each leaf position to the largest shape among ``datas`` (same layouts)."""
    flat = [jax.tree_util.tree_flatten(d) for d in datas]
    treedef = flat[0][1]
    columns = list(zip(*(leaves for leaves, _ in flat), strict=True))  # one per leaf position
    targets = [tuple(int(s) for s in np.max([a.shape for a in col], axis=0)) for col in columns]
    return [
        jax.tree_util.tree_unflatten(
            treedef, [_pad_to(a, t) for a, t in zip(leaves, targets, strict=True)]
        )
        for leaves, _ in flat
    ]


def _stack(trees: list):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def _build_groups(factors, names, pad: bool, stack: bool):
    """``(groups, data)``: factors that can share a kernel, in order of first appearance, and
    each group's data, padded and stacked as configured."""
    buckets: dict[Any, list[int]] = {}
    for i, f in enumerate(factors):
        key = _layout_key(f, exact_shapes=not pad)
        buckets.setdefault(key, []).append(i)
    groups, data = [], []
    for idx in buckets.values():
        datas = [factors[i].data for i in idx]
        if pad and len(idx) > 1:
            datas = _pad_group(datas)
        f0 = factors[idx[0]]
        # vmap needs an axis to map: data leaves or own parameters
        mappable = bool(jax.tree_util.tree_leaves(datas[0])) or f0.space is not None
        stacked = stack and len(idx) > 1 and mappable
        names_of = tuple(names[i] for i in idx)
        groups.append(_Group(f0.log_likelihood, names_of, f0.space is not None, stacked))
        data.append(
            jax.tree_util.tree_map(lambda *xs: np.stack(xs), *datas) if stacked else tuple(datas)
        )
    return groups, tuple(data)


def _flat_dict(tree) -> dict[str, float]:
    """A params (sub)tree as ``{flat name: value}``: ``"b"``, ``"tilt[1]"``, ``"g.flux"``."""
    out: dict[str, float] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = _leaf_name(path)
        a = np.asarray(leaf, dtype=np.float64)
        if a.shape == ():
            out[name] = float(a)
        else:
            for i in np.ndindex(a.shape):
                out[f"{name}[{','.join(map(str, i))}]"] = float(a[i])
    return out


def _params_of(fit, start):
    # a Result, read by what it holds: the model does not import the Result that fits it
    if hasattr(fit, "best_params") and hasattr(fit, "params"):
        if start is None:
            return fit.best_params
        return jax.tree_util.tree_map(lambda a: np.asarray(a)[start], fit.params)
    if start is not None:
        raise TypeError("start is only meaningful with a Result")
    return fit
