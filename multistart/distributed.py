"""Several processes, one job: :func:`initialize`, JAX's distributed runtime with CPU defaults.

Call :func:`initialize` in every process of the job before its first fit (before anything
else touches JAX). A fit without ``part=`` then runs one part per process, on that process's
devices, and every process returns the merged Result (the parts are exchanged once, at the
end, by :func:`allgather_bytes`)::

    import jax, multistart as ms

    ms.distributed.initialize()  # on Slurm, JAX finds the coordinator itself
    result = search.fit(objective, space)  # the whole Result, in every process

or give each process its part explicitly and merge the saved files later::

    i, k = jax.process_index(), jax.process_count()
    search.fit(objective, space, part=(i, k)).save(f"part-{i}.npz")
    # afterwards, anywhere: ms.Result.merge([f"part-{i}.npz" for i in range(k)])

Fault model: this is JAX's runtime, and in it one process lost (a node that dies, a task the
scheduler kills) stops every process of the job: the survivors' heartbeats to the coordinator
fail and they exit. Nothing is resumed by the runtime. The restart recipe is the scheduler's:
run the job again with the same script (with ``checkpoint_dir`` per part and
``fit(..., resume=True)`` each part continues from its newest checkpoint), or, since parts
never talk to each other, do not use the runtime at all and run the parts as independent tasks
(a Slurm job array), where a failed part is re-run alone. See ``docs/scale-out.md``.
"""

from __future__ import annotations

import numbers
import os

import jax
import numpy as np

__all__ = [
    "initialize",
    "CPU_COLLECTIVES",
    "allgather_bytes",
    "check_devices",
    "resolve_devices",
]

#: The cross-process collectives a CPU process uses (JAX's own choice; "mpi" needs an MPI).
CPU_COLLECTIVES = "gloo"
_USER_CHOICES = ("mpi", "megascale")  # a choice the user made on purpose is kept


def initialize(*args, **kwargs) -> None:
    """Start JAX's distributed runtime: ``jax.distributed.initialize(*args, **kwargs)``.

    Every argument is passed through (``coordinator_address``, ``num_processes``,
    ``process_id``, ``local_device_ids``, ``initialization_timeout``, ...; on Slurm and other
    clusters JAX detects them itself). First, unless JAX runs on accelerators only
    (``JAX_PLATFORMS`` without ``cpu``) or MPI was chosen, CPU processes are given the gloo
    collectives (``jax_cpu_collectives_implementation="gloo"``), without which CPU processes
    cannot run a computation together.

    Call it in every process, once, before anything else uses JAX (a fit, ``jax.devices()``).

    Example:
      >>> import multistart as ms
      >>> ms.distributed.initialize(  # doctest: +SKIP
      ...     coordinator_address="10.0.0.1:1234", num_processes=2, process_id=0
      ... )

    Raises:
      RuntimeError: as ``jax.distributed.initialize`` does (called twice, called after JAX
        started its backends, or the coordinator could not be reached in time).
    """
    if _uses_cpu() and jax.config.jax_cpu_collectives_implementation not in _USER_CHOICES:
        jax.config.update("jax_cpu_collectives_implementation", CPU_COLLECTIVES)
    jax.distributed.initialize(*args, **kwargs)


def _uses_cpu() -> bool:
    """Whether this process may run on the CPU backend (its platforms unset, or list cpu)."""
    platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
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
        raise ValueError(
            f"devices must be None, an int >= 1 or a list of jax devices; got {devices!r}"
        )
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


def resolve_devices(devices) -> list:
    """The devices a search runs on, from its checked ``devices=`` (at fit time).

    The mesh spans this process's devices only (``jax.local_devices()``): in a job of several
    processes each process runs its own part (``fit(..., part=(i, k))``).
    """
    local = jax.local_devices()
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
