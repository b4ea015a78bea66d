"""What every fixed-width program shares: compiling it once, padding a ragged chunk, the
out-of-memory back-off that narrows it, and one copy of a whole population.

A program is compiled for exactly ``width`` rows; a ragged last chunk is padded with copies of
its last row (:func:`multistart.device.chunking.pad_rows`) and its padded outputs dropped, so any
number of rows costs one compile. Every program is built so that a second process fitting the
same model lowers the same program (the model's data is an argument, the functions have fixed
names) and can load it from the persistent compilation cache.

In one process, a fit of new data of the same shapes reuses the very functions an earlier fit
of the same model jitted (:class:`Programs`), so JAX's own caches serve it: nothing is traced,
lowered or compiled again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..common import log
from .chunking import chunk_slices, pad_rows
from .oom import is_out_of_memory

__all__ = ["lower_and_compile", "padded_chunks", "retry_narrower", "first_line", "copy_tree"]
__all__ += ["Programs", "programs_for", "PROGRAMS_KEPT", "forget_other_float_types"]

#: Programs a process keeps for a refit (the least recently fitted dropped): a curve_fit model
#: takes two (its fit's and its covariance's), so the last 8 models are kept.
PROGRAMS_KEPT = 16


class Programs:
    """The jitted functions of one model's fit, kept for the next fit of that model.

    JAX keeps a jitted function's executables (one per shape of its arguments) as long as the
    function lives, keyed by the function itself: a fit that jits fresh closures over its
    model compiles again (or asks the persistent cache again), however alike the programs. A
    fit that takes its functions from here, made by the first fit of the same model
    (:func:`programs_for`), compiles nothing for data of shapes it has seen: JAX's caches
    serve it, without tracing or lowering.

    ``get(name, make)`` is the function (or any value derived from the model alone) made by
    ``make()`` under ``name`` the first time. ``name`` must hold everything ``make`` captures
    that the Programs' key does not (a width, a device list).
    """

    def __init__(self) -> None:
        self._made: dict[Hashable, Any] = {}

    def get(self, name: Hashable, make: Callable[[], Any]) -> Any:
        if name not in self._made:
            self._made[name] = make()
        return self._made[name]


_kept: OrderedDict[Hashable, Programs] = OrderedDict()
_kept_lock = threading.Lock()


def programs_for(key: Hashable | None) -> Programs:
    """The :class:`Programs` of the model ``key`` names, kept in this process (at most
    :data:`PROGRAMS_KEPT` models, least recently used dropped first, their executables with
    them); ``None`` (a model without a key): a fresh one, kept nowhere.

    ``key`` must change with everything the kept functions depend on but take as no argument
    (the model's functions, its space, the rule, the step's options, the float type): a key
    that missed one would serve a stale program.
    """
    if key is None:
        return Programs()
    with _kept_lock:
        programs = _kept.pop(key, None) or Programs()
        _kept[key] = programs
        while len(_kept) > PROGRAMS_KEPT:
            _kept.popitem(last=False)
        return programs


_last_float_type: list[str] = []  # the float type the last fit traced its model in


def forget_other_float_types(dtype) -> None:
    """Before a model is traced in ``dtype``: where the last fit traced in another float type
    (another ``jax_enable_x64``, or a search's ``dtype``), drop the kept programs made in it
    and JAX's caches. JAX keeps a NumPy array's canonical copy (its float type as the trace
    that made it saw ``jax_enable_x64``) for as long as anything refers to it (a kept program,
    a Result's model), and serves it to the next trace of that array whatever its float type:
    a float32 constant in a float64 fit, which does not lower. JAX's caches are cleared only
    at such a switch: a refit in one float type compiles nothing."""
    name = str(np.dtype(dtype))
    with _kept_lock:
        switched = bool(_last_float_type) and _last_float_type[-1] != name
        _last_float_type[:] = [name]
        for key in [k for k in _kept if _float_type(k) not in (None, name)]:
            del _kept[key]
    if switched:
        jax.clear_caches()


def _float_type(key) -> str | None:
    """The float type a programs key (:func:`multistart.host.identity.programs_key`) names."""
    if isinstance(key, tuple) and len(key) > 2 and key[2] in ("float32", "float64"):
        return key[2]
    return None


def lower_and_compile(jitted, what: str, *args):
    """``jitted.lower(*args).compile()``, with a heartbeat in the log while it runs.

    Returns ``(compiled, seconds)``.
    """
    t0 = time.perf_counter()
    with log.compile_heartbeat(what):
        compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - t0


def padded_chunks(tree, width: int):
    """``(lo, hi, chunk)`` for each fixed-width chunk of the rows (leading axis) of ``tree``.

    ``chunk`` holds rows ``lo:hi`` as NumPy, the ragged last one padded to ``width`` rows with
    copies of its last row (:func:`multistart.device.chunking.pad_rows`), so one program
    compiled for
    ``width`` rows serves every chunk; the caller keeps the first ``hi - lo`` rows of each
    output. The one chunk-pad loop of the filter and the records.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [np.asarray(a) for a in leaves]
    for lo, hi, pad in chunk_slices(len(leaves[0]), width):
        yield (
            lo,
            hi,
            jax.tree_util.tree_unflatten(treedef, [pad_rows(a[lo:hi], pad) for a in leaves]),
        )


def copy_tree(tree):
    """A copy of every leaf, where it lies, in one call (a copy per leaf would be a dispatch
    per leaf) that compiles no program. A leaf spread over several processes' devices cannot
    be put where it lies (``device_put`` takes only arrays this process addresses whole), so
    such a tree is copied by ``jnp.copy``, a program per leaf."""
    if all(getattr(a, "is_fully_addressable", True) for a in jax.tree_util.tree_leaves(tree)):
        return jax.device_put(tree, may_alias=False)
    return jax.tree_util.tree_map(jnp.copy, tree)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most 300 characters), for the log."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else repr(exc)


def retry_narrower(attempt, exc: BaseException, *, width: int, halve, fatal: str):
    """After ``exc`` (out of memory at ``width``): halve and retry ``attempt`` until it fits.

    ``halve(width, exc)`` narrows the program (and records why) and returns the new width;
    below width 1 the search stops with a ``RuntimeError(fatal)``. The one back-off loop of
    the sweeper and the broad-start filter.
    """
    while True:
        if width <= 1:
            raise RuntimeError(fatal) from exc
        width = halve(width, exc)
        try:
            return attempt()
        except Exception as again:
            if not is_out_of_memory(again):
                raise
            exc = again
