"""The multi-band demo: a synthetic galaxy imaged in three bands, fitted as one factor graph.

Everything is generated here, deterministically: a two-component elliptical source with
per-band fluxes, seen through a Gaussian PSF (applied analytically, so the model is exact) on
three pixel grids of the same 6" x 6" field, with Gaussian noise.

``multistart demo`` (see :mod:`multistart.__main__`) calls :func:`run`; :func:`demo_graph` and
:data:`TRUTH` are the pieces to reuse.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .common import log
from .common.status import Status
from .model.graph import Factor, FactorGraphModel
from .model.priors import LogUniform, Uniform
from .result import Result
from .result.laplace import flat_names, flat_values, leaf_paths
from .search.gradient import MultiStartProdigy

__all__ = [
    "Band",
    "BANDS",
    "TRUTH",
    "DATA_SEED",
    "render",
    "band_log_likelihood",
    "make_bands",
    "demo_graph",
    "run",
    "DemoRun",
]

FIELD = 6.0  # arcsec on a side, the same for every band
DATA_SEED = 20240611


@dataclass(frozen=True)
class Band:
    """One band's instrument: pixel grid, PSF width and per-pixel noise."""

    name: str
    n_pix: int
    psf_sigma: float  # arcsec
    noise: float  # per-pixel standard deviation

    @property
    def pixel_scale(self) -> float:
        return FIELD / self.n_pix


BANDS = (
    Band("g", 24, psf_sigma=0.50, noise=0.004),
    Band("r", 32, psf_sigma=0.40, noise=0.003),
    Band("i", 48, psf_sigma=0.30, noise=0.002),
)

#: The true parameters, as the demo graph's params pytree (shared at the top, fluxes per band).
#: Two-element arrays are (core, halo), or (x, y) for the centre.
TRUTH = {
    "centre": np.array([0.35, -0.25]),
    "q": np.float64(0.55),
    "phi": np.float64(0.9),
    "sigma": np.array([0.3, 1.2]),
    "g": {"flux": np.array([2.0, 5.0])},
    "r": {"flux": np.array([3.0, 8.0])},
    "i": {"flux": np.array([4.5, 10.0])},
}

# Parameters are small arrays rather than one scalar each: the compile time of the search's
# step grows with the number of parameter leaves (see profiling/README.md), and (x, y),
# (core, halo) read naturally as pairs.
SHARED_SPACE = {
    "centre": Uniform(-2.0, 2.0, shape=(2,)),
    "q": Uniform(0.2, 1.0),
    "phi": Uniform(0.0, math.pi),
    # disjoint ranges keep the core the narrower component (no label switching)
    "sigma": LogUniform([0.05, 0.8], [0.8, 3.0]),
}
BAND_SPACE = {"flux": LogUniform(0.1, 50.0, shape=(2,))}

#: Names of the elements of two-element parameters, for tables.
ELEMENTS = {"centre": ("x", "y"), "sigma": ("core", "halo"), "flux": ("core", "halo")}


def render(p, d, xp=jnp):
    """Model image of the source in one band (``xp``: ``jax.numpy`` or ``numpy``).

    ``p`` holds the shared parameters and the band's ``flux`` (one flat dict); ``d`` the band's
    pixel-centre coordinates ``x`` (columns) and ``y`` (rows), ``psf_sigma`` and
    ``pixel_area``. Each component ``k`` (core, halo) is an elliptical Gaussian of total flux
    ``flux[k]``, major-axis width ``sigma[k]`` and minor-axis width ``q * sigma[k]`` at
    position angle ``phi``; the PSF adds ``psf_sigma**2`` to both variances.
    """
    dx = d["x"][None, :] - p["centre"][0]
    dy = d["y"][:, None] - p["centre"][1]
    c, s = xp.cos(p["phi"]), xp.sin(p["phi"])
    u, v = c * dx + s * dy, -s * dx + c * dy
    psf2 = d["psf_sigma"] ** 2
    sigma = p["sigma"][:, None, None]  # components on a leading axis
    a2 = sigma**2 + psf2
    b2 = (p["q"] * sigma) ** 2 + psf2
    norm = p["flux"][:, None, None] * d["pixel_area"] / (2.0 * math.pi * xp.sqrt(a2 * b2))
    return xp.sum(norm * xp.exp(-0.5 * (u**2 / a2 + v**2 / b2)), axis=0)


