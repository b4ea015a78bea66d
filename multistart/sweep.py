"""Evaluators: how one step of every running start is run, at a given batch width.

Two backends share one interface (:class:`Sweep`), so the step loop in :mod:`multistart.search`
does not care which one runs:

- ``"loop"`` (:class:`ChunkSweep`, the default): the chunk step is compiled once for exactly
  ``width`` rows and a Python loop calls it per chunk; the ragged last chunk is padded (see
  :mod:`multistart.chunking`). Looping in Python rather than in XLA is deliberate on CPU: an
  in-XLA scan over a large multi-dataset likelihood can take hours and gigabytes to compile,
  while the chunk body compiles in the time of one ``vmap``.
- ``"scan"`` (:class:`ScanSweep`): the same chunk body inside one compiled loop over the
  chunks, a ``lax.fori_loop`` over the first ``n_chunks`` rows of a ``(max_chunks, width)``
  table of gather/scatter indices (:func:`make_scan_step`), so a step is one call. On a GPU
  that saves the host dispatch per chunk; the starts that ended are left out, as
  in the loop backend, without a recompile (the chunk table has a fixed shape and the loop a
  dynamic trip count).

On several devices (``devices=`` on the search) the population is sharded on a one-axis mesh
(``"starts"``: device ``d`` holds a contiguous block of rows) and the program is one
``shard_map`` of the same chunk body: each call runs one chunk on every device at once, each
device sweeping its own running rows (a device with no chunk left skips the body). One
compile serves every device; each start's arithmetic is that of one device at the same width.

Both step through a :class:`Stepper` (:meth:`Sweep.at`), which keeps a copy of the
population from a recent host sync, so a chunk call that runs out of
memory costs no state: the width is halved, the program recompiled and the steps since that
copy are run again (see :meth:`Stepper.step`).

Beside them, :class:`ValueSweep` evaluates only the figure of merit at many candidate
points (the broad-start filter). Every program here compiles once per width and is built so that
a second process fitting the same model lowers the same program (the model's data is an
argument, the functions have fixed names) and can load it from the persistent compilation
cache.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import log
from .chunking import chunk_indices, chunk_slices, pad_rows
from .distributed import put, spans_processes, to_host
from .memory import is_out_of_memory
from .step import PopState

__all__ = [
    "Sweep",
    "Stepper",
    "ChunkSweep",
    "ScanSweep",
    "ValueSweep",
    "BACKENDS",
    "device_chunks",
    "lower_and_compile",
    "make_scan_step",
    "padded_chunks",
]

FILTER_NAME = "multistart_filter_chunk"
AXIS = "starts"  # the mesh axis the population is sharded on
# Where each population leaf keeps its starts: the start state on axis 0, the history on axis 1.
_POP_SPEC = PopState(P(AXIS), P(None, AXIS))

# The population is copied at a host sync once this many steps have run since the last copy.
# A copy is one dispatch, which for a cheap objective costs as much as a step: copying at every
# sync made a one-chunk step of a small objective twice as slow, while every 16 steps costs a
# few percent at most. A back-off replays at most this many steps (or one sync interval).
BACKOFF_COPY_STEPS = 16


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


def padded_chunks(tree, width: int):
    """``(lo, hi, chunk)`` for each fixed-width chunk of the rows (leading axis) of ``tree``.

    ``chunk`` holds rows ``lo:hi`` as NumPy, the ragged last one padded to ``width`` rows with
    copies of its last row (:func:`multistart.chunking.pad_rows`), so one program compiled for
    ``width`` rows serves every chunk; the caller keeps the first ``hi - lo`` rows of each
    output. The one chunk-pad loop of the filter, the resurrection writer and the records.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [np.asarray(a) for a in leaves]
    for lo, hi, pad in chunk_slices(len(leaves[0]), width):
        yield lo, hi, treedef.unflatten([pad_rows(a[lo:hi], pad) for a in leaves])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else repr(exc)


