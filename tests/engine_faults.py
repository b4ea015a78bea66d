"""Faults for the real-engine tests (tests/test_engines.py), in the engine's worker process.

A ``submit`` wrapped by :func:`faulty` sends one part through :func:`run_with_fault` instead:
the first time that part runs anywhere (claimed with an exclusive file, so an engine's retry
of it runs cleanly), it is killed with SIGKILL while its fit runs, or raises. The workers
import this module by name (tests/ is on their PYTHONPATH).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from multistart.host import iterate


def faulty(submit, kind: str, index: int, folder: str):
    """``submit`` whose part ``index`` runs :func:`run_with_fault` (``kind``: kill, raise)."""

    def wrapped(fn, *args):
        if args[3][0] == index:
            return submit(run_with_fault, kind, folder, fn, *args)
        return submit(fn, *args)

    return wrapped


def _claim(folder: str, kind: str) -> bool:
    """True the first time ``kind`` runs, in any process (the engine's retries see False)."""
    try:
        fd = os.open(os.path.join(folder, f"{kind}-claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def run_with_fault(kind: str, folder: str, fn, *args):
    if not _claim(folder, kind):
        Path(folder, f"{kind}-reran-{os.getpid()}").touch()
        return fn(*args)
    if kind == "raise":
        raise RuntimeError("this part failed on purpose")
    assert kind == "kill", kind

    def kill(*_, **__):  # at the part's first host sync: inside its fit's loop, deterministic
        Path(folder, "killed").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)

    # the loop calls iterate.apply (a module global) at every sync; a thread polling the main
    # thread's frames could miss a short fit on a loaded machine
    iterate.apply = kill
    fn(*args)
    Path(folder, "fit-ended-before-the-kill").touch()  # the test fails on this file
    time.sleep(600)
    raise AssertionError("not killed")
