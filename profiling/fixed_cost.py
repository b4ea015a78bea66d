"""The fixed cost of a fit (issue 38): what a small fit pays beyond its arithmetic.

In one process, for a few NIST StRD problems (``tests/nist.py``), each arm over 32 starts in
the box built from NIST's starting values:

- ``ours``: ``MultiStartLeastSquares(n_starts=32, seed=0)``, its first fit (compiles
  included) and a second fit of the same function and space;
- ``scipy``: ``scipy.optimize.least_squares`` (trf, the box's bounds, jitted residuals and
  Jacobian) from the same kind of 32 box starts in a loop, one BLAS thread (threadpoolctl, as
  ``profiling/peers.py``);
- ``vmap``: the hand-written ``jax.jit(jax.vmap(lambda y0: optx.least_squares(fn,
  optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12), y0, max_steps=2000, throw=False).value))``
  over the same 32 starts, its first call (compile included) and a second.

Every wall is the fit call alone, in a fresh cache folder (cold: no persistent compilation
cache, no tuning record; the curve_fit child shares it); the table gives each wall as a ratio
against the peers' measured in the same run. Beside it: the traces of the user's residual
function (a Python counter inside it) and the compile requests (JAX's monitoring events,
``multistart.common.monitor.CompileCounter``) of our first and second fit. Last, one small
``ms.curve_fit`` (3 parameters, 50 points) in a fresh subprocess: its wall, traces and
compiles, against one compile-and-call of the hand-written vmap of the same model.

    python profiling/fixed_cost.py            # DanWood, Misra1a, Chwirut2, MGH09; 3 repeats
    python profiling/fixed_cost.py --quick    # DanWood, Misra1a; 1 repeat
    python profiling/fixed_cost.py --problems DanWood --profile   # cProfile of a second fit
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")

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


def ours(problem, repeats: int, profile: bool) -> dict:
    """First and second fits of one search object, with traces and compiles counted."""
    import multistart as ms
    from multistart.common.monitor import CompileCounter

    counted, space = Counted(problem), space_of(problem)
    search = ms.MultiStartLeastSquares(n_starts=N_STARTS, seed=0)
    out: dict = {}
    for label in ("first", *[f"second{i}" for i in range(repeats)]):
        counted.n = 0
        with CompileCounter() as compiles:
            t0 = time.perf_counter()
            result = search.fit(counted.named, space)
            wall = time.perf_counter() - t0
        out[label] = dict(wall=wall, traces=counted.n, compiles=compiles.total)
    out["best"] = float(result.best_fom)
    out["n_evals"] = int(result.stats.get("n_evals", 0) or 0)
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        search.fit(counted.named, space)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
        out["profile"] = s.getvalue()
    return out


def scipy_loop(problem) -> dict:
    import jax
    from peers import one_blas_thread
    from scipy.optimize import least_squares

    vector = Counted(problem).vector
    fun, jac = jax.jit(vector), jax.jit(jax.jacfwd(vector))
    bounds = tuple(np.array([b[i] for b in nist.box(problem)]) for i in (1, 2))
    x0s = box_starts(problem, N_STARTS, 0)
    kw = dict(method="trf", bounds=bounds, jac=lambda v: np.asarray(jac(v)))
    walls, best = [], np.inf
    with one_blas_thread():
        for _ in range(2):  # the first pays the jit of fun and jac
            t0 = time.perf_counter()
            for x0 in x0s:
                try:
                    r = least_squares(lambda v: np.asarray(fun(v)), x0, **kw)
                    best = min(best, 2.0 * r.cost)
                except (ValueError, np.linalg.LinAlgError):
                    pass
            walls.append(time.perf_counter() - t0)
    return dict(first=walls[0], second=walls[1], best=best)


def hand_vmap(problem) -> dict:
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
    walls = []
    for _ in range(2):
        t0 = time.perf_counter()
        values = jax.block_until_ready(fit(x0s))
        walls.append(time.perf_counter() - t0)
    ssr = jax.vmap(lambda b: jnp.sum(vector(b) ** 2))(values)
    return dict(first=walls[0], second=walls[1], best=float(jnp.nanmin(ssr)))


CURVE_FIT_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
import numpy as np
t0 = time.perf_counter()
import jax, jax.numpy as jnp
import multistart as ms
from multistart.common.monitor import CompileCounter
t_import = time.perf_counter() - t0
x = np.linspace(0.0, 5.0, 50)
y = 3.0 * np.exp(-x / 1.5) + 0.2 + np.random.default_rng(0).normal(0.0, 0.05, x.size)
n = 0
def f(x, a, tau, c):
    global n
    n += 1
    return a * jnp.exp(-x / tau) + c
out = {"import_s": t_import}
with CompileCounter() as compiles:
    t0 = time.perf_counter()
    popt, pcov = ms.curve_fit(f, x, y, p0=[1.0, 1.0, 0.0])
    out["ours_s"] = time.perf_counter() - t0
out.update(traces=n, compiles=compiles.total, names=dict(compiles.counts))
import optimistix as optx
def fn(p, args):
    return f(x, *p) - y
solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12)
t0 = time.perf_counter()
v = jax.jit(jax.vmap(lambda y0: optx.least_squares(fn, solver, y0, max_steps=2000,
                                                   throw=False).value))
jax.block_until_ready(v(jnp.asarray([[1.0, 1.0, 0.0]])))
out["vmap_s"] = time.perf_counter() - t0
print("RESULT " + json.dumps(out))
"""


