"""A first fit that is fast: batch_size="auto" against the best fixed width chosen in hindsight.

For each model, every arm runs in fresh processes: a **cold** one (an empty cache folder, so
JAX's persistent compilation cache is empty and no width is recorded: what a newcomer's first
fit pays) and then a **warm** one reading the same folder (a second run of the same fit). The
figure is the wall time of ``search.fit`` (checks, the broad-start filter, compiles, choosing
the width, every step, the Result), auto's against the best fixed width's in the same round;
rounds interleave the arms (reversed every other round) and the table gives medians. The same
ratio of the child's CPU seconds (every thread's) is printed beside it: on a machine shared
with other jobs, wall time is what they move most.

Models (``--models``, default all four):

  curve   the issue's first fit: MultiStartLBFGS, 8 starts, a 3-parameter curve of 60 points
          (float32, default n_steps=1000 and convergence)
  readme  the README's Gaussian peak (its data and chi-squared; the README now fits it by
          least squares) with batch_size left to "auto": MultiStartAdam, 64 starts,
          500 steps, a 3-parameter Gaussian on 400 points
  image   profiling/image_model.py (48 parameters, float64): MultiStartLBFGS, 32 starts,
          300 steps (time_to_solution.py's budget); fixed widths 1 and 4 (wider ones were
          1.4-2.7x slower a step than width 1 in every earlier run: auto_width.py)
  cheap   MultiStartAdam, 100,000 starts of a 2-parameter parabola, 100 steps (float32)
  image40, image1000
          profiling/image_model.py with MultiStartAdam, 32 starts, 40 and 1,000 steps,
          convergence off (issue 34: a short fit of an expensive model, and a long one);
          fixed widths 1 and 32 (the bound), and 1 alone at 1,000 steps

    python profiling/experiments/first_fit.py                      # the four models above, 2 rounds
    python profiling/experiments/first_fit.py --models image40,image1000 --rounds 2
    python profiling/experiments/first_fit.py --models curve,readme --rounds 3
    python profiling/experiments/first_fit.py --models image --fixed image=1 --rounds 5  # best

The table gives the ratio of the medians and, as "paired", the median over rounds of each
round's own ratio (auto against the best width's run of the same round: on a VM whose speed
drifts between rounds, the steadier figure).
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

MODELS = {  # name: the fixed widths timed against "auto" (the search is in problem())
    "curve": [1, 2, 4, 8],
    "readme": [1, 4, 16, 64],
    "image": [1, 4],
    "cheap": [4096, 16384, 100_000],
    "image40": [1, 32],
    "image1000": [1],
}
DEFAULT_MODELS = "curve,readme,image,cheap"


def problem(model: str):
    """``(search class, its keyword arguments, objective, space)`` of ``model``."""
    import jax.numpy as jnp
    import numpy as np

    import multistart as ms

    if model == "curve":
        x = np.linspace(0.0, 10.0, 60)
        y = 3.0 * np.exp(-0.4 * x) + 0.5 + np.random.default_rng(0).normal(0, 0.05, x.size)

        def curve(p):
            return jnp.sum((p["a"] * jnp.exp(-p["k"] * x) + p["c"] - y) ** 2)

        space = {"a": ms.Uniform(0, 10), "k": ms.LogUniform(0.01, 5), "c": ms.Uniform(-2, 2)}
        return ms.MultiStartLBFGS, dict(n_starts=8, seed=0), curve, space
    if model == "readme":
        sys.path.insert(0, str(HERE.parent / "tests"))  # the README's model lives with the tests
        import readme_model

        chi2, space = readme_model.make_problem()
        return ms.MultiStartAdam, dict(n_starts=64, n_steps=500, seed=0), chi2, space
    if model == "image":
        sys.path.insert(0, str(HERE))
        import image_model

        objective, space, _ = image_model.make_problem()
        return ms.MultiStartLBFGS, dict(n_starts=32, n_steps=300, seed=0), objective, space
    if model in ("image40", "image1000"):
        sys.path.insert(0, str(HERE))
        import image_model

        objective, space, _ = image_model.make_problem()
        kwargs = dict(n_starts=32, n_steps=int(model[5:]), seed=0, convergence=None)
        return ms.MultiStartAdam, kwargs, objective, space

    def cheap(p):
        return jnp.sum((p["x"] - 0.3) ** 2)

    space = {"x": ms.Uniform(-1.0, 1.0, shape=(2,))}
    return ms.MultiStartAdam, dict(n_starts=100_000, n_steps=100, seed=0), cheap, space


def run_arm(model: str, width: str) -> dict:
    """One fit in this process (the child): the wall of ``fit`` and what it chose."""
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    cls, kwargs, objective, space = problem(model)
    spec = "auto" if width == "auto" else int(width)
    search = cls(batch_size=spec, log_every=0, progress=False, **kwargs)
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = search.fit(objective, space)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    st = result.stats
    choice = st["width_choice"]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "step_s": (st["loop_s"] - st["first_step_s"]) / max(1, st["n_steps_run"] - 1),
        "fit_estimate_s": choice.get("fit_estimate_s"),
        "compile_estimate_s": choice.get("compile_estimate_s"),
        "reason": choice.get("reason"),
        "width": st["batch_size"],
        "compile_s": st["compile_s"],
        "select_s": st["select_s"],
        "decide_s": st["width_choice"].get("decide_s", 0.0),
        "selected_by": st["width_choice"]["selected_by"],
        "n_tune_compiles": st["n_tune_compiles"],
        "best_fom": float(result.best_fom),
    }


def child(model: str, width: str, folder: str) -> dict | None:
    """One fit in a fresh process with the tuning folder ``folder`` (None if it failed)."""
    env = {"MULTISTART_CACHE_DIR": folder, "MULTISTART_AUTO_WIDTH": "measure"}
    env |= {"JAX_COMPILATION_CACHE_DIR": None}
    return harness.fresh_process(__file__, "--arm", f"{model}:{width}", env=env, required=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"any of {','.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the record, with every run, here")
    parser.add_argument(
        "--fixed",
        action="append",
        default=[],
        metavar="MODEL=W1,W2",
        help="the fixed widths to time for MODEL (default: the module's MODELS)",
    )
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # child mode: model:width
    args = parser.parse_args()
    if args.arm:
        model, width = args.arm.split(":")
        harness.child_result(run_arm(model, width))
        return
    models = args.models.split(",")
    for spec in args.fixed:
        name, _, widths = spec.partition("=")
        if name not in MODELS or not all(w.isdigit() and int(w) > 0 for w in widths.split(",")):
            parser.error(f"--fixed {spec!r}: expected MODEL=W1,W2 with MODEL one of {list(MODELS)}")
        MODELS[name] = [int(w) for w in widths.split(",")]
    runs: dict[tuple[str, str, str], list[dict]] = {}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for model in models:
            arms = ["auto", *map(str, MODELS[model])]
            for width in arms if r % 2 == 0 else arms[::-1]:
                with tempfile.TemporaryDirectory(prefix="ms-first-fit-") as folder:
                    for phase in ("cold", "warm"):
                        row = child(model, width, folder)
                        if row is not None:
                            row["round"] = r
                            runs.setdefault((model, width, phase), []).append(row)
                            print(f"  {model} {width} {phase}: {row}", file=sys.stderr, flush=True)
    record = harness.Record("first_fit", args)
    report(record, models, runs, args.rounds, time.perf_counter() - t0)
    if args.json:
        flat = {":".join(k): v for k, v in runs.items()}
        Path(args.json).write_text(json.dumps({**record.as_dict(), "runs": flat}, indent=1))


def report(record, models, runs, rounds, seconds) -> None:
    def med(model, width, phase, key="wall_s"):
        rows = runs.get((model, width, phase), [])
        return harness.median(r[key] for r in rows) if rows else float("nan")

    import jax

    print(
        f"first fit: wall of fit(), batch_size='auto' / the best fixed width; median of "
        f"{rounds} round(s), fresh processes; jax {jax.__version__}; {seconds:.0f} s in all"
    )
    print(f"{'model':9s} {'phase':5s} {'auto/best':>9s} {'best':>6s} {'paired':>6s}"
          f" {'auto width':>10s} {'deciding s':>10s} {'deciding/wall':>13s}  fixed widths / best"
          f"    |  by CPU seconds: auto/best, best")  # fmt: skip
    for model in models:
        for phase in ("cold", "warm"):
            fixed = [str(w) for w in MODELS[model] if (model, str(w), phase) in runs]
            if not fixed or (model, "auto", phase) not in runs:
                continue
            best = min(fixed, key=lambda w: med(model, w, phase))
            ref = med(model, best, phase)
            for width in ["auto", *fixed]:
                record.figure(f"{model} {phase} {width} wall_s", med(model, width, phase))
            record.figure(f"{model} {phase} best fixed wall_s", ref)
            record.ratio(
                f"{model} {phase} auto / best fixed",
                f"{model} {phase} auto wall_s",
                f"{model} {phase} best fixed wall_s",
            )
            auto = runs[(model, "auto", phase)]
            widths = sorted({r["width"] for r in auto})
            deciding = med(model, "auto", phase, "decide_s")
            of_round = {b["round"]: b["wall_s"] for b in runs[(model, best, phase)]}
            paired = harness.median(
                [a["wall_s"] / of_round[a["round"]] for a in auto if a["round"] in of_round]
                or [float("nan")]
            )
            share = deciding / med(model, "auto", phase)
            others = ", ".join(f"{w}: {med(model, w, phase) / ref:.3f}" for w in fixed)
            cpu_best = min(fixed, key=lambda w: med(model, w, phase, "cpu_s"))
            cpu = med(model, "auto", phase, "cpu_s") / med(model, cpu_best, phase, "cpu_s")
            print(
                f"{model:9s} {phase:5s} {med(model, 'auto', phase) / ref:9.3f} {best:>6s}"
                f" {paired:6.3f} {','.join(map(str, widths)):>10s} {deciding:10.2f}"
                f" {share:13.3f}  {others}"
                f"    |  {cpu:.3f}, {cpu_best}"
            )
            chosen = {r["selected_by"] for r in auto}
            why = (auto[0].get("reason") or "")[:150]
            print(f"{'':9s} {'':5s} auto: {', '.join(sorted(chosen))} ({why})")


if __name__ == "__main__":
    main()
