"""The benchmarks' one harness: fresh processes, one BLAS thread, interleaved repeats, medians,
ratios against a named peer arm, and a JSON record of each run.

A benchmark script measures its arms with these helpers and ends by writing a record
(``--json PATH``)::

    record = harness.Record("fixed_cost", args)
    record.figure("DanWood ours 2nd s", 0.31)
    record.figure("DanWood scipy s", 0.09)
    record.ratio("DanWood ours 2nd / scipy", "DanWood ours 2nd s", "DanWood scipy s")
    record.write(args.json)

The record holds the machine (cores, Python, JAX and the BLAS libraries as this process sees
them), the git commit of the checkout, the command, every figure and every ratio (an arm's
figure over its peer's, both measured in the same run: the number to read, as absolute seconds
on a shared machine are noise). ``python -m profiling.compare A.json B.json`` sets two records
side by side.

An arm that must start cold (imports, compiles, caches) runs in a fresh process: the script
runs itself with a child option, ``harness.fresh_process(__file__, "--arm", name)``, and the
child hands its figures back with ``harness.child_result(figures)``. ``interleave`` takes turns
between arms (the order reversed every other round), so that drift in a shared machine's speed
favours none, and ``median`` reduces the repeats.

The scipy peer arms run with one BLAS thread (``one_blas_thread``): OpenBLAS's worker threads
spin after each call on the cores XLA's next evaluation needs (``peers.py`` measures it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

__all__ = [
    "RESULT",
    "Record",
    "add_arguments",
    "blas_threads",
    "child_result",
    "commit",
    "fresh_process",
    "interleave",
    "machine",
    "median",
    "one_blas_thread",
    "print_ratios",
    "ratios",
]

ROOT = Path(__file__).resolve().parent.parent
RESULT = "RESULT "  # a child's figures: the last stdout line that starts so, then JSON
SCHEMA = 1


# -- one BLAS thread ------------------------------------------------------------------------------


def one_blas_thread():
    """A context in which the BLAS libraries loaded so far (numpy's, scipy's) use one thread."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def blas_threads() -> str:
    """The BLAS libraries loaded and their thread counts, for a benchmark's header line."""
    from threadpoolctl import threadpool_info

    rows = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i['num_threads']} threads" for i in rows) or "none"


# -- repeats and medians --------------------------------------------------------------------------


def median(values) -> float:
    """The median of a non-empty sequence of numbers, as a float."""
    values = list(values)
    if not values:
        raise ValueError("median of no values")
    return float(np.median(np.asarray(values, dtype=np.float64)))


def interleave(arms: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, list]:
    """Every arm called ``repeats`` times, taking turns (the order reversed every other round,
    so that drift in the machine's speed favours none); ``{arm: [what each call returned]}``."""
    if repeats < 1:
        raise ValueError(f"repeats must be a positive int; got {repeats}")
    out: dict[str, list] = {name: [] for name in arms}
    names = list(arms)
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            out[name].append(arms[name]())
    return out


def ratios(figures: Mapping[str, float], peer: str) -> dict[str, float]:
    """Each arm's figure over the peer arm's (``peer`` must be one of ``figures``)."""
    if peer not in figures:
        raise KeyError(f"the peer arm {peer!r} is not one of {sorted(figures)}")
    return {name: float(value) / float(figures[peer]) for name, value in figures.items()}


def print_ratios(title: str, figures: Mapping[str, float], peer: str, unit: str = "s") -> None:
    """A table of each arm's figure and its ratio against ``peer``, measured in the same run."""
    width = max(len(name) for name in figures) + 2
    print(f"{title} (ratio: arm / {peer})")
    for name, r in ratios(figures, peer).items():
        print(f"  {name:<{width}}{figures[name]:>10.4g} {unit:<3}{r:>8.3f}")


# -- fresh processes ------------------------------------------------------------------------------


def child_result(figures: Mapping) -> None:
    """What a child process hands back to ``fresh_process``: its figures as one JSON line."""
    print(RESULT + json.dumps(dict(figures)), flush=True)


