"""Least squares, per start: ``MultiStartLeastSquares`` against scipy and against L-BFGS.

Four figures, each a subcommand; arms run side by side in one invocation (ratios are the
figure, seconds are not). Every scipy arm runs with one BLAS thread (``peers.py``) and jitted
residuals and Jacobian (``jax.jit`` of the residuals and of their ``jax.jacfwd``), compiled
inside its timed region as the engine's programs are in its own.

``curve-fit`` (figure 1): a two-peak curve fit, 7 parameters (two Gaussians' amplitude,
centre and width, and a constant), 1,000 residuals ``(model - data) / sigma``, float64. The
same starts (uniform in the central 70 % of each prior's quantiles) for every arm; the engine
takes them as ``starts=`` with the filter off. Each arm runs in a fresh Python process and is
timed from before its first JAX call (its compiles included) to its last result. Arms:
``scipy lm`` and ``scipy trf`` (``scipy.optimize.least_squares`` looped over the starts, its
defaults, ``trf`` with the priors' bounds), ``lm cold`` (``MultiStartLeastSquares`` with an
empty compilation cache: every program compiled), ``lm warm`` (the same with the cache the cold
arm filled: a user's second run of the model), ``lbfgs cold`` (``MultiStartLBFGS`` on the same
χ²). Rounds interleave the arms (reversed every other round); medians. Evaluations per start
count a Jacobian of ``n`` parameters as ``n`` evaluations for every arm (``nfev + n njev`` for
scipy, ``result.n_evals`` for the engine).

``multimodal`` (figure 2): a sum of three sinusoids (``multimodal.py``'s model: 9 parameters,
200 samples), several seeds; successes (final χ² within 1 of the truth's) per second for
``MultiStartLeastSquares``, ``MultiStartLBFGS`` (both with the default broad-start filter,
each fit compiling its programs) and scipy's ``least_squares`` loop over uniform starts.

``errors`` (figure 3): ``result.errors`` against ``scipy.optimize.curve_fit``'s
``sqrt(diag(pcov))`` at curve_fit's optimum, with ``absolute_sigma=True`` and without.

``image`` (figure 4): the image fit of ``image_model.py`` with 1, 2, 4 and 8 Gaussians (6 to 48
parameters, 32,000 residuals): the cost of one residual Jacobian in evaluations of the χ²'s
value-and-gradient (one start, jitted, median of repeats), and, from the same starts, the
wall time to convergence of ``MultiStartLeastSquares`` against ``MultiStartLBFGS``: where the
ratio passes 1 is the parameter count where least squares stops paying.

``solvers``: the choice behind ``method="lm"``: the built-in per-start rules against
optimistix's ``LevenbergMarquardt``, ``Dogleg`` and ``GaussNewton`` through the adapter, on the
curve fit.

    python profiling/least_squares.py curve-fit --starts 512 64 --rounds 3
    python profiling/least_squares.py multimodal --seeds 4 --starts 64
    python profiling/least_squares.py errors
    python profiling/least_squares.py image
    python profiling/least_squares.py solvers --starts 256
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")

import harness  # noqa: E402

# -- the curve fit (figure 1) -------------------------------------------------------------------

T = None  # set by _curve() once JAX is imported (the arms import it in their own process)
SIGMA = 0.1
TRUTH = {"a1": 2.0, "m1": 3.0, "s1": 0.6, "a2": 1.2, "m2": 6.5, "s2": 1.1, "b": 0.3}
KEYS = tuple(TRUTH)


def _curve():
    """``(residuals, space, starts_fn)`` of the two-peak curve fit (float64)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import multistart as ms

    jax.config.update("jax_enable_x64", True)
    t = np.linspace(0.0, 10.0, 1000)

    def model(p):
        g1 = p["a1"] * jnp.exp(-0.5 * ((t - p["m1"]) / p["s1"]) ** 2)
        g2 = p["a2"] * jnp.exp(-0.5 * ((t - p["m2"]) / p["s2"]) ** 2)
        return g1 + g2 + p["b"]

    y = np.asarray(model(TRUTH)) + SIGMA * np.random.default_rng(0).normal(size=t.size)

    def residuals(p):
        return (model(p) - y) / SIGMA

    space = {
        "a1": ms.Uniform(0.0, 5.0),
        "m1": ms.Uniform(0.0, 10.0),
        "s1": ms.LogUniform(0.1, 3.0),
        "a2": ms.Uniform(0.0, 5.0),
        "m2": ms.Uniform(0.0, 10.0),
        "s2": ms.LogUniform(0.1, 3.0),
        "b": ms.Uniform(-1.0, 1.0),
    }
    from peers import draw_starts

    return residuals, space, lambda n, seed: draw_starts(space, n, seed)


