"""The image-fit benchmark model: eight elliptical Gaussians seen in four bands.

Each Gaussian has a centre ``(x, y)``, a flux, a size (its major-axis sigma), an axis ratio
``q`` and a position angle: 48 parameters. It is rendered (analytically, no PSF) on four pixel
grids over one 6 x 6 field: 96², 64², 48² and 128² pixels, each band with its own noise level,
and the figure of merit is the χ² summed over the bands. Truth and noise are deterministic
(seeded). Float64 by default (the scripts turn on ``jax_enable_x64``).

This is the model of issue 10's time-to-solution comparison: XLA's CPU code for the vmapped
model costs several times more per start than one unbatched evaluation, so it is also the case
a CPU batch width must get right.

    >>> objective, space, truth = make()                      # doctest: +SKIP
    >>> float(objective(truth))                               # the truth's χ²  # doctest: +SKIP
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import multistart as ms

N_GAUSS = 8
GRIDS = (96, 64, 48, 128)
FIELD = 6.0
NOISE = (0.02, 0.015, 0.01, 0.03)


def space() -> dict:
    """The priors: one leaf per Gaussian property, each of shape ``(N_GAUSS,)``."""
    k = (N_GAUSS,)
    half = FIELD / 2 - 0.5
    return {
        "x": ms.Uniform(-half, half, shape=k),
        "y": ms.Uniform(-half, half, shape=k),
        "flux": ms.LogUniform(0.1, 20.0, shape=k),
        "size": ms.LogUniform(0.05, 1.5, shape=k),
        "q": ms.Uniform(0.2, 1.0, shape=k),
        "angle": ms.Uniform(0.0, np.pi, shape=k),
    }


def truth(seed: int = 7) -> dict:
    """Deterministic true parameters, well inside the priors."""
    rng = np.random.default_rng(seed)
    k = N_GAUSS
    return {
        "x": rng.uniform(-2.0, 2.0, k),
        "y": rng.uniform(-2.0, 2.0, k),
        "flux": rng.uniform(1.0, 8.0, k),
        "size": rng.uniform(0.15, 0.6, k),
        "q": rng.uniform(0.4, 0.95, k),
        "angle": rng.uniform(0.2, np.pi - 0.2, k),
    }


def _grid(n: int):
    c = -FIELD / 2 + (FIELD / n) * (np.arange(n) + 0.5)
    yy, xx = np.meshgrid(c, c, indexing="ij")
    return xx, yy


def render(params, xx, yy, pixel_area):
    """Surface brightness times pixel area of the eight Gaussians on one grid (jnp)."""
    x, y, flux, size = params["x"], params["y"], params["flux"], params["size"]
    q, angle = params["q"], params["angle"]
    c, s = jnp.cos(angle), jnp.sin(angle)
    dx = xx[..., None] - x
    dy = yy[..., None] - y
    u = (c * dx + s * dy) / size
    v = (-s * dx + c * dy) / (size * q)
    norm = flux / (2 * jnp.pi * size * size * q)
    return pixel_area * jnp.sum(norm * jnp.exp(-0.5 * (u * u + v * v)), axis=-1)


def make(seed: int = 7):
    """``(objective, space, truth)``: the χ² of the four bands, with the data captured."""
    t = truth(seed)
    rng = np.random.default_rng(seed + 1)
    bands = []
    for n, sigma in zip(GRIDS, NOISE, strict=True):
        xx, yy = _grid(n)
        area = (FIELD / n) ** 2
        clean = np.asarray(render({k: np.asarray(v) for k, v in t.items()}, xx, yy, area))
        data = clean + rng.normal(0.0, sigma, clean.shape)
        bands.append((xx, yy, area, data, 1.0 / sigma))

    def objective(p):
        chi2 = 0.0
        for xx, yy, area, data, inv_sigma in bands:
            r = (render(p, xx, yy, area) - data) * inv_sigma
            chi2 = chi2 + jnp.sum(r * r)
        return chi2

    return objective, space(), t
