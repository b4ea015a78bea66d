"""Several devices in one process: ``devices=`` shards the starts on a mesh (one compile).

The mesh cases run in one subprocess with four logical CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``, which must be set before JAX starts);
the bad-input cases run here, on this process's one CPU device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from conftest import PARABOLA_SPACE, NoCompile, parabola

import multistart as ms

REPO = Path(__file__).resolve().parents[1]

_WORKER = r"""
import sys, tempfile
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np
import multistart as ms
from conftest import assert_same_result

assert len(jax.devices()) == 4, jax.devices()
SPACE = {"x": ms.Uniform(-4.0, 4.0, shape=(2,))}

def nan_right(p):  # starts that begin right of 1 die at once and are resurrected
    x = p["x"]
    return jnp.where(x[0] > 1.0, jnp.nan, jnp.sum((x - 0.5) ** 2))

def search(**kw):
    base = dict(n_starts=10, n_steps=60, seed=0, n_candidates=0, batch_size=2, resurrect=1,
                log_every=0, progress=False)
    return ms.MultiStartAdam(**{**base, **kw})

fours = {}  # the four-device fits by backend; the resume check below reuses the default's
for backend in ("loop", "scan"):
    one = search(devices=1, backend=backend).fit(nan_right, SPACE)
    four = fours[backend] = search(backend=backend).fit(nan_right, SPACE)  # every local device
    assert one.stats["n_resurrections"] > 0, one.stats  # the case under test
    assert_same_result(one, four)
    assert (one.stats["n_devices"], four.stats["n_devices"]) == (1, 4)
    assert four.stats["n_compiles"] == 1, four.stats
    assert four.stats["batch_size"] == 2  # per device
    # each call steps a chunk on every device: fewer calls than on one device
    assert four.stats["n_chunk_calls"] < one.stats["n_chunk_calls"], backend
    print("ok", backend, one.stats["n_chunk_calls"], four.stats["n_chunk_calls"])

# two of the four, as a list; TikTak (slots reused as starts end)
two = jax.devices()[1:3]
kt = dict(start_strategy="tiktak", n_candidates=40, resurrect=0, n_steps=80)
assert_same_result(search(devices=1, **kt).fit(nan_right, SPACE),
                   search(devices=two, **kt).fit(nan_right, SPACE))
print("ok tiktak")

# halving ranks every device's starts together: the one-device result, pruning included
def bowl(p):  # every start alive, so rung 5 ranks all ten
    return jnp.sum((p["x"] - 0.5) ** 2)

kh = dict(schedule=ms.Halving(r0=5, eta=2, grace=0.0), resurrect=0)
one_h = search(devices=1, **kh).fit(bowl, SPACE)
assert one_h.stats["n_pruned"] > 0, one_h.stats  # the case under test
assert_same_result(one_h, search(**kh).fit(bowl, SPACE))
print("ok halving")

# a checkpointed search resumed longer gives the uninterrupted run; another device count refuses
d = tempfile.mkdtemp()
kc = dict(checkpoint_dir=d, checkpoint_every=20)
search(n_steps=30, **kc).fit(nan_right, SPACE)
resumed = search(n_steps=60, **kc).fit(nan_right, SPACE, resume=True)
assert resumed.stats["resumed_from"] == 30
assert_same_result(resumed, fours[search().backend])  # the uninterrupted run, fitted above
try:
    search(n_steps=60, devices=2, **kc).fit(nan_right, SPACE, resume=True)
except ms.CheckpointMismatch as e:
    assert "n_devices 4 -> 2" in str(e), e
else:
    raise AssertionError("a checkpoint of 4 devices was resumed on 2")
print("ok resume")

# "auto": a width per device, within that device's share of the starts
auto = search(batch_size="auto", resurrect=0).fit(nan_right, SPACE)
assert 1 <= auto.stats["batch_size"] <= 3, auto.stats["batch_size"]  # ceil(10 / 4)
print("ok auto")

# the filter's evaluator takes the steps' copy of the data on one device, not a mesh's (spread
# over the devices: each of its maps of rows puts the data again, as before)
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from multistart.device.evaluator import ValueEvaluator
host = {"c": np.array([0.5, -1.0])}
evaluator = ValueEvaluator(lambda u, d: (jnp.sum((u - d["c"]) ** 2), u), width=4, data=host)
mesh = Mesh(np.array(jax.devices()), ("d",))
assert not evaluator.share(host, jax.device_put(host, NamedSharding(mesh, PartitionSpec())))
assert evaluator.share(host, jax.device_put(host))
print("ok share")

