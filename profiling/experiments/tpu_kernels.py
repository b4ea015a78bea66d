"""The least-squares step's linear algebra on an accelerator: the forms a batch of small fits
can take, each timed per step at the same width (issue 70: "a step the chip does well").

B fits of the Gaussian peak of ``profiling/curve_fit_many.py`` (60 points, 4 parameters),
``--steps`` Levenberg-Marquardt steps in one jitted ``fori_loop`` (one evaluation, Jacobian,
normal equations and solve a step), warm, in each form:

  vmap-lu        the hand-written peer: ``jacfwd``, ``JᵀJ``, ``jnp.linalg.solve`` (LU) per fit
  vmap-cholesky  the same with ``jax.scipy.linalg.cho_solve`` (the library's solve today)
  vmap-unrolled  the Jacobian's columns by ``jax.linearize``, ``JᵀJ`` as n(n+1)/2 dot products
                 and a Cholesky written out entry by entry: under ``vmap`` every matrix entry
                 is one lane-dense vector over the fits
  optimistix     ``jit(vmap(optx.least_squares(LevenbergMarquardt)))`` for ``--steps`` steps

and the covariance ``(JᵀJ)⁻¹`` of B Jacobians (60 x 4) by ``jnp.linalg.svd``, QR then the
SVD of R, ``eigh`` of ``JᵀJ``, and the written-out Cholesky inverse. Then the library's own
batch, ``ms.curve_fit(batched=True, n_starts=1)`` on B fits, cold and warm, in ``--dtype``.

    python -m profiling.experiments.tpu_kernels --fits 200000      # on the chip
    python -m profiling.experiments.tpu_kernels --fits 2000 --steps 5   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import curve_fit_many as cfm  # noqa: E402

N = 4


def peak(x, p):
    a, mu, w, b = p[0], p[1], p[2], p[3]
    return a * jnp.exp(-0.5 * ((x - mu) / w) ** 2) + b


def timed(fn, *args, repeat=2):
    out = jax.block_until_ready(fn(*args))  # compiles
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, out


def compile_time(fn, *args):
    t0 = time.perf_counter()
    fn.lower(*args).compile()
    return time.perf_counter() - t0


# -- the forms of one LM step ------------------------------------------------------------------


def lm_dense(solve):
    """One fit's LM over ``steps``: (n,) and (n, n) arrays, ``solve`` for the normal equations."""

    def fit(p0, y, x, steps):
        def res(p):
            return peak(x, p) - y

        def body(_, s):
            p, cost, a, g, lam = s
            r = res(p)
            jac = jax.jacfwd(res)(p)
            c = jnp.vdot(r, r)
            ok = c < cost
            a = jnp.where(ok, jac.T @ jac, a)
            g = jnp.where(ok, jac.T @ r, g)
            base = jnp.where(ok, p, p)  # the evaluated point becomes the base when accepted
            lam = jnp.where(ok, lam / 3, lam * 2)
            cost = jnp.where(ok, c, cost)
            d = solve(a + lam * jnp.diag(jnp.diag(a)), -g)
            return base + d, cost, a, g, lam

        n = p0.shape[0]
        s = (p0, jnp.inf, jnp.eye(n, dtype=p0.dtype), jnp.zeros_like(p0), 1e-1)
        s = jax.tree_util.tree_map(lambda v: jnp.asarray(v, p0.dtype), s)
        return jax.lax.fori_loop(0, steps, body, s)[0]

    return fit


def _cho_solve(a, b):
    return jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a, lower=True), b)


def cholesky_entries(a):
    """Lower Cholesky factor of a symmetric matrix given as a list of rows of scalars."""
    n = len(a)
    low = [[None] * n for _ in range(n)]
    for j in range(n):
        s = a[j][j] - sum(low[j][k] ** 2 for k in range(j))
        low[j][j] = jnp.sqrt(s)
        for i in range(j + 1, n):
            low[i][j] = (a[i][j] - sum(low[i][k] * low[j][k] for k in range(j))) / low[j][j]
    return low


