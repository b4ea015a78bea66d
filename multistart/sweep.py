"""Evaluators: the Python-loop sweep of one compiled chunk function over many rows.

The chunk function is compiled once for exactly ``batch_size`` rows; a Python loop calls it per
chunk and the ragged last chunk is padded (see :mod:`multistart.chunking`). Looping in Python
rather than in XLA is deliberate: an in-XLA ``lax.map`` scan over a large multi-dataset
likelihood can take hours and gigabytes to compile on CPU, while the chunk body compiles in the
time of one ``vmap``.

Two sweeps live here: :class:`ChunkSweep` steps the population (value, gradient and optax
update, state donated in place), and :class:`ValueSweep` evaluates only the figure of merit at
many candidate points (the broad-start filter). Both compile exactly once, for a fixed width, and
both are built so that a second process fitting the same model lowers the same program (the
model's data is an argument, the functions have fixed names) and can load it from the persistent
compilation cache.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from . import log
from .chunking import chunk_indices, chunk_slices, pad_rows

__all__ = ["ChunkSweep", "ValueSweep", "device_chunks", "lower_and_compile"]

FILTER_NAME = "multistart_filter_chunk"


def lower_and_compile(jitted, what: str, *args):
    """``jitted.lower(*args).compile()``, with a heartbeat in the log while it runs.

    Returns ``(compiled, seconds)``.
    """
    t0 = time.perf_counter()
    with log.compile_heartbeat(what):
        compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - t0


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
        gather, scatter = device_chunks(np.arange(1), self.width, self.n_total)[0]
        self.compiled, self.compile_s = lower_and_compile(
            self._jit, "the chunk step", pop, gather, scatter, np.int32(0), self.data
        )
        return self.compile_s

    def step(self, pop, row: int):
        """One step of every swept row; ``row`` is the history row the step writes."""
        row = np.int32(row)
        for gather, scatter in self.chunks:
            pop = self.compiled(pop, gather, scatter, row, self.data)
        return pop


class ValueSweep:
    """The figure of merit alone, at many points: one compiled ``vmap`` over fixed-width chunks.

    ``fom_u(u, data)`` is evaluated at each row of a ``(n_rows, n_dims)`` array by a Python loop
    over chunks of exactly ``width`` rows (the ragged last one padded, its outputs dropped), so
    any number of rows costs one compile. Chunks are dispatched without waiting, and the values
    come back to the host once, at the end.

    Args:
      fom_u: ``fom_u(u, data) -> scalar`` at one flat unconstrained point ``u``.
      width: rows per compiled call.
      data: the model's data (an argument of the compiled program, not a constant in it).
      name: the compiled function's name (stable across processes: it is part of the program).
    """

    def __init__(self, fom_u, *, width: int, data, name: str = FILTER_NAME):
        def chunk(u, data):
            return jax.vmap(fom_u, in_axes=(0, None))(u, data)

        chunk.__name__ = chunk.__qualname__ = name
        self._jit = jax.jit(chunk)
        self.width = int(width)
        self.data = data
        self.compiled = None
        self.compile_s = 0.0

    def compile(self, n_dims: int, dtype) -> float:
        """Compile for ``(width, n_dims)`` rows of ``dtype``; returns the seconds taken."""
        example = jax.ShapeDtypeStruct((self.width, n_dims), dtype)
        self.compiled, self.compile_s = lower_and_compile(
            self._jit, "the broad-start filter", example, self.data
        )
        return self.compile_s

    def __call__(self, u: np.ndarray) -> np.ndarray:
        """The figure of merit at every row of ``u`` (NumPy in, NumPy out, in row order)."""
        if self.compiled is None:
            raise RuntimeError("ValueSweep.compile() must be called before evaluating")
        outs = []
        for lo, hi, pad in chunk_slices(len(u), self.width):
            outs.append((self.compiled(pad_rows(u[lo:hi], pad), self.data), hi - lo))
        if not outs:
            return np.zeros((0,), dtype=u.dtype)
        return np.concatenate([np.asarray(out)[:n] for out, n in outs])
