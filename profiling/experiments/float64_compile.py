"""What float64 costs a fit's compiles on the default device: float32 against float64.

One ``MultiStartLeastSquares(n_starts=32, seed=0)`` fit of a 3-parameter decay (50 points,
fresh cache folder) and one compile-and-call of the hand-written
``jax.jit(jax.vmap(optx.least_squares(..., optx.LevenbergMarquardt(...))))`` of the same
model over the same 32 rows, first in float32 and then in float64, in one process. Printed:
each arm's wall and the seconds of every backend compile it requested (JAX's monitoring
events; the fit's are the filter, the chunk step and the Result's parameter map, in that
order). On a CPU the two precisions compile alike; on a TPU, which has no float64 unit, the
float64 programs are much larger (profiling/HISTORY.md, "First figures on a TPU").

    python profiling/experiments/float64_compile.py
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ["MULTISTART_CACHE_DIR"] = tempfile.mkdtemp(prefix="float64_compile_")
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optimistix as optx  # noqa: E402
from jax import monitoring  # noqa: E402

import multistart as ms  # noqa: E402

COMPILES: list[float] = []
X = np.linspace(0.0, 5.0, 50)
Y = 3.0 * np.exp(-X / 1.5) + 0.2
SPACE = {"A": ms.Uniform(0.1, 10.0), "tau": ms.Uniform(0.1, 10.0), "c": ms.Uniform(-1.0, 1.0)}


def _listen(event: str, seconds: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        COMPILES.append(seconds)


def ours(dtype) -> float:
    x, y = X.astype(dtype), Y.astype(dtype)
    t0 = time.perf_counter()
    ms.MultiStartLeastSquares(n_starts=32, seed=0).fit(
        lambda p: p["A"] * jnp.exp(-x / p["tau"]) + p["c"] - y, SPACE
    )
    return time.perf_counter() - t0


def hand(dtype) -> float:
    x, y = jnp.asarray(X, dtype), jnp.asarray(Y, dtype)
    solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-8)

    def fn(b, _):
        return b[0] * jnp.exp(-x / b[1]) + b[2] - y

    def one(y0):
        return optx.least_squares(fn, solver, y0, max_steps=200, throw=False).value

    t0 = time.perf_counter()
    jax.block_until_ready(jax.jit(jax.vmap(one))(jnp.ones((32, 3), dtype)))
    return time.perf_counter() - t0


def main() -> None:
    print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}")
    monitoring.register_event_duration_secs_listener(_listen)
    for x64 in (False, True):
        jax.config.update("jax_enable_x64", x64)
        dtype = np.float64 if x64 else np.float32
        for arm, run in (("ours", ours), ("hand vmap", hand)):
            COMPILES.clear()
            wall = run(dtype)
            each = " ".join(f"{s:.2f}" for s in COMPILES)
            print(f"{np.dtype(dtype).name:8s} {arm:10s} {wall:7.2f} s; compiles (s): {each}")


if __name__ == "__main__":
    main()
