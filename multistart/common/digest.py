"""The hashes a search's identity is made of, each stable across processes: an array's bytes,
a program's lowered text, a plan's starts. :mod:`multistart.host.identity` builds a search's
identity from them; the tuning record keys a width choice by :func:`step_program_hash`."""

from __future__ import annotations

import hashlib

import jax
import jax.extend
import numpy as np

__all__ = ["hash_array", "trace_text", "replay", "step_program_hash", "starts_hash"]


def hash_array(h, a) -> None:
    a = np.asarray(a)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def trace_text(fn, *args, keep: bool = False):
    """``(lowered text, captured arrays)`` of ``jit(fn)`` at ``args``, from one trace; with
    ``keep``, the trace (a :class:`jax.stages.Traced`, for :func:`replay`) as a third item."""
    traced = jax.jit(fn).trace(*args)
    # as NumPy: kept for a refit, a captured jax.Array would be served to later traces of its
    # NumPy source (multistart.model.problem.ModelTrace)
    consts = [np.asarray(c) if isinstance(c, jax.Array) else c for c in traced.jaxpr.consts]
    if keep:
        return traced.lower().as_text(), consts, traced
    return traced.lower().as_text(), consts


def replay(traced, fn):
    """A function of ``traced``'s arguments that evaluates its recorded operations (its
    jaxpr): tracing it again, as the chunk step traces the per-start step under ``vmap``,
    binds the same operations without running the Python that recorded them. Called with
    other arguments than traced for, or inside ``shard_map`` (a mesh's per-device values are
    typed otherwise), it calls ``fn``, the function traced, instead (as
    :class:`multistart.model.problem.ModelTrace` does)."""
    consts = [np.asarray(c) if isinstance(c, jax.Array) else c for c in traced.jaxpr.consts]
    run = jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(traced.jaxpr.jaxpr, consts))
    types = [(a.shape, a.dtype) for a in traced.jaxpr.in_avals]
    mesh = jax.sharding.get_abstract_mesh()  # the trace's (none, outside shard_map)

    def replayed(*args):
        flat, tree = jax.tree_util.tree_flatten((args, {}))
        same = (
            tree == traced.in_tree
            and [(np.shape(x), jax.numpy.result_type(x)) for x in flat] == types
        )
        if not same or jax.sharding.get_abstract_mesh() != mesh:
            return fn(*args)
        return jax.tree_util.tree_unflatten(traced.out_tree, run(*flat))

    replayed.__name__ = replayed.__qualname__ = traced.fun_name
    return replayed


def step_program_hash(start_step, one_start, data) -> str:
    """SHA-256 of the lowered per-start step for one start's state (shapes only, no values)."""
    return hashlib.sha256(trace_text(start_step, one_start, data)[0].encode()).hexdigest()


def starts_hash(x0) -> str:
    """SHA-256 of a plan's starts (every leaf's bytes, in tree order)."""
    leaves = jax.tree_util.tree_leaves(x0)
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in leaves)).hexdigest()