def solve_entries(low, b):
    n = len(b)
    z = [None] * n
    for i in range(n):
        z[i] = (b[i] - sum(low[i][k] * z[k] for k in range(i))) / low[i][i]
    x = [None] * n
    for i in reversed(range(n)):
        x[i] = (z[i] - sum(low[k][i] * x[k] for k in range(i + 1, n))) / low[i][i]
    return x


def lm_unrolled(p0, y, x, steps):
    """One fit's LM with every matrix entry a scalar (a vector over the fits under vmap)."""

    def res(p):
        return peak(x, jnp.stack(p)) - y

    def body(_, s):
        p, cost, a, g, lam = s
        r, lin = jax.linearize(res, p)
        cols = [lin([jnp.asarray(float(i == j), r.dtype) for i in range(N)]) for j in range(N)]
        c = jnp.vdot(r, r)
        ok = c < cost
        new_a = [[jnp.vdot(cols[i], cols[j]) for j in range(N)] for i in range(N)]
        a = [[jnp.where(ok, new_a[i][j], a[i][j]) for j in range(N)] for i in range(N)]
        g = [jnp.where(ok, jnp.vdot(cols[i], r), g[i]) for i in range(N)]
        lam = jnp.where(ok, lam / 3, lam * 2)
        cost = jnp.where(ok, c, cost)
        damped = [
            [a[i][j] + (lam * a[i][i] if i == j else 0.0) for j in range(N)] for i in range(N)
        ]
        d = solve_entries(cholesky_entries(damped), [-gi for gi in g])
        return [pi + di for pi, di in zip(p, d, strict=True)], cost, a, g, lam

    dt = p0.dtype
    zero = jnp.zeros((), dt)
    s = (
        [p0[i] for i in range(N)],
        jnp.asarray(jnp.inf, dt),
        [[jnp.asarray(float(i == j), dt) for j in range(N)] for i in range(N)],
        [zero] * N,
        jnp.asarray(0.1, dt),
    )
    return jnp.stack(jax.lax.fori_loop(0, steps, body, s)[0])


def optimistix_fit(steps):
    import optimistix as optx

    solver = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-10)

    def fit(p0, y, x):
        def fn(p, args):
            return peak(x, p) - args

        sol = optx.least_squares(fn, solver, p0, args=y, max_steps=steps, throw=False)
        return sol.value

    return fit


# -- the covariance of B Jacobians --------------------------------------------------------------


def cov_svd(jac):
    _, s, vt = jnp.linalg.svd(jac, full_matrices=False)
    return jnp.einsum("bki,bk,bkj->bij", vt, 1 / s**2, vt)


def cov_qr_svd(jac):
    r = jnp.linalg.qr(jac, mode="r")
    _, s, vt = jnp.linalg.svd(r, full_matrices=False)
    return jnp.einsum("bki,bk,bkj->bij", vt, 1 / s**2, vt)


def cov_eigh(jac):
    lam, v = jnp.linalg.eigh(jnp.einsum("bmi,bmj->bij", jac, jac))
    return jnp.einsum("bik,bk,bjk->bij", v, 1 / lam, v)


