"""Evaluators: the Python-loop sweep of one compiled chunk function over many rows.

The chunk function is compiled once for exactly ``batch_size`` rows; a Python loop calls it per
chunk and the ragged last chunk is padded (see :mod:`multistart.chunking`). Looping in Python
rather than in XLA is deliberate: an in-XLA ``lax.map`` scan over a large multi-dataset
likelihood can take hours and gigabytes to compile on CPU, while the chunk body compiles in the
time of one ``vmap``.
"""

from __future__ import annotations

import jax
import numpy as np

from .chunking import chunk_indices

__all__ = ["device_chunks", "sweep_step"]


def device_chunks(rows: np.ndarray, batch_size: int, n_total: int) -> list[tuple]:
    """Gather/scatter index pairs for ``rows``, placed on the device once (not per call)."""
    return [
        (jax.device_put(g), jax.device_put(s)) for g, s in chunk_indices(rows, batch_size, n_total)
    ]


def sweep_step(chunk_step, pop, chunks, row, data):
    """One step of every start in ``chunks``: one call of the compiled chunk step per chunk.

    No host synchronisation happens here: the calls are queued on the device and the state
    stays there. ``row`` is the history row this step writes.
    """
    row = np.int32(row)
    for gather, scatter in chunks:
        pop = chunk_step(pop, gather, scatter, row, data)
    return pop
