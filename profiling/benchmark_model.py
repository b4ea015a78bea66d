"""The multi-dataset benchmark objective shared by the profiling scripts.

Four datasets of different shapes (two images, a 1-D spectrum and a rectangular map) share the
positions, widths and shapes of three Gaussian components; each dataset has its own amplitudes,
background and scale: 31 parameters in all. Values are deterministic (seeded).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import multistart as ms

SHAPES = {"img_a": (64, 64), "img_b": (48, 48), "spec": (400,), "map": (30, 50)}
K = 3  # Gaussian components


def space():
    per = {
        name: {
            "amp": ms.Uniform(0.0, 10.0, shape=(K,)),
            "bg": ms.Uniform(-1.0, 1.0),
            "scale": ms.LogUniform(0.5, 2.0),
        }
        for name in SHAPES
    }
    shared = {
        "xy": ms.Uniform(-1.0, 1.0, shape=(K, 2)),
        "sigma": ms.LogUniform(0.05, 0.5, shape=(K,)),
        "e": ms.Uniform(-0.5, 0.5, shape=(2,)),
    }
    return {"shared": shared, **per}


def truth():
    t = {
        "shared": {
            "xy": np.array([[-0.3, 0.2], [0.25, -0.1], [0.05, 0.4]]),
            "sigma": np.array([0.12, 0.2, 0.08]),
            "e": np.array([0.1, -0.05]),
        }
    }
    for i, name in enumerate(SHAPES):
        t[name] = {"amp": np.array([3.0, 1.5, 2.0]) * (1 + 0.2 * i), "bg": 0.1 * i, "scale": 1.0}
    return t


def _grids():
    grids = {}
    for name, shape in SHAPES.items():
        if len(shape) == 2:
            yy, xx = np.meshgrid(*(np.linspace(-1, 1, s) for s in shape), indexing="ij")
            grids[name] = (jnp.asarray(xx), jnp.asarray(yy))
        else:
            grids[name] = (jnp.asarray(np.linspace(-1, 1, shape[0])), None)
    return grids


GRIDS = _grids()


def model(p, name):
    sh, own = p["shared"], p[name]
    x, y = GRIDS[name]
    e1, e2 = sh["e"][0], sh["e"][1]
    out = own["bg"]
    for k in range(K):
        dx = x - sh["xy"][k, 0]
        if y is None:
            r2 = dx**2
        else:
            dy = y - sh["xy"][k, 1]
            r2 = (1 - e1) * dx**2 + (1 + e1) * dy**2 - 2 * e2 * dx * dy
        out = out + own["amp"][k] * jnp.exp(-0.5 * r2 / sh["sigma"][k] ** 2)
    return own["scale"] * out


def make_data(noise=0.1, seed=0):
    rng = np.random.default_rng(seed)
    t = truth()
    return {
        name: np.asarray(model(t, name)) + rng.normal(0, noise, SHAPES[name]) for name in SHAPES
    }


def make_objective(noise=0.1):
    data = {k: jnp.asarray(v) for k, v in make_data(noise).items()}

    def chi2(p):
        return sum(jnp.sum(((model(p, n) - data[n]) / noise) ** 2) for n in SHAPES)

    return chi2