# a chip's form (its platform injected): solves entry by entry, a Jacobian's columns from one
# linearisation (each tangent typed as the point, varying over the mesh), chunks stepped in
# windows of each device's rows: the one-device result (to rounding: the CPU's AVX code of the
# two programs rounds a figure of merit of 1e-31 otherwise)
from multistart.common import xla
xla.platform = lambda: "tpu"
t = np.linspace(0.0, 3.0, 15)

def decay(p):
    return p["a"] * jnp.exp(-t / p["tau"]) + p["c"] - (2.0 * jnp.exp(-t / 0.7) + 0.1)

space = {"a": ms.Uniform(0.1, 5.0), "tau": ms.LogUniform(0.1, 3.0), "c": ms.Uniform(-1, 1)}
ls = dict(n_starts=24, batch_size=4, n_steps=30, seed=3, n_candidates=0, log_every=0,
          progress=False, dtype="float64")
one_c = ms.MultiStartLeastSquares(devices=1, **ls).fit(decay, space)
four_c = ms.MultiStartLeastSquares(**ls).fit(decay, space)
assert four_c.stats["n_devices"] == 4
assert_same_result(one_c, four_c, exact=False, rtol=1e-9, atol=1e-20)
print("ok chip")
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_four_logical_devices_give_the_one_device_result_with_one_compile():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), str(REPO / "tests")]),
    }
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    env["MULTISTART_AUTO_WIDTH"] = "memory"
    env["MULTISTART_CACHE_DIR"] = ""
    env["MULTISTART_LOG_LEVEL"] = "WARNING"
    out = subprocess.run(
        [sys.executable, "-c", _WORKER],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n").count("ok tiktak") == 1, out.stdout
    for word in ("ok loop", "ok scan", "ok halving", "ok resume", "ok auto", "ok share", "ok chip"):
        assert word in out.stdout, out.stdout


@pytest.mark.parametrize(
    "devices, match",
    [
        (0, "devices must be None, an int >= 1"),
        (-2, "devices must be None, an int >= 1"),
        (True, "devices must be None, an int >= 1"),
        ("cpu", "devices must be None, an int >= 1"),
        ([], "devices must not be empty"),
        ([0, 1], "jax.Device objects"),
    ],
)
def test_bad_devices_are_refused_when_the_search_is_built(devices, match):
    with pytest.raises(ValueError, match=match):
        ms.MultiStartAdam(devices=devices)


def test_a_device_twice_is_refused():
    d = jax.devices()[0]
    with pytest.raises(ValueError, match="twice"):
        ms.MultiStartAdam(devices=[d, d])


def test_more_devices_than_the_process_has_is_a_clear_error_before_any_compile():
    n = len(jax.local_devices())
    search = ms.MultiStartAdam(n_starts=4, n_steps=5, devices=n + 1)
    with NoCompile(), pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        search.fit(parabola, PARABOLA_SPACE)


def test_one_device_records_it():
    r = ms.MultiStartAdam(n_starts=3, n_steps=3, n_candidates=0, devices=1).fit(
        parabola, PARABOLA_SPACE
    )
    assert r.stats["n_devices"] == 1


# -- several processes: a fit without part= is split over them and merged in each -------------

_PROCESS = r"""
import sys
import multistart as ms

address, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ms.distributed.initialize(
    coordinator_address=address, num_processes=2, process_id=process_id,
    initialization_timeout=60,
)
import jax
assert jax.process_count() == 2
from conftest import MULTIMODAL_SPACE, multimodal

kw = dict(n_starts=5, batch_size=2, n_steps=40, seed=3, progress=False)
ms.MultiStartAdam(**kw).fit(multimodal, MULTIMODAL_SPACE).save(out)
tiktak = dict(start_strategy="tiktak", n_local=12, local_steps=6, backend="scan")
ms.MultiStartAdam(**tiktak, **kw).fit(multimodal, MULTIMODAL_SPACE).save(out + ".whole.npz")
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_processes_split_a_fit_and_each_gets_the_whole_result(tmp_path):
    from conftest import MULTIMODAL_SPACE, assert_same_result, multimodal, run_two_processes

    outs = [str(tmp_path / f"out-{i}.npz") for i in range(2)]
    logs = run_two_processes(
        _PROCESS, lambda i: [outs[i]], env_extra={"MULTISTART_LOG_LEVEL": "INFO"}
    )
    kw = dict(n_starts=5, batch_size=2, n_steps=40, seed=3, progress=False)
    whole = ms.MultiStartAdam(**kw).fit(multimodal, MULTIMODAL_SPACE)
    for out in outs:  # the split run: each process holds every start's record
        r = ms.Result.load(out)
        assert_same_result(r, whole)
        assert (r.stats["n_processes"], r.stats["n_parts"]) == (2, 2)
        assert r.stats["n_evals"] == whole.stats["n_evals"]
    # a search whose slots are coupled runs on one mesh over both processes' devices (one
    # each), and gives what one process with one device gives (the scan backend here, the
    # loop backend in the test below)
    tiktak = dict(start_strategy="tiktak", n_local=12, local_steps=6, backend="scan")
    coupled = ms.MultiStartAdam(**tiktak, **kw).fit(multimodal, MULTIMODAL_SPACE)
    assert coupled.stats["n_resurrections"] > 0  # the coupling is exercised
    for out in outs:
        r = ms.Result.load(out + ".whole.npz")
        assert_same_result(r, coupled)
        assert (r.stats["n_processes"], r.stats["n_devices"]) == (2, 2)
        assert r.stats["n_resurrections"] == coupled.stats["n_resurrections"]
    assert "runs on one mesh over every process's devices, as start_strategy='tiktak'" in logs[0]
    # only process 0 logs progress
    assert "fitting multimodal" in logs[0] and "fitting multimodal" not in logs[1], logs


# -- a checkpointed search over two processes, killed and restarted ----------------------------

_KILLED = r"""
import os, signal, sys
import multistart as ms

address, process_id, folder, phase, out = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
ms.distributed.initialize(
    coordinator_address=address, num_processes=2, process_id=process_id,
    initialization_timeout=60,
)
from conftest import MULTIMODAL_SPACE, multimodal
from multistart.host.checkpoint import SearchCheckpoints

search = ms.MultiStartLBFGS(
    n_starts=5, batch_size=2, n_steps=40, seed=4, start_strategy="tiktak", n_local=16,
    local_steps=6, progress=False, checkpoint_dir=folder, checkpoint_every=5,
)
if phase == "first":
    from multistart.device.sweeper import Sweeper

    step, calls = Sweeper.sweep, []

    def step_then_signal(self, pop, t, n=1, *rest):  # only process 1 is told to stop, in step 3
        calls.append(t)
        if t < 3 <= t + n and process_id == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, pop, t, n, *rest)

    Sweeper.sweep = step_then_signal
    try:
        search.fit(multimodal, MULTIMODAL_SPACE)
    except ms.SearchInterrupted as e:
        print("interrupted:", e.reason, e.checkpoint, sorted(os.listdir(folder)), flush=True)
    save = SearchCheckpoints.save

    def save_then_die(self, state):
        save(self, state)
        if state.step == 10:  # the job dies (both processes, as JAX's runtime takes it down)
            os.kill(os.getpid(), signal.SIGKILL)

    SearchCheckpoints.save = save_then_die