def scipy_least_squares(residuals, space, starts, method: str) -> dict:
    """``scipy.optimize.least_squares`` looped over ``starts`` (jitted residuals, Jacobian)."""
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree
    from scipy.optimize import least_squares

    first = jax.tree_util.tree_map(lambda a: a[0], starts)
    _, unravel = ravel_pytree(first)
    fun = jax.jit(lambda v: residuals(unravel(v)))
    jac = jax.jit(jax.jacfwd(lambda v: residuals(unravel(v))))
    n_starts = len(jax.tree_util.tree_leaves(starts)[0])
    kw = {}
    if method == "trf":
        lower = ravel_pytree({k: np.broadcast_to(p.lower, p.shape) for k, p in space.items()})[0]
        upper = ravel_pytree({k: np.broadcast_to(p.upper, p.shape) for k, p in space.items()})[0]
        kw["bounds"] = (np.asarray(lower), np.asarray(upper))
    foms, evals, x = [], [], []
    with harness.one_blas_thread():
        for i in range(n_starts):
            x0 = np.asarray(ravel_pytree(jax.tree_util.tree_map(lambda a, i=i: a[i], starts))[0])
            r = least_squares(
                lambda v: np.asarray(fun(v)),
                x0,
                jac=lambda v: np.asarray(jac(v)),
                method=method,
                **kw,
            )
            foms.append(2.0 * r.cost)
            evals.append(r.nfev + x0.size * (r.njev or 0))
            x.append(r.x)
    return {"foms": foms, "evals": evals, "x": [list(map(float, v)) for v in x]}


def engine_fit(search, objective, space, starts) -> dict:
    result = search.fit(objective, space, starts=starts)
    st = result.stats
    return {
        "foms": [float(f) for f in result.foms],
        "evals": [int(e) for e in result.n_evals],
        "steps": [int(s) for s in result.n_steps],
        "status": result.status_counts(),
        "compile_s": st["compile_s"],
        "n_chunk_calls": st["n_chunk_calls"],
    }


def curve_arm(arm: str, n_starts: int, width, seed: int) -> dict:
    """One arm of figure 1, run twice in this fresh process: ``wall_s`` from the first JAX call
    to the last result of the first run (compiles included), ``again_s`` the second run's (the
    same model fitted again in a running process: new closures, programs from the caches)."""
    import jax.numpy as jnp

    import multistart as ms

    ms.configure_compilation_cache()  # every arm alike (the scipy arm's jits too)
    out: dict = {}
    for key in ("wall_s", "again_s"):
        t0 = time.perf_counter()
        residuals, space, starts_fn = _curve()
        starts = starts_fn(n_starts, seed)
        if arm.startswith("scipy"):
            run = scipy_least_squares(residuals, space, starts, arm.split()[1])
        else:
            common = dict(n_starts=n_starts, batch_size=width, n_candidates=0, seed=seed)
            common.update(log_every=0, progress=False)
            if arm.startswith("lbfgs"):
                search = ms.MultiStartLBFGS(**common)
                chi2 = lambda p, r=residuals: jnp.sum(r(p) ** 2)  # noqa: E731
                run = engine_fit(search, chi2, space, starts)
            else:
                run = engine_fit(ms.MultiStartLeastSquares(**common), residuals, space, starts)
        out.setdefault("run", run)
        out[key] = time.perf_counter() - t0
    return {**out.pop("run"), **out}


