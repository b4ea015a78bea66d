"""The census's child process: trace, lower, compile and time one transform of one cell.

Run as ``python -m profiling.experiments.census.probe '<spec as JSON>'`` by :mod:`.runner`, never
in the parent (a compile that blows up must take only its own process down). The spec
names the cell, size, components, transform, width, number of starts and the persistent-cache
folder.

Transforms, all of the figure of merit in the engine's own coordinates (one flat unconstrained
vector per start, mapped to the physical parameters as a search does):

- ``vag``: ``jit(value_and_grad(fom))`` of one start.
- ``vmap_vag``: ``jit(vmap(value_and_grad(fom)))`` of ``width`` starts.
- ``laxmap_vag``: ``jit(lax.map(value_and_grad(fom), batch_size=width))`` over ``n_starts``
  starts: the in-XLA scan over chunks.
- ``pyloop_vag``: this project's chunk step (``make_start_step`` / ``make_chunk_step``: value
  and gradient, a Prodigy update, the finite guard and the per-start best) for ``width``
  starts, compiled once by :class:`multistart.device.backends.LoopBackend` and swept in Python over
  ``n_starts`` starts.

Stdout carries phase markers (``#census-phase <name>``, so the parent can cap each phase) and a
last line ``#census-result <JSON>``. Cache events (``/jax/compilation_cache/cache_hits`` and
``cache_misses``, the latter recorded when an entry is written) are counted around the measured
compile alone.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

PHASE = "#census-phase"
RESULT = "#census-result"
TRANSFORMS = ("vag", "vmap_vag", "laxmap_vag", "pyloop_vag")
_CACHE_EVENTS = {
    "/jax/compilation_cache/cache_hits": "cache_hits",
    "/jax/compilation_cache/cache_misses": "cache_misses",
    "/jax/compilation_cache/compile_requests_use_cache": "cache_requests",
}


def phase(name: str) -> None:
    """Tell the parent a phase begins (it caps each phase's duration)."""
    print(f"{PHASE} {name}", flush=True)


def configure_cache(cache_dir: str | None) -> None:
    """Point JAX's persistent cache at ``cache_dir`` and cache every entry, however small or
    quick to compile; ``None`` disables the persistent cache.

    JAX decides once per process, at its first compile, whether it uses the cache and where;
    the decision is reset (``reset_cache``, public API) so the setting holds even in a process
    that has compiled before (the tests call :func:`measure` in theirs)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    cc.reset_cache()
    if cache_dir is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class CacheEvents:
    """Context manager: counts JAX's persistent-cache events inside it (``counts``)."""

    def __init__(self):
        self.counts = dict.fromkeys(_CACHE_EVENTS.values(), 0)

    def _on_event(self, event: str, **kwargs) -> None:
        if event in _CACHE_EVENTS:
            self.counts[_CACHE_EVENTS[event]] += 1

    def __enter__(self) -> CacheEvents:
        import jax

        self._listener = self._on_event
        jax.monitoring.register_event_listener(self._listener)
        return self

    def __exit__(self, *exc) -> None:
        import jax

        jax.monitoring.unregister_event_listener(self._listener)


def _starts(space, n: int, dtype):
    """``n`` unconstrained start vectors spread over the prior box (deterministic)."""
    import numpy as np

    from multistart.starts.strategies import uniform_band_starts

    x0 = uniform_band_starts(space, n, np.random.default_rng(0))
    return np.asarray(space.ravel(space.to_unconstrained(x0)), dtype)


def _steady(call, budget_s: float, min_calls: int = 3, max_calls: int = 50) -> tuple[float, int]:
    """Median seconds per ``call()`` (each blocks until done) after one warm-up call."""
    call()
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < min_calls or (len(times) < max_calls and time.perf_counter() < t_end):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


class Program(NamedTuple):
    """A transform ready to measure.

    ``jitted.trace(*args)`` starts the measured compile; ``run(compiled)`` makes one blocking
    call of the compiled program (for ``pyloop_vag``, one sweep of the compiled chunk step over
    every start), which evaluates ``starts_per_call`` starts.
    """

    jitted: Any
    args: tuple
    run: Callable[[Any], None]
    starts_per_call: int
    extra: dict


def _call(args: tuple) -> Callable[[Any], None]:
    import jax

    return lambda compiled: jax.block_until_ready(compiled(*args))


def _vag(vag, u_all, data, width, n_starts) -> Program:
    import jax

    args = (u_all[0], data)
    return Program(jax.jit(vag), args, _call(args), 1, {})


def _vmap_vag(vag, u_all, data, width, n_starts) -> Program:
    import jax

    args = (u_all[:width], data)
    return Program(jax.jit(jax.vmap(vag, in_axes=(0, None))), args, _call(args), width, {})


def _laxmap_vag(vag, u_all, data, width, n_starts) -> Program:
    import jax

    def mapped(u, d):
        return jax.lax.map(lambda one: vag(one, d), u, batch_size=width)

    args = (u_all, data)
    return Program(jax.jit(mapped), args, _call(args), n_starts, {})


def _pyloop_vag(fom_u, u_all, data, width, n_starts) -> Program:
    import jax
    import optax

    from multistart.device.backends import LoopBackend
    from multistart.device.step import (
        clock,
        init_population,
        init_rows,
        make_chunk_step,
        make_start_step,
    )
    from multistart.solvers import OptaxSolver

    solver = OptaxSolver(optax.contrib.prodigy(1.0))
    start_step = make_start_step(fom_u, solver, None, 8)
    chunk_step = make_chunk_step(start_step, functools.partial(init_rows, solver, 1))
    pop = jax.jit(lambda u: init_population(solver, u, 1, 1))(u_all)
    backend = LoopBackend(chunk_step, n_total=n_starts, data=data, pop=pop)
    chunks, args = backend.chunk_calls(backend.rows, width)  # every start, in chunks of this width
    state = {"pop": pop}

    def run(compiled):  # the program measured is the one swept: one step of every start
        state["pop"] = jax.block_until_ready(backend.run(compiled, state["pop"], args, clock(0)))

    class AtWidth:  # what the census traces: the sweep's program at this width
        @staticmethod
        def trace(pop):
            return backend.trace(pop, width)

    extra = {"chunk_calls_per_sweep": len(chunks)}
    return Program(AtWidth, (pop,), run, n_starts, extra)


_BUILDERS = {"vag": _vag, "vmap_vag": _vmap_vag, "laxmap_vag": _laxmap_vag}


def _program(spec: dict) -> Program:
    """Build the cell and the transform that ``spec`` names."""
    import jax
    import jax.numpy as jnp

    from . import cells

    transform = spec["transform"]
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown transform {transform!r}; transforms are {', '.join(TRANSFORMS)}")
    graph = cells.build(spec["cell"], spec["size"], spec.get("components"))
    problem = graph.multistart_problem()
    space, data = problem.space, jax.device_put(problem.data)

    def fom_u(u, d):
        return problem.fom(space.unravel(space.forward_flat(u)), d)

    u_all = jnp.asarray(_starts(space, spec["n_starts"], jnp.zeros(()).dtype))
    sizes = (u_all, data, spec["width"], spec["n_starts"])
    if transform == "pyloop_vag":
        return _pyloop_vag(fom_u, *sizes)
    return _BUILDERS[transform](jax.value_and_grad(fom_u), *sizes)


def measure(spec: dict) -> dict:
    """Trace, lower, compile and time one transform of one cell, in this process."""
    t_start = time.perf_counter()
    phase("setup")
    configure_cache(spec.get("cache_dir"))
    import jax
    import jaxlib

    program = _program(spec)

    phase("trace")
    t0 = time.perf_counter()
    traced = program.jitted.trace(*program.args)
    trace_s = time.perf_counter() - t0
    phase("lower")
    t0 = time.perf_counter()
    lowered = traced.lower()
    lower_s = time.perf_counter() - t0
    hlo_lines = lowered.as_text().count("\n")

    phase("compile")
    with CacheEvents() as events:
        t0 = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - t0

    phase("steady")
    t0 = time.perf_counter()
    program.run(compiled)
    first_call_s = time.perf_counter() - t0
    steady_s, n_calls = _steady(lambda: program.run(compiled), spec.get("steady_budget_s", 1.0))

    device = jax.devices()[0]
    return {
        **program.extra,
        "trace_s": trace_s,
        "lower_s": lower_s,
        "compile_s": compile_s,
        "first_call_s": first_call_s,
        "steady_s": steady_s,
        "steady_per_start_s": steady_s / program.starts_per_call,
        "starts_per_call": program.starts_per_call,
        "steady_calls": n_calls,
        "hlo_lines": hlo_lines,
        **events.counts,
        "child_max_rss_mb": _max_rss_mb(),
        "child_wall_s": time.perf_counter() - t_start,
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "python_version": platform.python_version(),
        "backend": device.platform,
        "device_kind": device.device_kind,
        "x64": bool(jax.config.jax_enable_x64),  # type: ignore[attr-defined]  # a dynamic option
    }


def _max_rss_mb() -> float:
    # ru_maxrss is in kilobytes on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        usage = "usage: python -m profiling.experiments.census.probe '<spec as JSON>'"
        print(usage, file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    out = measure(spec)
    print(f"{RESULT} {json.dumps(out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
