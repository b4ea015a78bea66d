"""Where L-BFGS's diagonal initial inverse Hessian (``diagonal=True``) helps and where it hurts.

``MultiStartLBFGS(n_starts=8)`` with ``diagonal`` off and on, float64, the same starts, on:
Rosenbrock in 2, 10 and 100 dimensions (coupled neighbours); a quadratic of 50 and of 500
coordinates whose curvatures span 1e4 and 1e6, once diagonal (the coordinates shuffled) and
once rotated by a random orthogonal matrix (every coordinate coupled to every other). Printed:
the summed steps of the 8 starts, how many converged, and the best figure of merit. The cohort
it was made for is measured by ``cohort_convergence.py`` (one start) and ``profiling/cohort.py``
(8 starts against scipy's loop).

Run: ``python profiling/experiments/lbfgs_diagonal.py`` (a few minutes). Findings:
profiling/HISTORY.md, "L-BFGS's diagonal for cohorts".
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")


def problems():
    import jax.numpy as jnp

    import multistart as ms

    rng = np.random.default_rng(0)

    def rosenbrock(p):
        x = p["x"]
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    def quadratic(a):
        return lambda p: 0.5 * p["x"] @ a @ p["x"] + 1.0

    out = {}
    for d in (2, 10, 100):
        out[f"Rosenbrock, {d}"] = (rosenbrock, {"x": ms.Uniform(-2.0, 2.0, shape=(d,))})
    for d, cond in ((50, 1e4), (500, 1e6)):
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        curvatures = np.logspace(0.0, np.log10(cond), d)
        space = {"x": ms.Uniform(-1.0, 1.0, shape=(d,))}
        rotated = jnp.asarray(q @ np.diag(curvatures) @ q.T)
        diagonal = jnp.diag(jnp.asarray(rng.permutation(curvatures)))
        out[f"quadratic {d}, condition {cond:.0e}, diagonal"] = (quadratic(diagonal), space)
        out[f"quadratic {d}, condition {cond:.0e}, rotated"] = (quadratic(rotated), space)
    return out


def main() -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    import multistart as ms

    for name, (objective, space) in problems().items():
        cells = []
        for diagonal in (False, True):
            search = ms.MultiStartLBFGS(
                n_starts=8, n_steps=20_000, seed=0, log_every=0, diagonal=diagonal
            )
            r = search.fit(objective, space)
            converged = sum(s == "converged" for s in r.status)
            cells.append(
                f"diagonal={diagonal}: {int(np.sum(r.n_steps))} steps, {converged}/8 converged, "
                f"best {float(r.best_fom):.3e}"
            )
        print(f"{name}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
