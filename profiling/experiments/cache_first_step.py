"""Time to first step of a second process (persistent compilation cache warm) against the first.

For each repeat a fresh, empty cache folder is made; one process fits the multi-dataset
benchmark objective (``benchmark_model.py``) with it (cold: compiles, writes the cache), then a
second process fits the same model with the same folder (warm: loads the filter and the chunk
step from the cache). Each process reports the time from its ``fit`` call to the end of the
first step (``result.stats["first_step_s"]``: checks, the broad-start filter's compile and
sweep, the chunk step's compile, the population's set-up and one step), and the ratio
warm / cold of each pair is the figure (median over repeats). The ratio over the whole
process (interpreter start to the end of the first step, JAX import included) is printed too.

    python profiling/experiments/cache_first_step.py                   # 3 pairs, 16 starts, width 4
    python profiling/experiments/cache_first_step.py --repeats 5 --n-starts 32 --width 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # profiling/: the benchmark models
sys.path.insert(0, str(HERE))

import harness  # noqa: E402  (its fresh processes)


def child(n_starts: int, width: int) -> dict:
    t_process = float(os.environ["_T_LAUNCH"])
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    sys.path.insert(0, str(HERE))
    import benchmark_model as bm

    import multistart as ms

    chi2 = bm.make_objective()
    search = ms.MultiStartAdam(
        n_starts=n_starts, batch_size=width, n_steps=2, seed=0, convergence=None, log_every=0
    )
    t0 = time.time()
    result = search.fit(chi2, bm.space())
    st = result.stats
    return {
        "first_step_s": st["first_step_s"],
        "process_first_step_s": t0 - t_process + st["first_step_s"],
        "compile_s": st["compile_s"],
        "filter_compile_s": st["filter_compile_s"],
        "n_cache_hits": st["n_cache_hits"],
        "n_compiles": st["n_compiles"],
        "best": result.best_fom,
    }


def run(cache: str, n_starts: int, width: int) -> dict:
    env = {"MULTISTART_CACHE_DIR": cache, "_T_LAUNCH": repr(time.time())}
    env["JAX_COMPILATION_CACHE_DIR"] = None
    argv = ["--child", "--n-starts", n_starts, "--width", width]
    return harness.fresh_process(__file__, *argv, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-starts", type=int, default=16)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        harness.child_result(child(args.n_starts, args.width))
        return

    pairs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="multistart-cache-bench-") as folder:
            cold = run(folder, args.n_starts, args.width)
            warm = run(folder, args.n_starts, args.width)
        assert cold["n_cache_hits"] == 0 and warm["n_cache_hits"] >= 2, (cold, warm)
        assert cold["best"] == warm["best"]  # the cached programs compute the same thing
        pairs.append((cold, warm))

    def ratio(key):
        return statistics.median(w[key] / c[key] for c, w in pairs)

    cold_med = statistics.median(c["first_step_s"] for c, _ in pairs)
    print(
        f"multi-dataset objective (31 parameters, 4 datasets), {args.n_starts} starts, width "
        f"{args.width}, filter on (10 x n_starts candidates); {args.repeats} cold/warm pairs, "
        f"fresh cache folder per pair; median of the per-pair ratios"
    )
    print(f"time to first step, warm / cold (from the fit call):      {ratio('first_step_s'):.3f}")
    print(
        "time to first step, warm / cold (from interpreter start): "
        f"{ratio('process_first_step_s'):.3f}"
    )
    print(f"chunk step compile (or load), warm / cold:                {ratio('compile_s'):.3f}")
    print(
        f"filter compile (or load), warm / cold:                    {ratio('filter_compile_s'):.3f}"
    )
    print(f"(cold first step, median: {cold_med:.1f} s on this machine, for scale only)")


if __name__ == "__main__":
    main()
