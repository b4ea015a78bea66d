"""Which of the package's modules one fit passes through, and how often it enters each.

Issue 39's measure ("following ``n_starts`` from ``fit`` to the Result: ``identity`` entered
once"). A warm second ``MultiStartLBFGS(n_starts=8).fit`` of a 2-parameter bowl runs under
``sys.setprofile``; a module is entered when a function of it is called from another module
(or from outside the package). Printed: the modules entered, the entries of ``host/identity.py``
with their callers, of ``host/driver.py``, and the twelve modules entered most.

    python profiling/experiments/reentry.py
"""

from __future__ import annotations

import collections
import os
import sys

os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import multistart as ms  # noqa: E402

jax.config.update("jax_enable_x64", True)
ROOT = os.path.dirname(ms.__file__) + os.sep


def _module(frame) -> str | None:
    name = frame.f_code.co_filename
    return name[len(ROOT) :] if name.startswith(ROOT) else None


def main() -> None:
    space = {"x": ms.Uniform(-2 * jnp.ones(2), 2 * jnp.ones(2))}
    search = ms.MultiStartLBFGS(n_starts=8, log_every=0)
    f = lambda p: jnp.sum((p["x"] - 0.3) ** 2)  # noqa: E731
    search.fit(f, space)  # compiles: the measured fit is the second
    entries: collections.Counter = collections.Counter()
    callers: list[str] = []

    def profile(frame, event, arg):
        if event != "call" or (module := _module(frame)) is None:
            return
        caller = frame.f_back
        from_module = _module(caller) if caller is not None else None
        if from_module != module:
            entries[module] += 1
            if module == "host/identity.py":
                callers.append(f"{from_module}:{caller.f_code.co_name} -> {frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        search.fit(f, space)
    finally:
        sys.setprofile(None)
    print(f"modules entered: {len(entries)}")
    print(f"host/identity.py entered {entries['host/identity.py']} times: {'; '.join(callers)}")
    print(f"host/driver.py entered {entries['host/driver.py']} times")
    print("most entered:", ", ".join(f"{m} {c}" for m, c in entries.most_common(12)))


if __name__ == "__main__":
    main()
