"""XLA's CPU fusion emitters against its older ones: compile time and step time of the engine.

XLA's CPU compiler generates each fused kernel with its newer MLIR "fusion emitters" by
default; ``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false`` selects the older emitters. A fit's
first run pays a compile of the chunk step per width it times (``batch_size="auto"`` on a CPU),
so compile time is part of the time to a first fit. This script measures both settings on the
image fit (``image_model.py``, 48 parameters, float64): each arm is a fresh process (the flag
is read when the backend starts), the persistent compilation cache off, ``MultiStartLBFGS`` at
width 1 on 8 starts for 40 steps with no convergence. Per arm: the chunk step's compile
seconds, the seconds per step after the first, and the best figure of merit (whether the two
code generators round alike). Arms alternate within each round; medians over ``--rounds``.

    python profiling/experiments/cpu_emitters.py             # 5 rounds
    python profiling/experiments/cpu_emitters.py --rounds 2  # quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # profiling/: the benchmark models
sys.path.insert(0, str(HERE))

import harness  # noqa: E402  (its fresh processes)

FLAG = "--xla_cpu_use_fusion_emitters=false"
ARMS = {"fusion emitters (default)": "", "older emitters": FLAG}


def child() -> None:
    sys.path.insert(0, str(HERE))
    import image_model

    import multistart as ms

    objective, space, _ = image_model.make_problem()
    ms.set_log_level("WARNING")
    search = ms.MultiStartLBFGS(
        n_starts=8,
        n_steps=40,
        batch_size=1,
        convergence=None,
        gtol=0.0,
        ftol=0.0,
        log_every=0,
        devices=1,
        n_candidates=0,
    )
    r = search.fit(objective, space)
    st = r.stats
    step_s = (st["loop_s"] - st["first_step_s"]) / max(st["n_steps_run"] - 1, 1)
    harness.child_result({"compile_s": st["compile_s"], "step_s": step_s, "best": r.best_fom})


def run_arm(flags: str) -> dict:
    env = {"MULTISTART_CACHE_DIR": "", "XLA_FLAGS": flags, "OPENBLAS_NUM_THREADS": "1"}
    return harness.fresh_process(__file__, "--child", env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return
    rows: dict[str, list[dict]] = {name: [] for name in ARMS}
    for i in range(args.rounds):
        order = list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]
        for name in order:
            rows[name].append(run_arm(ARMS[name]))
            print(f"  round {i + 1} {name}: {rows[name][-1]}", flush=True)
    ref = list(ARMS)[0]

    def med(name, key):
        return statistics.median(r[key] for r in rows[name])

    print(
        f"\nimage fit, MultiStartLBFGS width 1, 8 starts; median of {args.rounds} fresh processes"
    )
    print(f"{'arm':<28}{'compile / default':>18}{'step / default':>16}{'best fom':>16}")
    for name in ARMS:
        print(
            f"{name:<28}{med(name, 'compile_s') / med(ref, 'compile_s'):>18.3f}"
            f"{med(name, 'step_s') / med(ref, 'step_s'):>16.3f}{rows[name][0]['best']:>16.8g}"
        )


if __name__ == "__main__":
    main()
