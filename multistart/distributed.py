"""Several processes, one job: :func:`initialize`, JAX's distributed runtime with CPU defaults.

Call :func:`initialize` in every process of the job before its first fit (before anything
else touches JAX), then give each process its own part of the search and merge the parts::

    import jax, multistart as ms

    ms.distributed.initialize()  # on Slurm, JAX finds the coordinator itself
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

import os

import jax

__all__ = ["initialize", "CPU_COLLECTIVES"]

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
