"""The cache folder and JAX's persistent compilation cache, checked across processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

import multistart as ms
from multistart.device.cache import cache_dir, plan_cache

REPO = Path(__file__).resolve().parents[1]


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MULTISTART_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "multistart"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "multistart"
    monkeypatch.setenv("MULTISTART_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("MULTISTART_CACHE_DIR", "")
    assert cache_dir() is None


def test_plan_precedence_user_folder_then_ours_then_off():
    ours = Path("/c/multistart")
    assert plan_cache(True, None, ours) == ("/c/multistart/jax", "multistart")
    assert plan_cache(True, "/mine", ours) == ("/mine", "user")
    assert plan_cache(True, "/mine", None) == ("/mine", "user")
    assert plan_cache(True, None, None) == (None, "off")
    assert plan_cache(False, "/mine", ours) == (None, "off")


_SCRIPT = r"""
import json, logging, sys
import jax, jax.numpy as jnp

mode = sys.argv[1]
if mode == "disabled-first":
    # JAX decides at its first compile whether it uses the cache, and keeps the answer:
    # multistart must make it reconsider when it turns the cache on later.
    jax.config.update("jax_enable_compilation_cache", False)
    jnp.ones(3) + 1
    jax.config.update("jax_enable_compilation_cache", True)
else:
    jnp.ones(3) * 2  # something compiled before the first fit

hits = []
class Grab(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Persistent compilation cache hit for"):
            hits.append(message.split("'")[1])
compiler_log = logging.getLogger("jax._src.compiler")
compiler_log.addHandler(Grab())
compiler_log.setLevel(logging.DEBUG)
events = []
jax.monitoring.register_event_listener(lambda event, **kw: events.append(event))

import multistart as ms

dir_after_import = jax.config.jax_compilation_cache_dir  # configured at the first fit only

def bowl(p):
    return jnp.sum((p["x"] - 1.0) ** 2)

result = ms.MultiStartAdam(n_starts=4, batch_size=3, n_steps=4, seed=0, log_every=0).fit(
    bowl, {"x": ms.Uniform(-3.0, 3.0, shape=(2,))}
)
print(json.dumps({
    "dir_after_import": dir_after_import,
    "hits": hits,
    "hit_events": events.count("/jax/compilation_cache/cache_hits"),
    "n_cache_hits": result.stats["n_cache_hits"],
    "jax_dir": jax.config.jax_compilation_cache_dir,
    "source": ms.device.cache.cache_setup().source,
    "reason": ms.device.cache.cache_setup().reason,
    "min_compile_time": jax.config.jax_persistent_cache_min_compile_time_secs,
}))
"""


def _run(mode: str, **env) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("MULTISTART_", "JAX_"))}
    full.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        MULTISTART_LOG_LEVEL="WARNING",
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, env=full
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _entries(folder: Path, name: str) -> list[str]:
    return [p.name for p in folder.glob(f"jit_{name}-*")] if folder.exists() else []


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_second_process_loads_the_chunk_step_and_the_filter_from_the_cache(tmp_path):
    ours = tmp_path / "ms"
    first = _run("disabled-first", MULTISTART_CACHE_DIR=str(ours))
    assert first["dir_after_import"] is None  # importing multistart configures nothing
    assert first["source"] == "multistart" and first["jax_dir"] == str(ours / "jax")
    assert first["min_compile_time"] == 0.0
    assert first["hits"] == [] and first["n_cache_hits"] == 0
    # written although JAX had first compiled with the cache disabled
    assert _entries(ours / "jax", "multistart_chunk_step")
    assert _entries(ours / "jax", "multistart_filter_chunk")

    second = _run("plain", MULTISTART_CACHE_DIR=str(ours))
    # JAX's own log and monitoring events: both programs came from the cache
    assert "jit_multistart_chunk_step" in second["hits"]
    assert "jit_multistart_filter_chunk" in second["hits"]
    assert second["hit_events"] >= 2 and second["n_cache_hits"] >= 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_empty_multistart_cache_dir_turns_the_cache_off():
    out = _run("plain", MULTISTART_CACHE_DIR="")
    assert out["source"] == "off" and out["jax_dir"] is None
    assert "MULTISTART_CACHE_DIR is empty" in out["reason"]
    assert out["hits"] == [] and out["n_cache_hits"] == 0


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_users_own_jax_cache_folder_is_respected(tmp_path):
    user, ours = tmp_path / "user", tmp_path / "ms"
    out = _run("plain", JAX_COMPILATION_CACHE_DIR=str(user), MULTISTART_CACHE_DIR=str(ours))
    assert out["source"] == "user" and out["jax_dir"] == str(user)
    assert _entries(user, "multistart_chunk_step") and not ours.exists()


def test_configuring_twice_returns_the_first_setup():
    first = ms.configure_compilation_cache()
    jnp.zeros(2) + 1  # noqa: B018
    assert ms.configure_compilation_cache() is first