def retry_narrower(attempt, exc: BaseException, *, width: int, halve, fatal: str):
    """After ``exc`` (out of memory at ``width``): halve and retry ``attempt`` until it fits.

    ``halve(width, exc)`` narrows the program (and records why) and returns the new width;
    below width 1 the search stops with a ``RuntimeError(fatal)``. The one back-off loop of
    the chunk sweeps and the broad-start filter.
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


def _shape_of(a) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


@jax.jit
def _copy_tree(tree):
    # One program for the whole population: a copy per leaf would be a dispatch per leaf.
    return jax.tree_util.tree_map(jnp.copy, tree)


class Sweep:
    """The chunk step's programs, one per width, for a population shaped like ``pop``.

    The lifecycle is in the types: a ``Sweep`` compiles and times programs at any width
    (:meth:`compiled_for`, :meth:`time_chunks`: what choosing a width needs) but cannot step;
    :meth:`at` returns the :class:`Stepper` that steps at the width chosen, and backs off from
    it. Subclasses say how a step is laid out in calls (:meth:`_build`, :meth:`_lower_args`,
    :meth:`layout`, :meth:`run`). The population is donated to every call, so it is updated in
    place and the caller must use the returned state.

    With ``devices`` (two or more), ``n_total`` must be a multiple of their number: device
    ``d`` holds rows ``d * n_local`` to ``(d + 1) * n_local - 1`` and a width is the width of
    each device's chunk. :meth:`place` puts a population (or anything shaped like one) there.

    Args:
      chunk_step: ``chunk_step(pop, gather, scatter, row, data) -> pop`` (see subclasses).
      n_total: the population's rows.
      data: the model's data (an argument of every program).
      pop: the population, or its shapes: programs are compiled for them.
      rows: the rows to sweep at first (default: every row).
      devices: two or more devices: the population is sharded over them.
    """

    backend = ""

    def __init__(self, chunk_step, *, n_total: int, data, pop, rows=None, devices=None):
        devices = [] if devices is None else list(devices)
        self.n_devices = max(1, len(devices))
        if n_total % self.n_devices:
            raise ValueError(
                f"n_total ({n_total}) must be a multiple of the number of devices "
                f"({self.n_devices})"
            )
        self.n_local = n_total // self.n_devices  # rows per device
        self.mesh = Mesh(np.array(devices), (AXIS,)) if self.n_devices > 1 else None
        # A mesh over several processes' devices: the population is one global array, each
        # process steps its own devices' rows and reads the rest through collectives.
        self.spans_processes = spans_processes(devices)
        program = self._build(chunk_step)
        if self.mesh is None:
            self._jit = jax.jit(program, donate_argnums=0)
            self.data = jax.device_put(data)  # once, not at every call
        else:
            self._jit = self._sharded(program)
            self.data = put(data, NamedSharding(self.mesh, P()))
        self.n_total = n_total
        self.rows = np.arange(n_total) if rows is None else np.asarray(rows)
        # Shapes only, no sharding: lowering for committed arrays would make the outputs
        # committed, and every helper later jitted on them would compile a second time.
        self._pop_spec = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), pop
        )
        self._programs: dict[int, tuple[Any, float]] = {}  # width -> (compiled, seconds)

    # -- layout, per backend ---------------------------------------------------------------

    def _build(self, chunk_step):
        raise NotImplementedError

    # The number of per-device index arguments after ``pop`` (the rest are replicated).
    _n_index_args = 0

    def _local(self, program):
        """The body one device runs under ``shard_map`` (index arguments arrive as ``[1, ...]``)."""
        raise NotImplementedError

    def _sharded(self, program):
        """``jit(shard_map(...))`` of ``program`` over the mesh: one compile for every device."""
        mesh, k = self.mesh, self._n_index_args
        mapped = jax.shard_map(
            self._local(program),
            mesh=mesh,
            in_specs=(_POP_SPEC, *[P(AXIS)] * k, P(), P()),
            out_specs=_POP_SPEC,
        )

        def sharded(pop, *args):
            return mapped(pop, *args)

        # The chunk step's name, so the compile counter and the persistent cache see it as such.
        sharded.__name__ = sharded.__qualname__ = program.__name__
        pop_sh = self._pop_shardings()
        rows = NamedSharding(mesh, P(AXIS))
        rep = NamedSharding(mesh, P())
        return jax.jit(
            sharded,
            in_shardings=(pop_sh, *[rows] * k, rep, rep),
            out_shardings=pop_sh,
            donate_argnums=0,
        )

    def _pop_shardings(self):
        return PopState(*(NamedSharding(self.mesh, spec) for spec in _POP_SPEC))

    def place(self, pop):
        """``pop`` on the sweep's devices (sharded on the mesh); as it is on one device.

        A no-op for arrays already placed so. A population changed outside the sweep (rows
        replaced, a checkpoint restored) may come back laid out otherwise: every step places it.
        """
        if self.mesh is None:
            return pop
        return put(pop, self._pop_shardings())

    def _per_device(self, rows: np.ndarray) -> list[np.ndarray]:
        """Each device's rows among ``rows``, as local indices into its block."""
        rows = np.asarray(rows)
        owner = rows // self.n_local
        return [rows[owner == d] - d * self.n_local for d in range(self.n_devices)]

    def _first_rows(self, k: int, width: int) -> np.ndarray:
        """The swept rows of the first ``k`` calls at ``width`` (on every device)."""
        if self.mesh is None:
            return self.rows[: k * width]
        return np.concatenate(
            [r[: k * width] + d * self.n_local for d, r in enumerate(self._per_device(self.rows))]
        )

    def _put_rows(self, table: np.ndarray):
        """A per-device index table (leading axis: devices) placed one row per device."""
        if self.mesh is None:
            return jax.device_put(table)
        return put(table, NamedSharding(self.mesh, P(AXIS)))

    def _lower_args(self, width: int) -> tuple:
        """Index arguments with the shapes of one call at ``width`` (for lowering)."""
        raise NotImplementedError

    def layout(self, rows: np.ndarray, width: int) -> tuple[list, Any]:
        """``(chunks, args)``: the host-side chunks of ``rows`` and the device arguments."""
        raise NotImplementedError

    def run(self, compiled, pop, args, row):
        """One step of the rows laid out in ``args`` (from :meth:`layout`) with ``compiled``."""
        raise NotImplementedError

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
        return self._programs[width][0]

    def compile_seconds(self, width: int) -> float:
        return self._programs[width][1] if width in self._programs else 0.0

    def compiled_widths(self) -> list[int]:
        return sorted(self._programs)

    def release_width(self, width: int) -> None:
        """Drop the program at ``width`` (one that ran out of memory)."""
        self._programs.pop(width, None)

    def release(self, keep: int | None = None) -> None:
        """Drop the compiled programs of every width but ``keep`` (their memory too)."""
        for w in list(self._programs):
            if w != keep:
                del self._programs[w]

    def trace(self, pop, width: int) -> jax.stages.Traced:
        """Trace the program at ``width`` for ``pop``, so the compile census can time its
        lowering and its compile apart (``multistart profile``)."""
        return self._jit.trace(pop, *self._lower_args(width), self.data)

    def at(self, width: int) -> Stepper:
        """The sweep ready to step at ``width`` (compiled now unless it already is)."""
        return Stepper(self, width)

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
        _, args = self.layout(self._first_rows(k, width), width)
        p = self.run(compiled, _copy_tree(self.place(pop)), args, np.int32(0))
        jax.block_until_ready(p)
        seconds: list[float] = []
        t_end = time.perf_counter() + target_s
        while len(seconds) < min_reps or (len(seconds) < max_reps and time.perf_counter() < t_end):
            t0 = time.perf_counter()
            p = self.run(compiled, p, args, np.int32(0))
            jax.block_until_ready(p)
            seconds.append((time.perf_counter() - t0) / k)
        return seconds, k * (1 + len(seconds))

    def calls_per_step(self, width: int) -> int:
        """Chunk evaluations one step of every swept row runs at ``width`` (on several devices,
        the calls of the device with the most rows)."""
        if self.mesh is None:
            return -(-self.rows.size // width)
        return max(-(-r.size // width) for r in self._per_device(self.rows))


class Synced(NamedTuple):
    """What :meth:`Stepper.sync` read on the host (NumPy), with the population it read."""

    pop: Any
    status: np.ndarray
    best_fom: np.ndarray
    n_evals: np.ndarray


class Stepper:
    """A :class:`Sweep` at a chosen width: steps, reads statuses, repacks, backs off.

    Made by :meth:`Sweep.at`. It keeps a copy of the population from a recent host sync, so a
    chunk call that runs out of memory costs no state: the width is halved, the program
    recompiled and the steps since that copy are run again (see :meth:`step`).

    Attributes:
      programs: the :class:`Sweep` it steps with.
      width: the current batch width (rows per chunk, per device on several).
      rows: the population rows swept (the running starts).
      chunks: one entry per chunk evaluation a step runs.
      compiled: the program at ``width``.
      compile_s: compile seconds of the program(s) it stepped with.
      backoffs: one record per out-of-memory back-off.
    """

    def __init__(self, programs: Sweep, width: int):
        self.programs = programs
        self.rows = programs.rows
        self.chunks: list = []
        self.compile_s = 0.0
        self.backoffs: list[dict[str, Any]] = []
        self._saved = None  # the population at a recent host sync
        self._replay: list[tuple[int, np.ndarray]] = []  # (history row, rows) of steps since
        self._n_steps = 0
        self._args: Any = None
        self._set_width(width)

    @property
    def n_total(self) -> int:
        return self.programs.n_total

    @property
    def n_devices(self) -> int:
        return self.programs.n_devices

    @property
    def spans_processes(self) -> bool:
        return self.programs.spans_processes

    def place(self, pop):
        """See :meth:`Sweep.place`."""
        return self.programs.place(pop)

    def _set_width(self, width: int) -> None:
        self.compiled = self.programs.compiled_for(width)
        self.width = width
        self.compile_s += self.programs.compile_seconds(width)
        self.set_rows(self.rows)

    def set_rows(self, rows: np.ndarray) -> None:
        """Sweep only ``rows`` from now on (repacked into full chunks)."""
        self.rows = np.asarray(rows)
        self.chunks, self._args = self.programs.layout(self.rows, self.width)

    def step(self, pop, row: int):
        """One step of every swept row; ``row`` is the history row the step writes.

        No host synchronisation: a failure of a call may surface here or only at the next
        :meth:`sync`. Either way, if it is an out-of-memory error, the steps since the
        population was last saved are run again from that copy, at half the width.
        """
        pop = self.programs.place(pop)
        if self._saved is None:
            self._saved = _copy_tree(pop)
        self._replay.append((int(row), self.rows))
        self._n_steps += 1
        try:
            return self.programs.run(self.compiled, pop, self._args, np.int32(row))
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return self._back_off(exc)

    def sync(self, pop) -> Synced:
        """Read the starts' status, best figures of merit and evaluation counts on the host
        (one transfer; one collective on a mesh over several processes).

        The read waits for the steps so far, so it is where an asynchronous failure shows.
        After it, once :data:`BACKOFF_COPY_STEPS` steps have run since the last copy, the
        population is copied (one device program, never per chunk) as the point a later
        back-off restarts from.
        """

        def read(pop):
            s = pop.starts
            return Synced(pop, *to_host((s.status, s.best_fom, s.n_evals)))

        try:
            synced = read(pop)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            synced = read(self._back_off(exc))
        if len(self._replay) >= BACKOFF_COPY_STEPS:
            self._saved = _copy_tree(synced.pop)
            self._replay.clear()
        return synced

    def rebase(self, pop) -> None:
        """``pop`` changed outside the sweep (rows replaced, a checkpoint restored): make it
        the point a later back-off restarts from, as replaying steps over it would undo it."""
        self._saved = _copy_tree(self.programs.place(pop))
        self._replay.clear()

    def _back_off(self, exc: BaseException):
        """Halve the width until the steps since the saved copy run; returns their result."""
        if self.programs.spans_processes:
            # One process backing off alone would step other programs than the rest of the
            # job, which waits for it at the next collective: a clear error instead.
            raise RuntimeError(
                f"the chunk step ran out of memory at batch_size {self.width} in a search "
                "spanning several processes, where the width is not halved on the fly; "
                "set a smaller batch_size"
            ) from exc

        def halve(old: int, failure: BaseException) -> int:
            new = old // 2
            self.backoffs.append(
                {"step": self._n_steps, "from": old, "to": new, "replayed": len(self._replay)}
            )
            log.logger.warning(
                "out of memory at batch_size %d (%s); retrying the last %d step(s) at %d",
                old,
                _first_line(failure),
                len(self._replay),
                new,
            )
            self.programs.release_width(old)  # the program that did not fit
            self.compiled = None
            self._set_width(new)
            return new

        current = self.rows  # the rows to sweep afterwards (a failed replay may move them)

        def replay():
            pop = _copy_tree(self._saved)
            for row, rows in self._replay:  # each step with the rows it swept
                if rows is not self.rows:
                    self.set_rows(rows)
                pop = self.programs.run(self.compiled, pop, self._args, np.int32(row))
            jax.block_until_ready(pop)  # an asynchronous failure shows here, not later
            self.set_rows(current)
            return pop

        return retry_narrower(
            replay,
            exc,
            width=self.width,
            halve=halve,
            fatal=(
                f"the chunk step ran out of memory even at batch_size 1 ({self.programs.backend} "
                f"backend, after {self._n_steps} steps): one start of this model does not fit "
                "the device; use a device with more memory or a smaller model"
            ),
        )


class ChunkSweep(Sweep):
    """The ``"loop"`` backend: one compiled chunk step, called once per chunk from Python.

    ``chunk_step(pop, gather, scatter, row, data) -> pop`` updates the rows named by
    ``gather``/``scatter`` (``width`` each) of the population state ``pop``, whose buffers are
    donated so the update happens in place. :meth:`step` calls it once per chunk, with no host
    synchronisation.
    """

    backend = "loop"

    _n_index_args = 2

    def _build(self, chunk_step):
        return chunk_step

    def _local(self, program):
        n_local = self.n_local

        def local(pop, gather, scatter, row, data):
            gather, scatter = gather[0], scatter[0]
            # A device with no chunk left this call gets an all-padding chunk: skip the body.
            return jax.lax.cond(
                scatter[0] < n_local,
                lambda p: program(p, gather, scatter, row, data),
                lambda p: p,
                pop,
            )

        return local

    def _lower_args(self, width):
        if self.mesh is None:
            gather, scatter = device_chunks(np.arange(1), width, self.n_total)[0]
            return gather, scatter, np.int32(0)
        table = np.zeros((self.n_devices, width), np.int32)
        return table, table, np.int32(0)

    def layout(self, rows, width):
        if self.mesh is None:
            chunks = device_chunks(rows, width, self.n_total)
            return chunks, chunks
        per = [chunk_indices(r, width, self.n_local) for r in self._per_device(rows)]
        idle = (np.zeros(width, np.int32), np.full(width, self.n_local, np.int32))
        calls = []
        for i in range(max(len(c) for c in per)):
            pairs = [c[i] if i < len(c) else idle for c in per]
            calls.append(
                (
                    self._put_rows(np.stack([g for g, _ in pairs])),
                    self._put_rows(np.stack([s for _, s in pairs])),
                )
            )
        return calls, calls

    def run(self, compiled, pop, args, row):
        for gather, scatter in args:
            pop = compiled(pop, gather, scatter, row, self.data)
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
        self.backoffs: list[dict[str, int]] = []
        self._shape = None

    def compile(self, n_dims: int, dtype) -> float:
        """Compile for ``(width, n_dims)`` rows of ``dtype``; returns the seconds taken."""
        self._shape = (n_dims, dtype)
        example = jax.ShapeDtypeStruct((self.width, n_dims), dtype)
        self.compiled, seconds = lower_and_compile(
            self._jit, "the broad-start filter", example, self.data
        )
        self.compile_s += seconds
        return seconds

    def __call__(self, u: np.ndarray) -> np.ndarray:
        """The figure of merit at every row of ``u`` (NumPy in, NumPy out, in row order).

        A chunk that runs out of memory halves the width, recompiles and evaluates again
        (nothing is donated, so nothing is lost), down to width 1 and then a clear error.
        """
        if self.compiled is None:
            raise RuntimeError("ValueSweep.compile() must be called before evaluating")
        try:
            return self._evaluate(u)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            first = exc

        def halve(old: int, failure: BaseException) -> int:
            self.width = old // 2
            self.backoffs.append({"from": old, "to": self.width})
            log.logger.warning(
                "broad-start filter out of memory at width %d; retrying at %d", old, self.width
            )
            self.compile(*self._shape)
            return self.width

        return retry_narrower(
            lambda: self._evaluate(u),
            first,
            width=self.width,
            halve=halve,
            fatal="the broad-start filter ran out of memory even at width 1: one evaluation of "
            "this model does not fit the device",
        )

    def _evaluate(self, u: np.ndarray) -> np.ndarray:
        outs = [
            (self.compiled(c, self.data), hi - lo) for lo, hi, c in padded_chunks(u, self.width)
        ]
        if not outs:
            return np.zeros((0,), dtype=u.dtype)
        return np.concatenate([np.asarray(out)[:n] for out, n in outs])


def make_scan_step(chunk_step, tick=None):
    """Build ``scan_step(pop, gathers, scatters, n_chunks, row, data) -> pop``.

    It runs ``chunk_step`` over the first ``n_chunks`` rows of the ``(max_chunks, width)``
    index tables inside one compiled loop. ``n_chunks`` is a traced scalar, so the running
    starts can shrink without a recompile. ``tick(row, i, n_chunks)``, when given, is called
    on the host once per chunk through ``jax.debug.callback``; when it is None nothing is
    traced in.
    """

    def multistart_chunk_step_scan(pop, gathers, scatters, n_chunks, row, data):
        def body(i, pop):
            if tick is not None:
                jax.debug.callback(tick, row, i, n_chunks)
            return chunk_step(pop, gathers[i], scatters[i], row, data)

        return jax.lax.fori_loop(0, n_chunks, body, pop)

    return multistart_chunk_step_scan


def _scan_tick(row, i, n_chunks) -> None:
    log.logger.debug("step row %d: scan batch %d/%d", int(row), int(i) + 1, int(n_chunks))


class ScanSweep(Sweep):
    """The ``"scan"`` backend: every chunk of a step inside one compiled XLA loop.

    Same interface and same results as :class:`ChunkSweep` (each chunk runs the same
    ``vmap`` body on the same rows). With the ``multistart`` logger at DEBUG when the sweep is
    built, each scan batch logs a tick from inside the program (``jax.debug.callback``);
    otherwise no callback is compiled in.
    """

    backend = "scan"

    _n_index_args = 3

    def _build(self, chunk_step):
        tick = _scan_tick if log.logger.isEnabledFor(logging.DEBUG) else None
        self.ticks = tick is not None
        return make_scan_step(chunk_step, tick)

    def _local(self, program):
        def local(pop, gathers, scatters, n_chunks, row, data):
            return program(pop, gathers[0], scatters[0], n_chunks[0], row, data)

        return local

    def _max_chunks(self, width):
        return -(-self.n_local // width)

    def _lower_args(self, width):
        table = np.zeros((self._max_chunks(width), width), np.int32)
        if self.mesh is None:
            return table, table, np.int32(0), np.int32(0)
        tables = np.zeros((self.n_devices, *table.shape), np.int32)
        return tables, tables, np.zeros(self.n_devices, np.int32), np.int32(0)

    def _tables(self, rows, width):
        """``(chunks, gathers, scatters)`` of one device's local ``rows``."""
        chunks = chunk_indices(rows, width, self.n_local)
        gathers = np.zeros((self._max_chunks(width), width), np.int32)
        scatters = np.full_like(gathers, self.n_local)  # unused rows write out of bounds
        for i, (g, s) in enumerate(chunks):
            gathers[i], scatters[i] = g, s
        return chunks, gathers, scatters

    def layout(self, rows, width):
        if self.mesh is None:
            chunks, gathers, scatters = self._tables(rows, width)
            args = (jax.device_put(gathers), jax.device_put(scatters), np.int32(len(chunks)))
            return chunks, args
        per = [self._tables(r, width) for r in self._per_device(rows)]
        counts = np.array([len(c) for c, _, _ in per], np.int32)
        args = (
            self._put_rows(np.stack([g for _, g, _ in per])),
            self._put_rows(np.stack([s for _, _, s in per])),
            self._put_rows(counts),
        )
        return [None] * int(counts.max(initial=0)), args  # one entry per chunk call

    def run(self, compiled, pop, args, row):
        gathers, scatters, n_chunks = args
        return compiled(pop, gathers, scatters, n_chunks, row, self.data)


BACKENDS = {"loop": ChunkSweep, "scan": ScanSweep}
