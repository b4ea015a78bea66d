"""The census's cells: one galaxy model fitted to one or several bands, as factor graphs.

Every band is fitted with the same log-likelihood, a multi-Gaussian expansion (MGE) with a
linear inversion: ``components`` concentric elliptical Gaussians of fixed log-spaced widths
(scaled by a shared ``size``, sharing a centre, axis ratio and position angle, each blurred by
the band's Gaussian PSF analytically), whose fluxes are solved per band by weighted linear least
squares, as lens- and galaxy-modelling codes do with "linear light profiles". Each component is
its own expression (a Python loop, unrolled by the trace), as it is in a code where every light
profile is an object: that makes the per-band program large, like a real one, so differences in
compile time between cells and transforms stand out. Each band also has its own sky level.

The data are the demo's galaxy (:data:`multistart.demo.TRUTH`) rendered on each band's grid
with noise; pixel grids cover the same 6" field, so a finer grid is a different data shape.
Padded pixels carry zero weight, so ``pad_to_common_shape=True`` is exact for this model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from multistart import demo
from multistart.model.graph import Factor, FactorGraphModel
from multistart.model.priors import LogUniform, Uniform

__all__ = ["Cell", "CELLS", "SIZES", "Size", "build", "describe", "mge_log_likelihood"]

#: Seed of the census's synthetic data (fixed: every process builds identical data).
DATA_SEED = 7


@dataclass(frozen=True)
class Cell:
    """A census cell: the pixel grid of each band (n x n, in band order) and padding."""

    grids: tuple[int, ...]
    pad_to_common_shape: bool = False
    about: str = ""


@dataclass(frozen=True)
class Size:
    """How heavy the band model is: MGE components (the default; a census can set its own),
    and a factor on every grid's side."""

    components: int
    grid_scale: float


#: Grids are for ``grid_scale=1``; the quick size halves them, the tests' tiny size quarters them.
CELLS = {
    "one": Cell((64,), about="one band, 64x64"),
    "homo4": Cell((64, 64, 64, 64), about="4 bands of one shape (64x64)"),
    "hetero2": Cell((32, 32, 64, 64), about="4 bands, 2 distinct shapes (32x32, 64x64)"),
    "hetero4": Cell((24, 32, 48, 64), about="4 bands, 4 distinct shapes (24..64 px)"),
    "padded4": Cell(
        (24, 32, 48, 64),
        pad_to_common_shape=True,
        about="hetero4 zero-padded to 64x64 (pad_to_common_shape=True)",
    ),
}

SIZES = {
    "full": Size(components=16, grid_scale=1.0),
    "quick": Size(components=4, grid_scale=0.5),
    "tiny": Size(components=1, grid_scale=0.25),  # the tests' size: compiles in about a second
}

# Per band, in order: PSF sigma (arcsec) and per-pixel noise. A band's name is b<i>.
_PSF = (0.45, 0.35, 0.30, 0.25)
_NOISE = (0.004, 0.003, 0.003, 0.002)

SHARED_SPACE = {
    "centre": Uniform(-1.0, 1.0, shape=(2,)),
    "q": Uniform(0.2, 1.0),
    "phi": Uniform(0.0, math.pi),
    "size": LogUniform(0.5, 2.0),
}
BAND_SPACE = {"sky": Uniform(-0.01, 0.01)}


def _basis_widths(components: int) -> np.ndarray:
    """The MGE's component widths (arcsec) at ``size == 1``: log-spaced, 0.05" to 3"."""
    return np.geomspace(0.05, 3.0, components)


def mge_log_likelihood(p, d):
    """One band's Gaussian log-likelihood (``-chi2 / 2``) with the fluxes solved linearly.

    ``d["widths"]`` holds the components' widths; its length (static) is the number of
    components. Pixels are weighted by ``d["inv_sigma"]``: a zero weight (padding) removes a
    pixel from both the least-squares solve and the chi-squared.
    """
    dx = d["x"][None, :] - p["centre"][0]
    dy = d["y"][:, None] - p["centre"][1]
    c, s = jnp.cos(p["phi"]), jnp.sin(p["phi"])
    u2, v2 = (c * dx + s * dy) ** 2, (-s * dx + c * dy) ** 2
    psf2 = d["psf_sigma"] ** 2
    w = d["inv_sigma"].ravel()
    columns = []
    for k in range(d["widths"].shape[0]):  # unrolled: one expression per component
        sigma = p["size"] * d["widths"][k]
        a2 = sigma**2 + psf2
        b2 = (p["q"] * sigma) ** 2 + psf2
        image = jnp.exp(-0.5 * (u2 / a2 + v2 / b2)) / (2.0 * math.pi * jnp.sqrt(a2 * b2))
        columns.append((image * d["pixel_area"]).ravel() * w)
    a = jnp.stack(columns, axis=1)
    y = (d["image"] - p["sky"]).ravel() * w
    normal = a.T @ a
    # A small relative ridge keeps the solve finite when components become degenerate.
    ridge = 1e-6 * jnp.trace(normal) / normal.shape[0]
    flux = jnp.linalg.solve(normal + ridge * jnp.eye(normal.shape[0], dtype=a.dtype), a.T @ y)
    r = y - a @ flux
    return -0.5 * jnp.sum(r**2)