def _run_child(args: list[str], cache: str) -> dict:
    env = {"MULTISTART_CACHE_DIR": cache, "OPENBLAS_NUM_THREADS": "1"}
    return harness.fresh_process(Path(__file__).resolve(), "_arm", *args, env=env)


CURVE_ARMS = ("scipy lm", "scipy trf", "lm cold", "lm warm", "lbfgs cold")
# arms that share a cache folder run back to back: "lm warm" reads what "lm cold" wrote
CURVE_UNITS = (("scipy lm",), ("scipy trf",), ("lm cold", "lm warm"), ("lbfgs cold",))


def curve_fit_figure(args) -> None:
    import numpy as np

    print(
        f"two-peak curve fit: 7 parameters, 1000 residuals, float64; engine width "
        f"{args.width}; {args.rounds} rounds, each arm in a fresh process; medians"
    )
    for n in args.starts:
        rows: dict[str, list[dict]] = {a: [] for a in CURVE_ARMS}
        for rnd in range(args.rounds):
            units = CURVE_UNITS if rnd % 2 == 0 else CURVE_UNITS[::-1]
            for unit in units:
                with tempfile.TemporaryDirectory(prefix="ls-cache-") as cache:
                    for arm in unit:
                        rows[arm].append(_run_child([arm, str(n), str(args.width)], cache))
        _curve_table(n, rows, np)
        for a in CURVE_ARMS:
            for key in ("wall_s", "again_s"):
                args.record.figure(f"{n} {a} {key}", harness.median(r[key] for r in rows[a]))
        for a in CURVE_ARMS:
            if a != "scipy trf":
                arm, peer = f"{n} {a} wall_s", f"{n} scipy trf wall_s"
                args.record.ratio(f"{n} {a} wall / scipy trf", arm, peer)


def _curve_table(n: int, rows: dict, np) -> None:
    def med(arm, key):
        return harness.median(r[key] for r in rows[arm])

    ref = min(med("scipy lm", "wall_s"), med("scipy trf", "wall_s"))
    again = min(med("scipy lm", "again_s"), med("scipy trf", "again_s"))
    print(
        f"\n{n} starts: wall against the faster scipy arm ({ref:.2f} s here, first run; "
        f"{again:.2f} s again in its process)"
    )
    print(
        f"{'arm':12s} {'wall/scipy':>10s} {'again/scipy':>11s} {'best chi2':>12s} "
        f"{'evals/start':>11s} {'steps':>6s} {'compile/wall':>12s}"
    )
    for a in CURVE_ARMS:
        r = rows[a][0]
        steps = f"{np.median(r['steps']):6.1f}" if "steps" in r else f"{'':6s}"
        share = np.median([q["compile_s"] / q["wall_s"] for q in rows[a]]) if "steps" in r else None
        print(
            f"{a:12s} {med(a, 'wall_s') / ref:10.3f} {med(a, 'again_s') / again:11.3f} "
            f"{min(r['foms']):12.6f} {np.median(r['evals']):11.1f} {steps} "
            f"{'' if share is None else f'{share:12.2f}'}"
        )


# -- a multimodal curve fit (figure 2) ----------------------------------------------------------


