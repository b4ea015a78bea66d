"""The scipy peer arm at its best setting: one BLAS thread.

scipy's ``minimize(method="L-BFGS-B")`` does its own small vector work between evaluations
through BLAS (OpenBLAS, in the wheels). After each BLAS call OpenBLAS's worker threads spin a
while waiting for more work, on the same cores XLA's thread pool needs for the next
evaluation of a jitted JAX objective. On this project's 2-core VM, the image model's
value-and-grad (``image_model.py``) took 7.7 ms inside scipy's loop against 3.7 ms alone; with
one BLAS thread, 4.0 ms, and scipy's whole loop ran 2.2x faster. A user who times such a loop
would set ``OPENBLAS_NUM_THREADS=1`` (or use threadpoolctl, as here), so the benchmarks run
their scipy arms that way; ``time_to_solution.py`` also shows scipy with the default threads.

Install: ``pip install -e ".[profiling]"`` (threadpoolctl).
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
