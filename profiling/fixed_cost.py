"""The fixed cost of a fit (issue 38): what a small fit pays beyond its arithmetic.

In one process, for a few NIST StRD problems (``tests/nist.py``), each arm over 32 starts in
the box built from NIST's starting values:

- ``ours``: ``MultiStartLeastSquares(n_starts=32, seed=0)``, its first fit (compiles
  included) and a second fit of the same function and space;
- ``scipy``: ``scipy.optimize.least_squares`` (trf, the box's bounds, jitted residuals and
  Jacobian) from the same kind of 32 box starts in a loop, one BLAS thread
  (``harness.one_blas_thread``);
- ``vmap``: the hand-written ``jax.jit(jax.vmap(lambda y0: optx.least_squares(fn,
  optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12), y0, max_steps=2000, throw=False).value))``
  over the same 32 starts, its first call (compile included) and a second.

Every wall is the fit call alone, in a fresh cache folder (cold: no persistent compilation
cache, no tuning record); the table gives each wall as a ratio
against the peers' measured in the same run. Beside it: the traces of the user's residual
function (a Python counter inside it) and the compile requests (JAX's monitoring events,
``multistart.common.monitor.CompileCounter``) of our first and second fit. Printed last, one small
``ms.curve_fit`` (3 parameters, 50 points) in a fresh subprocess with an empty cache folder:
its wall, traces and compiles, against one compile-and-call of the hand-written vmap of the
same model in another (the two in turns, ``--repeats`` rounds, medians; run first, before this
process starts JAX's backend: a TPU is held by one process at a time).

The second passes of the three arms take turns (``--repeats`` rounds, medians); ``--json PATH``
writes the run's record (``profiling/harness.py``), for ``python -m profiling.compare``.

    python profiling/fixed_cost.py            # DanWood, Misra1a, Chwirut2, MGH09; 3 repeats
    python profiling/fixed_cost.py --quick    # DanWood, Misra1a; 1 repeat
    python profiling/fixed_cost.py --quick --json fixed_cost.json
    python profiling/fixed_cost.py --problems all   # the 27, and their totals (the targets)
    python profiling/fixed_cost.py --problems DanWood --profile   # cProfile of a second fit
    python profiling/fixed_cost.py --quick --repeats 7 --no-curve-fit   # the NIST arms alone
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")

import harness  # noqa: E402
import nist  # noqa: E402  (NumPy only)
from nist_strd import box_starts, space_of  # noqa: E402  (the same box as nist_strd.py)

N_STARTS = 32


class Counted:
    """A residual function of a NIST problem that counts its traces (calls from Python)."""

    def __init__(self, problem):
        import jax.numpy as jnp

        self.n = 0
        model, x, y, names = nist.MODELS[problem.name], problem.x, problem.y, problem.names
        self.vector = lambda b: model(b, x, jnp) - y

        def named(p):
            self.n += 1
            return self.vector([p[k] for k in names])

        self.named = named


def ours(problem, profile: bool):
    """Our first fit, measured, and a second fit of the same search object to repeat: each
    returns its wall, the traces of the residual function and the compiles requested."""
    import multistart as ms
    from multistart.common.monitor import CompileCounter

    counted, space = Counted(problem), space_of(problem)
    search = ms.MultiStartLeastSquares(n_starts=N_STARTS, seed=0)
    last: dict = {}

    def fit() -> dict:
        counted.n = 0
        with CompileCounter() as compiles:
            t0 = time.perf_counter()
            last["result"] = search.fit(counted.named, space)
            wall = time.perf_counter() - t0
        return dict(wall=wall, traces=counted.n, compiles=compiles.total)

    first = fit()
    first["best"] = float(last["result"].best_fom)
    first["n_evals"] = int(last["result"].stats.get("n_evals", 0) or 0)
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        search.fit(counted.named, space)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
        first["profile"] = s.getvalue()
    return first, fit


def scipy_loop(problem):
    """scipy's 32-start loop, its first pass (it pays the jit of fun and jac) and a pass to
    repeat; each returns its wall and the best sum of squares."""
    import jax
    from scipy.optimize import least_squares

    vector = Counted(problem).vector
    fun, jac = jax.jit(vector), jax.jit(jax.jacfwd(vector))
    bounds = tuple(np.array([b[i] for b in nist.box(problem)]) for i in (1, 2))
    x0s = box_starts(problem, N_STARTS, 0)
    kw = dict(method="trf", bounds=bounds, jac=lambda v: np.asarray(jac(v)))

    def loop() -> dict:
        best = np.inf
        with harness.one_blas_thread():
            t0 = time.perf_counter()
            for x0 in x0s:
                try:
                    r = least_squares(lambda v: np.asarray(fun(v)), x0, **kw)
                    best = min(best, 2.0 * r.cost)
                except (ValueError, np.linalg.LinAlgError):
                    pass
            return dict(wall=time.perf_counter() - t0, best=best)

    return loop(), loop


def hand_vmap(problem):
    """The hand-written optimistix vmap: its first call (compile included) and a call to
    repeat; each returns its wall and the best sum of squares."""
    import jax
    import jax.numpy as jnp
    import optimistix as optx

    vector = Counted(problem).vector

    def fn(y, args):
        return vector(y)

    solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12)
    fit = jax.jit(
        jax.vmap(lambda y0: optx.least_squares(fn, solver, y0, max_steps=2000, throw=False).value)
    )
    x0s = jnp.asarray(box_starts(problem, N_STARTS, 0))

    def call() -> dict:
        t0 = time.perf_counter()
        values = jax.block_until_ready(fit(x0s))
        wall = time.perf_counter() - t0
        ssr = jax.vmap(lambda b: jnp.sum(vector(b) ** 2))(values)
        return dict(wall=wall, best=float(jnp.nanmin(ssr)))

    return call(), call


def curve_fit_child(arm: str) -> None:
    """A fresh process of the curve_fit arms: one small ``ms.curve_fit`` (``arm="ours"``), or
    one compile and call of the hand-written vmap of the same model (``"vmap"``); each arm in
    its own process, so neither finds JAX warmed by the other."""
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp

    jax.devices()  # the backend started (a TPU client takes seconds) before anything is timed
    out: dict = {"import_s": time.perf_counter() - t0}
    x = np.linspace(0.0, 5.0, 50)
    y = 3.0 * np.exp(-x / 1.5) + 0.2 + np.random.default_rng(0).normal(0.0, 0.05, x.size)
    traces = [0]

    def f(x, a, tau, c):
        traces[0] += 1
        return a * jnp.exp(-x / tau) + c

    if arm == "ours":
        import multistart as ms
        from multistart.common.monitor import CompileCounter

        with CompileCounter() as compiles:
            t0 = time.perf_counter()
            ms.curve_fit(f, x, y, p0=[1.0, 1.0, 0.0])
            out["seconds"] = time.perf_counter() - t0
        out.update(traces=traces[0], compiles=compiles.total, names=dict(compiles.counts))
        harness.child_result(out)
        return
    import optimistix as optx

    def fn(p, args):
        return f(x, *p) - y

    solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12)
    with jax.enable_x64(True):  # float64, as curve_fit fits (a TPU compiles it far slower)
        t0 = time.perf_counter()
        v = jax.jit(
            jax.vmap(
                lambda y0: optx.least_squares(fn, solver, y0, max_steps=2000, throw=False).value
            )
        )
        jax.block_until_ready(v(jnp.asarray([[1.0, 1.0, 0.0]], jnp.float64)))
        out["seconds"] = time.perf_counter() - t0
    harness.child_result(out)


def curve_fit_arms(rounds: int) -> dict:
    """The curve_fit arms, each in a fresh process with an empty cache folder, in turns over
    ``rounds`` (medians): our wall, traces and compiles, and the vmap's wall."""
    runs: dict[str, list] = {"ours": [], "vmap": []}
    for _ in range(rounds):
        for arm in runs:
            with tempfile.TemporaryDirectory() as folder:
                env = {"MULTISTART_CACHE_DIR": folder}
                runs[arm].append(harness.fresh_process(__file__, "--child", arm, env=env))
    ours = runs["ours"][-1]
    return {
        "ours_s": harness.median([r["seconds"] for r in runs["ours"]]),
        "vmap_s": harness.median([r["seconds"] for r in runs["vmap"]]),
        "traces": ours["traces"],
        "compiles": ours["compiles"],
        "names": ours["names"],
        "process_s": harness.median([r["process_s"] for r in runs["ours"]]),
    }