def fresh_process(
    script, *args, env: Mapping[str, str | None] | None = None, required: bool = True
) -> dict | None:
    """Run ``python script *args`` in a new process that imports the same library as this one
    (its folder first on ``PYTHONPATH``) and return the figures it printed with
    ``child_result``, and the child's wall, its imports included, as ``"process_s"``.

    ``env`` adds to this process's environment (a value of None removes the name). A child
    that fails raises, or with ``required=False`` is reported on stderr and gives None (the
    other arms' figures are kept).
    """
    import time

    import multistart

    library = str(Path(multistart.__file__).resolve().parent.parent)
    path = os.pathsep.join([library, *(p for p in sys.path if p)])
    environ = {**os.environ, "PYTHONPATH": path}
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True, env=environ
    )
    process_s = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines() if proc.returncode == 0 else []):
        if line.startswith(RESULT):
            return {**json.loads(line[len(RESULT) :]), "process_s": process_s}
    failure = (
        f"{Path(script).name} {' '.join(map(str, args))} printed no result "
        f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    )
    if required:
        raise RuntimeError(failure)
    print(failure, file=sys.stderr, flush=True)
    return None


# -- the record -----------------------------------------------------------------------------------


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """What this process can read about the machine it runs on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    facts = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "platform": platform.platform(),
        "processor": platform.machine(),
        "python": platform.python_version(),
        **{name: _version(name) for name in ("jax", "jaxlib", "numpy", "scipy", "optax")},
        "blas_default": blas_threads() if "numpy" in sys.modules else None,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("MULTISTART_", "XLA_"))},
    }
    if "jax" in sys.modules:  # the devices as the benchmark saw them (never starts JAX itself)
        device = sys.modules["jax"].devices()[0]
        facts["device"] = f"{device.device_kind} ({device.platform})"
        facts["n_devices"] = sys.modules["jax"].device_count()
    return facts


def commit(root: Path = ROOT) -> dict:
    """The checkout's git commit, and whether its tracked files differ from it."""

    def git(*argv):
        run = subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True)
        return run.stdout.strip() if run.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def add_arguments(parser: argparse.ArgumentParser, quick: str | None = None) -> None:
    """The options every benchmark takes: ``--json PATH`` (write the record there) and, unless
    the script has its own, ``--quick`` (seconds-long sizes the test suite runs)."""
    parser.add_argument("--json", default=None, metavar="PATH", help="write the record here")
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)


def _script_path() -> str:
    script = Path(sys.argv[0]).resolve()
    try:
        return str(script.relative_to(ROOT))
    except ValueError:
        return str(script)


class Record:
    """One run's figures and ratios, with the machine and commit they came from."""

    def __init__(self, benchmark: str, args: argparse.Namespace | None = None):
        self.benchmark = benchmark
        self.quick = bool(getattr(args, "quick", False))
        self.command = " ".join(["python", _script_path(), *sys.argv[1:]])
        self.figures: dict[str, float] = {}
        self.ratios: dict[str, dict] = {}
        self.notes: dict[str, object] = {}

    def figure(self, name: str, value) -> float:
        """A measurement of this run (seconds, a count, a score), by a name unique in it."""
        value = float(value) if value is not None else float("nan")
        self.figures[name] = value
        return value

    def ratio(self, name: str, arm: str, peer: str) -> float:
        """The figure ``arm`` over the figure ``peer`` (both recorded already), kept as ``name``."""
        for figure in (arm, peer):
            if figure not in self.figures:
                raise KeyError(f"no figure {figure!r} recorded; have {sorted(self.figures)}")
        value = self.figures[arm] / self.figures[peer] if self.figures[peer] else float("nan")
        self.ratios[name] = {"value": value, "arm": arm, "peer": peer}
        return value

    def as_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "benchmark": self.benchmark,
            "command": self.command,
            "quick": self.quick,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "commit": commit(),
            "figures": self.figures,
            "ratios": self.ratios,
            "notes": self.notes,
        }

    def write(self, path) -> dict | None:
        """Write the record as JSON to ``path`` (nothing when ``path`` is None); return it."""
        if path is None:
            return None
        record = self.as_dict()
        Path(path).write_text(json.dumps(record, indent=1, default=str) + "\n")
        print(f"record written to {path}")
        return record
