"""The image-fit benchmark model: eight elliptical Gaussians seen in four bands (float64).

Each Gaussian has a centre ``x``, ``y``, a peak ``flux``, a ``size`` (sigma along its major
axis), an axis ratio ``q`` and a position angle ``theta``: 48 parameters. The same field
(``[-1, 1]^2``) is imaged on 96², 64², 48² and 128² pixel grids, each band with its own
Gaussian noise level; the figure of merit is χ² summed over the bands. The truth and the noise
are drawn from a seed, so the model is the same in every process.

Used by ``time_to_solution.py``, ``halving.py`` and by other benchmarks the same way they import
``benchmark_model.py``::

    sys.path.insert(0, "profiling")
    import image_model

    objective, space, truth = image_model.make_problem()  # enables float64
    chi2_truth = image_model.truth_chi2(objective, truth)
    result = ms.MultiStartAdam(n_starts=32).fit(objective, space)

The data are captured by ``objective`` (constants of its program), as a user's closure would.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import multistart as ms

N_GAUSSIANS = 8
# band name -> (pixels per side, noise sigma)
BANDS = {"g": (96, 0.05), "r": (64, 0.08), "i": (48, 0.1), "z": (128, 0.04)}
FIELD = 1.0  # the field spans [-FIELD, FIELD] on both axes


def space() -> dict:
    """The priors: one array of ``N_GAUSSIANS`` per parameter kind (48 parameters)."""
    n = (N_GAUSSIANS,)
    return {
        "x": ms.Uniform(-0.8, 0.8, shape=n),
        "y": ms.Uniform(-0.8, 0.8, shape=n),
        "flux": ms.LogUniform(0.2, 20.0, shape=n),
        "size": ms.LogUniform(0.03, 0.4, shape=n),
        "q": ms.Uniform(0.2, 1.0, shape=n),
        "theta": ms.Uniform(0.0, np.pi, shape=n),
    }


def make_truth(seed: int = 0) -> dict[str, np.ndarray]:
    """True parameters drawn inside the priors (away from their edges) from ``seed``."""
    rng = np.random.default_rng(seed)
    n = N_GAUSSIANS
    return {
        "x": rng.uniform(-0.6, 0.6, n),
        "y": rng.uniform(-0.6, 0.6, n),
        "flux": np.exp(rng.uniform(np.log(0.5), np.log(10.0), n)),
        "size": np.exp(rng.uniform(np.log(0.05), np.log(0.25), n)),
        "q": rng.uniform(0.3, 0.95, n),
        "theta": rng.uniform(0.1, np.pi - 0.1, n),
    }


def grid(side: int):
    """Pixel-centre coordinates ``(xx, yy)`` of a ``side`` x ``side`` image of the field."""
    edges = np.linspace(-FIELD, FIELD, side + 1)
    centres = 0.5 * (edges[:-1] + edges[1:])
    yy, xx = np.meshgrid(centres, centres, indexing="ij")
    return xx, yy


def render(p, xx, yy):
    """The noiseless image of the Gaussians ``p`` at pixel centres ``xx``, ``yy``."""
    dx = xx[..., None] - p["x"]
    dy = yy[..., None] - p["y"]
    c, s = jnp.cos(p["theta"]), jnp.sin(p["theta"])
    major = c * dx + s * dy
    minor = (-s * dx + c * dy) / p["q"]
    r2 = (major**2 + minor**2) / p["size"] ** 2
    return jnp.sum(p["flux"] * jnp.exp(-0.5 * r2), axis=-1)


def make_data(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """Per band: ``xx``, ``yy``, the noisy image ``img`` and ``sigma``, from ``seed``."""
    truth = make_truth(seed)
    rng = np.random.default_rng(seed + 1)
    data = {}
    for band, (side, sigma) in BANDS.items():
        xx, yy = grid(side)
        clean = np.asarray(render(truth, xx, yy), dtype=np.float64)
        data[band] = {
            "xx": xx,
            "yy": yy,
            "img": clean + rng.normal(0.0, sigma, (side, side)),
            "sigma": sigma,
        }
    return data


def make_problem(seed: int = 0):
    """``(objective, space, truth)`` of the image fit; turns on float64 (``jax_enable_x64``).

    ``objective(params)`` is χ² summed over the four bands; ``truth`` the parameters the data
    were drawn from (a dict of float64 arrays, the same pytree as the params).
    """
    jax.config.update("jax_enable_x64", True)
    bands = {
        b: {k: jnp.asarray(v, jnp.float64) for k, v in d.items()}
        for b, d in make_data(seed).items()
    }

    def image_chi2(p):
        total = 0.0
        for d in bands.values():
            total = total + jnp.sum(((render(p, d["xx"], d["yy"]) - d["img"]) / d["sigma"]) ** 2)
        return total

    return image_chi2, space(), make_truth(seed)


def truth_chi2(objective, truth) -> float:
    """χ² of the truth: about the number of pixels (32,000); 31,394 at seed 0."""
    return float(jax.jit(objective)(jax.tree_util.tree_map(jnp.asarray, truth)))


N_PIXELS = sum(side * side for side, _ in BANDS.values())


if __name__ == "__main__":
    f, sp, t = make_problem()
    print(f"{sum(v.size for v in t.values())} parameters, {N_PIXELS} pixels")
    print(f"chi2 at the truth: {truth_chi2(f, t):.1f}")