def band_log_likelihood(p, d):
    """Gaussian log-likelihood of one band, up to a constant: ``-chi2 / 2``.

    Pixels are weighted by ``d["inv_sigma"]``; a zero weight (a padded or masked pixel)
    contributes nothing, which is what makes zero-padding to a common grid exact.
    """
    r = (d["image"] - render(p, d)) * d["inv_sigma"]
    return -0.5 * jnp.sum(r**2)


def band_params(params, band: str) -> dict:
    """The flat dict one band's log-likelihood sees: shared parameters and the band's fluxes."""
    shared = {k: params[k] for k in SHARED_SPACE}
    return {**shared, **params[band]}


def make_bands(seed: int = DATA_SEED, bands=BANDS) -> dict[str, dict]:
    """Each band's data (NumPy, float64): coordinates, image, inverse sigma, PSF, pixel area.

    Deterministic for a given ``seed`` (NumPy's PCG64 generator).
    """
    rng = np.random.default_rng(seed)
    out = {}
    for band in bands:
        centres = -FIELD / 2 + band.pixel_scale * (np.arange(band.n_pix) + 0.5)
        d = {
            "x": centres,
            "y": centres.copy(),
            "psf_sigma": np.float64(band.psf_sigma),
            "pixel_area": np.float64(band.pixel_scale**2),
        }
        clean = render(band_params(TRUTH, band.name), d, xp=np)
        d["image"] = clean + rng.normal(0.0, band.noise, size=clean.shape)
        d["inv_sigma"] = np.full(clean.shape, 1.0 / band.noise)
        out[band.name] = d
    return out


def demo_graph(
    data: dict[str, dict] | None = None,
    *,
    pad_to_common_shape: bool = True,
    vmap_factors: bool = True,
) -> FactorGraphModel:
    """The demo's factor graph: one :class:`Factor` per band, shared shape parameters."""
    data = make_bands() if data is None else data
    factors = [
        Factor(band_log_likelihood, d, space=dict(BAND_SPACE), name=name)
        for name, d in data.items()
    ]
    return FactorGraphModel(
        factors,
        space=dict(SHARED_SPACE),
        pad_to_common_shape=pad_to_common_shape,
        vmap_factors=vmap_factors,
        name="multi-band demo",
    )


# -- the run behind `multistart demo` -----------------------------------------------------------

#: Search settings: the full demo (about 30 s on a 2-core laptop, compile included) and
#: ``--quick`` (under 10 s, most of it compiling, for CI).
FULL = {"n_starts": 256, "batch_size": 8, "n_steps": 2000}
QUICK = {"n_starts": 8, "batch_size": 4, "n_steps": 300}
OPTIONAL = ("matplotlib", "pandas")


@dataclass
class DemoRun:
    """What :func:`run` produced: the fit, the graph, the truth's figure of merit, the files."""

    result: Result
    graph: FactorGraphModel
    truth_fom: float
    files: dict[str, Path]
    wall_s: float


def missing_dependencies() -> list[str]:
    """The optional packages the demo needs (the ``plots`` extra) that are not installed."""
    return [m for m in OPTIONAL if importlib.util.find_spec(m) is None]


