"""Grouping starts into distinct minima: the windowed rule against the all-pairs loop.

``multistart.result.minima.cluster_minima`` (a bisected window of candidate minima by figure of
merit) against the all-pairs rule it replaced (``cluster_minima_all_pairs``, the tests'
specification in ``tests/reference_minima.py``: every start against every minimum so far, the same
labels), on the same points, side by side in one run. Cases: many starts at a few minima (a
converged search), and starts at all-distinct points (a search without convergence, every start its
own "minimum").

    python profiling/experiments/minima_grouping.py            # 2,000 and 20,000 starts
    python profiling/experiments/minima_grouping.py --quick    # 2,000 starts
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # profiling/: the harness

import harness  # noqa: E402
from reference_minima import cluster_minima_all_pairs  # noqa: E402

from multistart.result.minima import cluster_minima  # noqa: E402


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
    harness.add_arguments(ap, quick="2,000 starts only")
    a = ap.parse_args()
    record = harness.Record("minima_grouping", a)
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
            record.figure(f"{n} {name} windowed s", t_new)
            pairs = f"{n} {name} all-pairs s"
            record.figure(pairs, t_old)
            record.ratio(f"{n} {name} windowed / all-pairs", f"{n} {name} windowed s", pairs)
    record.write(a.json)


if __name__ == "__main__":
    main()
