"""``result.report()``: the fit in words, as lmfit's ``fit_report`` gives one.

Three blocks: the fit (rule, float type, best figure of merit and, where the number of data is
known, the reduced χ²; how the starts ended; the distinct minima; why the search stopped), the
parameters (value, error, relative error, prior and a flag for one on a bound, under the
covariance's convention), and the correlations above a threshold.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import numpy as np

from ..model.priors import HalfBounded, LogUniform, Normal, Uniform
from .laplace import flat_names, flat_values, leaf_paths

__all__ = ["report"]

MIN_CORRELATION = 0.1  # correlations smaller in magnitude are not listed


def report(result: Any, *, min_correlation: float = MIN_CORRELATION) -> str:
    """The report of ``result`` (a ``Result``; typed ``Any`` because ``core`` imports this module,
    so importing ``core`` here, even for the type, would be the cycle the import layers forbid).
    The covariance is computed if it was not yet. A batch's Result (``curve_fit(batched=True)``)
    is many fits, not one: its report says so and points to each fit's."""
    if "rows_per_datum" in result.stats:
        return _batch_lines(result)
    laplace, why = _laplace(result)
    lines = ["[[Fit]]", *_fit_lines(result)]
    if laplace is None:
        lines += ["[[Parameters]]", f"    (no errors: {why})", *_values_only(result)]
        return "\n".join(lines)
    lines += [f"[[Parameters]]   covariance: {laplace.convention}", *_parameter_lines(result)]
    pairs = _correlations(laplace, min_correlation)
    if pairs:
        lines += [f"[[Correlations]]   (|r| > {min_correlation:g})", *pairs]
    return "\n".join(lines)


def _batch_lines(result: Any) -> str:
    """A batch's search in words: no best over different datasets, no minima across them."""
    stats, k = result.stats, int(result.stats["rows_per_datum"])
    counts = ", ".join(f"{key} {v}" for key, v in result.status_counts().items())
    config = result.config
    return "\n".join(
        [
            "[[Batch]]",
            f"    rule               {config.get('rule', '?')} ({config.get('search', '?')}), "
            f"{result.fit_dtype.name}",
            f"    fits               {result.n_starts // k} datasets x {k} starts, each fit "
            "apart: no best or minima across them",
            f"    starts             {counts}",
            f"    stopped            {stats.get('stop_reason', '?')}: "
            f"{stats.get('n_steps_run', '?')} steps, {stats.get('n_evals', '?')} evaluations",
            "    each fit:          fits.report(i) (fits: curve_fit's BatchFits); the batch: "
            "fits.report()",
        ]
    )


def _fit_lines(result: Any) -> list[str]:
    config, stats = result.config, result.stats
    rule = f"{config.get('rule', '?')} ({config.get('search', '?')}), {result.fit_dtype.name}"
    best = f"{result.best_fom!r} (start {result.best_index} of {result.n_starts})"
    laplace = result._uncertainty.laplace  # only what was computed: no compile here
    if laplace is not None and laplace.reduced_chi2 is not None:
        best += f"; reduced χ² {laplace.reduced_chi2:.6g} ({laplace.dof} degrees of freedom)"
    counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
    minima = result.distinct_minima()
    found = "none" if not minima else f"{len(minima)} ({minima[0].n_starts} at the best)"
    stopped = (
        f"{stats.get('stop_reason', '?')}: {stats.get('n_steps_run', '?')} steps, "
        f"{stats.get('n_evals', '?')} evaluations"
    )
    return [
        f"    rule               {rule}",
        f"    figure of merit    {best}",
        f"    starts             {counts}",
        f"    distinct minima    {found}",
        f"    stopped            {stopped}",
    ]


def _laplace(result: Any):
    """``(laplace, None)``, or ``(None, why)`` where the errors cannot be had."""
    try:
        with warnings.catch_warnings():  # the report says what the warnings would
            warnings.simplefilter("ignore", RuntimeWarning)
            return result.laplace, None
    except ValueError as e:
        return None, str(e).split(":")[0]


