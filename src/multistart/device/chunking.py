"""Chunk bookkeeping for the Python-loop sweep: which rows each fixed-width call covers (and
which slots each part of a search split in parts holds).

NumPy only. This module must never import JAX (directly or through another module): its
bookkeeping is unit-tested in a bare NumPy environment, and a test checks ``sys.modules``.

Every call of a compiled chunk function sees exactly ``batch_size`` rows, so one compile serves
the whole sweep. The ragged last chunk is padded by repeating its last real row, and the padded
outputs are dropped. The reference semantics, as a Python loop::

    for lo, hi, pad in chunk_slices(n_rows, batch_size):
        rows = list(range(lo, hi)) + [hi - 1] * pad   # always batch_size rows
        out = f(x[rows])[: hi - lo]                    # padded outputs dropped
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["chunk_slices", "chunk_indices", "pad_rows", "part_slots"]


def _check_count(value, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


def chunk_slices(n_rows: int, batch_size: int) -> list[tuple[int, int, int]]:
    """Split ``n_rows`` rows into chunks of exactly ``batch_size`` rows, padding the last.

    Args:
      n_rows: number of rows to cover (``>= 0``).
      batch_size: rows per call (``>= 1``).

    Returns:
      One ``(lo, hi, pad)`` per chunk: real rows ``lo:hi`` plus ``pad`` padded rows, so that
      ``hi - lo + pad == batch_size``. Only the last chunk can have ``pad > 0``.

    Raises:
      ValueError: ``n_rows`` is not a non-negative int or ``batch_size`` not a positive int.

    >>> chunk_slices(10, 4)
    [(0, 4, 0), (4, 8, 0), (8, 10, 2)]
    >>> chunk_slices(3, 8)
    [(0, 3, 5)]
    """
    n_rows = _check_count(n_rows, "n_rows", minimum=0)
    batch_size = _check_count(batch_size, "batch_size", minimum=1)
    out = []
    for lo in range(0, n_rows, batch_size):
        hi = min(lo + batch_size, n_rows)
        out.append((lo, hi, batch_size - (hi - lo)))
    return out


def chunk_indices(
    rows: np.ndarray, batch_size: int, n_total: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Gather and scatter index arrays, each of length ``batch_size``, for the given rows.

    ``rows`` are indices into a population of ``n_total`` rows (for example the starts still
    running). For each chunk the *gather* index repeats the chunk's last real row into the
    padding, and the *scatter* index points the padding at ``n_total``, one past the end, so a
    scatter with out-of-bounds writes dropped discards the padded outputs.

    >>> [(g.tolist(), s.tolist()) for g, s in chunk_indices(np.array([1, 4, 6]), 2, 8)]
    [([1, 4], [1, 4]), ([6, 6], [6, 8])]
    """
    rows = np.asarray(rows)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"rows must be a 1-D integer array; got shape {rows.shape} {rows.dtype}")
    n_total = _check_count(n_total, "n_total", minimum=0)
    if rows.size and (rows.min() < 0 or rows.max() >= n_total):
        raise ValueError(f"rows must lie in [0, {n_total}); got {rows.min()}..{rows.max()}")
    out = []
    for lo, hi, pad in chunk_slices(rows.size, batch_size):
        real = rows[lo:hi].astype(np.int32)
        gather = np.concatenate([real, np.full(pad, real[-1], np.int32)])
        scatter = np.concatenate([real, np.full(pad, n_total, np.int32)])
        out.append((gather, scatter))
    return out


def pad_rows(x: np.ndarray, pad: int) -> np.ndarray:
    """Append ``pad`` copies of the last row of ``x`` (the padding rule of the sweep)."""
    pad = _check_count(pad, "pad", minimum=0)
    if pad == 0:
        return x
    if len(x) == 0:
        raise ValueError("cannot pad an empty chunk: it has no last row to repeat")
    return np.concatenate([x, np.repeat(x[-1:], pad, axis=0)], axis=0)


def part_slots(index: int, count: int, n_starts: int) -> tuple[int, int]:
    """``(lo, hi)``: the slots of part ``index`` of ``count``, as ``np.array_split`` splits.

    The first ``n_starts % count`` parts hold one slot more than the others.

    >>> [part_slots(i, 3, 10) for i in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    size, extra = divmod(n_starts, count)
    lo = index * size + min(index, extra)
    return lo, lo + size + (index < extra)
