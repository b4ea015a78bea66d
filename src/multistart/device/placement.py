"""Where the population lives: one device, or a one-axis mesh of several.

A backend (:mod:`multistart.device.backends`) writes its programs and index tables once, for any
placement; the placement says how a program is compiled for its devices, how the population
and the model's data are put there, and how the running rows are split and laid out per
device. On one device every step is the plain program; on a mesh (``devices=`` on a search)
the population is sharded on the axis ``"starts"`` (device ``d`` holds a contiguous block of
rows), the program is one ``shard_map`` of the same body, and each call runs one chunk on
every device at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..common import background, xla
from .distributed import put, spans_processes
from .step import PopState

__all__ = [
    "AXIS",
    "DeviceMesh",
    "OneDevice",
    "Placement",
    "data_on_device",
    "keep_device_copies",
    "placement",
    "send_ahead",
]

AXIS = "starts"  # the mesh axis the population is sharded on
# Where each population leaf keeps its starts: the start state on axis 0, the history on axis 1.
_POP_SPEC: tuple[P, P] = (P(AXIS), P(None, AXIS))  # (starts, history), as PopState


class Placement:
    """The population's devices (see the module doc); subclasses implement each method.

    Attributes:
      n_devices: how many devices hold rows.
      n_local: rows per device.
      spans_processes: the devices include another process's (the population is a global
        array; host reads go through collectives).
    """

    n_devices = 1
    spans_processes = False

    def __init__(self, n_total: int):
        self.n_local = n_total // self.n_devices

    def jit(self, program: Callable, local: Callable, n_index_args: int):
        """``program`` compiled for these devices, its population argument donated.

        ``local(program)`` is the body one device runs on a mesh (its index arguments arrive
        with a leading axis of 1); ``n_index_args`` index arguments follow the population.
        """
        raise NotImplementedError

    def put_data(self, data):
        """The model's data on every device (once, not at every call)."""
        raise NotImplementedError

    def place(self, pop):
        """``pop`` laid out on the devices (a no-op for arrays already laid out so)."""
        raise NotImplementedError

    def split(self, rows: np.ndarray) -> list[np.ndarray]:
        """Each device's rows among ``rows``, as local indices into its block (device ``d``
        holds rows ``d * n_local`` to ``(d + 1) * n_local - 1``)."""
        rows = np.asarray(rows)
        owner = self._owner(rows)
        return [rows[owner == d] - d * self.n_local for d in range(self.n_devices)]

    def split_values(self, rows: np.ndarray, values) -> list:
        """Each device's rows of ``values`` (a tree, one row per row of ``rows``), in the
        order :meth:`split` gives that device's rows."""
        owner = self._owner(np.asarray(rows))
        return [
            jax.tree_util.tree_map(lambda a, d=d: np.asarray(a)[owner == d], values)
            for d in range(self.n_devices)
        ]

    def _owner(self, rows: np.ndarray) -> np.ndarray:
        """The device that holds each row (device ``d`` holds rows ``d n_local`` to
        ``(d + 1) n_local - 1``; one device holds them all)."""
        return rows // self.n_local

    def join(self, local: Sequence[np.ndarray]) -> np.ndarray:
        """Global rows from each device's local rows (the inverse of :meth:`split`)."""
        raise NotImplementedError

    def put_rows(self, tables: Sequence[Any]):
        """One index table (or a tree of them) per device, placed so each device gets its
        own."""
        raise NotImplementedError

    def put_counts(self, counts: Sequence[int]):
        """One count per device (a scan's chunks this call)."""
        raise NotImplementedError

    def put_rows_each(self, each: Sequence[Sequence[Any]]) -> list:
        """:meth:`put_rows` of each entry of ``each``, a list of what it was given."""
        return [self.put_rows(tables) for tables in each]


class OneDevice(Placement):
    """Everything on JAX's default device: the plain compiled program."""

    def jit(self, program, local, n_index_args):
        return xla.jit(program, donate_argnums=0)

    def put_data(self, data):
        return data_on_device(data)

    def place(self, pop):
        return pop

    def join(self, local):
        return np.asarray(local[0])

    def put_rows(self, tables):
        return jax.device_put(tables[0])

    def put_rows_each(self, each):
        # one transfer of them all: a chip takes a fraction of a millisecond a transfer, and
        # 200,000 fits in 13 chunks sent 26 index tables one by one (issue 70)
        return jax.device_put([tables[0] for tables in each])

    def put_counts(self, counts):
        return np.int32(counts[0])