def run(
    out="multistart-out",
    *,
    n_starts: int | None = None,
    batch_size: int | None = None,
    n_steps: int | None = None,
    seed: int = 0,
    quick: bool = False,
    quiet: bool = False,
    stream=None,
) -> DemoRun:
    """Fit the demo graph with ``MultiStartProdigy``, print a report, write the outputs.

    Writes into ``out``: ``result.npz`` (:meth:`Result.save`), ``starts.csv`` (one row per
    start, :meth:`Result.to_dataframe`) and ``demo.png`` (each band's data, model and
    residual, and every start's figure-of-merit curve).

    Args:
      out: the output folder (created if missing).
      n_starts, batch_size, n_steps: the search's size; unset ones come from :data:`FULL`, or
        from :data:`QUICK` with ``quick``.
      seed: the start seed (the data never change).
      quick: CI-sized defaults.
      quiet: no progress lines (the report is still printed).
      stream: where the report goes (default ``sys.stdout``).

    Raises:
      ImportError: matplotlib or pandas is missing (checked before any work).
    """
    missing = missing_dependencies()
    if missing:
        raise ImportError(
            f"multistart demo needs {' and '.join(missing)} (the 'plots' extra): "
            "pip install 'multistart[plots]'"
        )
    stream = sys.stdout if stream is None else stream
    t0 = time.perf_counter()
    settings: dict[str, Any] = dict(QUICK if quick else FULL)
    for key, value in (("n_starts", n_starts), ("batch_size", batch_size), ("n_steps", n_steps)):
        if value is not None:
            settings[key] = value
    search = MultiStartProdigy(seed=seed, log_every=max(settings["n_steps"] // 10, 1), **settings)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)  # before the fit: a bad folder fails at once
    with _log_level("WARNING" if quiet else None):
        log.configure()
        log.logger.info("generating %d bands: %s", len(BANDS), _describe_bands())
        graph = demo_graph()
        result = search.fit(graph)
        truth_fom = graph.fom(TRUTH)
        files = _write(out, graph, result, truth_fom)
    print(report(graph, result, truth_fom), file=stream)
    print("outputs: " + ", ".join(str(p) for p in files.values()), file=stream)
    return DemoRun(result, graph, truth_fom, files, time.perf_counter() - t0)


def _write(out: Path, graph, result, truth_fom: float) -> dict[str, Path]:
    """The demo's files: the Result, one CSV row per start, and the figure."""
    files = {
        "result": out / "result.npz",
        "csv": out / "starts.csv",
        "figure": out / "demo.png",
    }
    result.save(files["result"])
    result.to_dataframe().to_csv(files["csv"], index=False)
    plot(graph, result, files["figure"], truth_fom)
    log.logger.info("wrote %s", ", ".join(str(p) for p in files.values()))
    return files


@contextlib.contextmanager
def _log_level(level: str | None):
    """Run with ``MULTISTART_LOG_LEVEL`` set to ``level`` (a search reads it when it starts);
    the variable and the logger's level are restored afterwards."""
    if level is None:
        yield
        return
    old_env, old_level = os.environ.get("MULTISTART_LOG_LEVEL"), log.logger.level
    os.environ["MULTISTART_LOG_LEVEL"] = level
    try:
        yield
    finally:
        if old_env is None:
            del os.environ["MULTISTART_LOG_LEVEL"]
        else:
            os.environ["MULTISTART_LOG_LEVEL"] = old_env
        log.logger.setLevel(old_level)


def _describe_bands() -> str:
    return "; ".join(
        f'{b.name} {b.n_pix}x{b.n_pix} px, PSF {b.psf_sigma}", noise {b.noise}' for b in BANDS
    )


def _element_label(path: str, index: tuple[int, ...]) -> str:
    if not index:
        return path
    leaf = path.rsplit(".", 1)[-1]
    names = ELEMENTS.get(leaf)
    label = f"{path}[{','.join(map(str, index))}]"
    return f"{label} ({names[index[0]]})" if names else label


def _rows(tree, paths):
    """``(label, value)`` per scalar element of a params pytree, in space order."""
    for path, leaf in zip(paths, jax.tree_util.tree_leaves(tree), strict=True):
        a = np.asarray(leaf, dtype=np.float64)
        for idx in np.ndindex(a.shape):
            yield _element_label(path, idx), float(a[idx])


def report(graph: FactorGraphModel, result: Result, truth_fom: float) -> str:
    """The results table (best fit against truth) and the per-start summary, as text."""
    paths = graph.space.paths
    truth = dict(_rows(TRUTH, paths))
    sigmas, caveats = None, []
    if result.best_index >= 0:
        # A short fit can stop off a minimum: then its sigmas are nan, and the report says why.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            sigmas = dict(_rows(result.attach_problem(graph).errors, paths))  # by name
        caveats = [f"note: {w.message}" for w in caught]
    lines = [
        f"{'parameter':<22} {'truth':>10} {'best fit':>10} {'+/- sigma':>10} "
        f"{'fit - truth':>12} {'pull':>6}"
    ]
    for label, value in _rows(result.best_params, paths):
        t = truth[label]
        sigma = np.nan if sigmas is None else sigmas[label]
        pull = (value - t) / sigma if sigma > 0 else np.nan
        lines.append(
            f"{label:<22} {t:>10.4f} {value:>10.4f} {sigma:>10.4f} {value - t:>+12.4f} "
            f"{pull:>+6.2f}"
        )
    lines.append(
        "(sigma: result.errors, from the curvature of the figure of merit at the best fit; "
        "pull = (fit - truth) / sigma)"
    )
    lines += caveats
    note = stall_note(graph, result)
    if note is not None:
        lines += ["", note]
    views_best = graph.factor_views(result)
    views_truth = graph.factor_views(TRUTH)
    lines.append("")
    lines.append(f"{'band':<6} {'pixels':>7} {'chi2 at fit':>12} {'chi2 at truth':>14}")
    for name, v in views_best.items():
        n_pix = int(np.size(v.data["image"]))
        chi2_truth = -2 * views_truth[name].log_likelihood
        lines.append(f"{name:<6} {n_pix:>7} {-2 * v.log_likelihood:>12.2f} {chi2_truth:>14.2f}")
    finite = result.foms[np.isfinite(result.foms)]
    near = int(np.sum(result.foms <= result.best_fom + 1.0))
    counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
    lines += [
        "",
        f"figure of merit -2(log L + log prior): best {result.best_fom:.3f} "
        f"(start {result.best_index}), at truth {truth_fom:.3f}",
        f"starts: {result.n_starts} ({counts}); median fom "
        f"{np.median(finite) if finite.size else float('nan'):.3f}; "
        f"{near} within 1 of the best",
        f"compile {result.stats['compile_s']:.1f} s, fit {result.stats['wall_s']:.1f} s, "
        f"{result.stats['n_evals']} evaluations",
    ]
    return "\n".join(lines)


def distance_to_minimum(graph: FactorGraphModel, result: Result) -> float:
    """How far the best fit lies from the minimum of the figure of merit, in units of each
    parameter's error: ``max |δᵢ / σᵢ|`` of the Newton step ``δ = -H⁻¹ g`` there (the step
    that would reach the minimum of the local quadratic; ``nan`` without a finite one)."""
    if result.problem is None:
        result = result.attach_problem(graph)
    lap = result.laplace
    grad = jax.grad(lambda p: graph._fom(p, graph._data))(result.best_params)
    shapes = [np.shape(v) for v in jax.tree_util.tree_leaves(result.best_params)]
    by_name = dict(
        zip(flat_names(leaf_paths(result.best_params), shapes), flat_values(grad), strict=True)
    )
    g = np.array([by_name[n] for n in lap.names], dtype=np.float64)
    try:
        step = -np.linalg.solve(np.asarray(lap.hessian, dtype=np.float64), g)
    except np.linalg.LinAlgError:
        return float("nan")
    ratio = np.abs(step / np.asarray(lap.std, dtype=np.float64))
    return float(np.max(ratio)) if np.all(np.isfinite(ratio)) else float("nan")


def stall_note(graph: FactorGraphModel, result: Result) -> str | None:
    """Why the best start did not converge, and whether its errors hold (``None`` when it
    converged): the errors hold where the best fit lies a small fraction of an error from
    the minimum, measured by :func:`distance_to_minimum`."""
    if result.best_index < 0 or result.status[result.best_index] is Status.CONVERGED:
        return None
    counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
    d = distance_to_minimum(graph, result)
    holds = (
        f"the best fit lies {d:.2g} sigma from the minimum (the Newton step there, in units "
        "of each parameter's error, largest over the parameters), so the errors above hold"
        if d < 0.1
        else f"the best fit lies {d:.2g} sigma from the minimum: fit longer (n_steps) before "
        "quoting the errors"
    )
    return (
        f"why no start converged ({counts}): Prodigy is a first-order rule; near a minimum "
        "its steps shrink with the gradient, and the window guard ends a start whose best "
        "improved by less than its tolerance over the window (stalled) before a gradient "
        f"test passes, or n_steps ends it (max_steps). {holds[0].upper()}{holds[1:]}."
    )


def plot(graph: FactorGraphModel, result: Result, path, truth_fom: float | None = None) -> None:
    """Each band's data, best-fit model and residual, and every start's fom curve, to ``path``."""
    from matplotlib.figure import Figure

    views = graph.factor_views(result)
    n = len(views)
    fig = Figure(figsize=(11, 3.2 * n + 3.6), layout="constrained")
    grid = fig.add_gridspec(n + 1, 3, height_ratios=[1] * n + [1.1])
    for row, (name, v) in enumerate(views.items()):
        d = v.data
        model = np.asarray(render(v.params, d, xp=np))
        half = FIELD / 2
        extent = (-half, half, -half, half)
        lo, hi = np.percentile(d["image"], [1, 99.8])
        panels = [
            (d["image"], f"{name}: data ({d['image'].shape[0]} px)", "gray_r", lo, hi),
            (model, f"{name}: best-fit model", "gray_r", lo, hi),
            ((d["image"] - model) * d["inv_sigma"], f"{name}: residual / sigma", "RdBu_r", -4, 4),
        ]
        for col, (img, title, cmap, vmin, vmax) in enumerate(panels):
            ax = fig.add_subplot(grid[row, col])
            im = ax.imshow(img, origin="lower", extent=extent, cmap=cmap, vmin=vmin, vmax=vmax)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel('x (")', fontsize=8)
            ax.tick_params(labelsize=7)
            fig.colorbar(im, ax=ax, shrink=0.85)
    ax = fig.add_subplot(grid[n, :])
    _plot_history(ax, result, truth_fom)
    if result.best_index >= 0 and result.status[result.best_index] is not Status.CONVERGED:
        d = distance_to_minimum(graph, result)
        counts = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
        ax.text(  # top right, under the legend: the curves have left that corner by then
            0.99,
            0.8,
            f"no start converged ({counts}): first-order steps shrink near the minimum;\n"
            f"the best fit lies {d:.2g} sigma from it (a Newton step in units of the errors)",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"},
        )
    fig.savefig(path, dpi=110)


def _plot_history(ax, result: Result, truth_fom: float | None) -> None:
    import matplotlib as mpl

    steps, hist = result.history_steps, result.history
    order = result.ranked()[::-1]  # worst first, so the best curves are drawn on top
    cmap = mpl.colormaps["viridis"]

    def curve(i):  # a start's curve ends where the start did (history is forward-filled)
        keep = steps <= max(result.n_steps[i], 1)
        return steps[keep], hist[keep, i]

    for rank, i in enumerate(order):
        colour = cmap(rank / max(len(order) - 1, 1))
        ax.plot(*curve(i), color=colour, lw=0.7, alpha=0.6)
    if result.best_index >= 0:
        ax.plot(*curve(result.best_index), color="crimson", lw=1.6, label="best start")
    if truth_fom is not None:
        ax.axhline(truth_fom, color="k", ls="--", lw=1, label="at the true parameters")
    finite = hist[np.isfinite(hist)]
    if finite.size and finite.min() > 0:
        ax.set_yscale("log")
    ax.set_xscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("best figure of merit so far")
    ax.set_title(
        f"every start's figure of merit, until it ended ({result.n_starts} starts; "
        "colour: final rank, yellow best)"
    )
    ax.legend(loc="upper right", fontsize=8)
