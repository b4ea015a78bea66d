"""Wide chunks on a glibc CPU: the cost of giving temporaries back to the OS after every call.

XLA's CPU runtime allocates a chunk step's temporaries with malloc for every call and frees
them after it. With glibc's defaults, large blocks are returned to the operating system on
free (heap trimming, or mmap/munmap for the largest), so the next call page-faults its way
through fresh memory again. For a wide chunk of a multi-dataset likelihood that can double the
step time. Starting Python with ``MALLOC_TOP_PAD_`` set (glibc keeps that much free memory at
the top of its heaps instead of trimming it) removes the cost; setting it with ``mallopt`` from
inside a running process does not (XLA's worker threads already have their own arenas).

Each arm is a fresh process: ``MultiStartAdam`` on the benchmark model (32 starts), steady time
per step at one width, with and without ``MALLOC_TOP_PAD_=512 MiB``; rounds interleave the arms.

    python profiling/experiments/malloc_top_pad.py                 # widths 8, 16, 32; 3 rounds
    python profiling/experiments/malloc_top_pad.py --widths 32 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # profiling/: the benchmark models
sys.path.insert(0, str(HERE))

import harness  # noqa: E402  (its fresh processes)

PAD = str(512 * 2**20)


def child(width: int, steps: int) -> None:
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    os.environ["MULTISTART_CACHE_DIR"] = ""
    sys.path.insert(0, str(HERE))
    import benchmark_model as bm

    import multistart as ms

    search = ms.MultiStartAdam(
        n_starts=32,
        n_steps=steps,
        seed=0,
        convergence=None,
        log_every=0,
        batch_size=width,
        n_candidates=0,
    )
    st = search.fit(bm.make_objective(), bm.space()).stats
    steady = (st["loop_s"] - st["first_step_s"]) / (st["n_steps_run"] - 1)
    harness.child_result({"steady_step_s": steady})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="8,16,32")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    widths = [int(w) for w in args.widths.split(",")]
    arms = [(w, pad) for w in widths for pad in (False, True)]
    times: dict = {arm: [] for arm in arms}
    for r in range(args.rounds):
        for width, pad in arms if r % 2 == 0 else arms[::-1]:
            env = {"MALLOC_TOP_PAD_": PAD if pad else None}
            argv = ["--child", width, "--steps", args.steps]
            times[(width, pad)].append(harness.fresh_process(__file__, *argv, env=env))
    med = {a: statistics.median(t["steady_step_s"] for t in times[a]) for a in arms}
    best = min(med.values())
    print(f"benchmark model, 32 starts, {args.steps} steps, median of {args.rounds} processes")
    print(
        f"{'width':>5} {'default / best':>15} {'MALLOC_TOP_PAD_ / best':>23} {'default / pad':>14}"
    )
    for w in widths:
        d, p = med[(w, False)], med[(w, True)]
        print(f"{w:>5} {d / best:>15.3f} {p / best:>23.3f} {d / p:>14.3f}")


if __name__ == "__main__":
    main()
