"""The test suite's time, cold and warm, side by side in one run (issue 14).

    python profiling/experiments/suite_time.py [--rounds 2]

Each round runs, as fresh processes, one after the other:

1. ``every test, fresh cache``: ``python -m pytest -q -m ""`` with ``MULTISTART_SUITE_JAX_CACHE=``
   (every test, a compilation cache made for the run and removed at its end): the suite as it
   ran before the second tier and the kept cache (the reference, 1.000);
2. ``fast suite, cold``: ``python -m pytest -q`` (the README's command) with a new, empty kept
   folder: a fresh checkout, or CI;
3. ``fast suite, warm``: the same command again, on that folder: a developer's next run;
4. ``slow tier, cold``: ``python -m pytest -q -m slow`` on that folder (its programs are new);
5. ``every test, warm``: ``python -m pytest -q -m ""`` on that folder, now holding them all.

For each: wall seconds and CPU seconds (user + system of the pytest process and everything it
started), printed as ratios to arm 1's median. The machine is shared and noisy: compare the
ratios of one run, not seconds across runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "profiling"))

import harness  # noqa: E402

ARMS = [
    ("every test, fresh cache", ["-m", ""], "fresh"),
    ("fast suite, cold", [], "kept"),
    ("fast suite, warm", [], "kept"),
    ("slow tier, cold", ["-m", "slow"], "kept"),
    ("every test, warm", ["-m", ""], "kept"),
]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_arm(args: list[str], cache: str) -> tuple[float, float, str]:
    """``(wall s, CPU s, pytest's last line)`` of one run of the suite."""
    env = {**os.environ, "MULTISTART_SUITE_JAX_CACHE": cache}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    c0, t0 = _cpu(), time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    last = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
    return wall, cpu, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    if opts.rounds < 1:
        parser.error("--rounds must be >= 1")
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in ARMS}
    for r in range(opts.rounds):
        kept = tempfile.mkdtemp(prefix="suite-time-cache-")
        try:
            for name, args, cache in ARMS:
                wall, cpu, last = run_arm(args, "" if cache == "fresh" else kept)
                rows[name].append((wall, cpu))
                print(f"round {r + 1} {name:24s} {wall:7.1f} s wall {cpu:7.1f} s CPU  {last}")
        finally:
            shutil.rmtree(kept, ignore_errors=True)
    ref_wall = harness.median(w for w, _ in rows[ARMS[0][0]])
    ref_cpu = harness.median(c for _, c in rows[ARMS[0][0]])
    print()
    print(f"{'arm':26s} {'wall / ref':>10s} {'CPU / ref':>10s}   (medians of {opts.rounds})")
    for name, _, _ in ARMS:
        wall = harness.median(w for w, _ in rows[name])
        cpu = harness.median(c for _, c in rows[name])
        print(f"{name:26s} {wall / ref_wall:10.3f} {cpu / ref_cpu:10.3f}")


if __name__ == "__main__":
    main()