def curve_fit_child() -> dict:
    import multistart

    root = Path(multistart.__file__).resolve().parent.parent  # the child fits the same library
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *sys.path]))
    proc = subprocess.run(
        [sys.executable, "-c", CURVE_FIT_CHILD], capture_output=True, text=True, env=env
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"the curve_fit child failed:\n{proc.stderr[-3000:]}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="DanWood and Misra1a, one repeat")
    p.add_argument("--problems", default=None, help="comma-separated NIST names")
    p.add_argument("--repeats", type=int, default=None, help="second fits timed (median)")
    p.add_argument("--profile", action="store_true", help="cProfile one more second fit")
    args = p.parse_args(argv)
    # cold means cold: a fresh cache folder (JAX's persistent compilation cache, tuning records)
    os.environ["MULTISTART_CACHE_DIR"] = tempfile.mkdtemp(prefix="fixed_cost_")
    import jax

    jax.config.update("jax_enable_x64", True)
    names = args.problems or ("DanWood,Misra1a" if args.quick else "DanWood,Misra1a,Chwirut2,MGH09")
    repeats = args.repeats or (1 if args.quick else 3)
    print(f"{N_STARTS} starts, float64, {jax.devices()[0].platform}; walls in seconds")
    header = (
        f"{'problem':<9} {'ours 1st':>8} {'ours 2nd':>8} {'scipy':>7} {'vmap 1st':>8} "
        f"{'vmap 2nd':>8} | {'1st/vmap1':>9} {'2nd/scipy':>9} {'2nd/vmap2':>9} | "
        f"{'traces 1st/2nd':>14} {'compiles 1st/2nd':>16}"
    )
    print(header)
    for name in names.split(","):
        problem = nist.load(name)
        o, s, v = ours(problem, repeats, args.profile), scipy_loop(problem), hand_vmap(problem)
        second = statistics.median(o[k]["wall"] for k in o if k.startswith("second"))
        s2 = o["second0"]
        print(
            f"{name:<9} {o['first']['wall']:8.3f} {second:8.3f} {s['second']:7.3f} "
            f"{v['first']:8.3f} {v['second']:8.4f} | {o['first']['wall'] / v['first']:9.2f} "
            f"{second / s['second']:9.3f} {second / v['second']:9.1f} | "
            f"{o['first']['traces']:>7}/{s2['traces']:<6} "
            f"{o['first']['compiles']:>8}/{s2['compiles']:<7}"
        )
        print(f"{'':9} best SSR: ours {o['best']:.6g}, scipy {s['best']:.6g}, vmap {v['best']:.6g}")
        if args.profile:
            print(o["profile"])
    c = curve_fit_child()
    print(
        f"ms.curve_fit (3 parameters, 50 points) in a fresh process: {c['ours_s']:.3f} s, "
        f"{c['traces']} traces, {c['compiles']} compiles {c['names']}; one compile and call "
        f"of the hand-written vmap: {c['vmap_s']:.3f} s (ratio {c['ours_s'] / c['vmap_s']:.2f})"
    )


if __name__ == "__main__":
    main()
