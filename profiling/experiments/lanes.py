"""Does it pay to hold the fits, not the points, on a chip's minor axis? An experiment.

A Gauss-Newton step of curve_fit_many's peak (4 parameters, 60 points) for ``--fits`` fits,
written three ways and each run ``--steps`` times under one ``lax.fori_loop``:

- ``rows``: ``vmap`` over fits of a per-fit step, data ``[n, 60]`` (what the library traces);
- ``lanes``: the same per-fit step under ``vmap(in_axes=1, out_axes=1)``, data ``[60, n]``;
- ``written``: the step written by hand on ``[60, n]`` arrays (no ``vmap``), the 4x4 solve by
  Cholesky written out, the layout a hand-tuned kernel would use.

Prints each form's seconds a step and its ratio to ``rows``. Nothing imports it.

    python -m profiling.experiments.lanes --fits 200000 --steps 50
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import curve_fit_many as cfm  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def peak(x, p):
    a, c, w, b = p[0], p[1], p[2], p[3]
    return a * jnp.exp(-0.5 * ((x - c) / w) ** 2) + b


def step_one(p, x, y):
    """One damped Gauss-Newton step of one fit (``x``, ``y``: ``[m]``; ``p``: ``[4]``)."""
    r, lin = jax.linearize(lambda q: peak(x, q) - y, p)
    cols = jnp.stack([lin(e) for e in jnp.eye(4, dtype=p.dtype)], axis=-1)  # [m, 4]
    g = cols.T @ r
    h = cols.T @ cols + 1e-3 * jnp.eye(4, dtype=p.dtype)
    return p - jnp.linalg.solve(h, g)


def step_written(p, x, y):
    """The same step on ``[m, n]`` data and ``[4, n]`` parameters, by hand."""
    a, c, w, b = p
    z = (x - c) / w
    e = jnp.exp(-0.5 * z * z)
    r = a * e + b - y
    cols = [e, a * e * z / w, a * e * z * z / w, jnp.ones_like(e)]
    g = [jnp.sum(ci * r, axis=0) for ci in cols]
    h = [[jnp.sum(ci * cj, axis=0) + (1e-3 if i == j else 0.0) for j, cj in enumerate(cols)]
         for i, ci in enumerate(cols)]  # fmt: skip
    # Cholesky of the 4x4, written out, then two triangular solves
    n = 4
    low = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = h[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            low[i][j] = jnp.sqrt(s) if i == j else s / low[j][j]
    zf = []
    for i in range(n):
        zf.append((g[i] - sum(low[i][k] * zf[k] for k in range(i))) / low[i][i])
    d = [None] * n
    for i in reversed(range(n)):
        d[i] = (zf[i] - sum(low[k][i] * d[k] for k in range(i + 1, n))) / low[i][i]
    return jnp.stack([p[i] - d[i] for i in range(n)])


def timed(fn, *args, reps: int = 3) -> float:
    out = fn(*args)
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fits", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args(argv)
    print("devices:", jax.devices())
    y = np.asarray(cfm.datasets(a.fits, 0, "anywhere")[1], np.float32)
    x = np.broadcast_to(np.asarray(cfm.X, np.float32), y.shape)
    p0 = np.broadcast_to(np.asarray(cfm.P0, np.float32), (a.fits, 4))
    steps = a.steps

    @jax.jit
    def rows(p, x, y):
        return jax.lax.fori_loop(0, steps, lambda _, p: jax.vmap(step_one)(p, x, y), p)

    @jax.jit
    def lanes(p, x, y):
        f = jax.vmap(step_one, in_axes=(1, 1, 1), out_axes=1)
        return jax.lax.fori_loop(0, steps, lambda _, p: f(p, x, y), p)

    @jax.jit
    def written(p, x, y):
        return jax.lax.fori_loop(0, steps, lambda _, p: step_written(p, x, y), p)

    xr, yr, pr = (jnp.asarray(v) for v in (x, y, p0))
    xl, yl, pl = (jnp.asarray(np.ascontiguousarray(v.T)) for v in (x, y, p0))
    base = None
    for name, fn, args in (
        ("rows [n, 60]", rows, (pr, xr, yr)),
        ("lanes [60, n], vmap", lanes, (pl, xl, yl)),
        ("written [60, n]", written, (pl, xl, yl)),
    ):
        t0 = time.perf_counter()
        fn.lower(*args).compile()
        c = time.perf_counter() - t0
        s = timed(fn, *args) / steps
        base = base or s
        print(f"{name:24s} {s * 1e3:8.3f} ms a step  x{s / base:5.2f}  (compile {c:.2f} s)")
    pa = np.asarray(rows(pr, xr, yr))
    pb = np.asarray(lanes(pl, xl, yl)).T
    pc = np.asarray(written(pl, xl, yl)).T
    ok = np.isfinite(pa).all(axis=1)
    for name, other in (("lanes", pb), ("written", pc)):
        near = np.isclose(other[ok], pa[ok], rtol=1e-3, atol=1e-4).all(axis=1).mean()
        print(f"{name}: {near:.1%} of the finite fits within 1e-3 of rows' parameters")


if __name__ == "__main__":
    main()
