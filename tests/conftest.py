"""Shared fixtures: small objectives with known minima, and an x64 switch."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
from pathlib import Path

# The suite never reads the user's persistent compilation cache or ours. It keeps one of its
# own, shared by its tests (xdist workers and the subprocesses they start) and kept between runs
# in this checkout (.pytest_cache/multistart-jax, git-ignored), so a program compiled by a test,
# or by an earlier run of the suite, is loaded instead of compiled again: a run after the first
# takes about half the time of a cold one on 2 cores (profiling/HISTORY.md). A cache hit
# gives the same executable a compile would (JAX keys an entry by the program, the compiler's
# options and versions, and the device) and still counts as a compile (monitor.py), so results
# and compile counts do not depend on what is in the cache. MULTISTART_SUITE_JAX_CACHE names
# another folder, used as it is; set empty, the run is cold (a fresh folder, removed at its
# end), as on CI's fresh checkout. The cache itself is tested in subprocesses with their own folders
# (test_cache.py). MULTISTART_CACHE_DIR="" keeps tuning records out of the user's folder
# (tests of them point it at their own). Set before JAX is imported, which reads
# JAX_COMPILATION_CACHE_DIR once.
_SUITE_CACHE_ENV = "MULTISTART_SUITE_JAX_CACHE"
_SUITE_CACHE_MAX_BYTES = 1 << 30  # past this (many runs of changed code) it is emptied first
_KEPT_SUITE_CACHE = Path(__file__).resolve().parent.parent / ".pytest_cache" / "multistart-jax"


def _suite_cache() -> tuple[str, bool]:
    """``(folder, fresh)`` for the first process of a run; ``fresh``: made for this run only."""
    asked = os.environ.get(_SUITE_CACHE_ENV)
    if asked == "":
        return tempfile.mkdtemp(prefix="multistart-suite-jax-cache-"), True
    folder = Path(asked) if asked else _KEPT_SUITE_CACHE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        if size > _SUITE_CACHE_MAX_BYTES:
            shutil.rmtree(folder)
            folder.mkdir(parents=True)
        _drop_truncated_entries(folder)
    except OSError:  # a read-only checkout: a cold run
        return tempfile.mkdtemp(prefix="multistart-suite-jax-cache-"), True
    return str(folder), False


def _drop_truncated_entries(folder: Path) -> None:
    """Remove entries that do not decompress. JAX writes an entry in place, not by a rename, so
    a process killed while writing one (the suite kills some on purpose) can leave it truncated;
    JAX would then compile that program at every read, with a warning, and never replace it."""
    try:
        from jax._src.compilation_cache import decompress_executable
    except ImportError:  # another JAX: nothing checked
        return
    for entry in folder.glob("*-cache"):
        try:
            decompress_executable(entry.read_bytes())
        except Exception:
            entry.unlink(missing_ok=True)


# The first process of the run decides; xdist workers and subprocesses inherit the folder.
_OWN_SUITE_CACHE = False
if _SUITE_CACHE_ENV not in os.environ or os.environ[_SUITE_CACHE_ENV] == "":
    _folder, _OWN_SUITE_CACHE = _suite_cache()
    os.environ[_SUITE_CACHE_ENV] = _folder
os.environ["MULTISTART_CACHE_DIR"] = ""
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_SUITE_CACHE_ENV]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import multistart as ms  # noqa: E402


def pytest_sessionfinish(session):
    if _OWN_SUITE_CACHE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(os.environ[_SUITE_CACHE_ENV], ignore_errors=True)


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "WARNING")


@pytest.fixture(autouse=True)
def _no_width_env(monkeypatch):
    """Width caps from the caller's shell would change widths. (MULTISTART_CACHE_DIR stays
    empty, above: tests of tuning records point it at their own folder.) "auto" keeps the
    memory bound without timing: a timed width could differ between two fits of one test, and
    each would cost compiles; test_width.py turns the timing on where it tests it."""
    monkeypatch.delenv("MULTISTART_MAX_BATCH", raising=False)
    monkeypatch.delenv("MULTISTART_MEMORY_BUDGET_GB", raising=False)
    monkeypatch.setenv("MULTISTART_AUTO_WIDTH", "memory")


@pytest.fixture(autouse=True)
def _float_type_restored(request):
    """A test leaves JAX's float type as it found it: a test that switched float64 on for the
    process and left it so once made a later file's float32 figures print in float64."""
    before = bool(jax.config.jax_enable_x64)
    yield
    after = bool(jax.config.jax_enable_x64)
    if after != before:
        jax.config.update("jax_enable_x64", before)
        pytest.fail(f"{request.node.nodeid} left jax_enable_x64 {after} (it was {before})")


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def parabola(p):
    return jnp.sum((p["x"] - 1.5) ** 2) + (p["y"] + 0.5) ** 2


PARABOLA_SPACE = {"x": ms.Uniform(-4.0, 4.0, shape=(2,)), "y": ms.Normal(0.0, 2.0)}
PARABOLA_MIN = {"x": [1.5, 1.5], "y": -0.5}


def rosenbrock(p):
    x = p["x"]
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


ROSENBROCK_SPACE = {"x": ms.Uniform(-2.0, 2.0, shape=(2,))}


def multimodal(p):
    """Minimum at n ~ -0.5 (global) among several local minima, times a LogUniform scale term."""
    return jnp.sin(3.0 * p["n"]) + 0.1 * p["n"] ** 2 + (jnp.log(p["s"]) - 0.3) ** 2


