"""L-BFGS's default start strategy (``"band_tiktak"``, 2026-12-03): what it costs a heavy fit,
how long L-BFGS's local searches are, and the suite with another gate.

``--image`` (the default mode): the 48-parameter image fit (``profiling/image_model.py``),
``--starts`` drawn starts, ``--n-steps`` steps, seed 0, float64, one BLAS thread, three arms in
this process: ``MultiStartLBFGS()`` (the default, run first, so it pays the compile),
``MultiStartLBFGS(start_strategy="band")`` (the default before), and scipy's L-BFGS-B looped
over the band arm's starts (the default's first wave is the same starts). Printed: evaluations
in all, wall (compile included), best χ², and each as a ratio to scipy's.

``--lengths``: median and mean evaluations a start of ``MultiStartLBFGS(n_starts=32,
start_strategy="band")``, seed 0, on every sixth function of scipy's suite (``--go-dir``) and on
NIST's 27 problems: how long a local search is, against the gate's 300.

``--gate N -- GO_SUITE_ARGS``: ``profiling/go_suite.py`` with the gate patched to ``N``.

    python profiling/experiments/lbfgs_default.py --image
    python profiling/experiments/lbfgs_default.py --image --arms default  # the default alone
    python profiling/experiments/lbfgs_default.py --lengths --go-dir PATH
    python profiling/experiments/lbfgs_default.py --gate 100 -- --go-dir PATH --half --arms ours
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "tests"))
os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import multistart as ms  # noqa: E402


def _engine(objective, space, n_starts: int, n_steps: int, **kw) -> tuple[dict, ms.Result]:
    t0 = time.perf_counter()
    r = ms.MultiStartLBFGS(n_starts=n_starts, n_steps=n_steps, seed=0, progress=False, **kw).fit(
        objective, space
    )
    row = dict(evals=int(r.stats["n_evals"]), wall_s=time.perf_counter() - t0, best=r.best_fom)
    row["n_local"] = r.stats.get("n_local", n_starts)
    return row, r


def image(n_starts: int, n_steps: int, arms: str = "all") -> None:
    import harness
    import image_model
    import scipy.optimize
    from peers import scipy_problem

    objective, space, _ = image_model.make_problem(0)
    with harness.one_blas_thread():
        threads = harness.blas_threads()
        rows: dict[str, dict] = {}
        rows["default"], _ = _engine(objective, space, n_starts, n_steps)
        if arms == "default":
            d = rows["default"]
            print(
                f"image fit, {n_starts} starts, n_steps {n_steps}; {threads}; the default: "
                f"evals {d['evals']}, wall {d['wall_s']:.1f} s, best {d['best']:.6g}, "
                f"local searches {d['n_local']}"
            )
            return
        rows["band"], band = _engine(objective, space, n_starts, n_steps, start_strategy="band")
        vg, x0s, bounds = scipy_problem(objective, space, band.start_params)
        t0, evals, best = time.perf_counter(), 0, np.inf

        def fun(v):
            f, g = vg(v)
            return float(f), np.asarray(g, dtype=np.float64)

        for x0 in x0s:
            out = scipy.optimize.minimize(
                fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxfun": n_steps}
            )
            evals, best = evals + out.nfev, min(best, float(out.fun))
        rows["scipy L-BFGS-B"] = dict(
            evals=evals, wall_s=time.perf_counter() - t0, best=best, n_local=n_starts
        )
    print(f"image fit, {n_starts} starts, n_steps {n_steps}; {threads}")
    for key in ("evals", "wall_s", "best"):
        harness.print_ratios(key, {k: v[key] for k, v in rows.items()}, "scipy L-BFGS-B", "")
    print("local searches:", {k: v["n_local"] for k, v in rows.items()})


def lengths(go_dir: str | None) -> None:
    import nist
    import nist_strd

    fits = []
    if go_dir:
        import go_suite

        problems, _ = go_suite.load(go_dir)
        for p in problems[::6]:
            space = {"x": ms.Uniform(p.lower, p.upper)}
            fits.append((f"GO {p.name}", lambda q, p=p: p.value(q["x"]), space))
    for name in nist.NAMES:
        problem = nist.load(name)
        _, residuals = nist_strd.residual_fns(problem)
        objective = lambda q, r=residuals: jax.numpy.sum(r(q) ** 2)  # noqa: E731
        fits.append((f"NIST {name}", objective, nist_strd.space_of(problem)))
    for label, objective, space in fits:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, r = _engine(objective, space, 32, 1000, start_strategy="band")
        e = np.asarray(r.n_evals)
        print(f"{label:32s} median {np.median(e):7.1f}  mean {e.mean():7.1f}  max {e.max()}")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", action="store_true")
    p.add_argument("--lengths", action="store_true")
    p.add_argument("--gate", type=int, default=None)
    p.add_argument("--go-dir", default=os.environ.get("MULTISTART_GO_DIR"))
    p.add_argument("--starts", type=int, default=32)
    p.add_argument("--n-steps", type=int, default=1000)
    p.add_argument(
        "--arms",
        choices=("all", "default"),
        default="all",
        help="--image: every arm, or the default alone (to set beside another commit's)",
    )
    args = p.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    if args.gate is not None:
        import go_suite

        import multistart.host.engine as engine

        engine.TIKTAK_SHORT_SEARCH = args.gate
        go_suite.main(rest)
    elif args.lengths:
        lengths(args.go_dir)
    else:
        image(args.starts, args.n_steps, args.arms)


if __name__ == "__main__":
    main()