def _band_data(n_pix: int, index: int, widths: np.ndarray, rng) -> dict:
    scale = demo.FIELD / n_pix
    centres = -demo.FIELD / 2 + scale * (np.arange(n_pix) + 0.5)
    d = {
        "x": centres,
        "y": centres.copy(),
        "psf_sigma": np.float64(_PSF[index % len(_PSF)]),
        "pixel_area": np.float64(scale**2),
    }
    truth = demo.band_params(demo.TRUTH, "i")
    noise = _NOISE[index % len(_NOISE)]
    clean = demo.render(truth, d, xp=np)
    d["image"] = clean + rng.normal(0.0, noise, size=clean.shape)
    d["inv_sigma"] = np.full(clean.shape, 1.0 / noise)
    d["widths"] = widths
    return d


def grids(cell: str, size: str) -> tuple[int, ...]:
    """The cell's band grids (pixels on a side) at ``size``."""
    scale = SIZES[size].grid_scale
    return tuple(max(4, round(n * scale)) for n in CELLS[cell].grids)


def build(cell: str, size: str = "full", components: int | None = None) -> FactorGraphModel:
    """The factor graph of ``cell`` at ``size`` (deterministic data).

    Args:
      cell: a key of :data:`CELLS`.
      size: a key of :data:`SIZES`.
      components: MGE components per band (default: the size's).

    Raises:
      ValueError: an unknown cell or size, or fewer than one component.
    """
    components = _check(cell, size, components)
    rng = np.random.default_rng(DATA_SEED)
    widths = _basis_widths(components)
    factors = [
        Factor(
            mge_log_likelihood,
            _band_data(n, i, widths, rng),
            space=dict(BAND_SPACE),
            name=f"b{i}",
        )
        for i, n in enumerate(grids(cell, size))
    ]
    return FactorGraphModel(
        factors,
        space=dict(SHARED_SPACE),
        pad_to_common_shape=CELLS[cell].pad_to_common_shape,
        name=f"census {cell}",
    )


def describe(
    cell: str, size: str, components: int | None = None, graph: FactorGraphModel | None = None
) -> dict:
    """Plain facts about a cell, for the census rows (builds the graph unless given)."""
    components = _check(cell, size, components)
    graph = build(cell, size, components) if graph is None else graph
    g = grids(cell, size)
    data = graph.multistart_problem().data  # one entry per group of factors
    shapes = set()
    for group in data:
        if isinstance(group, dict):  # stacked: a leading factor axis
            shapes.add(np.shape(group["image"])[1:])
        else:
            shapes.update(np.shape(d["image"]) for d in group)
    return {
        "n_bands": len(g),
        "shapes": ",".join(f"{n}x{n}" for n in g),
        "distinct_shapes": len(set(g)),
        "compiled_shapes": len(shapes),
        "groups": len(data),
        "pixels": int(sum(n * n for n in g)),
        "n_params": graph.space.n_dims,
        "components": components,
        "padded": CELLS[cell].pad_to_common_shape,
    }


def _check(cell: str, size: str, components: int | None) -> int:
    """Check the arguments; returns the number of components."""
    if cell not in CELLS:
        raise ValueError(f"unknown census cell {cell!r}; cells are {', '.join(CELLS)}")
    if size not in SIZES:
        raise ValueError(f"unknown census size {size!r}; sizes are {', '.join(SIZES)}")
    if components is None:
        return SIZES[size].components
    if isinstance(components, bool) or not isinstance(components, int) or components < 1:
        raise ValueError(f"components must be a positive int; got {components!r}")
    return components
