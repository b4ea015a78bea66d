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
side by side, and ``python -m profiling.report`` writes docs/profiling.md's tables from the
records kept in ``profiling/records/`` (``read_record`` reads one).

An arm that must start cold (imports, compiles, caches) runs in a fresh process: the script
runs itself with a child option, ``harness.fresh_process(__file__, "--arm", name)``, and the
child hands its figures back with ``harness.child_result(figures)``. Every child runs in a
process group of its own under optional caps (``run_child``: a time cap, restarted by each
progress line the child prints, and a memory cap), and is killed with its group past them: a
compile that explodes neither hangs a benchmark nor takes the shared machine down.
``interleave`` takes turns between arms (the order reversed every other round), so that drift
in a shared machine's speed favours none, and ``median`` reduces the repeats.

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
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "CHILD_ENDS",
    "RESULT",
    "Child",
    "Record",
    "add_arguments",
    "blas_threads",
    "child_env",
    "child_result",
    "commit",
    "fresh_process",
    "interleave",
    "machine",
    "median",
    "one_blas_thread",
    "print_ratios",
    "ratios",
    "read_record",
    "run_child",
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


CHILD_ENDS = {
    "ok": "finished",
    "error": "exited with a non-zero status",
    "timeout": "ran past the time cap (since its start or its last progress line); killed",
    "memory": "its resident memory went above the cap; killed",
    "oom_killed": "killed by a SIGKILL the harness did not send (the kernel's OOM killer, likely)",
    "signal": "killed by another signal",
}


@dataclass
class Child:
    """How a child process ended (``run_child``).

    Attributes:
      status: a key of :data:`CHILD_ENDS`.
      returncode: its exit status (negative: killed by that signal).
      note: a sentence saying how it ended ("" when it finished).
      lines: its stdout, line by line.
      stderr: the last 60 lines of its stderr (a traceback).
      wall_s: seconds from its start to its end, its imports included.
      peak_rss_mb: the largest resident memory sampled (with its descendants'); 0 unless a
        memory cap was given.
      progress: ``(text, seconds since the start)`` of each progress line it printed.
    """

    status: str
    returncode: int | None
    note: str
    lines: list[str] = field(repr=False)
    stderr: str = field(repr=False)
    wall_s: float
    peak_rss_mb: float = 0.0
    progress: list[tuple[str, float]] = field(default_factory=list, repr=False)

    def result(self) -> dict | None:
        """The figures the child handed back with ``child_result`` (None if it printed none)."""
        for line in reversed(self.lines):
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT) :])
        return None


def run_child(
    argv,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    memory_mb: float | None = None,
    progress: str | None = None,
    poll_s: float = 0.05,
) -> Child:
    """Run ``argv`` in a process group of its own until it exits, runs past ``timeout_s`` or
    its resident memory (with its descendants') passes ``memory_mb``; then kill the whole group
    (so nothing it started outlives it) and say how it ended.

    With ``progress`` (a line prefix), each stdout line that starts so restarts the time cap:
    a child that announces its phases (setup, compile, steady, ...) is capped per phase, and the
    last phase it announced names where it was stopped. A compile that explodes can then neither
    hang a benchmark nor take the shared machine down.
    """
    for name, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb)):
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a positive number or None; got {value!r}")
    lines: list[str] = []
    marks: list[tuple[str, float]] = []
    with tempfile.TemporaryFile(mode="w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(a) for a in argv],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=None if env is None else dict(env),
            start_new_session=True,  # its own process group: one kill reaches all of it
        )
        stdout = proc.stdout
        assert stdout is not None  # stdout=PIPE

        def read() -> None:
            for line in stdout:
                line = line.rstrip("\n")
                if progress and line.startswith(progress):
                    marks.append((line[len(progress) :].strip(), time.perf_counter() - t0))
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            peak, killed_for = _watch(proc, t0, marks, timeout_s, memory_mb, poll_s)
            proc.wait()
        except BaseException:  # Ctrl-C: its own group would not get the terminal's signal
            _kill_group(proc)
            raise
        wall_s = time.perf_counter() - t0
        _kill_group(proc)  # anything the child left behind in its group
        reader.join(timeout=5)
        stdout.close()
        err.seek(0)
        stderr = "\n".join(err.read().splitlines()[-60:])
    where = marks[-1][0] if marks else None
    status, note = _ending(proc.returncode, killed_for, where, timeout_s, memory_mb, peak)
    return Child(status, proc.returncode, note, lines, stderr, wall_s, peak, marks)


