"""Several processes, one job: :func:`initialize`, JAX's distributed runtime with CPU defaults.

Call :func:`initialize` in every process of the job before its first fit (before anything
else touches JAX); a fit then returns the whole Result in every process::

    ms.distributed.initialize()  # on Slurm, JAX finds the coordinator itself
    result = search.fit(objective, space)

A search whose starts are independent is split, one part per process, exchanged once at the end
(:func:`allgather_bytes`); one that couples its starts, or checkpoints, runs on one mesh over
every process's devices, every process making the same decisions at each host sync
(:func:`to_host`, :func:`agree_max`). One lost process stops the whole job. docs/scale-out.md
has the modes, the faults and the restart recipes.
"""

from __future__ import annotations

import functools
import numbers
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..common import xla

__all__ = [
    "initialize",
    "CPU_COLLECTIVES",
    "allgather_bytes",
    "agree_max",
    "check_devices",
    "put",
    "resolve_devices",
    "spans_processes",
    "to_host",
]

#: The cross-process collectives a CPU process uses (JAX's own choice; "mpi" needs an MPI).
CPU_COLLECTIVES = "gloo"
_USER_CHOICES = ("mpi", "megascale")  # a choice the user made on purpose is kept


def initialize(*args, **kwargs) -> None:
    """Start JAX's distributed runtime: ``jax.distributed.initialize(*args, **kwargs)``.

    Every argument is passed through (on Slurm and other clusters JAX detects them itself).
    First, unless JAX runs on accelerators only (``JAX_PLATFORMS`` without ``cpu``) or MPI was
    chosen, CPU processes are given the gloo collectives, without which they cannot run a
    computation together. Call it in every process, once, before anything else uses JAX.

    Example:
      >>> import multistart as ms
      >>> ms.distributed.initialize(  # doctest: +SKIP
      ...     coordinator_address="10.0.0.1:1234", num_processes=2, process_id=0
      ... )

    Raises:
      RuntimeError: as ``jax.distributed.initialize`` does (called twice, called after JAX
        started its backends, or the coordinator could not be reached in time).
    """
    chosen = jax.config.jax_cpu_collectives_implementation  # type: ignore[attr-defined]
    if _uses_cpu() and chosen not in _USER_CHOICES:
        jax.config.update("jax_cpu_collectives_implementation", CPU_COLLECTIVES)
    jax.distributed.initialize(*args, **kwargs)


def _uses_cpu() -> bool:
    """Whether this process may run on the CPU backend (its platforms unset, or list cpu)."""
    platforms = jax.config.jax_platforms  # type: ignore[attr-defined]  # a dynamic option
    platforms = platforms or os.environ.get("JAX_PLATFORMS", "")
    return not platforms or "cpu" in platforms.split(",")


