"""The compile heartbeat: "still compiling ..." lines while a compile runs long."""

import logging
import threading

import jax
import jax.numpy as jnp
import pytest

import multistart as ms
from multistart.common import log

# Generous: only reached if the heartbeat never comes (the test then fails, it does not hang).
_GUARD_S = 60.0


class _Beats(logging.Handler):
    """Collects heartbeat lines and signals each one."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self.beat = threading.Event()

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("still compiling"):
            self.lines.append(message)
            self.beat.set()


@pytest.fixture
def beats(monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    monkeypatch.setenv("MULTISTART_COMPILE_HEARTBEAT_S", "0.05")
    handler = _Beats()
    log.logger.addHandler(handler)
    old_level = log.logger.level
    log.logger.setLevel(logging.INFO)
    yield handler
    log.logger.removeHandler(handler)
    log.logger.setLevel(old_level)


def test_a_long_block_logs_still_compiling_lines(beats):
    with log.compile_heartbeat("the model"):
        assert beats.beat.wait(_GUARD_S)  # the block lasts until a heartbeat was logged
        beats.beat.clear()
        assert beats.beat.wait(_GUARD_S)  # and they keep coming
    assert len(beats.lines) >= 2
    assert all(line.startswith("still compiling the model (") for line in beats.lines)
    assert all(line.endswith(" s)") for line in beats.lines)


def test_slow_compiles_of_a_fit_get_heartbeats(beats, monkeypatch):
    """A compile made slow on purpose: it returns only after a heartbeat was logged."""
    original = jax.stages.Lowered.compile

    def slow_compile(self, *args, **kwargs):
        beats.beat.clear()
        assert beats.beat.wait(_GUARD_S), "no heartbeat during a slow compile"
        return original(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", slow_compile)
    result = ms.MultiStartAdam(n_starts=3, n_steps=3, log_every=0).fit(
        lambda p: jnp.sum(p["x"] ** 2), {"x": ms.Uniform(-1.0, 1.0, shape=(2,))}
    )
    assert result.stats["n_compiles"] == 1
    assert any(line.startswith("still compiling the chunk step (") for line in beats.lines)
    assert any(line.startswith("still compiling the broad-start filter (") for line in beats.lines)


def test_heartbeat_interval_from_the_environment(monkeypatch):
    monkeypatch.delenv("MULTISTART_COMPILE_HEARTBEAT_S", raising=False)
    assert log.heartbeat_interval() == 30.0
    monkeypatch.setenv("MULTISTART_COMPILE_HEARTBEAT_S", "2.5")
    assert log.heartbeat_interval() == 2.5
    monkeypatch.setenv("MULTISTART_COMPILE_HEARTBEAT_S", "0")
    assert log.heartbeat_interval() == 0.0
    with log.compile_heartbeat("nothing"):  # off: no thread is started
        assert not any(t.name.startswith("multistart-heartbeat") for t in threading.enumerate())
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv("MULTISTART_COMPILE_HEARTBEAT_S", bad)
        with pytest.raises(ValueError, match="MULTISTART_COMPILE_HEARTBEAT_S must be"):
            log.heartbeat_interval()


def test_the_heartbeat_thread_ends_with_the_block(beats):
    with log.compile_heartbeat("quick"):
        pass
    assert not any(t.name == "multistart-heartbeat-quick" for t in threading.enumerate())
