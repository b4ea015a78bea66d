"""Time to a good fit: the engine's rules against scipy's L-BFGS-B looped over the same starts.

The question a user asks first: from the same starts, how long until every start has
converged, how many evaluations does each need, and how soon does the best fit get under the
truth's χ²? Model: ``profiling/image_model.py`` (48 parameters, eight elliptical Gaussians on
96², 64², 48² and 128² grids, float64). Every arm starts from the same ``--starts`` points,
drawn uniformly in the central 70 % of each prior's quantiles (the library's default band).

Arms, run one after the other in this process (ratios are the figure; seconds are not), all
but ``scipy, default BLAS`` with one BLAS thread:

- ``scipy``: ``scipy.optimize.minimize(method="L-BFGS-B", jac=True, bounds=...)`` over a
  ``jax.jit(jax.value_and_grad)`` of the objective, looped over the starts, default tolerances,
  with one BLAS thread (``peers.py``: OpenBLAS's spinning threads otherwise take the cores
  XLA's evaluation needs). Its jit compile is included in its wall time, as the engine's
  compile is in its own. Every ratio is against this arm.
- ``scipy, default BLAS``: the same with the BLAS libraries' default threads, as a loop runs
  unless told otherwise (shown, not the reference).
- ``MultiStartLBFGS``: default settings (``batch_size="auto"``), the same starts.
- ``MultiStartAdam``: default settings, the same starts, ``--adam-steps`` steps.
- ``optax.lbfgs``: ``MultiStartGradient(optax.lbfgs())`` (with ``--with-optax-lbfgs``).
- ``MultiStartLBFGS, N devices`` (with ``--devices N``): the starts sharded over N logical CPU
  devices (``XLA_FLAGS`` is set for the whole run, before JAX starts; every other engine arm
  runs with ``devices=1``, and scipy's function on the default device, as without the flag).

Per arm: wall time (compile included) until every start ended, the process's CPU seconds
over the same span (every thread's: less moved than wall time by other jobs on the machine),
median evaluations per start, the best χ² against the truth's, and the time at which the best
χ² first went under the truth's (for the engine's arms interpolated from the per-step history
between the first step and the end of the loop; for scipy recorded at each evaluation).

    python profiling/time_to_solution.py            # 32 starts
    python profiling/time_to_solution.py --quick    # 8 starts, fewer steps
    python profiling/time_to_solution.py --max-evals 300 --devices 2 --no-adam
    python profiling/time_to_solution.py --max-evals 300 --no-adam --with-scan  # scan too
    python profiling/time_to_solution.py --quick --json tts.json   # and write the record
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# A fresh cache folder: every arm's first fit is cold (compile, and "auto" times its widths);
# the "warm" arm then runs MultiStartLBFGS again, as a user's second run of the model would.
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="tts-cache-"))
if "--devices" in sys.argv:  # logical CPU devices exist only if asked for before JAX starts
    _n = sys.argv[sys.argv.index("--devices") + 1]
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_n}"
    )
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import harness  # noqa: E402
import image_model  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import scipy.optimize  # noqa: E402
from peers import draw_starts, scipy_problem  # noqa: E402

import multistart as ms  # noqa: E402


def scipy_arm(objective, space, starts, n, target, max_evals=None):
    vg, x0s, bounds = scipy_problem(objective, space, starts)
    t0, cpu0 = time.perf_counter(), time.process_time()
    hit = [None]

    def fun(v):
        f, g = vg(v)
        f = float(f)
        if hit[0] is None and f <= target:
            hit[0] = time.perf_counter() - t0
        return f, np.asarray(g, dtype=np.float64)

    foms, nfev = [], []
    for x0 in x0s[:n]:
        options = {} if max_evals is None else {"maxfun": max_evals}
        r = scipy.optimize.minimize(
            fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options=options
        )
        foms.append(r.fun)
        nfev.append(r.nfev)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu0,
        "evals": float(np.median(nfev)),
        "best": float(np.min(foms)),
        "to_target_s": hit[0],
    }


def engine_arm(search, objective, space, starts, target):
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = search.fit(objective, space, starts=starts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    st = result.stats
    best_hist = result.best_history
    steps = result.history_steps
    under = np.flatnonzero(best_hist <= target)
    to_target = None
    if under.size:
        k = int(steps[under[0]])
        per_step = (st["loop_s"] - st["first_step_s"]) / max(st["n_steps_run"] - 1, 1)
        to_target = st["first_step_s"] + (k - 1) * per_step
    n_evals = result.n_evals if result.n_evals is not None else result.n_steps
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "evals": float(np.median(n_evals)),
        "best": result.best_fom,
        "to_target_s": to_target,
        "width": st["batch_size"],
        "compile_s": st["compile_s"],
        "select_s": st["select_s"],
        "statuses": result.status_counts(),
    }


def write_record(args, rows: dict, peer: str) -> None:
    """Every arm's wall, CPU seconds, evaluations and best, and its ratios against ``peer``."""
    record = harness.Record("time_to_solution", args)
    for name, r in rows.items():
        for key in ("wall_s", "cpu_s", "evals", "best"):
            record.figure(f"{name}: {key}", r[key])
    for name in rows:
        for key in ("wall_s", "cpu_s", "evals"):
            record.ratio(f"{name}: {key} / {peer}", f"{name}: {key}", f"{peer}: {key}")
    record.write(args.json)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=32)
    ap.add_argument("--adam-steps", type=int, default=1000)
    ap.add_argument("--lbfgs-steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--with-optax-lbfgs", action="store_true")
    ap.add_argument(
        "--max-evals",
        type=int,
        default=None,
        help="an evaluation budget per start for every arm (scipy's maxfun, the engine's "
        "n_steps); default: run to convergence (L-BFGS) or --adam-steps",
    )
    ap.add_argument("--quick", action="store_true", help="8 starts, 150 evaluations each")
    ap.add_argument("--devices", type=int, default=None, help="add an arm on N CPU devices")
    ap.add_argument("--no-adam", action="store_true", help="leave the Adam arm out")
    ap.add_argument(
        "--with-scan",
        action="store_true",
        help="add MultiStartLBFGS arms with backend='scan' (cold, then warm)",
    )
    harness.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.starts, args.max_evals = 8, 150
    if args.max_evals is not None:
        args.adam_steps = args.lbfgs_steps = args.max_evals

    objective, space, truth = image_model.make_problem()
    target = image_model.truth_chi2(objective, truth)
    starts = draw_starts(space, args.starts, args.seed)
    n = args.starts
    ms.set_log_level("WARNING")
    print(f"image fit: 48 parameters, {n} starts, truth's chi2 {target:.6g}; jax {jax.__version__}")
    print(f"BLAS: {harness.blas_threads()}; every arm but the default-BLAS one runs with 1 thread")

    arms = {
        "scipy L-BFGS-B loop": lambda: scipy_arm(
            objective, space, starts, n, target, args.max_evals
        ),
        "scipy, default BLAS": lambda: scipy_arm(
            objective, space, starts, n, target, args.max_evals
        ),
    }
    common = {"n_starts": n, "seed": args.seed, "log_every": 0, "devices": 1}
    arms["MultiStartLBFGS"] = lambda: engine_arm(
        ms.MultiStartLBFGS(n_steps=args.lbfgs_steps, **common), objective, space, starts, target
    )
    arms["MultiStartLBFGS, warm"] = lambda: engine_arm(
        ms.MultiStartLBFGS(n_steps=args.lbfgs_steps, **common), objective, space, starts, target
    )
    if args.with_scan:
        for name in ("MultiStartLBFGS, scan", "MultiStartLBFGS, scan, warm"):
            arms[name] = lambda: engine_arm(
                ms.MultiStartLBFGS(n_steps=args.lbfgs_steps, backend="scan", **common),
                objective,
                space,
                starts,
                target,
            )
    if args.devices:
        arms[f"MultiStartLBFGS, {args.devices} dev"] = lambda: engine_arm(
            ms.MultiStartLBFGS(n_steps=args.lbfgs_steps, **{**common, "devices": args.devices}),
            objective,
            space,
            starts,
            target,
        )
    if not args.no_adam:
        arms["MultiStartAdam"] = lambda: engine_arm(
            ms.MultiStartAdam(n_steps=args.adam_steps, **common), objective, space, starts, target
        )
    if args.with_optax_lbfgs:
        arms["optax.lbfgs"] = lambda: engine_arm(
            ms.MultiStartGradient(optax.lbfgs(), n_steps=args.adam_steps, **common),
            objective,
            space,
            starts,
            target,
        )
    rows = {}
    for name, run in arms.items():
        if name == "scipy, default BLAS":
            rows[name] = run()
        else:
            with harness.one_blas_thread():
                rows[name] = run()
        print(f"  ran {name}: {rows[name]}", flush=True)

    ref = rows["scipy L-BFGS-B loop"]
    print()
    print(
        f"{'arm':<22}{'wall/scipy':>11}{'cpu/scipy':>10}{'evals/start':>12}{'evals/scipy':>12}"
        f"{'best chi2':>13}{'best-scipy (rel)':>18}{'to truth/scipy':>15}"
    )
    for name, r in rows.items():
        tt = (
            "never"
            if r["to_target_s"] is None or ref["to_target_s"] is None
            else f"{r['to_target_s'] / ref['to_target_s']:.3f}"
        )
        rel = (r["best"] - ref["best"]) / abs(ref["best"])
        print(
            f"{name:<22}{r['wall_s'] / ref['wall_s']:>11.3f}{r['cpu_s'] / ref['cpu_s']:>10.3f}"
            f"{r['evals']:>12.0f}"
            f"{r['evals'] / ref['evals']:>12.2f}{r['best']:>13.6g}{rel:>18.2e}{tt:>15}"
        )
    print()
    for name, r in rows.items():
        if "compile_s" in r:
            print(
                f"{name:<22} width {r['width']}, compile {r['compile_s'] / ref['wall_s']:.3f} "
                f"and choosing the width {r['select_s'] / ref['wall_s']:.3f} of scipy's wall; "
                f"{r['statuses']}"
            )
    write_record(args, rows, "scipy L-BFGS-B loop")
    lb, ad = rows["MultiStartLBFGS"], rows.get("MultiStartAdam")
    if ad is None:
        return
    if lb["to_target_s"] is not None and ad["to_target_s"] is not None:
        ratio = lb["to_target_s"] / ad["to_target_s"]
        print(f"\ntime under the truth's chi2, LBFGS / Adam: {ratio:.3f}")
    elif lb["to_target_s"] is not None:
        print("\nMultiStartAdam never got under the truth's chi2; MultiStartLBFGS did")


if __name__ == "__main__":
    main()
