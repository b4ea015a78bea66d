"""The best of N for a fraction of N runs: ``schedule="halving"`` against scipy's loop and "all".

Two questions, each answered by arms run side by side in one process (ratios are the figure;
seconds on a shared machine are not):

``image`` (issues 22 and 73): the 48-parameter image fit (``image_model.py``, float64;
``--data`` its truth and noise seed), at most ``--cap`` evaluations a start. scipy's loop runs
from ``--starts`` starts drawn uniformly in the central band; the engine's arms run as a user
calls them, from their own starts (the broad-start filter's), unless named ``drawn``. Arms
(``--arms``, comma-separated; scipy always runs):

- ``scipy``: ``scipy.optimize.minimize(method="L-BFGS-B", jac=True, bounds=...,
  options={"maxfun": cap})`` over a jitted value-and-grad, looped over its starts, one BLAS
  thread (``peers.py``), its jit compile included. Every ratio is against this arm.
- ``halving``: ``MultiStartLBFGS(n_starts, schedule="halving", n_steps=cap)`` with the default
  start strategy (``"band_tiktak"``: the band's first wave, TikTak's refills while the local
  searches are short) and the default :class:`multistart.Halving` (or ``--r0/--eta/--grace/
  --keep``).
- ``band``: the same with ``start_strategy="band"`` (one wave, no refills).
- ``all``, ``all_band``: the same two with ``schedule="all"``, every start to its end.
- ``drawn``: ``halving`` with ``start_strategy="band"`` from scipy's own starts (issue 22's
  figure 1).

The engine's arms run with ``batch_size="auto"`` after an untimed fit of one step a start of
the same model (its filter included) has chosen and remembered the width and cached the
compiled programs (a user's second fit); loading them is in their wall, as scipy's jit compile
is in its own. Per seed and arm: wall / scipy's, evaluations / scipy's, best χ² relative to
scipy's best, the evaluations made when the final best was first seen (``evals_to_best``;
scipy's counted the same way, over its loop), the starts pruned and the local searches run.

``sines`` (figure 3): the sum of three sinusoids of ``multimodal.py`` (9 parameters, float64),
``--starts`` starts from the engine's default filter, ``MultiStartLBFGS`` with ``"halving"``
and with ``"all"``: successes (starts that end within 1 of the truth's χ²), wall, successes
per second, and whether the fit's best is the global minimum.

    python profiling/halving.py image --seeds 0 1 2               # issue 73: the default starts
    python profiling/halving.py image --seeds 0 1 2 --arms drawn,all    # figure 1 (32 starts)
    python profiling/halving.py image --starts 128 --seeds 0 --arms drawn   # figure 2
    python profiling/halving.py sines --seeds 0 1 2 3 4           # figure 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="halving-cache-"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import harness  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

import multistart as ms  # noqa: E402


def scipy_arm(objective, space, starts, cap: int) -> dict:
    """scipy's L-BFGS-B looped over ``starts``, at most ``cap`` evaluations each."""
    from peers import scipy_problem

    vg, x0s, bounds = scipy_problem(objective, space, starts)
    seen = {"n": 0, "best": np.inf, "to_best": 0}

    def fun(v):
        f, g = vg(v)
        f = float(f)
        seen["n"] += 1
        if f < seen["best"]:
            seen["best"], seen["to_best"] = f, seen["n"]
        return f, np.asarray(g, dtype=np.float64)

    t0, c0 = time.perf_counter(), time.process_time()
    foms = [
        scipy.optimize.minimize(
            fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxfun": cap}
        ).fun
        for x0 in x0s
    ]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    best = float(min(foms))
    return {"wall": wall, "cpu": cpu, "evals": seen["n"], "best": best, "to_best": seen["to_best"]}


def engine_arm(search, objective, space, starts=None) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    r = search.fit(objective, space, starts=starts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "wall": wall,
        "cpu": cpu,
        "evals": int(r.stats["n_evals"]),
        "best": float(r.best_fom),
        "to_best": r.stats["evals_to_best"],
        "pruned": r.stats.get("n_pruned", 0),
        "width": r.stats["batch_size"],
        "select_s": round(r.stats["select_s"], 2),
        "compile_s": round(r.stats["compile_s"], 2),
        "local": int(r.stats.get("n_local", r.n_starts)),
        "result": r,
    }


