"""Start generation: where each local search begins, in physical coordinates (NumPy)."""

from __future__ import annotations

import numpy as np

from .priors import Space

__all__ = ["uniform_band_starts", "check_band"]


def check_band(band) -> tuple[float, float]:
    """Validate a unit-cube band ``(lo, hi)`` with ``0 <= lo < hi <= 1``."""
    try:
        lo, hi = (float(b) for b in band)
    except (TypeError, ValueError) as e:
        raise ValueError(f"start_band must be a pair (lo, hi) of floats; got {band!r}") from e
    if not (0.0 <= lo < hi <= 1.0):
        raise ValueError(f"start_band must satisfy 0 <= lo < hi <= 1; got {band!r}")
    return lo, hi


def uniform_band_starts(space: Space, n: int, rng: np.random.Generator, band=(0.15, 0.85)):
    """``n`` starts drawn uniformly in the central ``band`` of each prior's quantiles.

    Returns the physical params pytree with a leading ``n`` axis on every leaf (float64).
    Keeping starts off the tails of each prior avoids beginning where a bounded prior's logit
    is steep and a normal prior's tail is implausible.
    """
    lo, hi = check_band(band)
    qs = [rng.uniform(lo, hi, size=(n, *p.shape)) for p in space.priors]
    return space.from_unit(qs)
