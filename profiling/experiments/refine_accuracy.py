"""How close does a chip's float64 refinement end to the CPU's float64 fit? An experiment, on
the CPU, with the chip's platform injected (``multistart.common.xla.platform``).

``--fits`` of curve_fit_many's peaks (peaks anywhere, one start a fit) fitted by the default
``curve_fit`` (float64 answers) twice in one process: as a CPU fits them (float64 steps), and
as a TPU would (float32 steps, then :data:`multistart.result.laplace.REFINE_STEPS` refinement
steps, every one but the last with float32 normal equations). Prints how many fits' ``popt``
and standard errors lie within 1e-6 and 1e-8 (each fit's largest relative difference) of the
CPU's, and within 1e-3 of a standard error. The chip's own figures are the accelerator
benchmark's ``float64`` section; this one isolates the arithmetic (the float32 steps here run
on the CPU). Nothing imports it.

    python -m profiling.experiments.refine_accuracy --fits 20000 --steps 4
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import curve_fit_many as cfm  # noqa: E402
import numpy as np  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.common import xla  # noqa: E402
from multistart.result import laplace  # noqa: E402


def fit(y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ms.curve_fit(
            cfm.peak, cfm.X, y, p0=cfm.P0, bounds=cfm.BOUNDS, n_starts=1, batched=True,
            log_every=0, progress=False,
        )  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fits", type=int, default=20_000)
    p.add_argument("--steps", default="4", help="an int, or 'until' (no fit moves)")
    args = p.parse_args(argv)
    laplace.REFINE_STEPS = None if args.steps == "until" else int(args.steps)
    y = cfm.datasets(args.fits, 0, "anywhere")[1]
    cpu_popt, cpu_pcov = fit(y)
    real = xla.platform
    xla.platform = lambda: "tpu"  # the chip's programs, traced and run on the CPU
    try:
        popt, pcov = fit(y)
    finally:
        xla.platform = real
    rel = np.max(np.abs(popt - cpu_popt) / np.maximum(np.abs(cpu_popt), 1e-300), axis=1)
    err, cpu_err = (np.sqrt(np.diagonal(c, axis1=1, axis2=2)) for c in (pcov, cpu_pcov))
    sigmas = np.max(np.abs(popt - cpu_popt) / cpu_err, axis=1)
    ok = np.all(np.isfinite(err) & np.isfinite(cpu_err) & (cpu_err > 0), axis=1)
    err_rel = np.max(np.abs(err[ok] / cpu_err[ok] - 1), axis=1)
    print(f"{args.fits} fits, refinement steps {args.steps}")
    print(f"  popt within 1e-6: {int(np.sum(rel <= 1e-6))}, within 1e-8: "
          f"{int(np.sum(rel <= 1e-8))}, median {np.median(rel):.2g}")  # fmt: skip
    print(f"  popt within 1e-3 of a standard error: {int(np.sum(sigmas <= 1e-3))}")
    print(f"  errors of {int(ok.sum())} fits: within 1e-6: {int(np.sum(err_rel <= 1e-6))}, "
          f"99th percentile {np.quantile(err_rel, 0.99):.2g}")  # fmt: skip


if __name__ == "__main__":
    main()
