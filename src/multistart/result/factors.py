"""A factor graph's Result factor by factor: a table of a row a factor, and a figure of each
factor's data against its model (a cohort's patients, a survey's galaxies)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .plot import PLOTS_HINT

__all__ = ["factor_table", "graph_of", "plot_factors"]

#: ``factor``, ``group``, ``log_likelihood``, ``log_prior``, ``fom``: then the own parameters
RECORD_COLUMNS = 5


def graph_of(result) -> Any:
    """The factor graph a Result was fitted to (attached with its problem).

    Raises:
      ValueError: the Result has no problem (loaded, or made by hand: attach the graph), or its
        problem is not a factor graph's.
    """
    problem = result._uncertainty.problem
    if problem is None:
        raise ValueError(
            "this Result has no graph attached (it was loaded, or built by hand): call "
            "result.attach_problem(graph) first"
        )
    graph = getattr(problem, "model", None)
    if graph is None or not hasattr(graph, "factor_rows"):
        raise ValueError(
            f"{problem.name!r} is not a factor graph: a table of factors needs a Result of "
            "ms.FactorGraphModel"
        )
    return graph


def _params(result, start: int | None):
    if start is None:
        if result.best_index < 0:
            raise ValueError("no start reached a finite figure of merit: no fit to tabulate")
        return result.best_params
    if not isinstance(start, (int, np.integer)) or not 0 <= start < result.n_starts:
        raise ValueError(f"start must be an int in [0, {result.n_starts}); got {start!r}")
    return jax.tree_util.tree_map(lambda a: np.asarray(a)[start], result.params)


def factor_table(result, start: int | None = None, *, errors: bool = True):
    """See :meth:`multistart.Result.factor_table`."""
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError(
            f"Result.factor_table() needs pandas; install it with {PLOTS_HINT}"
        ) from e
    graph = graph_of(result)
    params = _params(result, start)
    rows = graph.factor_rows(params)
    table = pd.DataFrame(rows).set_index("factor")
    if errors:
        fit = result.laplace if start is None else result._uncertainty.at(params)
        std = dict(zip(fit.names, fit.std, strict=True))
        names = list(table.index)
        for c in list(rows)[RECORD_COLUMNS:]:
            # a fixed parameter has no error of its own (0, as result.errors gives it)
            table[f"error:{c}"] = [
                std.get(f"{n}.{c}", 0.0) if np.isfinite(rows[c][i]) else np.nan
                for i, n in enumerate(names)
            ]
    return table


def plot_factors(
    result,
    curve: Callable,
    *,
    x: str,
    y: str,
    factors: Sequence[str] | int = 12,
    ncols: int = 4,
    points: int = 200,
):
    """See :meth:`multistart.Result.plot_factors`."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            f"Result.plot_factors() needs matplotlib; install it with {PLOTS_HINT}"
        ) from e
    if not callable(curve):
        raise TypeError(
            f"curve must be callable as curve(params, data, x) -> y; got {type(curve).__name__}"
        )
    graph = graph_of(result)
    names = _chosen(graph, factors)
    if not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be a positive int; got {ncols!r}")
    views = graph.factor_views(result, names=names)
    for n in names:
        for key in (x, y):
            if not isinstance(views[n].data, dict) or key not in views[n].data:
                raise KeyError(f"factor {n!r} has no data key {key!r} (x= and y= name them)")
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(
        nrows,
        min(ncols, len(names)),
        figsize=(3 * min(ncols, len(names)), 2.4 * nrows),
        squeeze=False,
        layout="constrained",
    )
    for ax, n in zip(axes.ravel(), names, strict=False):
        view = views[n]
        xs, ys = np.asarray(view.data[x]), np.asarray(view.data[y])
        ax.plot(xs, ys, "o", ms=3, color="black", label="data")
        grid = np.linspace(xs.min(), xs.max(), points)
        ax.plot(
            grid, np.asarray(curve(view.params, view.data, grid)), color="crimson", label="model"
        )
        ax.set_title(f"{n}  (log L {view.log_likelihood:.4g})", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(names) :]:
        ax.set_visible(False)
    axes[0, 0].legend(fontsize=7)
    fig.supxlabel(x, fontsize=9)
    fig.supylabel(y, fontsize=9)
    return fig


def _chosen(graph, factors) -> list[str]:
    """The factors to draw: the first ``factors`` of the graph, or those named."""
    if isinstance(factors, (int, np.integer)) and not isinstance(factors, bool):
        if factors < 1:
            raise ValueError(f"factors must be a positive int or a list of names; got {factors}")
        return list(graph.names[: int(factors)])
    if isinstance(factors, str) or not isinstance(factors, Sequence) or not factors:
        raise TypeError(
            f"factors must be a positive int or a non-empty list of factor names; got {factors!r}"
        )
    unknown = [n for n in factors if n not in graph.names]
    if unknown:
        raise KeyError(f"no factor named {unknown[0]!r}; factors are {list(graph.names)[:10]}...")
    return list(factors)
