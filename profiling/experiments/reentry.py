"""Which of the package's modules one fit passes through, and how often it enters each.

Issue 39's measure ("following ``n_starts`` from ``fit`` to the Result: ``identity`` entered
once"). A warm second ``MultiStartLBFGS(n_starts=8).fit`` of a 2-parameter bowl runs under
``sys.setprofile``; a module is entered when a function of it is called from another module
(or from outside the package). Printed: the modules entered, the entries of ``host/identity.py``
with their callers, of ``host/driver.py``, and the twelve modules entered most.

Issue 71's measure, "the driver's walk returns to a module already left", is printed too: a
reader starts at ``driver.run`` and reads each function once, the first time it is called,
then goes back to its caller. The walk is the sequence of modules the reader is in; a return
is a step of the walk into a module it was in before and left (going back to a caller's module
counts, as a reader flips back to it); of those, the calls into a module read before and left
are printed apart. Printed: the modules the walk visits, its returns, the modules reopened
most, and the pairs of modules it moves between most.

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
    seen: set = set()  # the functions the walk has read
    reading: list = []  # the frames of the functions being read, innermost last
    walk: list[str] = []  # the modules the reader is in, in order
    reopened: list[str] = []  # calls the walk follows into a module it read before and left

    def step(module: str) -> None:
        if not walk or walk[-1] != module:
            walk.append(module)

    def profile(frame, event, arg):
        module = _module(frame)
        if event == "return" and reading and frame is reading[-1]:
            reading.pop()
            if reading:
                step(_module(reading[-1]))
            return
        if event != "call" or module is None:
            return
        code = frame.f_code
        started = reading or (module == "host/driver.py" and code.co_name == "run")
        if started and code not in seen:
            seen.add(code)
            if walk and walk[-1] != module and module in walk:
                reopened.append(module)
            reading.append(frame)
            step(module)
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
    total = sum(entries.values())
    print(
        f"modules entered: {len(entries)}; entries {total}, {total - len(entries)} of them into "
        "a module entered before"
    )
    print(f"host/identity.py entered {entries['host/identity.py']} times: {'; '.join(callers)}")
    print(f"host/driver.py entered {entries['host/driver.py']} times")
    print("most entered:", ", ".join(f"{m} {c}" for m, c in entries.most_common(12)))
    returns = [m for i, m in enumerate(walk) if m in walk[:i]]
    print(
        f"driver's walk: {len(set(walk))} modules, {len(returns)} returns to a module already "
        f"left ({len(reopened)} of them calls, the rest back to a caller), {len(seen)} "
        "functions read"
    )
    most = collections.Counter(reopened).most_common(12)
    print("most reopened:", ", ".join(f"{m} {c}" for m, c in most))
    moves = collections.Counter(frozenset(p) for p in zip(walk, walk[1:], strict=False))
    pairs = moves.most_common(12)
    print("most moved between:", ", ".join(" <-> ".join(sorted(p)) + f" {c}" for p, c in pairs))


if __name__ == "__main__":
    main()
