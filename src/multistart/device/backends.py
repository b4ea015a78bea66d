"""Backends: how one step of every running start is laid out in compiled calls.

Two backends share one interface (:class:`Backend`), so the sweeper
(:class:`multistart.device.sweeper.Sweeper`) and the host loop do not care which one runs:

- ``"loop"`` (:class:`LoopBackend`, the default): the chunk step is compiled once for exactly
  ``width`` rows and a Python loop calls it per chunk; the ragged last chunk is padded (see
  :mod:`multistart.device.chunking`). On a CPU an in-XLA loop over a large multi-dataset likelihood
  can take hours to compile, while the chunk body compiles in the time of one ``vmap``.
- ``"scan"`` (:class:`ScanBackend`): the same chunk body inside one compiled loop over the
  chunks, a ``lax.fori_loop`` over the first ``n_chunks`` rows of a ``(max_chunks, width)``
  table of gather/scatter indices (:func:`make_scan_step`), so a step is one call (on a GPU,
  no host dispatch per chunk). The fixed-shape table and dynamic trip count leave the ended
  starts out without a recompile.

Where the population lives (one device, or a mesh of several: ``devices=`` on a search) is a
:class:`multistart.device.placement.Placement`; each call then runs one chunk on every device at
once, each device sweeping its own running rows, with one compile for every device.

A backend compiles and times programs at any width (:meth:`Backend.compiled_for`,
:meth:`Backend.time_chunks`: what choosing a width needs) but does not step: the
:class:`multistart.device.sweeper.Sweeper` made for the width chosen steps, and backs off from it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import numpy as np

from ..common import log
from .chunking import chunk_indices
from .placement import Placement, placement
from .programs import Programs, copy_tree, lower_and_compile, padded_chunks
from .step import clock

__all__ = ["Backend", "LoopBackend", "ScanBackend", "BACKENDS", "make_scan_step"]


def _shape_of(a) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


class Backend:
    """The chunk step's programs, one per width, for a population shaped like ``pop``.

    Subclasses say how a step is laid out in calls (:meth:`_build`, :meth:`_lower_args`,
    :meth:`layout`, :meth:`run`). The population is donated to every call, so it is updated in
    place and the caller must use the returned state.

    Args:
      chunk_step: ``chunk_step(pop, gather, scatter, new, clock, data) -> pop``
        (:func:`multistart.device.step.make_chunk_step`; see subclasses).
      n_total: the population's rows (a multiple of the number of devices).
      data: the model's data (an argument of every program).
      pop: the population, or its shapes: programs are compiled for them.
      rows: the rows to sweep at first (default: every row).
      devices: two or more devices: the population is sharded over them.
      programs: where the jitted program is kept for a refit of the same model (default:
        nowhere), per backend, host tick and device layout.
    """

    name = ""
    # The number of per-device index arguments after ``pop`` (the rest are replicated).
    _n_index_args = 0
    ticks = False  # the program logs each chunk from inside it

    def __init__(
        self, chunk_step, *, n_total: int, data, pop, rows=None, devices=None, programs=None
    ):
        self.placement: Placement = placement(n_total, devices)
        self.n_devices = self.placement.n_devices
        self.n_local = self.placement.n_local  # rows per device
        # A mesh over several processes' devices: the population is one global array, each
        # process steps its own devices' rows and reads the rest through collectives.
        self.spans_processes = self.placement.spans_processes
        self.ticks = self._ticks()
        where = tuple(map(str, devices or ()))
        programs = programs or Programs()
        kind = (self.name, self.ticks, where, self.n_local if where else None)
        self._jit = programs.get(
            ("chunk step", *kind),
            lambda: self.placement.jit(self._build(chunk_step), self._local, self._n_index_args),
        )
        self.data = self.placement.put_data(data)  # once, not at every call
        self.n_total = n_total
        self.rows = np.arange(n_total) if rows is None else np.asarray(rows)
        # Shapes only, no sharding: lowering for committed arrays would make the outputs
        # committed, and every helper later jitted on them would compile a second time.
        self._pop_spec = jax.tree_util.tree_map(_shape_of, pop)
        self._idle: dict[int, Any] = {}  # width -> a call's ``new`` that writes nothing, placed
        # width -> (compiled, seconds), shared with a refit of the same model: it compiles
        # nothing (and lowers nothing) at a width an earlier fit compiled
        spec = (jax.tree_util.tree_structure(pop), tuple(jax.tree_util.tree_leaves(self._pop_spec)))
        self._programs: dict[int, tuple[Any, float]] = programs.get(("compiled", *kind, spec), dict)
        self._fresh: set[int] = set()  # the widths compiled by this backend

    # -- layout, per backend ---------------------------------------------------------------

    def _ticks(self) -> bool:
        return False

    def _build(self, chunk_step):
        raise NotImplementedError

    def _local(self, program):
        """The body one device runs under ``shard_map`` (index arguments arrive as ``[1, ...]``)."""
        raise NotImplementedError

    def _lower_args(self, width: int) -> tuple:
        """Index arguments with the shapes of one call at ``width`` (for lowering)."""
        raise NotImplementedError

    def chunk_calls(self, rows: np.ndarray, width: int, u_new=None) -> tuple[list, Any]:
        """``(chunks, args)``: one entry per chunk call of ``rows``, and the device arguments;
        with ``u_new`` (a row per row of ``rows``), calls that give ``rows`` those new
        starts."""
        raise NotImplementedError

    def _new_rows(self, lead: tuple[int, ...]):
        """A ``new`` argument that writes nothing, of leading shape ``lead`` (NumPy)."""
        u = self._pop_spec.starts.u
        zeros = jax.tree_util.tree_map(lambda a: np.zeros(lead + a.shape[1:], a.dtype), u)
        return np.zeros(lead, np.int8), zeros

    def _idle_new(self, width: int):
        """:meth:`_new_rows` placed on the devices once per width (no transfer a call)."""
        if width not in self._idle:
            self._idle[width] = self.placement.put_rows([self._idle_rows(width)] * self.n_devices)
        return self._idle[width]

    def _idle_rows(self, width: int):
        """One device's ``new`` argument of a call that writes nothing."""
        raise NotImplementedError

    def write(self, compiled, pop, rows: np.ndarray, u_new, width: int):
        """``pop`` with new starts ``u_new`` written into ``rows`` by ``compiled`` (the chunk
        step at ``width``, taking no step: it sets their initial state), one call per chunk of
        them: a refill compiles no program of its own."""
        _, args = self.chunk_calls(np.asarray(rows), width, u_new)
        return self.run(compiled, pop, args, clock(0, 0))

    def run(self, compiled, pop, args, clock):
        """The steps ``clock`` says (:func:`multistart.device.step.clock`) of the rows laid out
        in ``args`` (from :meth:`layout`) with ``compiled``."""
        raise NotImplementedError

    def place(self, pop):
        """``pop`` on the backend's devices (sharded on a mesh); as it is on one device.

        A no-op for arrays already placed so. A population changed outside the sweeper (rows
        replaced, a checkpoint restored) may come back laid out otherwise: every step places it.
        """
        return self.placement.place(pop)

    # -- programs ---------------------------------------------------------------------------

    def compiled_for(self, width: int):
        """The program at ``width``, compiled on first use and kept until :meth:`release`."""
        if width not in self._programs:
            args = self._lower_args(width)
            if self.spans_processes:  # JAX lowers host arrays as this process's only
                args = jax.tree_util.tree_map(_shape_of, args)
            self._programs[width] = lower_and_compile(
                self._jit,
                f"the chunk step (width {width})",
                self._pop_spec,
                *args,
                self.data,
            )
            self._fresh.add(width)
        return self._programs[width][0]

    def compile_seconds(self, width: int) -> float:
        """Seconds this backend spent compiling the program at ``width`` (0: none, or an
        earlier fit's program)."""
        return self._programs[width][1] if width in self._fresh else 0.0

    def compiled_widths(self) -> list[int]:
        """The widths this backend compiled (not those an earlier fit left it)."""
        return sorted(w for w in self._programs if w in self._fresh)

    def release_width(self, width: int) -> None:
        """Drop the program at ``width`` (one that ran out of memory)."""
        self._programs.pop(width, None)

    def release(self, keep=()) -> None:
        """Drop the compiled programs of every width but those in ``keep`` (their memory
        too)."""
        for w in list(self._programs):
            if w not in keep:
                del self._programs[w]

    def trace(self, pop, width: int) -> jax.stages.Traced:
        """Trace the program at ``width`` for ``pop``, so the compile census can time its
        lowering and its compile apart (``python -m profiling.experiments.census``)."""
        return self._jit.trace(pop, *self._lower_args(width), self.data)

    def time_chunks(
        self, pop, width: int, *, calls: int, target_s: float, min_reps: int, max_reps: int
    ) -> tuple[list[float], int]:
        """Seconds per chunk call at ``width``, from a bounded number of calls.

        The first ``k = min(calls, chunks a step has)`` chunks of the swept rows are laid out
        (never every start) and run once to warm up, then ``k`` at a time, dispatched as a
        step dispatches them and waited for at the end, at least ``min_reps`` and at most
        ``max_reps`` times, until ``target_s`` seconds have passed. They step a copy of
        ``pop`` that is then discarded: ``pop`` is not touched.

        Returns:
          ``(seconds, n_calls)``: per repeat, its seconds divided by ``k``; and how many chunk
          calls were made in all, the warm-up included.
        """
        compiled = self.compiled_for(width)
        k = max(1, min(calls, self.calls_per_step(width)))
        first = self.placement.join([r[: k * width] for r in self.placement.split(self.rows)])
        _, args = self.chunk_calls(first, width)
        p = self.run(compiled, copy_tree(self.place(pop)), args, clock(0))
        jax.block_until_ready(p)
        seconds: list[float] = []
        t_end = time.perf_counter() + target_s
        while len(seconds) < min_reps or (len(seconds) < max_reps and time.perf_counter() < t_end):
            t0 = time.perf_counter()
            p = self.run(compiled, p, args, clock(0))
            jax.block_until_ready(p)
            seconds.append((time.perf_counter() - t0) / k)
        return seconds, k * (1 + len(seconds))

    def calls_per_step(self, width: int) -> int:
        """Chunk evaluations one step of every swept row runs at ``width`` (on several devices,
        the calls of the device with the most rows)."""
        return max(-(-r.size // width) for r in self.placement.split(self.rows))


class LoopBackend(Backend):
    """The ``"loop"`` backend: one compiled chunk step, called once per chunk from Python.

    ``chunk_step(pop, gather, scatter, clock, data) -> pop`` steps the rows named by
    ``gather``/``scatter`` (``width`` each) of the population state ``pop``, whose buffers are
    donated so the update happens in place. :meth:`run` calls it once per chunk, with no host
    synchronisation.
    """

    name = "loop"
    _n_index_args = 3

    def _build(self, chunk_step):
        return chunk_step

    def _local(self, program):
        n_local = self.n_local

        def local(pop, gather, scatter, new, clock, data):
            gather, scatter = gather[0], scatter[0]
            new = jax.tree_util.tree_map(lambda a: a[0], new)
            # A device with no chunk left this call gets an all-padding chunk: skip the body.
            return jax.lax.cond(
                scatter[0] < n_local,
                lambda p: program(p, gather, scatter, new, clock, data),
                lambda p: p,
                pop,
            )

        return local

    def _idle_rows(self, width):
        return self._new_rows((width,))

    def _lower_args(self, width):
        table = self.placement.put_rows([np.zeros(width, np.int32)] * self.n_devices)
        return table, table, self._idle_new(width), clock(0)

    def chunk_calls(self, rows, width, u_new=None):
        split = self.placement.split(rows)
        per = [chunk_indices(r, width, self.n_local) for r in split]
        n_calls = max(len(c) for c in per)
        news = None
        if u_new is not None:
            idle_new = self._idle_rows(width)
            news = [
                _new_chunks(u, width, n_calls, idle_new)
                for u in self.placement.split_values(rows, u_new)
            ]
        idle = (np.zeros(width, np.int32), np.full(width, self.n_local, np.int32))
        tables = []  # each call's gathers, scatters (and new starts), sent together
        for i in range(n_calls):
            pairs = [c[i] if i < len(c) else idle for c in per]
            tables += [[g for g, _ in pairs], [s for _, s in pairs]]
            if news is not None:
                tables.append([chunks[i] for chunks in news])
        placed = iter(self.placement.put_rows_each(tables))
        calls = []
        for _ in range(n_calls):
            gathers, scatters = next(placed), next(placed)
            new = self._idle_new(width) if news is None else next(placed)
            calls.append((gathers, scatters, new))
        return calls, calls

    def run(self, compiled, pop, args, clock):
        for gather, scatter, new in args:
            pop = compiled(pop, gather, scatter, new, clock, self.data)
        return pop


def _new_chunks(u, width: int, n_calls: int, idle) -> list:
    """The ``new`` argument of each of ``n_calls`` chunk calls of one device's new starts
    ``u`` (a row per row it writes, in the order of its chunks' rows): call ``i`` writes rows
    ``i * width`` on (:func:`multistart.device.programs.padded_chunks`, its padding taking
    nothing), and a call past the last is ``idle``."""
    chunks = [
        ((np.arange(width) < hi - lo).astype(np.int8), chunk)
        for lo, hi, chunk in padded_chunks(u, width)
    ]
    return chunks + [idle] * (n_calls - len(chunks))


def make_scan_step(chunk_step, tick=None):
    """Build ``scan_step(pop, gathers, scatters, news, n_chunks, clock, data) -> pop``.

    It runs ``chunk_step`` over the first ``n_chunks`` rows of the ``(max_chunks, width)``
    index tables (and ``news``, each chunk's ``new`` argument) inside one compiled loop.
    ``n_chunks`` is a traced scalar, so the running starts can shrink without a recompile;
    each chunk takes the steps ``clock`` says in turn. ``tick(clock, i, n_chunks)``, when
    given, is called on the host once per chunk through ``jax.debug.callback``; when it is
    None nothing is traced in.
    """

    def multistart_chunk_step_scan(pop, gathers, scatters, news, n_chunks, clock, data):
        def body(i, pop):
            if tick is not None:
                jax.debug.callback(tick, clock, i, n_chunks)
            new = jax.tree_util.tree_map(lambda a: a[i], news)
            return chunk_step(pop, gathers[i], scatters[i], new, clock, data)

        return jax.lax.fori_loop(0, n_chunks, body, pop)

    return multistart_chunk_step_scan


def _scan_tick(clock, i, n_chunks) -> None:
    step, n = (int(v) for v in clock[:2])
    log.logger.debug("steps %d-%d: scan batch %d/%d", step + 1, step + n, int(i) + 1, int(n_chunks))


class ScanBackend(Backend):
    """The ``"scan"`` backend: every chunk of a step inside one compiled XLA loop.

    Same interface and same results as :class:`LoopBackend` (each chunk runs the same
    ``vmap`` body on the same rows). With the ``multistart`` logger at DEBUG when the backend
    is built, each scan batch logs a tick from inside the program (``jax.debug.callback``);
    otherwise no callback is compiled in.
    """

    name = "scan"
    _n_index_args = 4

    def _ticks(self) -> bool:
        return log.logger.isEnabledFor(logging.DEBUG)

    def _build(self, chunk_step):
        return make_scan_step(chunk_step, _scan_tick if self.ticks else None)

    def _local(self, program):
        def local(pop, gathers, scatters, news, n_chunks, clock, data):
            news = jax.tree_util.tree_map(lambda a: a[0], news)
            return program(pop, gathers[0], scatters[0], news, n_chunks[0], clock, data)

        return local

    def _max_chunks(self, width):
        return -(-self.n_local // width)

    def _idle_rows(self, width):
        return self._new_rows((self._max_chunks(width), width))

    def _lower_args(self, width):
        table = np.zeros((self._max_chunks(width), width), np.int32)
        news = self._idle_new(width)
        if self.n_devices == 1:  # host arrays, as layout()'s are placed
            return table, table, news, np.int32(0), clock(0)
        tables = np.stack([table] * self.n_devices)
        return tables, tables, news, np.zeros(self.n_devices, np.int32), clock(0)

    def _tables(self, rows, width, u_new, idle):
        """``(n_chunks, gathers, scatters, news)`` of one device's local ``rows`` (``news``
        ``None`` when ``u_new`` is: no new starts; ``idle``: one chunk's rows of no start)."""
        chunks = chunk_indices(rows, width, self.n_local)
        gathers = np.zeros((self._max_chunks(width), width), np.int32)
        scatters = np.full_like(gathers, self.n_local)  # unused rows write out of bounds
        for i, (g, s) in enumerate(chunks):
            gathers[i], scatters[i] = g, s
        news = None
        if u_new is not None:
            rows_of = _new_chunks(u_new, width, self._max_chunks(width), idle)
            news = jax.tree_util.tree_map(lambda *t: np.stack(t), *rows_of)
        return len(chunks), gathers, scatters, news

    def chunk_calls(self, rows, width, u_new=None):
        split = self.placement.split(rows)
        us = [None] * len(split) if u_new is None else self.placement.split_values(rows, u_new)
        idle = None if u_new is None else self._new_rows((width,))  # made once per layout
        per = [self._tables(r, width, u, idle) for r, u in zip(split, us, strict=True)]
        counts = [n for n, _, _, _ in per]
        news = (
            self._idle_new(width) if u_new is None else self.placement.put_rows([t[3] for t in per])
        )
        args = (
            self.placement.put_rows([t[1] for t in per]),
            self.placement.put_rows([t[2] for t in per]),
            news,
            self.placement.put_counts(counts),
        )
        return [None] * max(counts), args  # one entry per chunk call

    def run(self, compiled, pop, args, clock):
        gathers, scatters, news, n_chunks = args
        return compiled(pop, gathers, scatters, news, n_chunks, clock, self.data)


BACKENDS: dict[str, type[Backend]] = {"loop": LoopBackend, "scan": ScanBackend}