search.fit(multimodal, MULTIMODAL_SPACE, resume=True).save(out)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_processes_stopped_or_killed_resume_to_the_uninterrupted_result(tmp_path):
    import signal

    from conftest import MULTIMODAL_SPACE, assert_same_result, multimodal, run_two_processes

    folder, outs = str(tmp_path / "ckpt"), [str(tmp_path / f"out-{i}.npz") for i in range(2)]
    # SIGTERM to one process: both stop at the same step, with one checkpoint of it; resumed,
    # the job is then killed (both processes) after the checkpoint of step 10. The process
    # that dies second may first see the other gone and abort (JAX's runtime: one lost
    # process stops all), so SIGABRT counts as dying too.
    died = {-signal.SIGKILL, -signal.SIGABRT}
    logs = run_two_processes(
        _KILLED,
        lambda i: [folder, "first", outs[i]],
        returncodes=lambda codes: set(codes) <= died,
    )
    assert all("interrupted: SIGTERM 3 ['3']" in log for log in logs), logs
    assert sorted(os.listdir(folder), key=int) == ["5", "10"], os.listdir(folder)
    assert not any(os.path.exists(out) for out in outs)
    logs = run_two_processes(
        _KILLED, lambda i: [folder, "resume", outs[i]], env_extra={"MULTISTART_LOG_LEVEL": "INFO"}
    )
    assert "resuming from the checkpoint of step 10" in logs[0], logs[0]
    whole = ms.MultiStartLBFGS(
        n_starts=5,
        batch_size=2,
        n_steps=40,
        seed=4,
        start_strategy="tiktak",
        n_local=16,
        local_steps=6,
        progress=False,
    ).fit(multimodal, MULTIMODAL_SPACE)
    assert whole.stats["n_resurrections"] > 5  # replacements before and after the kill
    for out in outs:  # every process holds the whole, uninterrupted result
        r = ms.Result.load(out)
        assert_same_result(r, whole)
        assert r.stats["resumed_from"] == 10 and r.stats["n_processes"] == 2
        assert r.stats["n_resurrections"] == whole.stats["n_resurrections"]
