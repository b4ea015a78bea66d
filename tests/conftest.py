"""Shared fixtures: small objectives with known minima, and an x64 switch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import multistart as ms


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "WARNING")


@pytest.fixture(autouse=True)
def _no_width_env(monkeypatch, tmp_path_factory):
    """Width caps from the caller's shell would change widths; tuning records stay here."""
    monkeypatch.delenv("MULTISTART_MAX_BATCH", raising=False)
    monkeypatch.delenv("MULTISTART_MEMORY_BUDGET_GB", raising=False)
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


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
