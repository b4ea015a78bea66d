"""Counting compiles through JAX's own monitoring events.

JAX records ``/jax/core/compile/backend_compile_duration`` once per XLA compile request (a hit
in the persistent compilation cache included), with the jitted function's name. A search counts
those events while it runs, so ``result.stats["n_compiles"]`` is measured, not assumed.

JAX also records ``/jax/compilation_cache/cache_hits`` when a compile request was served from
the persistent compilation cache, and ``/jax/compilation_cache/cache_misses`` when a freshly
compiled program was written to it. Those events carry no function name, but both happen on the
compiling thread inside the same request, just before its duration event, so they are held per
thread and credited to the name the duration event brings.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

import jax

__all__ = ["CompileCounter"]

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_EVENTS = {
    "/jax/compilation_cache/cache_hits": "hit",
    "/jax/compilation_cache/cache_misses": "write",
}
# multistart.common.xla's PROBE_NAME (the bottom's modules do not import each other;
# tests/test_xla.py checks that the two agree)
_NOT_COUNTED = "multistart_compile_options_probe"
_lock = threading.Lock()
_active: list[CompileCounter] = []
_installed = False
_pending = threading.local()  # cache outcome of the compile request running on this thread


def _listener(event: str, duration_secs: float, **kwargs) -> None:
    if event != _BACKEND_COMPILE:
        return
    name = str(kwargs.get("fun_name", "?"))
    outcome = getattr(_pending, "outcome", None)
    _pending.outcome = None
    if _NOT_COUNTED in name:  # the process's one check of XLA's options, not a fit's program
        return
    with _lock:
        for counter in _active:
            counter.counts[name] += 1
            counter.seconds[name] += duration_secs
            if outcome == "hit":
                counter.cache_hits[name] += 1
            elif outcome == "write":
                counter.cache_writes[name] += 1


def _event_listener(event: str, **kwargs) -> None:
    outcome = _CACHE_EVENTS.get(event)
    if outcome is not None:
        _pending.outcome = outcome


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            jax.monitoring.register_event_listener(_event_listener)
            _installed = True


class CompileCounter:
    """Context manager: ``counts[fun_name]`` and ``seconds[fun_name]`` of compiles inside it.

    ``cache_hits[fun_name]`` counts those compiles served from the persistent compilation cache,
    ``cache_writes[fun_name]`` those compiled afresh and written to it.
    """

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.cache_hits: Counter[str] = Counter()
        self.cache_writes: Counter[str] = Counter()

    def __enter__(self) -> CompileCounter:
        _install()
        with _lock:
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _active.remove(self)

    def count(self, name_contains: str) -> int:
        return sum(v for k, v in self.counts.items() if name_contains in k)

    @property
    def total(self) -> int:
        return sum(self.counts.values())
