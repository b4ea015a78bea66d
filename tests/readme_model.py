"""The README's Gaussian peak as a benchmark model: 400 points, 3 parameters.

The same data and figure of merit as the README's first example (the χ² of its residuals; the
README fits them by least squares and names the peak's width ``width``), so a benchmark of
"the README's fit" measures what a newcomer runs. It lives with the tests, which fit it too
(``tests/test_minima.py``); a benchmark imports it from there::

    sys.path.insert(0, "tests")
    import readme_model

    chi2, space = readme_model.make_problem()
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import multistart as ms


def make_problem(*, noise: bool = True):
    """``(chi2, space)``: the README's χ² of a peak (amp 25, centre 37, sigma 4, noise sigma
    0.5 from seed 0; ``noise=False``: the noiseless curve) and its space."""
    x = np.linspace(0.0, 100.0, 400)
    data = 25.0 * np.exp(-0.5 * ((x - 37.0) / 4.0) ** 2)
    if noise:
        data = data + np.random.default_rng(0).normal(0.0, 0.5, x.size)

    def chi2(p):
        model = p["amp"] * jnp.exp(-0.5 * ((x - p["centre"]) / p["sigma"]) ** 2)
        return jnp.sum(((model - data) / 0.5) ** 2)

    space = {
        "centre": ms.Uniform(0.0, 100.0),
        "sigma": ms.LogUniform(0.1, 30.0),
        "amp": ms.Uniform(0.0, 50.0),
    }
    return chi2, space
