"""Where the test suite's compile time goes: a pytest plugin.

    PYTHONPATH=profiling python -m pytest -q -p suite_compiles [pytest args]

Each test's XLA backend compiles (count and seconds, counted by the library's own
``multistart.common.monitor.CompileCounter``, cache hits included: a hit still reports a short
compile),
each program's name, and each chunk-step program it lowers (a SHA-1 of the lowered text, so two
tests that compile the same program are seen to share it). At the end the plugin prints the
suite's totals, a table per test file (backend compile seconds, chunk steps lowered, and how many
of those were distinct programs), then the programs that took the most compile seconds. With
xdist each worker writes its records to a folder and the controller adds them up.

The figures behind issue 14's notes on the suite's time ("compiling is about half of it; the
chunk step is the program compiled; most programs are distinct"). Lowering a chunk step twice
(once here to hash it) adds a little time to each fit; compare runs with the plugin on both.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import tempfile
from pathlib import Path

import pytest

_DIR_ENV = "SUITE_COMPILES_DIR"
_current: dict[str, str | None] = {"test": None}
_records: dict[str, dict] = collections.defaultdict(
    lambda: {"n_compiles": 0, "compile_s": 0.0, "chunk_steps": [], "by_name": {}}
)


def pytest_configure(config):
    if not hasattr(config, "workerinput") and _DIR_ENV not in os.environ:
        os.environ[_DIR_ENV] = tempfile.mkdtemp(prefix="suite-compiles-")  # workers inherit it
    from multistart.device import backends

    original = backends.lower_and_compile

    def hashing(jitted, what, *args):
        if _current["test"] is not None and what.startswith("the chunk step"):
            text = jitted.lower(*args).as_text()
            _records[_current["test"]]["chunk_steps"].append(
                hashlib.sha1(text.encode()).hexdigest()[:12]
            )
        return original(jitted, what, *args)

    backends.lower_and_compile = hashing


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    from multistart.common.monitor import CompileCounter

    _current["test"] = item.nodeid
    with CompileCounter() as counter:  # the library's own count of backend compiles
        yield
    _current["test"] = None
    rec = _records[item.nodeid]
    rec["n_compiles"] += counter.total
    rec["compile_s"] += sum(counter.seconds.values())
    for name, seconds in counter.seconds.items():
        n, s = rec["by_name"].get(name, (0, 0.0))
        rec["by_name"][name] = (n + counter.counts[name], s + seconds)


def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = Path(os.environ[_DIR_ENV]) / f"{worker}.json"
    path.write_text(json.dumps(_records))


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):
        return
    records: dict[str, dict] = {}
    for path in Path(os.environ[_DIR_ENV]).glob("*.json"):
        records.update(json.loads(path.read_text()))
        path.unlink()
    files: dict[str, list] = collections.defaultdict(lambda: [0.0, 0, 0, set()])
    for test, rec in records.items():
        row = files[test.split("::")[0]]
        row[0] += rec["compile_s"]
        row[1] += rec["n_compiles"]
        row[2] += len(rec["chunk_steps"])
        row[3].update(rec["chunk_steps"])
    every = [h for rec in records.values() for h in rec["chunk_steps"]]
    write = terminalreporter.write_line
    write("")
    write(
        f"suite_compiles: {sum(r[1] for r in files.values())} backend compiles, "
        f"{sum(r[0] for r in files.values()):.1f} s compiling; {len(every)} chunk steps "
        f"lowered, {len(set(every))} distinct programs"
    )
    write(f"{'compile s':>10} {'compiles':>9} {'chunk steps':>12} {'distinct':>9}  file")
    for name, (seconds, n, steps, distinct) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        write(f"{seconds:10.1f} {n:9d} {steps:12d} {len(distinct):9d}  {name}")
    programs: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for rec in records.values():
        for name, (n, seconds) in rec["by_name"].items():
            programs[name][0] += n
            programs[name][1] += seconds
    write("")
    write(f"{'compile s':>10} {'compiles':>9}  program (the 12 with the most seconds)")
    for name, (n, seconds) in sorted(programs.items(), key=lambda kv: -kv[1][1])[:12]:
        write(f"{seconds:10.1f} {n:9d}  {name}")