def multimodal_figure(args) -> None:
    """Successes per second on a sum of three sinusoids (``multimodal.py``'s model)."""
    import jax.numpy as jnp
    import multimodal as mm
    import numpy as np

    import multistart as ms

    def residuals(p):
        return (mm.signal(p) - mm.Y) / mm.SIGMA

    def chi2(p):
        return jnp.sum(residuals(p) ** 2)

    n = args.starts
    common = dict(n_starts=n, batch_size=args.width, log_every=0, progress=False)
    arms = {
        "scipy trf": lambda seed: scipy_least_squares(
            residuals, mm.SPACE, mm.band_starts(n, seed), "trf"
        )["foms"],
        "scipy lm": lambda seed: scipy_least_squares(
            residuals, mm.SPACE, mm.band_starts(n, seed), "lm"
        )["foms"],
        "lbfgs": lambda seed: ms.MultiStartLBFGS(seed=seed, **common).fit(chi2, mm.SPACE).foms,
        "lm": lambda seed: (
            ms.MultiStartLeastSquares(seed=seed, **common).fit(residuals, mm.SPACE).foms
        ),
        "lm, scipy's starts": lambda seed: (
            ms.MultiStartLeastSquares(seed=seed, n_candidates=0, **common)
            .fit(residuals, mm.SPACE, starts=mm.band_starts(n, seed))
            .foms
        ),
    }
    print(
        f"sum of 3 sinusoids, 9 parameters, 200 residuals, chi2(truth) = {mm.TRUTH_FOM:.2f}; "
        f"{n} starts, seeds 0..{args.seeds - 1}, engine width {args.width}; success: chi2 <= "
        "chi2(truth) + 1; every fit compiles its programs (no persistent cache)"
    )
    rows = {name: {"hits": 0, "wall": 0.0, "seeds_hit": 0} for name in arms}
    for seed in range(args.seeds):
        names = list(arms) if seed % 2 == 0 else list(arms)[::-1]
        for name in names:
            t0 = time.perf_counter()
            with harness.one_blas_thread():
                foms = np.asarray(arms[name](seed))
            wall = time.perf_counter() - t0
            hits = int(np.sum(foms <= mm.TRUTH_FOM + 1.0))
            row = rows[name]
            row["hits"], row["wall"] = row["hits"] + hits, row["wall"] + wall
            row["seeds_hit"] += hits > 0
            print(f"  seed {seed} {name:18s} successes {hits:4d}  wall {wall:6.1f} s", flush=True)
    ref = rows["scipy trf"]
    ref_rate = ref["hits"] / ref["wall"]
    print(
        f"\n{'arm':18s} {'successes':>9s} {'fraction':>8s} {'wall/trf':>8s} {'succ/s vs trf':>13s}"
    )
    for name, r in rows.items():
        rate = r["hits"] / r["wall"]
        vs = f"{rate / ref_rate:.2f}" if ref_rate > 0 else "n/a"
        print(
            f"{name:18s} {r['hits']:9d} {r['hits'] / (n * args.seeds):8.3f} "
            f"{r['wall'] / ref['wall']:8.2f} {vs:>13s}"
        )
        args.record.figure(f"{name} successes", r["hits"])
        args.record.figure(f"{name} wall", r["wall"])
    for name in rows:
        if name != "scipy trf":
            args.record.ratio(f"{name} wall / scipy trf", f"{name} wall", "scipy trf wall")


# -- errors against curve_fit (figure 3) ---------------------------------------------------------


