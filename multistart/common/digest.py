"""The hashes a search's identity is made of, each stable across processes: an array's bytes,
a program's lowered text, a plan's starts. :mod:`multistart.host.identity` builds a search's
identity from them; the tuning record keys a width choice by :func:`step_program_hash`."""

from __future__ import annotations

import hashlib

import jax
import numpy as np

__all__ = ["hash_array", "trace_text", "step_program_hash", "starts_hash"]


def hash_array(h, a) -> None:
    a = np.asarray(a)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def trace_text(fn, *args):
    """``(lowered text, captured arrays)`` of ``jit(fn)`` at ``args``, from one trace."""
    traced = jax.jit(fn).trace(*args)
    # as NumPy: kept for a refit, a captured jax.Array would be served to later traces of its
    # NumPy source (multistart.model.problem.ModelTrace)
    consts = [np.asarray(c) if isinstance(c, jax.Array) else c for c in traced.jaxpr.consts]
    return traced.lower().as_text(), consts


def step_program_hash(start_step, one_start, data) -> str:
    """SHA-256 of the lowered per-start step for one start's state (shapes only, no values)."""
    return hashlib.sha256(trace_text(start_step, one_start, data)[0].encode()).hexdigest()


def starts_hash(x0) -> str:
    """SHA-256 of a plan's starts (every leaf's bytes, in tree order)."""
    leaves = jax.tree_util.tree_leaves(x0)
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in leaves)).hexdigest()
