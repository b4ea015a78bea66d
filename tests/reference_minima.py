"""The reference rule for grouping starts into minima, in its plain quadratic form.

``multistart.result.minima.cluster_minima`` bisects a window of candidate minima by figure of merit;
this is the rule it must agree with, label for label (``tests/test_minima.py``), written as
plainly as it can be. ``profiling/experiments/minima_grouping.py`` times the two side by side.
"""

from __future__ import annotations

import numpy as np


def cluster_minima_all_pairs(x, f, *, xtol: float, ftol: float) -> np.ndarray:
    """The grouping rule of ``cluster_minima`` in its plain form, every start against every
    minimum so far: quadratic in the starts. The specification the windowed ``cluster_minima``
    is tested against (``tests/test_minima.py``), and the peer arm of
    ``profiling/experiments/minima_grouping.py``."""
    f = np.asarray(f, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64).reshape(len(f), -1)
    labels = np.full(len(f), -1)
    heads: list[int] = []
    finite = np.isfinite(f) & np.all(np.isfinite(x), axis=1)
    for i in np.flatnonzero(finite)[np.argsort(f[finite], kind="stable")]:
        for label, h in enumerate(heads):
            same_f = abs(f[i] - f[h]) <= ftol * max(1.0, abs(f[h]))
            if same_f and np.all(np.abs(x[i] - x[h]) <= xtol * np.maximum(1.0, np.abs(x[h]))):
                labels[i] = label
                break
        else:
            labels[i] = len(heads)
            heads.append(i)
    return labels