def errors_figure(args) -> None:
    """``result.errors`` against curve_fit's ``sqrt(diag(pcov))`` at curve_fit's optimum."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from scipy.optimize import curve_fit

    import multistart as ms

    jax.config.update("jax_enable_x64", True)
    t = np.linspace(0.0, 5.0, 100)
    sigma = 0.05
    y = 3.0 * np.exp(-t / 1.5) + 0.2 + sigma * np.random.default_rng(0).normal(size=t.size)

    def decay(p):
        return (p["A"] * jnp.exp(-t / p["tau"]) + p["c"] - y) / sigma

    space = {"A": ms.Uniform(0.0, 10.0), "tau": ms.LogUniform(0.1, 10.0), "c": ms.Uniform(-1, 1)}
    curve, curve_space, starts_fn = _curve()
    cases = {
        "exponential decay, 3 parameters, 100 residuals": (decay, space, ("A", "tau", "c")),
        "two-peak curve fit, 7 parameters, 1000 residuals": (curve, curve_space, KEYS),
    }
    print("result.errors / curve_fit's sqrt(diag(pcov)) - 1, largest over the parameters")
    print(f"{'fit':50s} {'absolute_sigma':>14s} {'least squares':>13s} {'Laplace (H)':>11s}")
    for name, (res, sp, keys) in cases.items():
        for absolute in (True, False):
            search = ms.MultiStartLeastSquares(
                n_starts=16, seed=0, absolute_sigma=absolute, log_every=0, progress=False
            )
            fit = search.fit(res, sp)
            p0 = [float(fit.best_params[k]) for k in keys]

            def model(_, *v, res=res, keys=keys):
                return np.asarray(res(dict(zip(keys, v, strict=True))))

            # curve_fit of the normalised residuals against zero: its pcov is that of the fit
            popt, pcov = curve_fit(
                model, None, np.zeros(len(model(None, *p0))), p0=p0, absolute_sigma=absolute
            )
            ref = dict(zip(keys, np.sqrt(np.diag(pcov)), strict=True))
            hess = ms.laplace(
                lambda p, res=res: jnp.sum(res(p) ** 2), sp, dict(zip(keys, popt, strict=True))
            )
            s2 = (
                1.0
                if absolute
                else float(np.sum(model(None, *popt) ** 2)) / (len(model(None, *popt)) - len(keys))
            )
            ls = max(abs(fit.errors[k] / ref[k] - 1) for k in keys)
            h = max(abs(hess.errors[k] * np.sqrt(s2) / ref[k] - 1) for k in keys)
            print(f"{name:50s} {absolute!s:>14s} {ls:13.1e} {h:11.1e}")
            args.record.figure(f"{name}, absolute {absolute}: ours against curve_fit", ls)
            args.record.figure(f"{name}, absolute {absolute}: Laplace against curve_fit", h)


# -- the image fit: the Jacobian's cost and the crossover (figure 4) ----------------------------


def _image(k: int, seed: int = 0):
    """``(residuals, chi2, space, truth)`` of the image fit with its first ``k`` Gaussians."""
    import image_model as im
    import jax.numpy as jnp
    import numpy as np

    import multistart as ms

    truth = {name: v[:k] for name, v in im.make_truth(seed).items()}
    rng = np.random.default_rng(seed + 1)
    bands = []
    for side, sig in im.BANDS.values():
        xx, yy = im.grid(side)
        clean = np.asarray(im.render(truth, xx, yy), dtype=np.float64)
        img = clean + rng.normal(0.0, sig, (side, side))
        bands.append((jnp.asarray(xx), jnp.asarray(yy), jnp.asarray(img), sig))

    def residuals(p):
        return tuple(((im.render(p, xx, yy) - img) / sig).ravel() for xx, yy, img, sig in bands)

    def chi2(p):
        return sum(jnp.sum(r**2) for r in residuals(p))

    full = im.space()
    space = {
        name: type(pr)(np.asarray(pr.lower)[:k], np.asarray(pr.upper)[:k], shape=(k,))
        for name, pr in full.items()
    }
    assert all(isinstance(p, ms.Prior) for p in space.values())
    return residuals, chi2, space, truth


def _costs(fns: dict, x, repeats: int) -> dict[str, float]:
    """Seconds per call of each jitted ``fn(x)``: the fastest of ``repeats`` calls, the calls
    of the functions interleaved (on a shared machine the fastest call is the cost of the
    work itself; a median carries whatever else ran then)."""
    import jax

    for fn in fns.values():
        jax.block_until_ready(fn(x))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x))
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def image_figure(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.flatten_util import ravel_pytree

    import multistart as ms

    jax.config.update("jax_enable_x64", True)
    print(
        "image fit (image_model.py) with k Gaussians, 32,000 residuals, float64. J/vg, J/value: "
        "one Jacobian's time over one value-and-gradient's and one value's (one start, the "
        f"fastest of {args.repeats} interleaved calls each). Fits: {args.starts} starts from the "
        "default filter, batch_size 1: the whole fit's wall, and the steps after the first (steps)"
    )
    print(
        f"{'k':>2s} {'n':>3s} {'J/vg':>6s} {'J/value':>7s} | {'lm wall/lbfgs':>13s} "
        f"{'steps/lbfgs':>11s} {'lm best':>10s} {'lbfgs best':>10s} {'lm evals':>8s} "
        f"{'lbfgs evals':>11s}"
    )
    for k in args.gaussians:
        residuals, chi2, space, truth = _image(k)
        x0, unravel = ravel_pytree(jax.tree_util.tree_map(jnp.asarray, truth))

        def flat_res(v, unravel=unravel, residuals=residuals):
            return ravel_pytree(residuals(unravel(v)))[0]

        jac = jax.jit(jax.jacfwd(flat_res))
        vg = jax.jit(jax.value_and_grad(lambda v, unravel=unravel, chi2=chi2: chi2(unravel(v))))
        val = jax.jit(lambda v, unravel=unravel, chi2=chi2: chi2(unravel(v)))
        cost = _costs({"jac": jac, "vg": vg, "value": val}, x0, args.repeats)
        t_j, t_vg, t_v = cost["jac"], cost["vg"], cost["value"]
        # the default broad-start filter: the same starts for both rules (it ranks by chi2)
        common = dict(n_starts=args.starts, batch_size=1, seed=0, log_every=0, progress=False)
        arms = {}
        for name, make, fn in (
            ("lm", lambda c=common: ms.MultiStartLeastSquares(n_steps=300, **c), residuals),
            ("lbfgs", lambda c=common: ms.MultiStartLBFGS(n_steps=3000, **c), chi2),
        ):
            t0 = time.perf_counter()
            r = make().fit(fn, space)
            arms[name] = (time.perf_counter() - t0, r)
        (w_lm, lm), (w_lb, lb) = arms["lm"], arms["lbfgs"]
        loop = [r.stats["loop_s"] - r.stats["first_step_s"] for r in (lm, lb)]
        print(
            f"{k:2d} {x0.size:3d} {t_j / t_vg:6.1f} {t_j / t_v:7.1f} | {w_lm / w_lb:13.2f} "
            f"{loop[0] / loop[1]:11.2f} {lm.best_fom:10.1f} {lb.best_fom:10.1f} "
            f"{np.median(lm.n_evals):8.0f} {np.median(lb.n_evals):11.0f}",
            flush=True,
        )
        for name, value in (("jac", t_j), ("vg", t_vg), ("lm wall", w_lm), ("lbfgs wall", w_lb)):
            args.record.figure(f"{k} gaussians {name}", value)
        args.record.ratio(f"{k} gaussians jac / vg", f"{k} gaussians jac", f"{k} gaussians vg")
        args.record.ratio(
            f"{k} gaussians lm wall / lbfgs", f"{k} gaussians lm wall", f"{k} gaussians lbfgs wall"
        )


# -- the choice of the built-in rule ------------------------------------------------------------


def solvers_figure(args) -> None:
    """The built-in rules against optimistix's through the adapter, on the curve fit."""
    import jax
    import numpy as np
    import optimistix as optx

    import multistart as ms

    residuals, space, starts_fn = _curve()
    starts = starts_fn(args.starts, 0)
    rules = {
        "lm": "lm",
        "optx LM": optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8),
        "dogleg": "dogleg",
        "optx Dogleg": optx.Dogleg(rtol=1e-8, atol=1e-8),
        "gauss-newton": "gauss-newton",
        "optx GaussNewton": optx.GaussNewton(rtol=1e-8, atol=1e-8),
    }
    print(
        f"two-peak curve fit, {args.starts} starts, width {args.width}, every arm compiling its "
        f"programs; median of {args.rounds} rounds; state: bytes per start"
    )
    rows: dict[str, list] = {name: [] for name in rules}
    for rnd in range(args.rounds):
        names = list(rules) if rnd % 2 == 0 else list(rules)[::-1]
        for name in names:
            search = ms.MultiStartLeastSquares(
                method=rules[name],
                n_starts=args.starts,
                batch_size=args.width,
                n_candidates=0,
                seed=0,
                log_every=0,
                progress=False,
            )
            t0 = time.perf_counter()
            r = search.fit(residuals, space, starts=starts)
            wall = time.perf_counter() - t0
            st = r.stats
            per_call = (st["loop_s"] - st["first_step_s"]) / max(st["n_chunk_calls"] - 1, 1)
            one = jax.eval_shape(search.solver.init, np.zeros(len(space)))
            state = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(one))
            rows[name].append((wall, per_call, r, state))
    ref = harness.median(w for w, *_ in rows["lm"])
    ref_call = harness.median(c for _, c, *_ in rows["lm"])
    print(
        f"\n{'rule':17s} {'wall/lm':>7s} {'call/lm':>7s} {'steps p50':>9s} {'p90':>5s} "
        f"{'max':>5s} {'best chi2':>11s} {'state':>6s}  statuses"
    )
    for name, runs in rows.items():
        wall = harness.median(w for w, *_ in runs) / ref
        call = harness.median(c for _, c, *_ in runs) / ref_call
        r, state = runs[0][2], runs[0][3]
        print(
            f"{name:17s} {wall:7.2f} {call:7.2f} {np.median(r.n_steps):9.1f} "
            f"{np.percentile(r.n_steps, 90):5.0f} {r.n_steps.max():5d} {r.best_fom:11.4f} "
            f"{state:6d}  {r.status_counts()}"
        )
        args.record.figure(f"{name} wall", harness.median(w for w, *_ in runs))
        args.record.figure(f"{name} call", harness.median(c for _, c, *_ in runs))
    for name in rows:
        if name != "lm":
            args.record.ratio(f"{name} wall / lm", f"{name} wall", "lm wall")


