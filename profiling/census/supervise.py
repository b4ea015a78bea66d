"""Run a child process under a time cap per phase and a memory cap, and say how it ended.

A compile that explodes must not hang the census or take the machine down. The child runs in
its own process group (so a kill reaches anything it started); it announces phases on stdout
(``#census-phase <name>``), and no phase may last longer than ``phase_cap_s``. Its resident
memory (with its descendants') is sampled every ``poll_s``; above ``rss_cap_mb`` the group is
killed. A child that dies of SIGKILL which this module did not send was most likely killed by
the kernel's OOM killer, and is recorded so.

No JAX here: the parent only watches.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import psutil

__all__ = ["Outcome", "run_supervised", "STATUSES", "default_rss_cap_mb"]

PHASE_PREFIX = "#census-phase "

#: How a child can end, and what each status means in the rows and tables.
STATUSES = {
    "ok": "finished",
    "timeout": "a phase ran past the time cap; killed",
    "memory_cap": "resident memory went above the cap; killed",
    "oom_killed": "killed by SIGKILL not sent by the census (the kernel's OOM killer, likely)",
    "signal": "killed by another signal",
    "error": "exited with a non-zero status",
}


@dataclass
class Outcome:
    """How a supervised child ended.

    Attributes:
      status: a key of :data:`STATUSES`.
      returncode: the child's exit status (negative: killed by that signal).
      phase: the last phase the child announced (``None`` if none).
      note: a sentence saying what happened, for the rows and the table.
      stdout_lines: the child's stdout, line by line (phase markers included).
      stderr_tail: the last lines of its stderr.
      wall_s: seconds from start to exit.
      peak_rss_mb: the largest resident memory sampled (the child and its descendants).
      phases: ``(name, seconds since start)`` of every announced phase.
    """

    status: str
    returncode: int | None
    phase: str | None
    note: str
    stdout_lines: list[str] = field(repr=False)
    stderr_tail: str = field(repr=False)
    wall_s: float
    peak_rss_mb: float
    phases: list[tuple[str, float]] = field(repr=False)


def default_rss_cap_mb(fraction: float = 0.5) -> float:
    """A safe memory cap: ``fraction`` of the memory available now, in MiB."""
    return fraction * psutil.virtual_memory().available / 2**20


def _rss_mb(proc: psutil.Process) -> float:
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _check_caps(phase_cap_s: float, rss_cap_mb: float, poll_s: float) -> None:
    for name, value in (("phase_cap_s", phase_cap_s), ("rss_cap_mb", rss_cap_mb)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a positive number; got {value!r}")
    if not (isinstance(poll_s, (int, float)) and 0 < poll_s <= phase_cap_s):
        raise ValueError(f"poll_s must be positive and at most phase_cap_s; got {poll_s!r}")


def run_supervised(
    cmd: list[str],
    *,
    phase_cap_s: float,
    rss_cap_mb: float,
    env: dict[str, str] | None = None,
    poll_s: float = 0.05,
) -> Outcome:
    """Run ``cmd`` until it exits, a phase outlasts ``phase_cap_s`` or it outgrows ``rss_cap_mb``.

    The time before the first phase marker counts as a phase named ``"start"``.

    Raises:
      ValueError: a cap that is not a positive number.
    """
    _check_caps(phase_cap_s, rss_cap_mb, poll_s)
    lines: list[str] = []
    phases: list[tuple[str, float]] = []
    with tempfile.TemporaryFile(mode="w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: one kill reaches all of it
        )

        stdout = proc.stdout
        assert stdout is not None  # stdout=PIPE

        def read() -> None:
            for line in stdout:
                line = line.rstrip("\n")
                if line.startswith(PHASE_PREFIX):
                    phases.append((line[len(PHASE_PREFIX) :].strip(), time.perf_counter() - t0))
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        peak, killed_for = _watch(proc, t0, phases, phase_cap_s, rss_cap_mb, poll_s)
        proc.wait()
        wall_s = time.perf_counter() - t0
        _kill_group(proc)  # anything the child left behind in its group
        reader.join(timeout=5)
        stdout.close()
        err.seek(0)
        stderr_tail = "\n".join(err.read().splitlines()[-20:])
    phase = phases[-1][0] if phases else None
    status, note = _classify(proc.returncode, killed_for, phase, phase_cap_s, rss_cap_mb, peak)
    return Outcome(status, proc.returncode, phase, note, lines, stderr_tail, wall_s, peak, phases)


def _watch(proc, t0: float, phases: list, phase_cap_s: float, rss_cap_mb: float, poll_s: float):
    """Poll ``proc`` until it exits or outgrows a cap (then kill its group); returns
    ``(peak resident MB, "memory_cap" | "timeout" | None)``."""
    watched = psutil.Process(proc.pid)
    peak, killed_for = 0.0, None
    while proc.poll() is None:
        peak = max(peak, _rss_mb(watched))
        now = time.perf_counter() - t0
        since = now - (phases[-1][1] if phases else 0.0)
        if peak > rss_cap_mb:
            killed_for = "memory_cap"
        elif since > phase_cap_s:
            killed_for = "timeout"
        if killed_for:
            _kill_group(proc)
            break
        time.sleep(poll_s)
    return peak, killed_for


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(returncode, killed_for, phase, phase_cap_s, rss_cap_mb, peak) -> tuple[str, str]:
    where = f" (in phase {phase})" if phase else ""
    if killed_for == "timeout":
        return "timeout", f"{phase or 'start'} did not finish in {phase_cap_s:g} s"
    if killed_for == "memory_cap":
        return (
            "memory_cap",
            f"killed above the memory cap of {rss_cap_mb:.0f} MB{where}; peak {peak:.0f} MB",
        )
    if returncode == 0:
        return "ok", ""
    if returncode == -signal.SIGKILL:
        return (
            "oom_killed",
            f"killed by SIGKILL not sent by the census{where}, most likely the kernel's OOM "
            f"killer; peak sampled RSS {peak:.0f} MB",
        )
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return "signal", f"killed by signal {name}{where}"
    return "error", f"exited with status {returncode}{where}"
