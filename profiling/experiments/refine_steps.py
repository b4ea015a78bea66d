"""How many float64 Gauss-Newton steps should a chip's refinement of a large batch take? An
experiment.

The accelerator benchmark's ``float64`` section (``--fits`` of curve_fit_many's peaks, the
float64 answer refined from float32 steps against ``dtype="float32"``, and against the CPU's
float64 answer from a fresh process) with the chip's refinement set to ``--steps`` Gauss-Newton
steps (``multistart.result.laplace.REFINE_STEPS``), or ``until`` no fit moves (at most
``REFINE_MAX_STEPS``, as the CPU refines). Prints the section's rows: the warm calls, their
ratio, and how many fits end within 1e-6 of the CPU's float64 answer. Nothing imports it.

    python -m profiling.experiments.refine_steps --steps 4
    python -m profiling.experiments.refine_steps --steps until
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import accelerator  # noqa: E402
import harness  # noqa: E402

from multistart.result import laplace  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="4", help="an int, or 'until' (no fit moves)")
    p.add_argument("--fits", type=int, default=20_000)
    args = p.parse_args(argv)
    laplace.REFINE_STEPS = None if args.steps == "until" else int(args.steps)
    record = harness.Record("refine_steps", args)
    for row in accelerator.float64({"fits64": args.fits}, record):
        print(row)


if __name__ == "__main__":
    main()
