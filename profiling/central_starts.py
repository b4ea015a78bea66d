"""Starts for the benchmarks against scipy: uniform in the central band of each prior.

One copy for every script that hands the same starts to scipy's loop and to a search
(``time_to_solution.py``, ``least_squares.py``, ``halving.py``, ``peers.py`` ...). No side
effects on import (no JAX configuration), so a script can import it in any process.
"""

from __future__ import annotations

import numpy as np

BAND = (0.15, 0.85)  # the quantiles of each prior the starts are drawn between


def draw_starts(space: dict, n: int, seed: int) -> dict:
    """``n`` starts per leaf, uniform in the central band of each prior's quantiles (log-uniform
    for a ``LogUniform`` prior)."""
    import multistart as ms

    rng = np.random.default_rng(seed)
    out = {}
    for name, prior in space.items():
        u = rng.uniform(*BAND, size=(n, *prior.shape))
        lo, hi = np.asarray(prior.lower, float), np.asarray(prior.upper, float)
        if isinstance(prior, ms.LogUniform):
            out[name] = np.exp(np.log(lo) + (np.log(hi) - np.log(lo)) * u)
        else:
            out[name] = lo + (hi - lo) * u
    return out
