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
import pytest  # noqa: E402

import multistart as ms  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "WARNING")


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
