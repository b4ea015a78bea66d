"""Does batch_size="auto" find a width as fast as the best fixed one? And what does deciding cost?

For each model, side by side in one run, every arm in a fresh process (compilation cache off):

  fixed:M:W   MultiStartAdam(batch_size=W) on model M: steady seconds per step after step 1
  cold:M      batch_size="auto" with an empty tuning folder (it times widths, then records one)
  warm:M      batch_size="auto" again, reading the record cold:M wrote (no timing)

Models: ``bench`` (benchmark_model.py, 31 parameters, float32, 32 starts), ``image``
(image_model.py, 48 parameters, float64, 32 starts) and ``cheap`` (a 2-parameter parabola,
float32, 100,000 starts). Printed per model: "auto" steady step time / the best fixed width's
(targets: <= 1.10; <= 1.2 for ``cheap``), and the cost of deciding, cold and warm:
``select_s`` (choosing the width, the chosen width's compile included) less ``compile_s`` (that
compile alone), and the widths compiled only to be timed.

    python profiling/experiments/auto_width.py --quick     # 1 repeat, fewer steps
    python profiling/experiments/auto_width.py --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # profiling/: the harness and the models
sys.path.insert(0, str(HERE))

import harness  # noqa: E402

MODELS = {
    # name: (n_starts, fixed widths, steps, quick steps)
    "bench": (32, [1, 2, 4, 8, 16, 32], 40, 15),
    "image": (32, [1, 2, 4, 8, 16, 32], 30, 10),
    "cheap": (100_000, [256, 1024, 4096, 16384, 100_000], 60, 20),
}


def problem(model: str):
    sys.path.insert(0, str(HERE))
    if model == "bench":
        import benchmark_model as bm

        return bm.make_objective(), bm.space()
    if model == "image":
        import image_model

        objective, space, _ = image_model.make_problem()
        return objective, space
    import jax.numpy as jnp

    import multistart as ms

    def cheap(p):
        return jnp.sum((p["x"] - 0.3) ** 2)

    return cheap, {"x": ms.Uniform(-1.0, 1.0, shape=(2,))}


def run_arm(arm: str, steps: int, tuning_dir: str) -> dict:
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    os.environ["MULTISTART_CACHE_DIR"] = tuning_dir
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import multistart as ms

    kind, model, *rest = arm.split(":")
    n_starts = MODELS[model][0]
    spec = "auto" if kind in ("cold", "warm") else int(rest[0])
    objective, space = problem(model)
    search = ms.MultiStartAdam(
        n_starts=n_starts, n_steps=steps, batch_size=spec, seed=0, convergence=None, log_every=0
    )
    st = search.fit(objective, space).stats
    return {
        "width": st["batch_size"],
        "step_s": (st["loop_s"] - st["first_step_s"]) / (st["n_steps_run"] - 1),
        "select_s": st["select_s"],
        "compile_s": st["compile_s"],
        "n_tune_compiles": st["n_tune_compiles"],
        "selected_by": st["width_choice"]["selected_by"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat, fewer steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--json", help="write the record, with every arm's rows, here")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tuning-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        harness.child_result(run_arm(args.arm, args.steps, args.tuning_dir))
        return

    repeats = 1 if args.quick else args.repeats
    models = args.models.split(",")
    runs: dict[str, list[dict]] = {}
    t0 = time.perf_counter()
    for rep in range(repeats):
        for model in models if rep % 2 == 0 else models[::-1]:
            n_starts, widths, steps, quick_steps = MODELS[model]
            steps = quick_steps if args.quick else steps
            with tempfile.TemporaryDirectory(prefix="ms-auto-width-") as folder:
                # cold then warm share one tuning folder; fixed arms have their own empty one
                arms = [f"fixed:{model}:{w}" for w in widths] + [f"cold:{model}", f"warm:{model}"]
                fixed = arms[: len(widths)]
                order = fixed if rep % 2 == 0 else fixed[::-1]
                for arm in [order[0], arms[-2], arms[-1], *order[1:]]:
                    with tempfile.TemporaryDirectory(prefix="ms-empty-") as empty:
                        argv = ["--arm", arm, "--steps", steps, "--tuning-dir"]
                        argv.append(empty if arm.startswith("fixed") else folder)
                        row = harness.fresh_process(__file__, *argv, required=False)
                    if row is None:
                        continue
                    runs.setdefault(arm, []).append(row)
                    print(f"  {arm}: {runs[arm][-1]}", file=sys.stderr, flush=True)
    report(args, models, runs, repeats, time.perf_counter() - t0)


def report(args, models, runs, repeats, seconds) -> None:
    def med(arm, key):
        values = [r[key] for r in runs.get(arm, [])]
        return harness.median(values) if values else float("nan")

    record = harness.Record("auto_width", args)

    print(
        f"batch_size='auto' against fixed widths: median of {repeats} fresh process(es) per "
        f"arm, {seconds:.0f} s in all"
    )
    for model in models:
        n_starts, widths, steps, quick_steps = MODELS[model]
        fixed = [f"fixed:{model}:{w}" for w in widths if runs.get(f"fixed:{model}:{w}")]
        if not fixed:
            continue
        best = min(fixed, key=lambda a: med(a, "step_s"))
        ref = med(best, "step_s")
        for arm in [*fixed, f"cold:{model}", f"warm:{model}"]:
            record.figure(f"{arm} step_s", med(arm, "step_s"))
        record.figure(f"{model} best fixed step_s", ref)
        for arm in [*fixed, f"cold:{model}", f"warm:{model}"]:
            if runs.get(arm):
                record.ratio(f"{arm} / best fixed", f"{arm} step_s", f"{model} best fixed step_s")
        print(f"\n{model} ({n_starts} starts): step time / best fixed width ({best.split(':')[2]})")
        print("  " + ", ".join(f"{a.split(':')[2]}: {med(a, 'step_s') / ref:.3f}" for a in fixed))
        for kind in ("cold", "warm"):
            arm = f"{kind}:{model}"
            if not runs.get(arm):
                continue
            chosen = sorted({r["width"] for r in runs[arm]})
            deciding = med(arm, "select_s") - med(arm, "compile_s")
            print(
                f"  auto {kind}: {med(arm, 'step_s') / ref:.3f}  width(s) {chosen}, deciding "
                f"{deciding:.1f} s beyond the chosen width's compile "
                f"({med(arm, 'compile_s'):.1f} s), {med(arm, 'n_tune_compiles'):.0f} extra "
                f"compile(s)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({**record.as_dict(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