def halving_from(args) -> ms.Halving:
    d = ms.Halving()
    return ms.Halving(
        r0=args.r0 or d.r0,
        eta=args.eta or d.eta,
        grace=d.grace if args.grace is None else args.grace,
        keep=args.keep or d.keep,
    )


IMAGE_ARMS = ("scipy", "halving", "band", "all", "all_band", "drawn")


def image(args) -> None:
    import image_model
    from peers import draw_starts

    objective, space, _ = image_model.make_problem(args.data)
    halving, n, cap = halving_from(args), args.starts, args.cap
    common = {"n_starts": n, "n_steps": cap, "log_every": 0, "progress": False, "devices": 1}
    # An untimed fit of one step per start chooses and remembers the width ("auto"), runs the
    # broad-start filter and puts the chunk step and the filter's program in the compilation
    # cache, as a user's earlier fit of the model would (the same n_steps: the history's
    # length is part of the program), so no arm pays the first compile.
    ms.MultiStartLBFGS(**common, max_evals=n).fit(objective, space)
    print(
        f"image fit (data seed {args.data}), {n} starts, at most {cap} evaluations each; "
        f"{halving}; jax {jax.__version__}"
    )
    print(f"BLAS: {harness.blas_threads()}; every arm runs with one BLAS thread")
    rows = []
    for seed in args.seeds:
        starts = draw_starts(space, n, seed)
        engine = {**common, "seed": seed}

        def lbfgs(start_strategy=None, schedule=halving, user=None, engine=engine):
            chosen = {} if start_strategy is None else {"start_strategy": start_strategy}
            search = ms.MultiStartLBFGS(**engine, **chosen, schedule=schedule)
            return engine_arm(search, objective, space, user)

        arms = {
            "scipy": lambda s=starts: scipy_arm(objective, space, s, cap),
            # a user's call: the default start strategy and its filter, racing
            "halving": lambda: lbfgs(),
            "band": lambda: lbfgs("band"),
            "all": lambda: lbfgs(schedule="all"),
            "all_band": lambda: lbfgs("band", schedule="all"),
            # the race on scipy's own starts (the figures before issue 73)
            "drawn": lambda s=starts: lbfgs("band", user=s),
        }
        arms = {name: arm for name, arm in arms.items() if name in args.arms}
        names = list(arms) if seed % 2 == 0 else list(arms)[::-1]  # a slow spell hits all
        out = {}
        for name in names:
            with harness.one_blas_thread():
                out[name] = arms[name]()
            shown = {k: v for k, v in out[name].items() if k != "result"}
            print(f"  seed {seed} {name}: {shown}", flush=True)
        rows.append((seed, out))
    print_image(rows)
    record = harness.Record("halving", args)
    for seed, out in rows:
        for name, r in out.items():
            for key in ("wall", "cpu", "evals", "best"):
                record.figure(f"seed {seed} {name} {key}", r[key])
            if name != "scipy":
                for key in ("wall", "cpu", "evals"):
                    arm, peer = f"seed {seed} {name} {key}", f"seed {seed} scipy {key}"
                    record.ratio(f"{arm} / scipy", arm, peer)
    record.write(args.json)


def print_image(rows) -> None:
    print()
    print(
        f"{'seed':>4} {'arm':8s}{'wall/scipy':>11}{'CPU/scipy':>10}{'evals/scipy':>12}"
        f"{'best-scipy (rel)':>18}{'to best/scipy evals':>21}{'pruned':>8}{'local':>7}"
    )
    ratios: dict[str, list[tuple]] = {}
    for seed, out in rows:
        ref = out["scipy"]
        for name in IMAGE_ARMS:
            if name not in out:
                continue
            r = out[name]
            rel = (r["best"] - ref["best"]) / abs(ref["best"])
            ratio = (r["wall"] / ref["wall"], r["cpu"] / ref["cpu"], r["evals"] / ref["evals"])
            ratios.setdefault(name, []).append((*ratio, rel))
            print(
                f"{seed:>4} {name:8s}{ratio[0]:>11.3f}{ratio[1]:>10.3f}{ratio[2]:>12.3f}"
                f"{rel:>18.2e}{r['to_best'] / ref['evals']:>21.3f}{r.get('pruned', 0):>8}"
                f"{r.get('local', 32):>7}"
            )
    print("\nmedians over the seeds; best within 0.1 % of scipy's (or better): seeds")
    for name, rs in ratios.items():
        wall, cpu, evals, rel = (harness.median(r[k] for r in rs) for k in range(4))
        ok = sum(r[3] <= 1e-3 for r in rs)
        print(f"     {name:8s}{wall:>11.3f}{cpu:>10.3f}{evals:>12.3f}{rel:>18.2e}   {ok}/{len(rs)}")


