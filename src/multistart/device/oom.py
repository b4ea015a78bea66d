"""Is an exception XLA reporting an allocation failure? (The out-of-memory back-off asks.)"""

from __future__ import annotations

import re

__all__ = ["is_out_of_memory"]

_OOM = re.compile(
    r"RESOURCE_EXHAUSTED|out of memory|failed to allocate|could not allocate|allocation fail",
    re.IGNORECASE,
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Is ``exc`` XLA reporting an allocation failure?

    A launch that cannot allocate raises ``RESOURCE_EXHAUSTED: Out of memory ...``; on the CPU
    the failure is asynchronous and a later call or read that depends on the failed buffers
    raises ``INTERNAL: ... Out of memory allocating ...``. Both count.
    """
    if isinstance(exc, MemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    return bool(_OOM.search(str(exc)))