def check_devices(devices):
    """Validate ``devices=`` of a search (no device is touched: JAX may not be started yet).

    ``None`` (every local device), an int ``>= 1`` (the first that many local devices) or a
    non-empty sequence of distinct ``jax.Device`` objects.
    """
    if devices is None:
        return None
    wrong = f"devices must be None, an int >= 1 or a list of jax devices; got {devices!r}"
    if isinstance(devices, bool):
        raise ValueError(wrong)
    if isinstance(devices, numbers.Integral):
        if devices < 1:
            raise ValueError(wrong)
        return int(devices)
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
        raise ValueError(wrong)
    devices = tuple(devices)
    if not devices:
        raise ValueError("devices must not be empty; pass None for every local device")
    bad = [d for d in devices if not isinstance(d, jax.Device)]
    if bad:
        raise ValueError(f"devices must be jax.Device objects (from jax.devices()); got {bad[0]!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"devices lists a device twice: {list(devices)}")
    if len({d.platform for d in devices}) > 1:
        raise ValueError(f"devices must all be of one platform; got {list(devices)}")
    return devices


def resolve_devices(devices, *, every_process: bool = False) -> list:
    """The devices a search runs on, from its checked ``devices=`` (at fit time).

    The mesh spans this process's devices (``jax.local_devices()``), or with ``every_process``
    those of every process of the job, in process order (``None``: all of each; ``k``: the
    first ``k`` of each; a list of devices is refused there, as it can only name this
    process's own).
    """
    local = jax.local_devices()
    if every_process:
        if devices is not None and not isinstance(devices, int):
            raise ValueError(
                "devices must be None or an int (per process) when one search spans the "
                f"processes of a job; got a list of {len(devices)} device(s)"
            )
        resolve_devices(devices)  # each process checks it has them
        k = len(local) if devices is None else devices
        return [
            d
            for p in range(jax.process_count())
            for d in [d for d in jax.devices() if d.process_index == p][:k]
        ]
    if devices is None:
        return list(local)
    if isinstance(devices, int):
        if devices > len(local):
            raise ValueError(
                f"devices={devices} but this process has {len(local)} local device"
                f"{'' if len(local) == 1 else 's'} ({local[0].platform}); on a CPU, "
                "XLA_FLAGS=--xla_force_host_platform_device_count=N (set before JAX starts) "
                "makes N logical devices"
            )
        return list(local[:devices])
    foreign = [d for d in devices if d not in local]
    if foreign:
        raise ValueError(
            f"devices must be this process's own devices (jax.local_devices()); {foreign[0]} is not"
        )
    return list(devices)


def allgather_bytes(blob: bytes) -> list[bytes]:
    """Every process's ``blob``, in process order, in every process (a collective: every
    process of the job must call it, in the same order as its other collectives)."""
    from jax.experimental import multihost_utils

    sizes = multihost_utils.process_allgather(np.array([len(blob)], np.int64)).reshape(-1)
    buf = np.zeros(max(1, int(sizes.max())), np.uint8)
    buf[: len(blob)] = np.frombuffer(blob, np.uint8)
    rows = multihost_utils.process_allgather(buf).reshape(len(sizes), -1)
    return [rows[p, : sizes[p]].tobytes() for p in range(len(sizes))]


def spans_processes(devices) -> bool:
    """Whether ``devices`` include another process's (the population is then a global array)."""
    me = jax.process_index()
    return any(d.process_index != me for d in devices)


def to_host(tree):
    """Every leaf of ``tree`` as a NumPy array on this host.

    Leaves sharded over several processes' devices are gathered (one collective per mesh):
    every process of the job must call this at the same point. Otherwise ``jax.device_get``.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    spread: dict = {}  # mesh -> indices of the leaves sharded on it
    for i, a in enumerate(leaves):
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            mesh = a.sharding.mesh  # type: ignore[attr-defined]  # a NamedSharding's
            spread.setdefault(mesh, []).append(i)
    for mesh, idx in spread.items():
        gathered = _replicated(mesh)([leaves[i] for i in idx])
        for i, g in zip(idx, gathered, strict=True):
            leaves[i] = g.addressable_data(0)  # this process's full copy
    return jax.tree_util.tree_unflatten(treedef, [np.asarray(a) for a in jax.device_get(leaves)])


@functools.cache
def _replicated(mesh):
    """The identity, its outputs replicated on every device of ``mesh`` (all-gathers)."""
    return xla.jit(lambda tree: tree, out_shardings=NamedSharding(mesh, P()))


def agree_max(values) -> np.ndarray:
    """The elementwise maximum of every process's ``values`` (small ints), in every process:
    how processes that step together agree on what only one of them may have seen (a signal, a
    clock past ``max_time_s``). A collective; one process alone returns ``values``."""
    values = np.asarray(values, np.int32).reshape(-1)
    if jax.process_count() == 1:
        return values
    sharding, program = _max_over_processes()
    x = jax.make_array_from_process_local_data(sharding, values[None])
    return np.asarray(program(x).addressable_data(0))


@functools.cache
def _max_over_processes():
    """A mesh of each process's first device, and the max over it (compiled once)."""
    first = [
        min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
        for p in range(jax.process_count())
    ]
    mesh = Mesh(np.array(first), ("process",))
    program = xla.jit(lambda x: x.max(0), out_shardings=NamedSharding(mesh, P()))
    return NamedSharding(mesh, P("process")), program


def put(tree, shardings):
    """``jax.device_put(tree, shardings)``, also onto devices of several processes.

    ``shardings`` is one sharding or a tree-prefix of ``tree``. Over several processes each
    places only its own devices' shards of the same host value, without ``device_put``'s
    cross-process equality check (one collective per leaf, and one that fails on nan).
    """
    flat = jax.tree_util.tree_leaves(shardings)
    if all(sh.is_fully_addressable for sh in flat):
        return jax.device_put(tree, shardings)

    def one(a, sh):
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            return a if a.sharding == sh else jax.device_put(a, sh)
        host = np.asarray(jax.device_get(a))
        return jax.make_array_from_callback(host.shape, sh, lambda index: host[index])

    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree_util.tree_map(lambda a: one(a, shardings), tree)
    return jax.tree_util.tree_map(
        lambda sh, sub: jax.tree_util.tree_map(lambda a: one(a, sh), sub), shardings, tree
    )
