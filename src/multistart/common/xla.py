"""The options XLA compiles this library's programs with: :func:`jit` is ``jax.jit`` with them.

On a CPU, XLA writes each fused kernel's code with its fusion emitters (MLIR) by default; its
elemental emitters, still in it, write the same kernels in about two thirds of the time. A small
fit's fixed cost is mostly its compiles: the chunk step of a 2-parameter NIST fit compiled in
0.54 s with ``xla_cpu_use_fusion_emitters=False`` against 0.91 s without
(``profiling/experiments/compile_options.py``), and the kernels ran as fast (the image fit's
and a batch of 2,000 curve fits' steady steps: profiling/HISTORY.md, "The elemental emitters:
a third off every compile"). So on a CPU every program compiled here
(the chunk step, the broad-start filter, the physical map, the curvature and the covariance)
sets that option. The two emitters may round a transcendental function differently in its
last bit, so a fit's digits can differ in the last place from a fit compiled without it (as
between two jaxlib versions); a fit stays deterministic.

Nothing is set on a GPU or TPU, where the option means nothing; where the user's own
``XLA_FLAGS`` name the option (theirs is kept); or where this jaxlib does not know it (a later
XLA may drop it: for a jaxlib release not known to take it, one tiny compile a process finds
out, :func:`options`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import jax
import jaxlib
import numpy as np

__all__ = [
    "OPTIONS",
    "PROBE_NAME",
    "jit",
    "native_float64",
    "options",
    "on_chip",
    "platform",
    "precision",
    "refine_device",
]

#: The compile options of every program on a CPU.
OPTIONS: dict[str, Any] = {"xla_cpu_use_fusion_emitters": False}
#: The name of the one-off probe :func:`options` compiles (not one of a fit's programs:
#: :class:`~multistart.common.monitor.CompileCounter` does not count it: its _NOT_COUNTED).
PROBE_NAME = "multistart_compile_options_probe"


def platform() -> str:
    """The platform a program traced now runs on: the default device's (``jax.default_device``,
    when set) or JAX's default backend's. A program traced for one platform may be written
    differently for another (:func:`multistart.solvers.small.entrywise`), so the keys of kept
    programs hold it."""
    device = jax.config.jax_default_device  # type: ignore[attr-defined]
    if device is None:
        return jax.default_backend()
    return device if isinstance(device, str) else device.platform


_platform = platform


def on_chip() -> bool:
    """Whether a program traced now runs on an accelerator (:func:`platform` not the CPU)."""
    return platform() != "cpu"


def native_float64() -> bool:
    """Whether the platform of :func:`platform` has float64 arithmetic (a TPU emulates it, at
    several times float32's cost, and has no float64 factorisations)."""
    return platform() != "tpu"


#: The most fits a float64 refinement runs on the host's CPU where the chip has no float64
#: arithmetic (:func:`refine_device`). A chip compiles its refinement (float32 steps, the last
#: step and the covariance in emulated float64) in about 80 s on a TPU v5e, its host in about
#: a second; a refined fit costs the host a little more than the chip. A batch's first call
#: of 1,000 fits took 11.9 s refined on the host against 92.6 s on the chip, and 5,000 fits
#: 13.2 s against 99.2 s; their warm calls 0.071 s against 0.042 s and 0.166 s against
#: 0.066 s (``python -m profiling.experiments.refine_where``, each arm a fresh process): at
#: 5,000 fits the chip repays its compile after about 800 calls of that shape (it is kept in
#: the persistent compilation cache), so up to here a batch refines on the host. (1,000
#: before, set when the chip refined in float64 throughout. Past it: 20,000 fits' first call
#: took 95.1 s refined on the chip, its warm calls 0.156 s; refined on the host, in blocks
#: (:data:`multistart.result.laplace.REFINE_BLOCK`), 16.9 s and 0.45-0.49 s, 2.3x the float32
#: call where the chip's is 1.1x.)
REFINE_ON_HOST_FITS = 5000


def refine_device(n_fits: int = 1):
    """The device a float64 refinement of ``n_fits`` float32 answers runs on: the host's CPU
    where the platform has no float64 arithmetic and they are at most
    :data:`REFINE_ON_HOST_FITS`; ``None`` (the default device) otherwise."""
    if native_float64() or n_fits > REFINE_ON_HOST_FITS:
        return None
    return jax.devices("cpu")[0]


def precision(dtype: str | None):
    """The context a computation in ``dtype`` runs in: JAX's float64 on for ``"float64"``, off
    for ``"float32"`` (arrays made inside, data put on a device included, take that type); as
    it is for ``None``."""
    if dtype is None:
        return contextlib.nullcontext()
    return jax.enable_x64(dtype == "float64")


def options(platform: str | None = None) -> dict[str, Any] | None:
    """The compile options for a program on ``platform`` (default: the one a program traced now
    runs on, :func:`platform`), or ``None`` where none are set (the module's docstring says
    where)."""
    if (platform or _platform()) != "cpu" or _named_by_user() or not _accepted():
        return None
    return dict(OPTIONS)


def jit(fn, **kwargs):
    """``jax.jit(fn, **kwargs)``, compiled with :func:`options`."""
    return jax.jit(fn, compiler_options=options(), **kwargs)


def _named_by_user() -> bool:
    flags = os.environ.get("XLA_FLAGS", "")
    return any(name in flags for name in OPTIONS)


#: jaxlib releases (major, minor) known to take :data:`OPTIONS`: no probe compile for them
KNOWN_TO_ACCEPT = {(0, 10)}


@functools.cache
def _accepted() -> bool:
    """Does this jaxlib know :data:`OPTIONS`? A release in :data:`KNOWN_TO_ACCEPT` does;
    for any other, one compile of the identity finds out (about 40 ms in a fresh process)."""
    if _release(jaxlib.__version__) in KNOWN_TO_ACCEPT:
        return True
    return _probe()


def _release(version: str) -> tuple[int, ...]:
    """``(major, minor)`` of a version string (``()`` where it does not parse)."""
    try:
        return tuple(int(v) for v in version.split(".")[:2])
    except ValueError:
        return ()


def _probe() -> bool:
    """Compile the identity with :data:`OPTIONS`: does this jaxlib take them?"""

    def probe(x):
        return x

    probe.__name__ = probe.__qualname__ = PROBE_NAME
    try:
        jax.jit(probe, compiler_options=OPTIONS).lower(np.float32(0)).compile()
    except jax.errors.JaxRuntimeError:
        return False
    return True
