"""Start by start: MultiStartLBFGS against scipy's L-BFGS-B, in physical and in logit coordinates.

The best of a few starts is dominated by which start finds which basin; this script compares
the rules start by start on the image fit (``image_model.py``), from the first ``--starts`` of
``time_to_solution.py``'s starts (seed 0): scipy's ``minimize(method="L-BFGS-B")`` with the
priors' bounds in physical coordinates, the same in the engine's unconstrained (logit)
coordinates without bounds, and ``MultiStartLBFGS`` (window rule off, ``--steps`` steps).
Prints each start's final χ² and evaluations per arm.

    python profiling/experiments/per_start_lbfgs.py --starts 3 --steps 1500
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # profiling/: the models

import image_model  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize as so  # noqa: E402
from peers import draw_starts  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.model.priors import Space  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    args = ap.parse_args(argv)
    objective, space, _ = image_model.make_problem()
    sp = Space(space)
    starts = {k: v[: args.starts] for k, v in draw_starts(space, 8, 0).items()}
    x0 = sp.ravel(starts)
    u0 = sp.ravel(sp.to_unconstrained(starts))
    f_u = jax.jit(jax.value_and_grad(lambda u: objective(sp.unravel(sp.forward_flat(u)))))
    f_x = jax.jit(jax.value_and_grad(lambda x: objective(sp.unravel(x))))
    lo = np.concatenate([np.broadcast_to(p.lower_bound, p.shape).ravel() for p in sp.priors])
    hi = np.concatenate([np.broadcast_to(p.upper_bound, p.shape).ravel() for p in sp.priors])

    def scipy_arm(f, points, bounds):
        out = []
        for s in points:
            r = so.minimize(
                lambda v: tuple(np.asarray(a, np.float64) for a in f(v)),
                s,
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
            )
            out.append((float(r.fun), int(r.nfev)))
        return out

    rows = {
        "scipy, physical + bounds": scipy_arm(f_x, x0, list(zip(lo, hi, strict=True))),
        "scipy, logit coordinates": scipy_arm(f_u, u0, None),
    }
    r = ms.MultiStartLBFGS(
        n_starts=args.starts, batch_size=1, n_steps=args.steps, convergence=None, log_every=0
    ).fit(objective, space, starts=starts)
    rows["MultiStartLBFGS"] = list(zip(r.foms.tolist(), r.n_evals.tolist(), strict=True))
    for name, out in rows.items():
        cells = "  ".join(f"{f:>10.0f} ({n:>5d})" for f, n in out)
        print(f"{name:<26} {cells}")
    print("(final chi2 (evaluations) per start)")


if __name__ == "__main__":
    main()
