"""How large a chip's float64 refinement program is: the batch covariance program
(:func:`multistart.result.laplace.residual_curvature`) of a Gaussian peak's residuals lowered
for ``--fits`` fits, as a float64 answer's (refined in its box) and as a float32 answer's (the
search's own type, no refinement), its StableHLO operations counted: all,
those of float64 type (a TPU emulates each with several float32 operations, and compiled the
refined program in about 80 s, ``refine_where.py``), and the model's ``exp`` (a copy of the
model each). Lowered on this machine with the platform taken as a TPU's (the program a chip
gets: float32 normal equations but in the last step, small solves written out); nothing is
compiled or run. An experiment: nothing imports it (issue 70).

    python -m profiling.experiments.refine_program --fits 1000
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from multistart.common import xla
from multistart.result.laplace import residual_curvature

M = 60  # points a fit


def residuals(v, data):
    x, y = data
    return v[0] * jnp.exp(-0.5 * ((x - v[1]) / v[2]) ** 2) + v[3] - y


def counts(text: str) -> dict[str, int]:
    ops = [line for line in text.splitlines() if "= stablehlo." in line]
    exps = [line for line in ops if "stablehlo.exponential" in line]
    return {
        "operations": len(ops),
        "float64 operations": sum("xf64>" in line or "tensor<f64>" in line for line in ops),
        "exp (model copies)": len(exps),
        "exp in float64": sum("f64" in line for line in exps),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fits", type=int, default=1000)
    a = p.parse_args(argv)
    xla.platform = lambda: "tpu"  # the chip's program (this process lowers, never runs it)
    jax.config.update("jax_enable_x64", True)
    program = residual_curvature(residuals, stacked=True)
    spec = jax.ShapeDtypeStruct
    arms = (("float64, refined", np.float64, True), ("float32", np.float32, False))
    for label, dtype, box in arms:
        points = spec((a.fits, 4), dtype)
        data = (spec((a.fits, M), dtype),) * 2
        args = (points, data, (spec((4,), dtype),) * 2) if box else (points, data)
        print(f"{label:18s}", counts(program.lower(*args).as_text()))


if __name__ == "__main__":
    main()
