"""Why L-BFGS takes more evaluations than scipy's on a cohort: one start, step by step.

The cohort of ``profiling/cohort.py`` (default 3,000 patients, 9,005 parameters), float64,
from that script's first start. Arms, in this one process:

- scipy's L-BFGS-B on the array objective in physical coordinates (the benchmark's peer), and
  in the priors' standardised coordinates (``eta / 0.3``: the coordinates ``MultiStartLBFGS``
  steps a ``Normal(0, 0.3)`` in): evaluations, and the figure of merit it ends at;
- ``MultiStartLBFGS(n_starts=1)`` at ``memory`` 10, 20, 40, with looser tests (``rtol``
  1e-10 and 1e-9) and with scipy's ``ftol`` (2.2e-9) and 1e-10: steps to converge (or
  stall), the figure of merit at its end, and the first step its best reached scipy's
  (physical) figure of merit; and with ``diagonal=True`` (the initial inverse Hessian a scale
  a coordinate);
- seconds a step of 8 starts at ``memory`` 10, 20 and 40 (300 steps, ``batch_size="auto"``).

Run: ``python profiling/experiments/cohort_convergence.py`` (``--patients 1000`` for a few
minutes less). Findings: profiling/HISTORY.md, "A cohort of 3,000 patients as a factor graph".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cohort  # noqa: E402
import harness  # noqa: E402


def scipy_arm(fom, data, x0, scale):
    import jax
    import scipy.optimize

    vg = jax.jit(jax.value_and_grad(lambda z, d: fom(z * scale, d)))
    bounds = [(None, None)] * 4 + [(-5.0, 0.0)] + [(None, None)] * (x0.size - 5)
    with harness.one_blas_thread():
        res = scipy.optimize.minimize(
            lambda z: tuple(np.asarray(a, np.float64) for a in vg(z, data)),
            x0 / scale,
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
        )
    return res.nfev, float(res.fun)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=3000)
    args = parser.parse_args()
    if args.patients < 1:
        parser.error("--patients must be a positive int")
    import jax

    jax.config.update("jax_enable_x64", True)
    import multistart as ms

    n = args.patients
    patients = cohort.make_cohort(n)
    fom, data = cohort.array_objective(patients)
    first = cohort.starts(n, 1)
    x0 = cohort.flat_point(first[0], n)
    ones = np.ones(x0.size)
    z = np.concatenate([np.ones(5), np.full(3 * n, cohort.OMEGA)])
    evals, target = scipy_arm(fom, data, x0, ones)
    print(f"scipy L-BFGS-B, physical coordinates: {evals} evaluations, ends at {target:.6f}")
    evals_z, end_z = scipy_arm(fom, data, x0, z)
    print(f"scipy L-BFGS-B, standardised coordinates: {evals_z} evaluations, ends at {end_z:.6f}")

    graph = cohort.cohort_graph(patients)
    arms = {
        "memory=10": {},
        "memory=20": {"memory": 20},
        "memory=40": {"memory": 40},
        "rtol=1e-10": {"rtol": 1e-10},
        "rtol=1e-9": {"rtol": 1e-9},
        "ftol=2.2e-9 (scipy's)": {"ftol": 2.220446049250313e-09},
        "ftol=1e-10": {"ftol": 1e-10},
        "diagonal=True": {"diagonal": True},
    }
    for name, options in arms.items():
        search = ms.MultiStartLBFGS(n_starts=1, n_steps=15_000, seed=0, log_every=0, **options)
        result = search.fit(graph, starts=cohort.stacked(first))
        best = np.asarray(result.history)[:, 0]  # a row every history_steps step
        reached = np.flatnonzero(best <= target)
        at = f"step {int(result.history_steps[reached[0]])}" if reached.size else "never"
        print(
            f"MultiStartLBFGS {name}: {result.status[0]} after {int(result.n_steps[0])} steps, "
            f"ends at {result.best_fom:.6f}; reached scipy's figure of merit: {at}",
            flush=True,
        )

    eight = cohort.stacked(cohort.starts(n, 8))
    for memory in (10, 20, 40):
        search = ms.MultiStartLBFGS(n_starts=8, n_steps=300, memory=memory, seed=0, log_every=0)
        st = search.fit(graph, starts=eight).stats
        per_step = (st["loop_s"] - st["first_step_s"]) / (st["n_steps_run"] - 1)
        print(
            f"8 starts, memory={memory}: {per_step * 1e3:.1f} ms a step (width {st['batch_size']})",
            flush=True,
        )


if __name__ == "__main__":
    main()
