"""A stack of one-start fits stepped as one chunk, in place, against the default width (issue
38: a lead measured, not built; the closing note of 2026-12-06).

``profiling/curve_fit_many.py``'s peaks (its ``--truths``), ``--fits`` of them, one start a
fit. Each arm runs in a fresh process with an empty cache folder: a cold call, then two warm
calls on new data (the next two seeds). The arms are ``auto`` (the library's width: 250 rows a
chunk for 2,000 fits, each chunk gathered and scattered) and ``whole`` (``batch_size`` the
number of fits: one chunk, stepped where it lies), in turns over ``--rounds`` rounds; scipy's
loop over the cold call's data runs in this process as the peer. The script prints each arm's
medians and their speed against scipy's loop.

    python profiling/experiments/stack_in_place.py --truths centred --rounds 3
    python profiling/experiments/stack_in_place.py --truths anywhere --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness, curve_fit_many

import curve_fit_many as cfm  # noqa: E402
import harness  # noqa: E402

ARMS = ("auto", "whole")


def child(arm: str, n: int, draw: str, seed: int) -> None:
    """A cold call and two warm calls on new data, in this process."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import multistart as ms

    width = "auto" if arm == "auto" else n
    walls = []
    for s in (seed, seed + 1, seed + 2):
        _, y = cfm.datasets(n, s, draw)
        t0 = time.perf_counter()
        ms.curve_fit(
            cfm.peak, cfm.X, y, p0=cfm.P0, bounds=cfm.BOUNDS, n_starts=1, batched=True,
            batch_size=width, log_every=0,
        )  # fmt: skip
        walls.append(time.perf_counter() - t0)
    harness.child_result({"cold": walls[0], "warm": min(walls[1:])})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=2000)
    parser.add_argument("--truths", choices=tuple(cfm.TRUTHS), default="centred")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.fits, args.truths, args.seed)
    got: dict[str, dict[str, list[float]]] = {a: {"cold": [], "warm": []} for a in ARMS}
    for i in range(args.rounds):
        for arm in ARMS[:: 1 if i % 2 == 0 else -1]:
            with tempfile.TemporaryDirectory() as folder:
                env = {"MULTISTART_CACHE_DIR": folder, "MULTISTART_LOG_LEVEL": "WARNING"}
                argv = ["--child", arm, "--fits", args.fits, "--truths", args.truths]
                r = harness.fresh_process(__file__, *argv, "--seed", args.seed, env=env)
            for call in ("cold", "warm"):
                got[arm][call].append(r[call])
            print(f"  round {i + 1}, {arm:<5}: cold {r['cold']:.3f} s, warm {r['warm']:.3f} s")
    scipy_s, _ = cfm.scipy_loop(cfm.datasets(args.fits, args.seed, args.truths)[1])
    print(f"{args.fits} one-start fits, truths {args.truths}; scipy's loop {scipy_s:.2f} s")
    for arm in ARMS:
        cold, warm = (harness.median(got[arm][c]) for c in ("cold", "warm"))
        print(
            f"{arm:<6} cold {cold:.3f} s ({scipy_s / cold:.1f}x scipy), "
            f"warm {warm:.3f} s ({scipy_s / warm:.1f}x scipy)"
        )


if __name__ == "__main__":
    main()
