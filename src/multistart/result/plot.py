"""A Result's figure: every start's best-so-far curve, and the distinct minima beside it."""

from __future__ import annotations

import numpy as np

__all__ = ["plot", "PLOTS_HINT"]

PLOTS_HINT = "pip install 'multistart[plots]'"


def plot(result, *, max_minima: int = 20):
    """See :meth:`multistart.Result.plot`."""
    try:
        import matplotlib as mpl
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401  (mpl.ticker below)
    except ImportError as e:
        raise ImportError(f"Result.plot() needs matplotlib; install it with {PLOTS_HINT}") from e
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10, 4), width_ratios=(3, 1), sharey=True, layout="constrained"
    )
    _curves(result, left, mpl.colormaps["viridis"])
    _minima(result, right, max_minima, mpl.ticker)
    return fig


def _curves(result, ax, colours) -> None:
    steps, hist = np.asarray(result.history_steps), np.asarray(result.history)
    order = result.ranked()[::-1]  # worst first, so the best curves are drawn on top
    for rank, i in enumerate(order):
        keep = steps <= max(int(result.n_steps[i]), 1)
        colour = colours(rank / max(len(order) - 1, 1))
        ax.plot(steps[keep], hist[keep, i], color=colour, lw=0.7, alpha=0.6)
    if result.best_index >= 0:
        keep = steps <= max(int(result.n_steps[result.best_index]), 1)
        ax.plot(steps[keep], hist[keep, result.best_index], color="crimson", label="best")
        ax.legend(loc="upper right", fontsize=8)
    finite = hist[np.isfinite(hist)]
    if finite.size and finite.min() > 0:
        ax.set_yscale("log")
    if steps.size and steps.max() > 1:
        ax.set_xscale("log")
    ax.set(xlabel="step", ylabel="best figure of merit so far")
    ax.set_title(f"{result.n_starts} starts (colour: final rank, yellow best)", fontsize=10)
    _rungs(result, ax)


def _rungs(result, ax) -> None:
    """The halving schedule's rungs (evaluations of a start) as dotted lines, with the starts
    each pruned. A rule with one evaluation a step reaches a rung at that step."""
    rungs = result.stats.get("rungs")
    if not rungs:
        return
    for k, (at, pruned) in enumerate(zip(rungs["evals"], rungs["pruned"], strict=True)):
        ax.axvline(at, color="grey", ls=":", lw=0.8)
        ax.annotate(
            f"rung {k}: {pruned} pruned",
            (at, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="grey",
        )


def _minima(result, ax, max_minima: int, ticker) -> None:
    minima = result.distinct_minima()[:max_minima]
    ranks = np.arange(1, len(minima) + 1)
    counts = np.array([m.n_starts for m in minima])
    ax.scatter(ranks, [m.fom for m in minima], s=20 + 180 * counts / max(result.n_starts, 1))
    for r, m in zip(ranks, minima, strict=True):
        ax.annotate(str(m.n_starts), (r, m.fom), textcoords="offset points", xytext=(6, 4))
    ax.set(xlabel="distinct minimum (best first)")
    ax.set_title("minima (label: starts reaching it)", fontsize=10)
    # Whole ranks only, even when one is all the view holds: MaxNLocator's default wants two
    # integers in view and otherwise falls back to 0.6, 0.8, ... (overprinted in this panel).
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, min_n_ticks=1))
    if len(minima):
        ax.set_xlim(0.5, len(minima) + 0.5)