def _parameter_lines(result: Any) -> list[str]:
    laplace = result.laplace
    names = list(laplace.names)
    values = dict(zip(_sorted_names(result), flat_values(laplace.params), strict=True))
    priors, on_bound = _priors(result)
    held = [n for n in _written_names(result) if n in values and n not in names]  # fixed
    width = max(len(n) for n in names + held)
    rows = [f"    {'name':{width}s}  {'value':>13s}  {'error':>11s}  {'relative':>9s}  prior"]
    for name, error in zip(names, laplace.std, strict=True):
        value = values[name]
        rel = abs(error / value) if value != 0 and np.isfinite(error) else float("nan")
        flag = "  on a bound" if name in on_bound else ""
        rows.append(
            f"    {name:{width}s}  {value:13.7g}  {error:11.5g}  {_percent(rel):>9s}  "
            f"{priors.get(name, '')}{flag}"
        )
    for name in held:  # as lmfit's report: the value, "(fixed)" for its error
        rows.append(f"    {name:{width}s}  {values[name]:13.7g}  {'(fixed)':>11s}")
    return rows


def _values_only(result: Any) -> list[str]:
    values = flat_values(result.best_params)
    return [f"    {n} = {v:.7g}" for n, v in zip(_sorted_names(result), values, strict=True)]


def _written_names(result: Any) -> list[str]:
    """Flat names in the order of ``result.paths`` (the space's as written)."""
    shape = dict(zip(leaf_paths(result.best_params), map(np.shape, _leaves(result)), strict=True))
    return flat_names(
        [p for p in result.paths if p in shape], [shape[p] for p in result.paths if p in shape]
    )


def _leaves(result: Any) -> list:
    return jax.tree_util.tree_leaves(result.best_params)


def _sorted_names(result: Any) -> list[str]:
    """Flat names in ``jax.tree_util`` order (the order of ``flat_values``)."""
    leaves = [np.shape(v) for v in jax.tree_util.tree_leaves(result.best_params)]
    return flat_names(leaf_paths(result.best_params), leaves)


def _priors(result: Any) -> tuple[dict[str, str], set[str]]:
    """Each flat parameter's prior in words, and those of the best fit on a bound."""
    problem = result._uncertainty.problem
    if problem is None:
        return {}, set()
    space = problem.space
    out: dict[str, str] = {}
    for path, prior in zip(space.paths, space.priors, strict=True):
        for name in flat_names([path], [prior.shape]):
            out[name] = _prior_words(prior, name, path)
    one = jax.tree_util.tree_map(lambda a: np.asarray(a)[None], result.best_params)
    _, names = space.near_bound(one)
    return out, set(names.get(0, []))


def _prior_words(prior, name: str, path: str) -> str:
    index = () if name == path else tuple(int(i) for i in name[len(path) + 1 : -1].split(","))

    def at(a) -> float:
        return float(np.asarray(a)[index]) if index else float(np.asarray(a))

    if isinstance(prior, LogUniform):
        return f"[{at(prior.lower):.4g}, {at(prior.upper):.4g}] log"
    if isinstance(prior, Uniform):
        return f"[{at(prior.lower):.4g}, {at(prior.upper):.4g}]"
    if isinstance(prior, Normal):
        return f"normal({at(prior.mean):.4g}, {at(prior.sigma):.4g})"
    if isinstance(prior, HalfBounded):
        b = at(prior.bound)
        return f"[{b:.4g}, inf)" if prior.sign > 0 else f"(-inf, {b:.4g}]"
    return type(prior).__name__


def _percent(rel: float) -> str:
    return "nan" if not np.isfinite(rel) else f"{100 * rel:.3g} %"


def _correlations(laplace, threshold: float) -> list[str]:
    names = laplace.names
    if hasattr(laplace, "correlated_pairs"):  # a graph's arrow: never the n x n correlation
        found = laplace.correlated_pairs(threshold)
        pairs = [(abs(r), f"    C({names[i]}, {names[j]}) = {r:+.3f}") for i, j, r in found]
        return [line for _, line in sorted(pairs, reverse=True)]
    corr = laplace.correlation
    pairs = [
        (abs(corr[i, j]), f"    C({names[i]}, {names[j]}) = {corr[i, j]:+.3f}")
        for i in range(len(names))
        for j in range(i + 1, len(names))
        if np.isfinite(corr[i, j]) and abs(corr[i, j]) > threshold
    ]
    return [line for _, line in sorted(pairs, reverse=True)]