MULTIMODAL_SPACE = {"n": ms.Normal(0.0, 2.0), "s": ms.LogUniform(0.1, 10.0)}


class NoCompile:
    """Fails the test if anything is compiled inside the block."""

    def __enter__(self):
        from multistart.common.monitor import CompileCounter

        self.counter = CompileCounter().__enter__()
        return self

    def __exit__(self, *exc):
        self.counter.__exit__(*exc)
        assert self.counter.total == 0, dict(self.counter.counts)


# The fields of a Result that two runs of "the same search" must share: all but those that
# describe the run rather than its outcome (incarnations are compared record by record).
RUN_FIELDS = ("stats", "paths", "config", "incarnations")
RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ms.Result) if f.name not in RUN_FIELDS)


def _assert_leaf_equal(x, y, where: str, rtol: float | None, atol: float) -> None:
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape, f"{where}: shape {x.shape} != {y.shape}"
    if x.dtype == object or y.dtype == object:  # a status column: enum members
        assert x.tolist() == y.tolist(), f"{where}: {x.tolist()} != {y.tolist()}"
        return
    if rtol is None or not np.issubdtype(x.dtype, np.floating):
        # exact: the same dtype and the same values, nan where the other has nan
        assert x.dtype == y.dtype, f"{where}: dtype {x.dtype} != {y.dtype}"
        np.testing.assert_array_equal(x, y, err_msg=where, strict=True)
    else:
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=where)


def _assert_tree_equal(a, b, where: str, rtol: float | None, atol: float) -> None:
    sa, sb = jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)
    assert sa == sb, f"{where}: tree {sa} != {sb}"
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    for i, (x, y) in enumerate(zip(la, lb, strict=True)):
        _assert_leaf_equal(x, y, f"{where}[leaf {i}]", rtol, atol)


def _assert_record_equal(r: dict, q: dict, where: str, rtol: float | None, atol: float) -> None:
    assert r.keys() == q.keys(), f"{where}: keys {sorted(r)} != {sorted(q)}"
    for k in r:
        if k.endswith("params") or isinstance(r[k], (float, np.floating, np.ndarray)):
            _assert_tree_equal(r[k], q[k], f"{where}[{k!r}]", rtol, atol)
        else:  # ints, None, a Status
            assert r[k] == q[k], f"{where}[{k!r}]: {r[k]!r} != {q[k]!r}"


def assert_same_result(
    a: ms.Result, b: ms.Result, *, exact: bool = True, rtol: float | None = None, atol: float = 0.0
) -> bool:
    """Assert two Results hold the same outcome for every start (``stats`` may differ).

    Compares every field in ``RESULT_FIELDS`` and every incarnation record. ``exact=True``
    (the default) demands the same dtypes and the same values bit for bit (nan where the other
    has nan): the check behind every "bit-identical" claim. ``exact=False`` compares floating
    fields within ``rtol`` (required) and ``atol``, and everything else (status, step counts,
    indices, the best index) exactly.

    Returns:
      True, so that ``assert assert_same_result(a, b)`` reads naturally; a difference raises an
      ``AssertionError`` naming the field.
    """
    if exact == (rtol is not None) or (exact and atol):
        raise TypeError("give exact=True, or exact=False with an rtol (and an atol)")
    for name in RESULT_FIELDS:
        _assert_tree_equal(getattr(a, name), getattr(b, name), name, rtol, atol)
    assert len(a.incarnations) == len(b.incarnations), (
        f"incarnations: {len(a.incarnations)} != {len(b.incarnations)} records"
    )
    for i, (r, q) in enumerate(zip(a.incarnations, b.incarnations, strict=True)):
        _assert_record_equal(r, q, f"incarnations[{i}]", rtol, atol)
    return True


def same_result(a: ms.Result, b: ms.Result) -> bool:
    """Kept for the test files that still call it: ``assert_same_result(a, b)``, exact."""
    return assert_same_result(a, b)


def signal_at_step(monkeypatch, k: int, sig=signal.SIGINT):
    """Send ``sig`` to this process during the call that takes the k-th step of the search
    (deterministic): the search stops at the end of that call, after step k with
    ``steps_per_call=1``.

    A signal this process ignores (pytest started in the background) gets Python's default
    handler first: a search leaves an ignored signal ignored, and the test is of a signal.
    """
    if signal.getsignal(sig) is signal.SIG_IGN:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    from multistart.device.sweeper import Sweeper

    original = Sweeper.sweep

    def step(self, pop, t, n=1, *rest):  # a call of steps t + 1 to t + n
        if t < k <= t + n:
            os.kill(os.getpid(), sig)
        return original(self, pop, t, n, *rest)

    monkeypatch.setattr(Sweeper, "sweep", step)


def run_two_processes(
    code: str, args, *, env_extra=None, timeout: float = 240, returncodes=(0, 0)
) -> list[str]:
    """Run ``python -c code ADDRESS i *args(i)`` for i = 0, 1: two processes of one JAX job on
    127.0.0.1 (``ms.distributed.initialize`` in ``code``), the repository and ``tests/`` on
    their path. Returns both logs; fails the test unless they exit with ``returncodes`` (a pair,
    or a function of the list of both that says whether they are right)."""
    import socket
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo), str(repo / "tests")]),
    }
    env.pop("XLA_FLAGS", None)
    env.update(env_extra or {})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, address, str(i), *map(str, args(i))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    codes = [p.returncode for p in procs]
    ok = returncodes(codes) if callable(returncodes) else codes == list(returncodes)
    assert ok, (codes, logs)
    return logs
