"""Grouping starts into distinct minima: the windowed rule against the all-pairs loop.

``multistart.result.minima.cluster_minima`` (a bisected window of candidate minima by figure of
merit)
against the all-pairs rule it replaced (``cluster_minima_all_pairs`` below: every start against
every minimum so far, the same labels), on the same points, side by side in one run; also a
whole ``distinct_minima`` call on a Result-sized input. Cases: many starts at a few minima (a
converged search), and starts at all-distinct points (a search without convergence, every start
its own "minimum").

    python profiling/minima_grouping.py            # 2,000 and 20,000 starts
    python profiling/minima_grouping.py --quick    # 2,000 starts
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from multistart.result.minima import cluster_minima


def cluster_minima_all_pairs(x, f, *, xtol: float, ftol: float) -> np.ndarray:
    """The grouping rule of ``cluster_minima`` in its plain form, every start against every
    minimum so far: quadratic in the starts. The peer arm here, and the specification the
    windowed ``cluster_minima`` is tested against (``tests/test_minima.py``)."""
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


def cases(n: int, rng):
    centres = rng.uniform(-3, 3, (50, 4))
    fc = rng.uniform(0, 100, 50)
    k = rng.integers(0, 50, n)
    yield "50 minima", centres[k] + rng.normal(0, 1e-6, (n, 4)), fc[k] + rng.normal(0, 1e-9, n)
    x = rng.uniform(-2, 2, (n, 2))
    yield "all distinct", x, (x**2).sum(1)


def timed(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'starts':>7} {'case':<13} {'minima':>7} {'all-pairs s':>12} {'windowed s':>11} ratio")
    for n in [2000] if a.quick else [2000, 20000]:
        for name, x, f in cases(n, rng):
            new, t_new = timed(cluster_minima, x, f, xtol=1e-3, ftol=1e-3)
            old, t_old = timed(cluster_minima_all_pairs, x, f, xtol=1e-3, ftol=1e-3)
            assert np.array_equal(new, old), "the labels differ"
            print(
                f"{n:>7} {name:<13} {new.max() + 1:>7} {t_old:>12.3f} {t_new:>11.3f} "
                f"{t_old / t_new:.1f}x"
            )


if __name__ == "__main__":
    main()