def sines(args) -> None:
    import multimodal

    halving, n = halving_from(args), args.starts
    common = {"n_starts": n, "n_steps": args.cap, "log_every": 0, "progress": False}
    goal = multimodal.TRUTH_FOM + 1.0
    print(
        f"sum of 3 sinusoids, 9 parameters, {n} starts, at most {args.cap} evaluations each; "
        f"{halving}; success: chi2 <= chi2(truth) + 1 = {goal:.2f}"
    )
    # As for the image fit: the width chosen and the step compiled once, untimed.
    ms.MultiStartLBFGS(**common, max_evals=n).fit(multimodal.chi2, multimodal.SPACE)
    totals = {n: {"hits": 0, "wall": 0.0, "cpu": 0.0, "found": 0} for n in ("halving", "all")}
    for seed in args.seeds:
        arms = {
            "halving": lambda seed=seed: ms.MultiStartLBFGS(**common, seed=seed, schedule=halving),
            "all": lambda seed=seed: ms.MultiStartLBFGS(**common, seed=seed),
        }
        names = list(arms) if seed % 2 == 0 else list(arms)[::-1]
        for name in names:
            with harness.one_blas_thread():
                r = engine_arm(arms[name](), multimodal.chi2, multimodal.SPACE)
            hits = int(np.sum(np.asarray(r["result"].foms) <= goal))
            t = totals[name]
            t["hits"] += hits
            t["wall"] += r["wall"]
            t["cpu"] += r["cpu"]
            t["found"] += r["best"] <= goal
            print(
                f"  seed {seed} {name:8s} successes {hits:3d}  best {r['best']:9.3f}  "
                f"evals {r['evals']:6d}  pruned {r['pruned']:3d}  wall {r['wall']:6.2f} s",
                flush=True,
            )
    ref = totals["all"]
    print()
    print(
        f"{'arm':8s}{'successes':>10}{'wall/all':>9}{'CPU/all':>8}{'succ/s vs all':>14}"
        f"{'succ/CPU-s vs all':>18}{'global found':>13}"
    )
    for name, t in totals.items():
        rate = (t["hits"] / t["wall"]) / (ref["hits"] / ref["wall"]) if ref["hits"] else np.nan
        per_cpu = (t["hits"] / t["cpu"]) / (ref["hits"] / ref["cpu"]) if ref["hits"] else np.nan
        print(
            f"{name:8s}{t['hits']:>10}{t['wall'] / ref['wall']:>9.3f}{t['cpu'] / ref['cpu']:>8.3f}"
            f"{rate:>14.3f}{per_cpu:>18.3f}{t['found']:>9}/{len(args.seeds)}"
        )
    record = harness.Record("halving", args)
    for name, t in totals.items():
        for key in ("hits", "wall", "cpu", "found"):
            record.figure(f"{name} {key}", t[key])
    for key in ("wall", "cpu"):
        record.ratio(f"halving {key} / all", f"halving {key}", f"all {key}")
    record.write(args.json)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", choices=("image", "sines"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--starts", type=int, default=None, help="default: 32 (image), 128 (sines)")
    ap.add_argument("--cap", type=int, default=1500, help="evaluations a start at most")
    ap.add_argument(
        "--arms",
        default="scipy,halving,band",
        help=f"image: comma-separated, of {', '.join(IMAGE_ARMS)} (scipy always runs)",
    )
    ap.add_argument("--data", type=int, default=0, help="image: the model's data seed")
    for key, kind in (("--r0", int), ("--eta", int), ("--grace", float), ("--keep", int)):
        ap.add_argument(key, type=kind, default=None, help="the Halving setting (default: its)")
    harness.add_arguments(ap)
    args = ap.parse_args(argv)
    args.arms = ["scipy", *(a for a in args.arms.split(",") if a and a != "scipy")]
    for arm in args.arms:
        if arm not in IMAGE_ARMS:
            ap.error(f"--arms: {arm!r} is not one of {', '.join(IMAGE_ARMS)}")
    if args.starts is None:
        args.starts = 32 if args.problem == "image" else 128
    {"image": image, "sines": sines}[args.problem](args)


if __name__ == "__main__":
    main()
