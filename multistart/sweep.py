"""Evaluators: the Python-loop sweep of one compiled chunk function over many rows.

The chunk function is compiled once for exactly ``batch_size`` rows; a Python loop calls it per
chunk and the ragged last chunk is padded (see :mod:`multistart.chunking`). Looping in Python
rather than in XLA is deliberate: an in-XLA ``lax.map`` scan over a large multi-dataset
likelihood can take hours and gigabytes to compile on CPU, while the chunk body compiles in the
time of one ``vmap``.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from .chunking import chunk_indices

__all__ = ["ChunkSweep", "device_chunks"]


def device_chunks(rows: np.ndarray, batch_size: int, n_total: int) -> list[tuple]:
    """Gather/scatter index pairs for ``rows``, placed on the device once (not per call)."""
    return [
        (jax.device_put(g), jax.device_put(s)) for g, s in chunk_indices(rows, batch_size, n_total)
    ]


class ChunkSweep:
    """One compiled chunk step and the chunks of the rows it currently sweeps.

    ``chunk_step(pop, gather, scatter, row, data) -> pop`` updates the rows named by
    ``gather``/``scatter`` (``batch_size`` each) of the population state ``pop``, whose buffers
    are donated so the update happens in place. :meth:`step` calls it once per chunk, with no
    host synchronisation.
    """

    def __init__(self, chunk_step, *, width: int, n_total: int, data):
        self._jit = jax.jit(chunk_step, donate_argnums=0)
        self.width = width
        self.n_total = n_total
        self.data = data
        self.compiled = None
        self.compile_s = 0.0
        self.set_rows(np.arange(n_total))

    def set_rows(self, rows: np.ndarray) -> None:
        """Sweep only ``rows`` from now on (repacked into full chunks)."""
        self.rows = np.asarray(rows)
        self.chunks = device_chunks(self.rows, self.width, self.n_total)

    def trace(self, pop) -> jax.stages.Traced:
        """Trace the chunk step for ``pop``'s shapes (lower and compile it from there)."""
        gather, scatter = device_chunks(np.arange(1), self.width, self.n_total)[0]
        return self._jit.trace(pop, gather, scatter, np.int32(0), self.data)

    def compile(self, pop) -> float:
        """Lower and compile the chunk step for ``pop``'s shapes; returns the seconds taken."""
        t0 = time.perf_counter()
        self.compiled = self.trace(pop).lower().compile()
        self.compile_s = time.perf_counter() - t0
        return self.compile_s

    def step(self, pop, row: int):
        """One step of every swept row; ``row`` is the history row the step writes."""
        row = np.int32(row)
        for gather, scatter in self.chunks:
            pop = self.compiled(pop, gather, scatter, row, self.data)
        return pop