class DeviceMesh(Placement):
    """A one-axis mesh of several devices (one process's, or every process's of a job)."""

    def __init__(self, n_total: int, devices: Sequence[jax.Device]):
        self.n_devices = len(devices)
        if n_total % self.n_devices:
            raise ValueError(
                f"n_total ({n_total}) must be a multiple of the number of devices "
                f"({self.n_devices})"
            )
        super().__init__(n_total)
        self.mesh = Mesh(np.array(devices), (AXIS,))
        self.spans_processes = spans_processes(devices)

    def pop_shardings(self) -> PopState:
        return PopState._make(NamedSharding(self.mesh, spec) for spec in _POP_SPEC)

    def jit(self, program, local, n_index_args):
        """``jit(shard_map(...))``: one compile for every device."""
        k = n_index_args
        mapped = jax.shard_map(
            local(program),
            mesh=self.mesh,
            in_specs=(PopState._make(_POP_SPEC), *[P(AXIS)] * k, P(), P()),
            out_specs=PopState._make(_POP_SPEC),
        )

        def sharded(pop, *args):
            return mapped(pop, *args)

        # The chunk step's name, so the compile counter and the persistent cache see it as such.
        sharded.__name__ = sharded.__qualname__ = program.__name__
        pop_sh = self.pop_shardings()
        rows = NamedSharding(self.mesh, P(AXIS))
        rep = NamedSharding(self.mesh, P())
        return xla.jit(
            sharded,
            in_shardings=(pop_sh, *[rows] * k, rep, rep),
            out_shardings=pop_sh,
            donate_argnums=0,
        )

    def put_data(self, data):
        return put(data, NamedSharding(self.mesh, P()))

    def place(self, pop):
        return put(pop, self.pop_shardings())

    def join(self, local):
        return np.concatenate([r + d * self.n_local for d, r in enumerate(local)])

    def put_rows(self, tables):
        stacked = jax.tree_util.tree_map(lambda *t: np.stack(t), *tables)
        return put(stacked, NamedSharding(self.mesh, P(AXIS)))

    def put_counts(self, counts):
        return self.put_rows([np.int32(c) for c in counts])


def placement(n_total: int, devices: Sequence[jax.Device] | None) -> Placement:
    """One device (``devices`` ``None`` or one), or a mesh of several."""
    devices = [] if devices is None else list(devices)
    if len(devices) > 1:
        return DeviceMesh(n_total, devices)
    return OneDevice(n_total)


# -- the model's data on the default device ----------------------------------------------------

#: A NumPy leaf repeated along its first axis (a stride of 0) past this many bytes, as the
#: device holds it, is sent as its first row and repeated on the device: a batch's shared
#: ``xdata`` and unit weights, ``(200000, 60)`` each, took 62 ms to convert and send on a TPU's
#: host against 1 ms (``profiling/experiments/transfers.py``). Below it, the repeat's own
#: small program (compiled once a shape) is not worth it.
BROADCAST_BYTES = 1 << 20

# (id, type, device) -> (leaf, its copy), within keep_device_copies (a context variable: each
# thread, and each task, has its own)
_copies: contextvars.ContextVar[dict | None] = contextvars.ContextVar("copies", default=None)


@contextlib.contextmanager
def keep_device_copies():
    """Within it, each NumPy leaf :func:`data_on_device` sends keeps its device copy, and a
    second send of the same array (a batch's covariance after its search) is that copy, not a
    second transfer; the copies are dropped on exit."""
    token = _copies.set({} if _copies.get() is None else _copies.get())
    try:
        yield
    finally:
        _copies.reset(token)


def data_on_device(data):
    """``jax.device_put(data)`` on the default device, a large NumPy leaf repeated along its
    first axis sent as one row (:data:`BROADCAST_BYTES`): the same values, in the type JAX
    gives them now (float32 where ``jax_enable_x64`` is off)."""
    return jax.tree_util.tree_map(_leaf_on_device, data)


#: A NumPy leaf of at least this many bytes is worth sending ahead (:func:`send_ahead`).
AHEAD_BYTES = 1 << 20


