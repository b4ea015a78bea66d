"""Shared fixtures: small objectives with known minima, and an x64 switch."""

from __future__ import annotations

import os

# The suite never reads or writes a persistent compilation cache in its own process (the user's
# or ours): results and compile counts must not depend on what earlier runs left on disk. The
# cache itself is tested in subprocesses with their own folders (test_cache.py). Set before
# JAX is imported, which reads JAX_COMPILATION_CACHE_DIR once.
os.environ["MULTISTART_CACHE_DIR"] = ""
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import multistart as ms  # noqa: E402


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
        from multistart.monitor import CompileCounter

        self.counter = CompileCounter().__enter__()
        return self

    def __exit__(self, *exc):
        self.counter.__exit__(*exc)
        assert self.counter.total == 0, dict(self.counter.counts)


def tree_equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(x, y, equal_nan=True) for x, y in zip(la, lb, strict=True)
    )


def same_result(a: ms.Result, b: ms.Result) -> bool:
    """Bit-identical per-start records, history and resurrection records."""
    return (
        np.array_equal(a.foms, b.foms)
        and tree_equal(a.params, b.params)
        and tree_equal(a.start_params, b.start_params)
        and np.array_equal(a.history, b.history, equal_nan=True)
        and np.array_equal(a.n_steps, b.n_steps)
        and np.array_equal(a.best_step, b.best_step)
        and list(a.status) == list(b.status)
        and np.array_equal(a.resurrections, b.resurrections)
        and len(a.incarnations) == len(b.incarnations)
        and all(
            tree_equal(x["params"], y["params"])
            and {k: v for k, v in x.items() if "params" not in k}
            == {k: v for k, v in y.items() if "params" not in k}
            for x, y in zip(a.incarnations, b.incarnations, strict=True)
        )
    )
