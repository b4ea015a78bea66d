"""Worked example: recover a Gaussian line profile seen in three channels.

A user's first fit: one centre and width shared by three channels, each with its own amplitude,
with noise. Run ``python workspace_tests/gaussian_peaks.py`` (add ``--quick`` for the CI size).
Asserts that the best fit is at least as good as the truth (chi-squared at the best fit is no
worse than at the true parameters) and that the search compiled its chunk step once.
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np

import multistart as ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small, for CI")
    args = parser.parse_args()

    rng = np.random.default_rng(42)
    x = np.linspace(0.0, 100.0, 400)
    truth = {"centre": 37.0, "sigma": 4.0, "amp": np.array([12.0, 25.0, 6.0])}
    noise = 0.5

    def model(p):
        profile = jnp.exp(-0.5 * ((x - p["centre"]) / p["sigma"]) ** 2)
        return p["amp"][:, None] * profile

    data = np.asarray(model(truth)) + rng.normal(0.0, noise, size=(3, x.size))

    def chi2(p):
        return jnp.sum(((model(p) - data) / noise) ** 2)

    space = {
        "centre": ms.Uniform(0.0, 100.0),
        "sigma": ms.LogUniform(0.1, 30.0),
        "amp": ms.Uniform(0.0, 50.0, shape=(3,)),
    }
    n_starts, n_steps = (16, 400) if args.quick else (64, 1500)
    search = ms.MultiStartAdam(n_starts=n_starts, batch_size=8, n_steps=n_steps, seed=0)
    result = search.fit(chi2, space)

    chi2_truth = float(chi2(truth))
    print(result)
    print(f"chi2 at best fit {result.best_fom:.3f}, at truth {chi2_truth:.3f}")
    print("best:", {k: np.round(v, 3).tolist() for k, v in result.best_params.items()})
    assert result.stats["n_compiles"] == 1, result.stats
    assert result.best_fom <= chi2_truth + 1e-3 * abs(chi2_truth), (result.best_fom, chi2_truth)
    assert abs(float(result.best_params["centre"]) - truth["centre"]) < 1.0


if __name__ == "__main__":
    main()
