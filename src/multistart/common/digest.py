"""The hashes a search's identity is made of, each stable across processes: an array's bytes,
a program's lowered text, a plan's starts. :mod:`multistart.host.identity` builds a search's
identity from them; the tuning record keys a width choice by :func:`step_program_hash`."""

from __future__ import annotations

import hashlib

import jax
import jax.extend
import numpy as np

__all__ = [
    "Replay",
    "hash_array",
    "numpy_consts",
    "replay",
    "starts_hash",
    "step_program_hash",
    "trace_text",
]


def hash_array(h, a) -> None:
    """Update ``h`` with ``a``'s type, shape and values. A broadcast array (a stride of 0: a
    batch's shared ``xdata``, repeated for every fit) is hashed by its distinct values, not by
    a copy of every repeat; a contiguous one from its own memory, with no copy."""
    a = np.asarray(a)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    if a.ndim and any(st == 0 and d > 1 for st, d in zip(a.strides, a.shape, strict=True)):
        h.update(b"broadcast")
        a = a[tuple(slice(0, 1) if st == 0 else slice(None) for st in a.strides)]
    h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def numpy_consts(consts) -> list:
    """A trace's captured arrays as NumPy. Kept for a refit, a captured ``jax.Array`` JAX made
    from a NumPy array while tracing would be served to later traces of that NumPy source, even
    after ``jax_enable_x64`` changed (a float64 constant in a float32 fit), for as long as it
    lives. The same holds for the typed NumPy copy JAX made of a NumPy source (its
    ``TypedNdArray``, a subclass of ``numpy.ndarray``): kept as it is, a float32 fit's copy of
    a global ``ydata`` was served to a later float64 fit's trace while the first fit's Result
    lived (a float32 constant under a float64 operation, which does not trace); a copy of it
    is kept instead, of its own type, which JAX does not serve to other traces."""
    return [
        np.asarray(c)
        if isinstance(c, jax.Array)
        else c.copy()
        if isinstance(c, np.ndarray) and type(c) is not np.ndarray
        else c
        for c in consts
    ]


def trace_text(fn, *args, keep: bool = False):
    """``(lowered text, captured arrays)`` of ``jit(fn)`` at ``args``, from one trace; with
    ``keep``, the trace (a :class:`jax.stages.Traced`, for :func:`replay`) as a third item."""
    traced = jax.jit(fn).trace(*args)
    consts = numpy_consts(traced.jaxpr.consts)
    if keep:
        return traced.lower().as_text(), consts, traced
    return traced.lower().as_text(), consts


class Replay:
    """A function that evaluates one trace's recorded operations (its closed jaxpr): tracing
    it again (the chunk step traces the per-start step under ``vmap``; every program of a fit
    calls the model) binds the same operations without running the Python that recorded them,
    so the same primitives lower to the same program. Called with other arguments than traced
    for, or inside ``shard_map`` (a mesh's per-device values are typed otherwise), it calls
    ``fn``, the function traced, instead; with :attr:`per_signature`, arguments of other
    shapes or types (a float32 search's model in a float64 refinement) are traced once more,
    alone, and that trace replayed from then on, where ``fn`` would run at every call.

    Attributes:
      closed: the ``ClosedJaxpr``, its captured arrays as NumPy (:func:`numpy_consts`).
      fn: the function traced.
    """

    #: trace ``fn`` once for each signature of arguments it is called with (a pure function of
    #: its arguments only: it is traced alone, outside the caller's trace)
    per_signature = False

    def __init__(self, closed, in_tree, out_tree, fn, name: str):
        self.closed, run = _runner(closed)
        self.fn = fn
        self._in_tree = in_tree  # the in tree: (args, {})
        signature = tuple((a.shape, a.dtype) for a in closed.in_avals)
        # each signature's (replayed function, out tree); the first the trace given
        self._runs = {signature: (run, out_tree)}
        self._mesh = jax.sharding.get_abstract_mesh()  # the trace's (none, outside shard_map)
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args):
        flat, tree = jax.tree_util.tree_flatten((args, {}))
        if tree != self._in_tree or jax.sharding.get_abstract_mesh() != self._mesh:
            return self.fn(*args)
        signature = tuple((np.shape(x), jax.numpy.result_type(x)) for x in flat)
        entry = self._runs.get(signature)
        if entry is None and self.per_signature:
            entry = self._runs[signature] = self._traced_at(args)
        if entry is None:
            return self.fn(*args)
        run, out_tree = entry
        return jax.tree_util.tree_unflatten(out_tree, run(*flat))

    def _traced_at(self, args):
        """``fn`` traced alone at ``args``' shapes and types: its replayed function and out tree."""
        specs = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)), args
        )
        traced = jax.jit(lambda *a: self.fn(*a)).trace(*specs)
        return _runner(traced.jaxpr)[1], traced.out_tree


def _runner(closed):
    """``(closed, run)``: ``closed`` with its captured arrays as NumPy, and the function that
    evaluates it."""
    closed = jax.extend.core.ClosedJaxpr(closed.jaxpr, numpy_consts(closed.consts))
    return closed, jax.extend.core.jaxpr_as_fun(closed)


def replay(traced, fn) -> Replay:
    """:class:`Replay` of ``traced`` (a :class:`jax.stages.Traced` of ``jit(fn)``)."""
    return Replay(traced.jaxpr, traced.in_tree, traced.out_tree, fn, traced.fun_name)


def step_program_hash(start_step, one_start, data) -> str:
    """SHA-256 of the lowered per-start step for one start's state (shapes only, no values)."""
    return hashlib.sha256(trace_text(start_step, one_start, data)[0].encode()).hexdigest()


def starts_hash(x0) -> str:
    """SHA-256 of a plan's starts (every leaf's bytes, in tree order)."""
    leaves = jax.tree_util.tree_leaves(x0)
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in leaves)).hexdigest()
