"""A warm ``ms.curve_fit`` in a loop over datasets, two checkouts in turns (issue 38;
profiling/HISTORY.md, "The filter's map of rows on the steps' data").

What a scipy user's first loop does: ``ms.curve_fit(f, x, y, p0=...)`` (3 parameters, 50
points, 32 starts, the defaults) on one dataset after another, the programs compiled by a first
call. Each checkout (``--before PATH``, ``--after PATH``) runs in a fresh process of its own,
the two in turns over ``--rounds`` rounds; each process times ``--calls`` calls on new data
(medians) and counts the calls of ``jax.device_put`` they make. Beside them, in the parent,
scipy's ``curve_fit`` from the same ``p0`` on the same datasets (one start; 32 of them are the
work of 32 starts).

    python profiling/experiments/warm_curve_fit.py --before /tmp/before --after . --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness

import harness  # noqa: E402

X = np.linspace(0.0, 5.0, 50)
P0 = [1.0, 1.0, 0.0]


def datasets(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [3.0 * np.exp(-X / 1.5) + 0.2 + rng.normal(0.0, 0.05, X.size) for _ in range(n)]


def child(calls: int) -> None:
    import jax
    import jax.numpy as jnp

    import multistart as ms

    def f(x, a, tau, c):
        return a * jnp.exp(-x / tau) + c

    ys = datasets(calls + 1)
    ms.curve_fit(f, X, ys[0], p0=P0)  # compiles
    puts, real = [0], jax.device_put

    def counting(*args, **kw):
        puts[0] += 1
        return real(*args, **kw)

    jax.device_put = counting
    walls, popts = [], []
    for y in ys[1:]:
        t0 = time.perf_counter()
        popt, _ = ms.curve_fit(f, X, y, p0=P0)
        walls.append(time.perf_counter() - t0)
        popts.append([float(v) for v in popt])
    jax.device_put = real
    harness.child_result({"wall": harness.median(walls), "puts": puts[0] / calls, "popt": popts})


def scipy_call(calls: int) -> float:
    from scipy.optimize import curve_fit

    def f(x, a, tau, c):
        return a * np.exp(-x / tau) + c

    walls = []
    with harness.one_blas_thread():
        for y in datasets(calls + 1)[1:]:
            t0 = time.perf_counter()
            curve_fit(f, X, y, p0=P0)
            walls.append(time.perf_counter() - t0)
    return harness.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a checkout of the library (the reference)")
    parser.add_argument("--after", help="another checkout, measured against --before")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.calls)
        return
    if not (args.before and args.after):
        parser.error("--before and --after are required")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(args.rounds):
        for arm in ("before", "after") if i % 2 == 0 else ("after", "before"):
            env = {"PYTHONPATH": str(Path(getattr(args, arm)).resolve())}
            env["MULTISTART_LOG_LEVEL"] = "WARNING"
            result = _in(getattr(args, arm), env, args.calls)
            runs[arm].append(result)
    scipy_s = scipy_call(args.calls)
    same = runs["before"][-1]["popt"] == runs["after"][-1]["popt"]
    print(f"a warm ms.curve_fit (3 parameters, 50 points, 32 starts), {args.calls} calls a process")
    for arm, results in runs.items():
        wall = harness.median([r["wall"] for r in results])
        puts = harness.median([r["puts"] for r in results])
        print(
            f"  {arm:<7} {1e3 * wall:7.2f} ms a call, {puts:5.1f} device_put a call, "
            f"{wall / (32 * scipy_s):5.2f}x scipy's 32 single-start calls"
        )
    after = harness.median([r["wall"] for r in runs["after"]])
    before = harness.median([r["wall"] for r in runs["before"]])
    print(f"  after / before {after / before:.3f}; scipy's one call {1e3 * scipy_s:.3f} ms")
    print(f"  the same parameters in both: {same}")


def _in(checkout: str, env: dict, calls: int) -> dict:
    """One child process importing the library of ``checkout`` (its own cache folder)."""
    script = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory() as folder:
        environ = {**os.environ, **env, "MULTISTART_CACHE_DIR": folder}
        proc = subprocess.run(
            [sys.executable, script, "--child", "--calls", str(calls)],
            capture_output=True,
            text=True,
            env=environ,
            cwd=checkout,
            check=True,
        )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(harness.RESULT)][-1]
    return json.loads(line[len(harness.RESULT) :])


if __name__ == "__main__":
    main()
