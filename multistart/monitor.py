"""Counting compiles through JAX's own monitoring events.

JAX records ``/jax/core/compile/backend_compile_duration`` once per XLA compile request (a hit
in the persistent compilation cache included), with the jitted function's name. A search counts
those events while it runs, so ``result.stats["n_compiles"]`` is measured, not assumed.
"""

from __future__ import annotations

import threading
from collections import Counter

import jax

__all__ = ["CompileCounter"]

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_active: list[CompileCounter] = []
_installed = False


def _listener(event: str, duration: float, **kwargs) -> None:
    if event != _BACKEND_COMPILE:
        return
    name = str(kwargs.get("fun_name", "?"))
    with _lock:
        for counter in _active:
            counter.counts[name] += 1
            counter.seconds[name] += duration


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _installed = True


class CompileCounter:
    """Context manager: ``counts[fun_name]`` and ``seconds[fun_name]`` of compiles inside it."""

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()

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
