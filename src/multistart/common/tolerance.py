"""When two points are the same minimum: the tolerances' one test; and which figure of merit
is the best (NumPy)."""

from __future__ import annotations

import numpy as np

__all__ = ["lowest_finite", "same_minimum"]


def same_minimum(f, x, f_head, x_head, *, xtol: float, ftol: float):
    """Is ``(f, x)`` the minimum whose best is ``(f_head, x_head)``: ``f`` within ``ftol`` and
    every coordinate of ``x`` (its last axis) within ``xtol``, both relative above magnitude 1
    and absolute below? Broadcasts (NumPy). The test TikTak's and the rediscovery rule's
    counts of how often the best was found make, and the one
    :func:`multistart.result.minima.cluster_minima` groups by (written out there, with each
    minimum's scale kept, for speed).

    >>> same_minimum(1.0 + 1e-9, np.array([1e-9]), 1.0, np.array([0.0]), xtol=1e-6, ftol=1e-6)
    np.True_
    """
    with np.errstate(invalid="ignore"):  # inf against inf: not the same (nan compares False)
        f_ok = np.abs(f - f_head) <= ftol * np.maximum(1.0, np.abs(f_head))
        x_ok = np.abs(x - x_head) <= xtol * np.maximum(1.0, np.abs(x_head))
    return f_ok & np.all(x_ok, axis=-1)


def lowest_finite(foms, axis: int = -1):
    """The index of the lowest finite figure of merit along ``axis`` (the first on ties; the
    first where none is finite): the one pick of a best start, a run's best so far
    (:mod:`multistart.host.iterate`, :mod:`multistart.starts.refill`) and a Result's
    (:func:`multistart.result.merge.best_rows`).

    >>> lowest_finite(np.array([np.nan, 2.0, -np.inf, 1.0, 1.0])), lowest_finite([np.nan] * 2)
    (np.int64(3), np.int64(0))
    """
    foms = np.asarray(foms)
    return np.argmin(np.where(np.isfinite(foms), foms, np.inf), axis=axis)
