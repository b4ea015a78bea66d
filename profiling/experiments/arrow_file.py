"""What saving and reporting a cohort's fit costs now that a graph's errors stay an arrow.

The cohort of ``profiling/cohort.py`` (default 3,000 patients, 9,005 parameters), float64: one
start fitted with ``MultiStartLBFGS(diagonal=True)``, its Laplace errors computed (the arrow,
``ms.ArrowLaplace``). Arms, each in a fresh process (the peak memory is the process's):

- ``save``: ``result.save(path)`` (the arrow's blocks) and ``Result.load(path)``: seconds, the
  file's size, the errors equal bit for bit;
- ``report``: ``result.report()`` (its correlations 512 rows of the inverse at a time);
- ``dense``: what both made before, the ``n x n`` covariance and Hessian
  (``laplace.covariance``, ``laplace.hessian``) and the correlation matrix.

Each prints seconds and the process's peak memory before and after the arm's own work. Run:
``python profiling/experiments/arrow_file.py`` (``--patients 1000`` for less). Findings:
profiling/HISTORY.md, "A cohort's errors saved and reported from the arrow".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cohort  # noqa: E402
import harness  # noqa: E402

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")


def fitted(n: int):
    import jax

    jax.config.update("jax_enable_x64", True)
    import multistart as ms

    graph = cohort.cohort_graph(cohort.make_cohort(n))
    search = ms.MultiStartLBFGS(n_starts=1, seed=0, log_every=0, diagonal=True)
    result = search.fit(graph, starts=cohort.stacked(cohort.starts(n, 1)))
    assert isinstance(result.laplace, ms.ArrowLaplace)  # computed here, before the arm
    return result


def arm(name: str, n: int) -> dict:
    import jax

    import multistart as ms

    result = fitted(n)
    before = cohort.peak_gb()
    t0 = time.perf_counter()
    out: dict = {}
    if name == "save":
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "cohort.npz"
            result.save(path)
            out["save_s"] = time.perf_counter() - t0
            out["file_mb"] = path.stat().st_size / 2**20
            t1 = time.perf_counter()
            loaded = ms.Result.load(path)
            same = all(
                np.array_equal(a, b)
                for a, b in zip(
                    jax.tree_util.tree_leaves(loaded.errors),
                    jax.tree_util.tree_leaves(result.errors),
                    strict=True,
                )
            )
            out["load_s"] = time.perf_counter() - t1
            out["same_errors"] = same
    elif name == "report":
        text = result.report()
        out["report_s"] = time.perf_counter() - t0
        out["report_lines"] = len(text.splitlines())
    else:
        fit = result.laplace
        fit.covariance, fit.hessian, fit.correlation  # noqa: B018 - made on reading
        out["dense_s"] = time.perf_counter() - t0
    out["peak_before_gb"], out["peak_after_gb"] = before, cohort.peak_gb()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=3000)
    parser.add_argument("--arm", choices=("save", "report", "dense"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.patients < 1:
        parser.error("--patients must be a positive int")
    if args.arm:
        harness.child_result(arm(args.arm, args.patients))
        return
    print(f"PK cohort: {args.patients} patients ({3 * args.patients + 5} parameters), one start")
    for name in ("save", "report", "dense"):
        got = harness.fresh_process(__file__, "--arm", name, "--patients", args.patients)
        print(
            f"{name}: "
            + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in got.items()
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