HEADER = (
    f"{'problem':<9} {'ours 1st':>8} {'ours 2nd':>8} {'scipy':>7} {'vmap 1st':>8} "
    f"{'vmap 2nd':>8} | {'1st/vmap1':>9} {'2nd/scipy':>9} {'2nd/vmap2':>9} | "
    f"{'traces 1st/2nd':>14} {'compiles 1st/2nd':>16}"
)


def one_problem(record: harness.Record, name: str, repeats: int, profile: bool) -> dict:
    """Every arm's first pass, then ``repeats`` interleaved second passes (medians); returns
    the walls, for the totals."""
    problem = nist.load(name)
    (o, ours_again), (s, scipy_again), (v, vmap_again) = (
        ours(problem, profile),
        scipy_loop(problem),
        hand_vmap(problem),
    )
    again = harness.interleave(
        {"ours": ours_again, "scipy": scipy_again, "vmap": vmap_again}, repeats
    )
    second = {arm: harness.median(r["wall"] for r in runs) for arm, runs in again.items()}
    o2 = again["ours"][0]
    figures = {
        "ours 1st s": o["wall"],
        "ours 2nd s": second["ours"],
        "scipy 1st s": s["wall"],
        "scipy s": second["scipy"],
        "vmap 1st s": v["wall"],
        "vmap 2nd s": second["vmap"],
        "ours traces 1st": o["traces"],
        "ours traces 2nd": o2["traces"],
        "ours compiles 1st": o["compiles"],
        "ours compiles 2nd": o2["compiles"],
        "ours best SSR": o["best"],
        "scipy best SSR": s["best"],
        "vmap best SSR": v["best"],
    }
    for key, value in figures.items():
        record.figure(f"{name} {key}", value)
    r1 = record.ratio(f"{name} ours 1st / vmap 1st", f"{name} ours 1st s", f"{name} vmap 1st s")
    r2 = record.ratio(f"{name} ours 2nd / scipy", f"{name} ours 2nd s", f"{name} scipy s")
    r3 = record.ratio(f"{name} ours 2nd / vmap 2nd", f"{name} ours 2nd s", f"{name} vmap 2nd s")
    print(
        f"{name:<9} {o['wall']:8.3f} {second['ours']:8.3f} {second['scipy']:7.3f} "
        f"{v['wall']:8.3f} {second['vmap']:8.4f} | {r1:9.2f} {r2:9.3f} {r3:9.1f} | "
        f"{o['traces']:>7}/{o2['traces']:<6} {o['compiles']:>8}/{o2['compiles']:<7}"
    )
    print(f"{'':9} best SSR: ours {o['best']:.6g}, scipy {s['best']:.6g}, vmap {v['best']:.6g}")
    if profile:
        print(o["profile"])
    return {key: figures[key] for key in TOTALS}


