"""The loop backend against the scan backend at width 1 on a CPU: where a step's time goes.

``MultiStartLBFGS`` on the image fit (``image_model.py``, 48 parameters, float64), 32 starts,
``batch_size=1``, ``--steps`` steps, convergence off, the same starts for both arms; each arm
fitted once untimed (compiles, cached), then timed in interleaved rounds (the order reversed
every other round). Per evaluation: wall and process CPU milliseconds, and the scan backend's
ratio to the loop's. Then one more loop-backend fit under cProfile: the Python seconds spent
calling the compiled chunk step (``jax.stages.Compiled.__call__``) per chunk call, against the
seconds the host waits for results (``jax.Array._value``): whether the loop backend's extra
cost is Python dispatch or the device's execution of many small programs.

    python profiling/experiments/backend_dispatch.py --steps 150 --rounds 2
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="backend-dispatch-"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # profiling/: the models

import image_model  # noqa: E402
import jax  # noqa: E402

import multistart as ms  # noqa: E402


def fit(objective, space, backend: str, steps: int):
    search = ms.MultiStartLBFGS(
        n_starts=32, batch_size=1, n_steps=steps, seed=0, convergence=None, progress=False,
        backend=backend,
    )  # fmt: skip
    t, c = time.perf_counter(), time.process_time()
    result = search.fit(objective, space)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return result, wall, cpu


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    objective, space, _ = image_model.make_problem()  # enables float64
    arms = ("loop", "scan")
    for backend in arms:
        fit(objective, space, backend, args.steps)  # compile, cache
    per_eval: dict[str, list[tuple[float, float]]] = {b: [] for b in arms}
    bests = {}
    for r in range(args.rounds):
        for backend in arms if r % 2 == 0 else arms[::-1]:
            result, wall, cpu = fit(objective, space, backend, args.steps)
            n = result.stats["n_evals"]
            per_eval[backend].append((1e3 * wall / n, 1e3 * cpu / n))
            bests[backend] = result.best_fom
    print(f"image fit, 32 starts, width 1, {args.steps} steps; jax {jax.__version__}")
    print(f"{'backend':8s}{'ms/eval':>9s}{'CPU ms/eval':>13s}{'/ loop':>8s}   best chi2")
    loop = statistics.median(w for w, _ in per_eval["loop"])
    for backend in arms:
        wall = statistics.median(w for w, _ in per_eval[backend])
        cpu = statistics.median(c for _, c in per_eval[backend])
        print(f"{backend:8s}{wall:9.3f}{cpu:13.3f}{wall / loop:8.3f}   {bests[backend]:.6g}")

    profile = cProfile.Profile()
    profile.enable()
    result, wall, _ = fit(objective, space, "loop", args.steps)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    calls = waits = 0.0
    n_calls = 0
    for (filename, _, name), (_, ncalls, tottime, _, _) in stats.items():
        if filename.endswith("stages.py") and name == "__call__":
            calls, n_calls = calls + tottime, n_calls + ncalls
        if filename.endswith("array.py") and name == "_value":
            waits += tottime
    chunk_calls = result.stats["n_chunk_calls"]
    print(
        f"\nloop backend under cProfile: {chunk_calls} chunk calls in {wall:.2f} s; Python in "
        f"the compiled calls {1e6 * calls / max(n_calls, 1):.0f} us a call, the host waiting "
        f"for results {waits / wall:.0%} of the wall"
    )


if __name__ == "__main__":
    main()