# -- the entry point ----------------------------------------------------------------------------


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_arm":
        arm, n, width = argv[1], int(argv[2]), argv[3]
        width = None if width == "None" else int(width)
        harness.child_result(curve_arm(arm, n, width, seed=0))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="figure", required=True)
    c = sub.add_parser("curve-fit")
    c.add_argument("--starts", type=int, nargs="+", default=[512, 64])
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--width", type=int, default=32)
    m = sub.add_parser("multimodal")
    m.add_argument("--starts", type=int, default=64)
    m.add_argument("--seeds", type=int, default=4)
    m.add_argument("--width", type=int, default=16)
    sub.add_parser("errors")
    i = sub.add_parser("image")
    i.add_argument("--gaussians", type=int, nargs="+", default=[1, 2, 4, 8])
    i.add_argument("--starts", type=int, default=4)
    i.add_argument("--repeats", type=int, default=30)
    v = sub.add_parser("solvers")
    v.add_argument("--starts", type=int, default=256)
    v.add_argument("--width", type=int, default=32)
    v.add_argument("--rounds", type=int, default=2)
    for p in (c, m, sub.choices["errors"], i, v):
        harness.add_arguments(p)
    args = ap.parse_args(argv)
    args.record = harness.Record(f"least_squares {args.figure}", args)
    figures = {
        "curve-fit": curve_fit_figure,
        "multimodal": multimodal_figure,
        "errors": errors_figure,
        "image": image_figure,
        "solvers": solvers_figure,
    }
    if args.figure in ("errors", "image", "solvers"):
        os.environ["MULTISTART_CACHE_DIR"] = ""  # every fit compiles its programs
    figures[args.figure](args)
    args.record.write(args.json)


if __name__ == "__main__":
    main()
