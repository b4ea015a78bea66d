"""Batch width: throughput per width and backend, what "tune" and "auto" choose, the cost of the
out-of-memory guard, and "auto"'s peak memory under a budget.

Every arm runs in a fresh process with the persistent compilation cache off and an empty
tuning folder; arms are interleaved (the order reversed on odd repeats) and medians reported.
Figures are ratios measured side by side in one run.

  fixed:B:W    MultiStartAdam(batch_size=W, backend=B) on the multi-dataset benchmark objective
               (31 parameters, 4 datasets); steady starts x steps per second after step 1
  tune:B       batch_size="tune" (measured, nothing recorded before): its width and throughput
  auto:B       batch_size="auto": its width and throughput
  guard:O:E    the back-off's population copy every E steps (E=0: never) on objective O
               ("bench" at width 4, or "tiny", a 3-parameter parabola at one chunk per step)
  mem:S        a one-image model whose full vmap of 64 starts needs about 5 GB, under
               MULTISTART_MEMORY_BUDGET_GB=0.5, batch_size S ("auto" or 1): peak RSS growth
               over the RSS before the fit. The fixed cost (compiler, runtime, data, population
               and its copy) is the growth at width 1 less XLA's estimate for one start

    python profiling/experiments/batch_width.py  # defaults: 32 starts, 60 steps, 3 repeats
    python profiling/experiments/batch_width.py --repeats 5 --json out.json
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

WIDTHS = [1, 2, 4, 8, 16, 32]
BACKENDS = ["loop", "scan"]


def big_model(side: int = 1024):
    """Three Gaussians on a side x side image, the data passed as an argument (not a
    constant): about 77 MiB of working memory per start in float32."""
    import jax.numpy as jnp
    import numpy as np

    import multistart as ms
    from multistart.model.priors import Space
    from multistart.model.problem import Problem

    k = 3
    space = {
        "xy": ms.Uniform(-1.0, 1.0, shape=(k, 2)),
        "sigma": ms.LogUniform(0.05, 0.5, shape=(k,)),
        "amp": ms.Uniform(0.0, 10.0, shape=(k,)),
        "bg": ms.Uniform(-1.0, 1.0),
    }

    def model(p, xx, yy):
        out = p["bg"]
        for i in range(k):
            r2 = (xx - p["xy"][i, 0]) ** 2 + (yy - p["xy"][i, 1]) ** 2
            out = out + p["amp"][i] * jnp.exp(-0.5 * r2 / p["sigma"][i] ** 2)
        return out

    def fom(p, d):
        return jnp.sum(((model(p, d["xx"], d["yy"]) - d["img"]) / 0.1) ** 2)

    g = np.linspace(-1, 1, side, dtype=np.float32)
    yy, xx = np.meshgrid(g, g, indexing="ij")
    truth = {
        "xy": np.array([[-0.3, 0.2], [0.25, -0.1], [0.05, 0.4]], np.float32),
        "sigma": np.array([0.12, 0.2, 0.08], np.float32),
        "amp": np.array([3.0, 1.5, 2.0], np.float32),
        "bg": np.float32(0.1),
    }
    noise = np.random.default_rng(0).normal(0, 0.1, xx.shape).astype(np.float32)
    img = np.asarray(model(truth, xx, yy)) + noise

    class Big:
        def multistart_problem(self):
            return Problem(fom, Space(space), {"xx": xx, "yy": yy, "img": img}, "big")

    return Big()


def run_arm(arm: str, n_starts: int, steps: int) -> dict:
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    tuning_dir = tempfile.TemporaryDirectory(prefix="ms-tune-")  # removed when the arm exits
    os.environ["MULTISTART_CACHE_DIR"] = tuning_dir.name
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    sys.path.insert(0, str(HERE))
    import benchmark_model as bm

    import multistart as ms
    import multistart.device.sweeper

    kind, *rest = arm.split(":")
    base = dict(n_starts=n_starts, n_steps=steps, seed=0, convergence=None, log_every=0)

    if kind == "mem":
        import psutil

        problem = big_model()
        os.environ["MULTISTART_MEMORY_BUDGET_GB"] = "0.5"
        spec = rest[0] if rest[0] == "auto" else int(rest[0])
        search = ms.MultiStartAdam(**{**base, "n_starts": 64, "n_steps": 4, "batch_size": spec})
        rss0 = psutil.Process().memory_info().rss
        result = search.fit(problem)
        peak = psutil.Process().memory_info().rss
        try:
            import resource

            peak = max(peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        except ImportError:
            pass
        info = result.stats["width_choice"]
        out = {"width": result.stats["batch_size"], "rss_growth": peak - rss0}
        if info.get("estimates"):
            chosen = [e for e in info["estimates"] if e["width"] == out["width"]][-1]
            one = [e for e in info["estimates"] if e["width"] == 1]
            out.update(
                budget=info["budget_bytes"],
                resident=chosen["resident"],
                checkpoint=info["checkpoint_bytes"],
                extra=chosen["extra"],
                extra_1=one[0]["extra"] if one else None,
                full_vmap_extra=info["fixed_bytes"] + 64 * info["per_start_bytes"],
            )
        return out

    if kind == "guard":
        objective, every = rest[0], int(rest[1])
        multistart.device.sweeper.BACKOFF_COPY_STEPS = every if every > 0 else 10**9
        if objective == "bench":
            f, space, kw = bm.make_objective(), bm.space(), {"batch_size": 4}
        else:
            sys.path.insert(0, str(HERE.parent / "tests"))
            from conftest import PARABOLA_SPACE, parabola

            f, space = parabola, PARABOLA_SPACE
            kw = {"n_starts": 8, "batch_size": 8, "n_steps": 30 * steps}
        result = ms.MultiStartAdam(**{**base, **kw}).fit(f, space)
    else:
        backend = rest[0]
        spec = kind if kind in ("tune", "auto") else int(rest[1])
        search = ms.MultiStartAdam(**{**base, "batch_size": spec, "backend": backend})
        result = search.fit(bm.make_objective(), bm.space())
    st = result.stats
    n_steps = st["n_steps_run"]
    steady = (st["loop_s"] - st["first_step_s"]) / (n_steps - 1)
    out = {
        "width": st["batch_size"],
        "steady_step_s": steady,
        "rate": result.n_starts / steady,  # starts x steps per second
        "compile_s": st["compile_s"],
        "select_s": st["select_s"],
        "n_compiles": st["n_compiles"],
        "n_tune_compiles": st["n_tune_compiles"],
    }
    if "tuning" in st:
        out["table"] = [
            {k: row.get(k) for k in ("width", "starts_steps_per_s")}
            for row in st["tuning"]["table"]
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-starts", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", help="comma-separated arms (default: all)")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--json", help="write the record, with every arm's rows, here")
    args = parser.parse_args()
    if args.arm:
        harness.child_result(run_arm(args.arm, args.n_starts, args.steps))
        return

    widths = [w for w in WIDTHS if w <= args.n_starts]
    arms = [f"fixed:{b}:{w}" for b in BACKENDS for w in widths]
    arms += [f"{k}:{b}" for k in ("tune", "auto") for b in BACKENDS]
    arms += [f"guard:{o}:{e}" for o in ("bench", "tiny") for e in (0, 16, 1)]
    arms += ["mem:auto", "mem:1"]
    if args.arms:
        arms = args.arms.split(",")
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    t0 = time.perf_counter()
    sizes = ["--n-starts", args.n_starts, "--steps", args.steps]
    for rep in range(args.repeats):
        for arm in arms if rep % 2 == 0 else arms[::-1]:
            row = harness.fresh_process(__file__, "--arm", arm, *sizes, required=False)
            if row is not None:
                runs[arm].append(row)

    record = harness.Record("batch_width", args)
    if args.json:  # the raw rows first: a summary bug must not lose a long run
        Path(args.json).write_text(json.dumps({**record.as_dict(), "runs": runs}, indent=1))

    def med(arm, key):
        values = [r[key] for r in runs.get(arm, []) if isinstance(r.get(key), (int, float))]
        return harness.median(values) if values else float("nan")

    def widths_of(arm):
        return sorted({r["width"] for r in runs.get(arm, [])})

    print(
        f"multi-dataset benchmark objective (31 parameters, 4 datasets): {args.n_starts} starts, "
        f"{args.steps} steps, median of {args.repeats} fresh processes per arm, "
        f"{time.perf_counter() - t0:.0f} s in all"
    )
    best = {}
    for b in BACKENDS:
        fixed = [f"fixed:{b}:{w}" for w in widths if runs.get(f"fixed:{b}:{w}")]
        if not fixed:
            continue
        best[b] = max(fixed, key=lambda a: med(a, "rate"))
        ref = med(best[b], "rate")
        record.figure(f"{b} best fixed rate", ref)
        for arm in [*fixed, f"tune:{b}", f"auto:{b}"]:
            if runs.get(arm):
                record.figure(f"{arm} rate", med(arm, "rate"))
                record.ratio(f"{arm} rate / best fixed", f"{arm} rate", f"{b} best fixed rate")
        print(f"\n{b} backend: starts x steps / s relative to its best fixed width ({best[b]})")
        print(f"  {'width':>6} {'rate / best':>12} {'compile s':>10}")
        for arm in fixed:
            rate, compile_s = med(arm, "rate") / ref, med(arm, "compile_s")
            print(f"  {arm.split(':')[2]:>6} {rate:>12.3f} {compile_s:>10.2f}")
        for kind in ("tune", "auto"):
            arm = f"{kind}:{b}"
            if runs.get(arm):
                print(
                    f"  {kind:>6} {med(arm, 'rate') / ref:>12.3f}   width(s) {widths_of(arm)}, "
                    f"selection {med(arm, 'select_s'):.1f} s, "
                    f"{med(arm, 'n_tune_compiles'):.0f} extra compiles"
                )
    if "loop" in best and "scan" in best:
        ratio = med(best["scan"], "rate") / med(best["loop"], "rate")
        print(f"\nbest scan / best loop throughput: {ratio:.3f}")
    for objective in ("bench", "tiny"):
        never = f"guard:{objective}:0"
        if runs.get(never):
            ref = med(never, "steady_step_s")
            line = ", ".join(
                f"every {e} steps {med(f'guard:{objective}:{e}', 'steady_step_s') / ref:.3f}"
                for e in (16, 1)
                if runs.get(f"guard:{objective}:{e}")
            )
            print(f"\nout-of-memory guard on {objective}: steady step time / no copy: {line}")
    for arm in ("mem:auto", "mem:1"):
        if runs.get(arm):
            growth = med(arm, "rss_growth") / 2**30
            print(f"\n{arm}: width {widths_of(arm)}, peak RSS growth {growth:.3f} GiB")
    if runs.get("mem:auto") and runs.get("mem:1"):
        gib = {k: med("mem:auto", k) / 2**30 for k in runs["mem:auto"][0] if k != "width"}
        fixed = med("mem:1", "rss_growth") / 2**30 - gib["extra_1"]
        print(
            f"  a full vmap of 64 would need {gib['full_vmap_extra']:.2f} GiB beyond its "
            f"arguments; auto's width needs {gib['extra']:.3f} GiB (XLA), budget "
            f"{gib['budget']:.3f} GiB; fixed cost {fixed:.3f} GiB (of which arguments + copy "
            f"{gib['resident'] + gib['checkpoint']:.3f})\n"
            f"  peak RSS growth / (budget + fixed cost) = "
            f"{gib['rss_growth'] / (gib['budget'] + fixed):.3f}"
        )
    if args.json:  # with the figures and ratios of the summary
        Path(args.json).write_text(json.dumps({**record.as_dict(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