def cov_unrolled(jac):
    def one(jm):
        cols = [jm[:, i] for i in range(N)]
        a = [[jnp.vdot(cols[i], cols[j]) for j in range(N)] for i in range(N)]
        low = cholesky_entries(a)
        inv = [
            solve_entries(low, [jnp.asarray(float(i == j), jm.dtype) for i in range(N)])
            for j in range(N)
        ]
        return jnp.stack([jnp.stack(c) for c in inv])

    return jax.vmap(one)(jac)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--skip", default="", help="comma-separated arms to skip")
    args = parser.parse_args(argv)
    skip = set(args.skip.split(","))
    dev = jax.devices()[0]
    print(
        f"jax {jax.__version__}, {dev.device_kind} ({dev.platform}), {args.fits} fits, "
        f"{args.steps} steps, {args.dtype}",
        flush=True,
    )
    dt = jnp.dtype(args.dtype)
    if dt == jnp.float64:
        jax.config.update("jax_enable_x64", True)
    truths, y = cfm.datasets(args.fits, 0, "anywhere")
    x = jnp.asarray(cfm.X, dt)
    yd = jnp.asarray(y, dt)
    p0 = jnp.tile(jnp.asarray(cfm.P0, dt), (args.fits, 1)) + jnp.asarray([0.5, 0.1, 0.2, 0.0], dt)
    steps = args.steps
    arms = {
        "vmap-lu": lambda: jax.jit(
            jax.vmap(lm_dense(jnp.linalg.solve), (0, 0, None, None)), static_argnums=3
        ),
        "vmap-cholesky": lambda: jax.jit(
            jax.vmap(lm_dense(_cho_solve), (0, 0, None, None)), static_argnums=3
        ),
        "vmap-unrolled": lambda: jax.jit(
            jax.vmap(lm_unrolled, (0, 0, None, None)), static_argnums=3
        ),
    }
    rows = {}
    for name, make in arms.items():
        if name in skip:
            continue
        fn = make()
        try:
            c = compile_time(fn, p0, yd, x, steps)
            t, out = timed(fn, p0, yd, x, steps)
            good = cfm.good(np.asarray(out, np.float64), truths)
            rows[name] = t / steps
            print(
                f"  {name:<16} compile {c:6.2f} s  {1e3 * t / steps:8.3f} ms a step  good {good}",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001 - an arm that does not run is a finding
            print(f"  {name:<16} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if "optimistix" not in skip:
        try:
            fn = jax.jit(jax.vmap(optimistix_fit(steps), (0, 0, None)))
            c = compile_time(fn, p0, yd, x)
            t, out = timed(fn, p0, yd, x)
            rows["optimistix"] = t / steps
            good = cfm.good(np.asarray(out, np.float64), truths)
            print(
                f"  {'optimistix':<16} compile {c:6.2f} s  {1e3 * t / steps:8.3f} ms a step  "
                f"good {good}",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001
            print(f"  optimistix FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if "cov" not in skip:
        jac = jax.jit(jax.vmap(jax.jacfwd(lambda p, yy: peak(x, p) - yy)))(p0, yd)
        for name, f in (
            ("svd", cov_svd),
            ("qr+svd(R)", cov_qr_svd),
            ("eigh(JᵀJ)", cov_eigh),
            ("unrolled", cov_unrolled),
        ):
            try:
                fn = jax.jit(f)
                c = compile_time(fn, jac)
                t, _ = timed(fn, jac)
                print(f"  cov {name:<12} compile {c:6.2f} s  {1e3 * t:8.2f} ms", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  cov {name} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if "library" not in skip:
        import multistart as ms

        _, y2 = cfm.datasets(args.fits, 1, "anywhere")
        kw = dict(p0=cfm.P0, bounds=cfm.BOUNDS, n_starts=1, batched=True, log_every=0)
        if "dtype" in (ms.curve_fit.__doc__ or ""):
            kw["dtype"] = args.dtype
        elif dt == jnp.float32:  # before the option: curve_fit's float64 switched off
            import contextlib

            jax.enable_x64 = lambda flag=True: contextlib.nullcontext()
        kw["full_output"] = True
        for when, data in (("first", y2), ("warm", y)):
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            popt, _, info, _, _ = ms.curve_fit(cfm.peak, cfm.X, data, **kw)
            prof.disable()
            t = time.perf_counter() - t0
            st = info["fits"].result.stats
            keep = (
                "n_steps_taken",
                "steps",
                "n_chunk_calls",
                "batch_size",
                "stop_reason",
                "n_compiles",
                "compile_s",
                "steps_per_call",
            )
            shown = {k: st[k] for k in st if any(w in k for w in keep)}
            print(
                f"  library {when:<6} {t:8.2f} s  good {cfm.good(popt, truths)} {shown}", flush=True
            )
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
        print(s.getvalue()[:6000])


if __name__ == "__main__":
    main()
