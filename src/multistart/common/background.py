"""Work done beside the caller, on a worker thread of its own kind.

A search hands a few pieces of host work to a thread while it goes on: the hashes of large data
(:mod:`multistart.host.identity`), a chip's covariance compile
(:func:`multistart.curve_fit.covariance.compile_ahead`) and a batch's data sent to the chip
(:func:`multistart.device.placement.send_ahead`). Each kind has one thread, made when first
needed and kept for the process (``multistart-<kind>``): the work lets go of the GIL (hashlib,
XLA's compiler, a host-to-device copy), and one kind's long task (a compile of seconds) does
not hold up another's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["submit"]

_pools: dict[str, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def submit(kind: str, fn: Callable[..., Any], /, *args: Any) -> Future:
    """A Future of ``fn(*args)``, run on the one worker thread of ``kind`` (named
    ``multistart-<kind>``), in the order submitted; its exception is the Future's."""
    with _lock:
        pool = _pools.get(kind)
        if pool is None:
            pool = _pools[kind] = ThreadPoolExecutor(1, thread_name_prefix=f"multistart-{kind}")
    return pool.submit(fn, *args)