TOTALS = ("ours 1st s", "ours 2nd s", "scipy s", "vmap 1st s", "vmap 2nd s")


def totals(record: harness.Record, walls: list[dict]) -> None:
    """The summed walls of every problem run (the issue's targets are on the 27's totals)."""
    sums = {key: sum(w[key] for w in walls) for key in TOTALS}
    for key, value in sums.items():
        record.figure(f"total {key}", value)
    r1 = record.ratio("total ours 1st / vmap 1st", "total ours 1st s", "total vmap 1st s")
    r2 = record.ratio("total ours 2nd / scipy", "total ours 2nd s", "total scipy s")
    r3 = record.ratio("total ours 2nd / vmap 2nd", "total ours 2nd s", "total vmap 2nd s")
    print(
        f"{'total':<9} {sums['ours 1st s']:8.3f} {sums['ours 2nd s']:8.3f} "
        f"{sums['scipy s']:7.3f} {sums['vmap 1st s']:8.3f} {sums['vmap 2nd s']:8.4f} | "
        f"{r1:9.2f} {r2:9.3f} {r3:9.1f} | ({len(walls)} problems)"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="DanWood and Misra1a, one repeat")
    p.add_argument("--problems", default=None, help="comma-separated NIST names, or all")
    p.add_argument("--repeats", type=int, default=None, help="second fits timed (median)")
    p.add_argument("--profile", action="store_true", help="cProfile one more second fit")
    p.add_argument("--no-curve-fit", action="store_true", help="the NIST problems' arms alone")
    p.add_argument("--child", choices=("ours", "vmap"), help=argparse.SUPPRESS)  # curve_fit's
    harness.add_arguments(p)
    args = p.parse_args(argv)
    if args.child:
        return curve_fit_child(args.child)
    names = (
        args.problems or ("DanWood,Misra1a" if args.quick else "DanWood,Misra1a,Chwirut2,MGH09")
    ).split(",")
    if names == ["all"]:
        names = list(nist.NAMES)
    unknown = [n for n in names if n not in nist.MODELS]
    if unknown:
        p.error(f"unknown problem(s) {', '.join(unknown)}; choose from {', '.join(nist.NAMES)}")
    repeats = args.repeats or (1 if args.quick else 3)
    # cold means cold: a fresh cache folder (JAX's persistent compilation cache, tuning records)
    os.environ["MULTISTART_CACHE_DIR"] = tempfile.mkdtemp(prefix="fixed_cost_")
    # the curve_fit arms first: on an accelerator this process holds the device once it
    # starts JAX's backend, and a TPU is held by one process at a time
    c = None if args.no_curve_fit else curve_fit_arms(repeats)
    import jax

    jax.config.update("jax_enable_x64", True)
    record = harness.Record("fixed_cost", args)
    print(f"{N_STARTS} starts, float64, {jax.devices()[0].platform}; walls in seconds")
    print(HEADER)
    walls = [one_problem(record, name, repeats, args.profile) for name in names]
    if len(walls) > 1:
        totals(record, walls)
    if c is None:
        return record.write(args.json)
    ratio = c["ours_s"] / c["vmap_s"]
    print(
        f"ms.curve_fit (3 parameters, 50 points) in a fresh process: {c['ours_s']:.3f} s, "
        f"{c['traces']} traces, {c['compiles']} compiles {c['names']}; one compile and call "
        f"of the hand-written vmap in another: {c['vmap_s']:.3f} s (ratio {ratio:.2f}; "
        f"medians of {repeats})"
    )
    for key in ("ours_s", "vmap_s", "traces", "compiles", "process_s"):
        record.figure(f"curve_fit child {key}", c[key])
    record.ratio("curve_fit child ours / vmap", "curve_fit child ours_s", "curve_fit child vmap_s")
    record.write(args.json)


if __name__ == "__main__":
    main()