def _watch(proc, t0, marks, timeout_s, memory_mb, poll_s):
    """Poll ``proc`` until it exits or passes a cap (then kill its group); returns
    ``(peak resident MB, "memory" | "timeout" | None)``."""
    if timeout_s is None and memory_mb is None:
        proc.wait()
        return 0.0, None
    watched = None
    if memory_mb is not None:
        import psutil  # only a memory cap samples the child's memory

        watched = psutil.Process(proc.pid)
    peak, killed_for = 0.0, None
    while proc.poll() is None:
        if watched is not None:
            peak = max(peak, _rss_mb(watched))
        since = time.perf_counter() - t0 - (marks[-1][1] if marks else 0.0)
        if memory_mb is not None and peak > memory_mb:
            killed_for = "memory"
        elif timeout_s is not None and since > timeout_s:
            killed_for = "timeout"
        if killed_for:
            _kill_group(proc)
            break
        time.sleep(poll_s)
    return peak, killed_for


def _rss_mb(proc) -> float:
    import psutil

    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _ending(returncode, killed_for, where, timeout_s, memory_mb, peak) -> tuple[str, str]:
    at = f" (after {where!r})" if where else ""
    if killed_for == "timeout":
        return "timeout", f"{where or 'start'} did not finish in {timeout_s:g} s"
    if killed_for == "memory":
        return (
            "memory",
            f"killed above the memory cap of {memory_mb:.0f} MB{at}; peak {peak:.0f} MB",
        )
    if returncode == 0:
        return "ok", ""
    if returncode == -signal.SIGKILL:
        return (
            "oom_killed",
            f"killed by a SIGKILL the harness did not send{at}, most likely the OOM killer",
        )
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return "signal", f"killed by signal {name}{at}"
    return "error", f"exited with status {returncode}{at}"


def child_env(env: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """This process's environment for a child that imports the same library as this one (its
    folder first on ``PYTHONPATH``), with ``env`` added (a value of None removes the name)."""
    import multistart

    library = str(Path(multistart.__file__).resolve().parent.parent)
    path = os.pathsep.join([library, str(ROOT), *(p for p in sys.path if p)])
    environ = {**os.environ, "PYTHONPATH": path}
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return environ


def fresh_process(
    script,
    *args,
    env: Mapping[str, str | None] | None = None,
    required: bool = True,
    timeout_s: float | None = None,
    memory_mb: float | None = None,
) -> dict | None:
    """Run ``python script *args`` in a new process that imports the same library as this one
    (``child_env``) and return the figures it printed with ``child_result``, and the child's
    wall, its imports included, as ``"process_s"``.

    ``env`` adds to this process's environment (a value of None removes the name);
    ``timeout_s`` and ``memory_mb`` cap the child (``run_child``). A child that fails raises,
    or with ``required=False`` is reported on stderr and gives None (the other arms' figures
    are kept).
    """
    child = run_child(
        [sys.executable, script, *args],
        env=child_env(env),
        timeout_s=timeout_s,
        memory_mb=memory_mb,
    )
    figures = child.result() if child.status == "ok" else None
    if figures is not None:
        return {**figures, "process_s": child.wall_s}
    failure = (
        f"{Path(script).name} {' '.join(map(str, args))} printed no result "
        f"({child.status}: {child.note or CHILD_ENDS[child.status]}):\n{child.stderr[-3000:]}"
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


def read_record(path) -> dict:
    """The record a benchmark wrote to ``path``; a clear error for a file that is not one."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the record {path}: {e}") from e
    if not isinstance(record, dict) or "figures" not in record or "ratios" not in record:
        raise ValueError(f"{path} is not a benchmark record (no figures and ratios)")
    return record
