"""The scipy peer arm: the problem as scipy's loop sees it, at its best setting (one BLAS thread).

scipy's ``minimize(method="L-BFGS-B")`` does its own small vector work between evaluations
through BLAS (OpenBLAS, in the wheels). After each BLAS call OpenBLAS's worker threads spin a
while waiting for more work, on the same cores XLA's thread pool needs for the next
evaluation of a jitted JAX objective. On this project's 2-core VM, the image model's
value-and-grad (``image_model.py``) cost 2.22x as much inside scipy's loop as alone, and 1.18x
with one BLAS thread (``main`` below); scipy's whole loop ran about 2x faster with one
(``time_to_solution.py``). A user who times such a loop
would set ``OPENBLAS_NUM_THREADS=1`` (or use threadpoolctl, as here), so the benchmarks run
their scipy arms that way; ``time_to_solution.py`` also shows scipy with the default threads.

``scipy_problem`` hands a search's objective and starts to scipy (``time_to_solution.py``,
``halving.py``, ``accelerator.py``), and ``draw_starts`` draws the starts every arm of such a
benchmark shares (uniform in the central band of each prior); ``one_blas_thread`` and
``blas_threads`` are the harness's (``harness.py``), named here too for the scripts that import
them from this module.

Install: ``pip install -e ".[profiling]"`` (threadpoolctl). Run it to see the effect:

    python profiling/peers.py   # an evaluation alone, and inside scipy's loop, both ways
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import blas_threads, one_blas_thread  # noqa: E402

__all__ = ["BAND", "blas_threads", "draw_starts", "one_blas_thread", "scipy_problem"]

BAND = (0.15, 0.85)  # the quantiles of each prior the shared starts are drawn between


def draw_starts(space: dict, n: int, seed: int) -> dict:
    """``n`` starts per leaf, uniform in the central band of each prior's quantiles (log-uniform
    for a ``LogUniform`` prior): the same starts for scipy's loop and for a search."""
    import numpy as np

    import multistart as ms

    rng = np.random.default_rng(seed)
    out = {}
    for name, prior in space.items():
        u = rng.uniform(*BAND, size=(n, *prior.shape))
        lo, hi = np.asarray(prior.lower, float), np.asarray(prior.upper, float)
        if isinstance(prior, ms.LogUniform):
            out[name] = np.exp(np.log(lo) + (np.log(hi) - np.log(lo)) * u)
        else:
            out[name] = lo + (hi - lo) * u
    return out


def scipy_problem(objective, space, starts):
    """``(vg, x0s, bounds)`` for scipy: a jitted value-and-grad over the flat parameter vector
    (compiled at its first call), each start flattened, and the priors' bounds."""
    import jax
    import numpy as np
    from jax.flatten_util import ravel_pytree

    _, unravel = ravel_pytree(jax.tree_util.tree_map(lambda a: a[0], starts))
    vg = jax.jit(jax.value_and_grad(lambda v: objective(unravel(v))))
    n = len(jax.tree_util.tree_leaves(starts)[0])
    x0s = [
        np.asarray(ravel_pytree(jax.tree_util.tree_map(lambda a, i=i: a[i], starts))[0])
        for i in range(n)
    ]
    lower = ravel_pytree({k: np.broadcast_to(p.lower, p.shape) for k, p in space.items()})[0]
    upper = ravel_pytree({k: np.broadcast_to(p.upper, p.shape) for k, p in space.items()})[0]
    return vg, x0s, list(zip(np.asarray(lower), np.asarray(upper), strict=True))


def main(argv=None) -> None:
    """Seconds per evaluation of the image fit's jitted value-and-grad: alone, and inside
    scipy's L-BFGS-B loop with the default BLAS threads and with one; arms take turns."""
    import argparse
    import time

    import image_model
    import jax
    import numpy as np
    import scipy.optimize

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    harness.add_arguments(parser)
    args = parser.parse_args(argv)
    objective, space, _ = image_model.make_problem()
    vg, x0s, bounds = scipy_problem(objective, space, draw_starts(space, 4, 0))
    jax.block_until_ready(vg(x0s[0]))
    inside = {"n": 0, "s": 0.0}

    def fun(v):
        t0 = time.perf_counter()
        f, g = vg(v)
        out = float(f), np.asarray(g, dtype=np.float64)
        inside["s"] += time.perf_counter() - t0
        inside["n"] += 1
        return out

    def in_loop():
        inside.update(n=0, s=0.0)
        for x0 in x0s:
            scipy.optimize.minimize(
                fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxfun": 150}
            )
        return inside["s"] / inside["n"]

    def alone():
        t0 = time.perf_counter()
        for i in range(200):
            jax.block_until_ready(vg(x0s[i % 4]))
        return (time.perf_counter() - t0) / 200

    def one_thread_loop():
        with one_blas_thread():
            return in_loop()

    arms = {
        "alone (peer)": alone,
        "in scipy's loop, default BLAS": in_loop,
        "in scipy's loop, 1 BLAS thread": one_thread_loop,
    }
    times = harness.interleave(arms, 3)
    print(f"BLAS: {blas_threads()}; median of 3 interleaved rounds")
    figures = {name: harness.median(t) for name, t in times.items()}
    harness.print_ratios("image fit's value-and-grad, s an evaluation", figures, "alone (peer)")
    record = harness.Record("peers", args)
    for name, value in figures.items():
        record.figure(name, value)
    for name in list(figures)[1:]:
        record.ratio(f"{name} / alone", name, "alone (peer)")
    record.write(args.json)


if __name__ == "__main__":
    main()