def send_ahead(data, *, x64: bool | None = None) -> None:
    """Within :func:`keep_device_copies`, start sending ``data``'s large NumPy leaves (at least
    :data:`AHEAD_BYTES`, not repeated rows) to the default device on a worker thread, in the
    type :func:`data_on_device` will send them now, which then waits for that copy instead of
    making its own. A batch of small fits on a chip sends its data while the host plans its
    starts and its search: 200,000 fits' ``ydata`` took about 50 ms to convert and send on a
    TPU's host, before the first step. ``x64``: float64 on or off for these copies (as they
    are now: ``None``). Outside the context, nothing."""
    copies = _copies.get()
    if copies is None:
        return
    enabled = jax.config.jax_enable_x64 if x64 is None else x64  # type: ignore[attr-defined]
    device = jax.config.jax_default_device  # type: ignore[attr-defined]
    for a in jax.tree_util.tree_leaves(data):
        if not isinstance(a, np.ndarray) or a.nbytes < AHEAD_BYTES:
            continue
        with jax.enable_x64(enabled):
            key, repeated = _key(a), _repeated(a)
        if not repeated and key not in copies:
            copies[key] = (a, background.submit("transfer", _put, a, enabled, device))


#: A floating leaf sent ahead goes as this many blocks of rows in one transfer, as it is
#: (float64 too), and is joined and converted to the type the device holds there: a TPU's host
#: sends blocks side by side, and its conversion to float32 allocated the float32 copy, whose
#: new pages cost it about 50 ms of 55 for 200,000 fits' ``ydata`` (issue 70; 80 ms to convert
#: and send, 17 ms in blocks joined there: ``profiling/experiments/transfers.py``).
AHEAD_BLOCKS = 8
#: ...where the leaf, as it is, takes at most this many bytes: on the device the blocks and the
#: joined copy are held together for a moment, and a larger leaf is converted on the host.
AHEAD_JOIN_BYTES = 1 << 30


def _put(a: np.ndarray, enabled: bool, device):
    """``jax.device_put(a)`` with float64 on or off (``enabled``) and ``device`` the default
    device, as the caller of :func:`send_ahead` had them: a floating leaf of at least
    :data:`AHEAD_BLOCKS` rows and at most :data:`AHEAD_JOIN_BYTES` in blocks, joined and
    converted on the device."""
    with jax.enable_x64(enabled), jax.default_device(device):
        held = jax.dtypes.canonicalize_dtype(a.dtype)  # the type the device holds it in
        floating = np.issubdtype(a.dtype, np.floating)
        if not floating or a.ndim == 0 or len(a) < AHEAD_BLOCKS or a.nbytes > AHEAD_JOIN_BYTES:
            return jax.device_put(a)
    with jax.enable_x64(True), jax.default_device(device):
        return _joined(jax.device_put(np.array_split(a, AHEAD_BLOCKS)), held.name)


@functools.partial(jax.jit, static_argnums=1)
def _joined(blocks, dtype: str):
    """Row blocks joined, in ``dtype``."""
    return jnp.concatenate(blocks).astype(dtype)


def _key(a: np.ndarray) -> tuple:
    dtype = jax.dtypes.canonicalize_dtype(a.dtype)
    return (id(a), dtype.name, str(jax.config.jax_default_device))  # type: ignore[attr-defined]


def _repeated(a: np.ndarray) -> bool:
    """A leaf repeated along its first axis (a stride of 0), sent as one row."""
    itemsize = jax.dtypes.canonicalize_dtype(a.dtype).itemsize
    repeats = a.ndim and a.strides[0] == 0 and a.shape[0] > 1
    return bool(repeats and a.size * itemsize > BROADCAST_BYTES)


def _leaf_on_device(a):
    if not isinstance(a, np.ndarray):
        return jax.device_put(a)
    key = _key(a)
    copies = _copies.get()
    if copies is not None and key in copies:
        out = copies[key][1]
        if isinstance(out, Future):  # sent ahead: its copy, once there
            out = out.result()
            copies[key] = (a, out)
        return out
    if _repeated(a):
        # (one row, whatever else repeats: x and unit weights of a shape share one program)
        out = _repeat(jax.device_put(np.ascontiguousarray(a[:1])), a.shape)
    else:
        out = jax.device_put(a)
    if copies is not None:
        copies[key] = (a, out)  # (the leaf kept: its id is not reused while the copy is)
    return out


@functools.partial(jax.jit, static_argnums=1)
def _repeat(base, shape):
    return jnp.broadcast_to(base, shape)
