"""The scipy peer arm at its best setting: one BLAS thread.

scipy's ``minimize(method="L-BFGS-B")`` does its own small vector work between evaluations
through BLAS (OpenBLAS, in the wheels). After each BLAS call OpenBLAS's worker threads spin a
while waiting for more work, on the same cores XLA's thread pool needs for the next
evaluation of a jitted JAX objective. On this project's 2-core VM, the image model's
value-and-grad (``image_model.py``) cost 2.22x as much inside scipy's loop as alone, and 1.18x
with one BLAS thread (``main`` below); scipy's whole loop ran about 2x faster with one
(``time_to_solution.py``). A user who times such a loop
would set ``OPENBLAS_NUM_THREADS=1`` (or use threadpoolctl, as here), so the benchmarks run
their scipy arms that way; ``time_to_solution.py`` also shows scipy with the default threads.

Install: ``pip install -e ".[profiling]"`` (threadpoolctl). Run it to see the effect:

    python profiling/peers.py   # an evaluation alone, and inside scipy's loop, both ways
"""

from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

__all__ = ["blas_threads", "one_blas_thread"]


def one_blas_thread():
    """A context in which BLAS libraries loaded so far (numpy's, scipy's) use one thread."""
    return threadpool_limits(limits=1, user_api="blas")


def blas_threads() -> str:
    """The BLAS libraries loaded and their thread counts, for a benchmark's header line."""
    rows = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i['num_threads']} threads" for i in rows) or "none"


def main() -> None:
    """Seconds per evaluation of the image fit's jitted value-and-grad: alone, and inside
    scipy's L-BFGS-B loop with the default BLAS threads and with one; arms take turns."""
    import sys
    import time
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import image_model
    import jax
    import numpy as np
    import scipy.optimize
    from time_to_solution import draw_starts, scipy_problem

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
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(3):
        for name, arm in arms.items():
            times[name].append(arm())
    print(f"image fit's value-and-grad; BLAS: {blas_threads()}; median of 3 rounds")
    base = float(np.median(times["alone (peer)"]))
    for name, t in times.items():
        print(f"{name:32s} {float(np.median(t)) / base:6.2f}")


if __name__ == "__main__":
    main()
