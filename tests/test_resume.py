"""Nothing lost: checkpoints, resume after SIGKILL / Ctrl-C / SIGTERM, and checkpoint faults."""

import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import MULTIMODAL_SPACE, assert_same_result, multimodal, signal_at_step

import multistart as ms
from multistart.host.checkpoint import Checkpointer

pytest.importorskip("orbax.checkpoint")


def search(tmp_path=None, **kw):
    base = dict(n_starts=6, batch_size=4, n_steps=120, seed=0, log_every=0)
    if tmp_path is not None:
        base.update(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=10)
    return ms.MultiStartAdam(**{**base, **kw})


@pytest.fixture(scope="module")
def uninterrupted():
    """The float64 search the signal tests interrupt, run to its end without checkpoints."""
    with jax.enable_x64(True):
        return search(convergence=None).fit(multimodal, MULTIMODAL_SPACE)


@pytest.fixture(scope="module")
def finished_folder(tmp_path_factory):
    """A checkpoint folder of a finished search (``resume=True`` on an empty folder)."""
    tmp_path = tmp_path_factory.mktemp("finished")
    result = search(tmp_path).fit(multimodal, MULTIMODAL_SPACE, resume=True)
    return tmp_path, result


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_returns_the_partial_result_and_resume_completes_it(
    tmp_path, monkeypatch, sig, x64, uninterrupted
):
    full = uninterrupted

    # a context, not monkeypatch.undo(): that would also undo the autouse fixtures' environment
    with monkeypatch.context() as mp, pytest.raises(ms.SearchInterrupted) as info:
        signal_at_step(mp, 37, sig)  # one step a call: the search stops after step 37
        search(tmp_path, convergence=None, steps_per_call=1).fit(multimodal, MULTIMODAL_SPACE)
    stopped = info.value
    assert isinstance(stopped, KeyboardInterrupt)
    assert stopped.reason == signal.Signals(sig).name and stopped.checkpoint == 37
    partial = stopped.result
    assert all(s is ms.Status.INTERRUPTED for s in partial.status)
    assert partial.stats["n_steps_run"] == 37 and np.all(partial.n_steps == 37)
    np.testing.assert_array_equal(partial.history, full.history[:37])
    # the handlers are restored: the default SIGINT handler raises KeyboardInterrupt again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    # resumed with many steps a call (the default's): the same result as one run
    resumed = search(tmp_path, convergence=None).fit(multimodal, MULTIMODAL_SPACE, resume=True)
    assert resumed.stats["resumed_from"] == 37
    assert_same_result(full, resumed)


def test_an_ignored_signal_stays_ignored_through_a_fit(monkeypatch, x64):
    # A job started in the background ignores SIGINT: a Ctrl-C meant for the shell must not
    # stop its fit. (float64 and no convergence: the program of ``uninterrupted``, compiled once.)
    from multistart.device.sweeper import Sweeper

    original = Sweeper.sweep

    def step(self, pop, t, n=1, *rest):  # a call of steps t + 1 to t + n
        if t <= 3 < t + n:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, pop, t, n, *rest)

    monkeypatch.setattr(Sweeper, "sweep", step)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = search(convergence=None).fit(multimodal, MULTIMODAL_SPACE)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.stats["stop_reason"] == "n_steps"


def test_ctrl_c_without_checkpoints_still_returns_the_partial_result(monkeypatch):
    signal_at_step(monkeypatch, 5, signal.SIGINT)
    with pytest.raises(ms.SearchInterrupted) as info:
        search(steps_per_call=1).fit(multimodal, MULTIMODAL_SPACE)  # it stops after step 5
    assert info.value.checkpoint is None
    assert info.value.result.stats["n_steps_run"] == 5
    assert np.all(np.isfinite(info.value.result.foms))


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import multistart as ms
    from multistart.device.sweeper import Sweeper

    # "kill" ends the process in step kill_at; "resume" resumes from the folder and then,
    # in the same process (one interpreter and JAX start fewer), runs the uninterrupted search
    # that the resumed one must equal. The resume goes first: it sees a fresh process, as after
    # a real kill, not one that has already run this search.
    mode, folder, out = sys.argv[1], sys.argv[2], sys.argv[3]
    kill_at = int(sys.argv[4]) if mode == "kill" else 0

    def objective(p):  # nan on a band of x: starts die there and are resurrected
        x = p["x"]
        bowl = jnp.sum((x - 0.3) ** 2) + jnp.sin(4 * x[0]) * 0.1
        return jnp.where(x[1] > 0.5, jnp.nan, bowl)

    space = {"x": ms.Uniform(-3.0, 3.0, shape=(2,))}
    kw = dict(n_starts=7, batch_size=3, n_steps=150, seed=2, log_every=0, resurrect=2,
              n_candidates=0, sync_every=3)
    full_kw = dict(kw)
    kw.update(checkpoint_dir=folder, checkpoint_every=int(os.environ["MS_EVERY"]))
    if mode == "kill":
        original = Sweeper.sweep
        def step(self, pop, t, n=1, *rest):  # killed in step kill_at
            if t < kill_at <= t + n:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, pop, t, n, *rest)
        Sweeper.sweep = step
    rule = ms.MultiStartLBFGS if os.environ["MS_RULE"] == "lbfgs" else ms.MultiStartAdam
    result = rule(**kw).fit(objective, space, resume=(mode == "resume"))
    result.save(out)
    if mode == "resume":
        rule(**full_kw).fit(objective, space).save(sys.argv[4])
    """
)


def _child(tmp_path, *args, rule="adam", every=20):
    env = dict(os.environ, MULTISTART_LOG_LEVEL="WARNING", MULTISTART_CACHE_DIR="")
    env.update(MS_RULE=rule, MS_EVERY=str(every))
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(
    "rule, kill_at, every, kept",
    [("adam", 97, 20, [60, 80]), ("lbfgs", 12, 5, [5, 10])],  # L-BFGS: mid line search
)
def test_killed_with_sigkill_at_an_arbitrary_step_resumes_bit_identically(
    tmp_path, rule, kill_at, every, kept
):
    folder = tmp_path / "ck"
    kw = dict(rule=rule, every=every)
    killed = _child(tmp_path, "kill", folder, tmp_path / "never.npz", kill_at, **kw)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (tmp_path / "never.npz").exists()
    assert Checkpointer(folder).steps() == kept
    # a write torn by the kill leaves orbax's temporary folder behind; it must be ignored
    (folder / f"{kept[-1] + every}.orbax-checkpoint-tmp-1234567").mkdir()

    resumed = _child(
        tmp_path, "resume", folder, tmp_path / "resumed.npz", tmp_path / "full.npz", **kw
    )
    assert resumed.returncode == 0, resumed.stderr
    a, b = ms.Result.load(tmp_path / "full.npz"), ms.Result.load(tmp_path / "resumed.npz")
    assert b.stats["resumed_from"] == kept[-1]
    assert a.stats["n_resurrections"] > 0  # the host state (resurrection) was exercised
    assert a.config["rule"] == rule
    assert_same_result(a, b)


def test_resume_with_an_empty_folder_starts_afresh_and_resume_needs_a_folder(finished_folder):
    folder, a = finished_folder
    assert "resumed_from" not in a.stats
    assert a.stats["checkpoints"][-2:] == Checkpointer(folder / "ck").steps()
    assert a.stats["checkpoints"][-1] == a.stats["n_steps_run"]
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        search().fit(multimodal, MULTIMODAL_SPACE, resume=True)


def test_a_checkpoint_of_another_configuration_is_refused_before_any_compile(finished_folder):
    other = search(finished_folder[0], learning_rate=0.01)
    from multistart.common.monitor import CompileCounter

    with CompileCounter() as compiles, pytest.raises(ms.CheckpointMismatch, match="another config"):
        other.fit(multimodal, MULTIMODAL_SPACE, resume=True)
    assert compiles.count("multistart_chunk_step") == 0


def test_a_checkpoint_of_another_model_is_refused(finished_folder):
    def shifted(p):
        return multimodal(p) + 1.0

    with pytest.raises(ms.CheckpointMismatch, match="another model"):
        search(finished_folder[0]).fit(shifted, MULTIMODAL_SPACE, resume=True)


def test_resuming_a_finished_search_gives_its_result(finished_folder):
    folder, first = finished_folder
    again = search(folder).fit(multimodal, MULTIMODAL_SPACE, resume=True)
    assert again.stats["resumed_from"] == first.stats["n_steps_run"]
    assert_same_result(first, again)


@pytest.mark.parametrize(
    "strategy, reason",
    # the default refills ended slots and ends by TikTak's rediscovery rule: the rename of the
    # resumed run's all-ended sync once wrote the last step again ("already exists")
    [("band", "all ended"), ("auto", "max_discoveries")],
)
def test_resuming_a_search_whose_starts_all_ended_takes_no_step(tmp_path, strategy, reason):
    def bowl(p):
        return jnp.sum((p["x"] - 1.0) ** 2)

    space = {"x": ms.Uniform(-3.0, 3.0, shape=(2,))}
    kw = dict(n_starts=4, n_steps=200, seed=0, log_every=0, checkpoint_every=5)
    kw["start_strategy"] = strategy
    rule = ms.MultiStartLBFGS(checkpoint_dir=str(tmp_path / "ck"), **kw)
    first = rule.fit(bowl, space, resume=True)
    assert first.stats["stop_reason"] == reason and first.stats["n_steps_run"] < 200
    last = first.stats["checkpoints"][-1]  # where the host learnt that every start had ended
    assert first.stats["n_steps_run"] <= last
    again = rule.fit(bowl, space, resume=True)
    assert again.stats["resumed_from"] == last
    assert_same_result(first, again)
    # it stays ended: no step of nothing, no checkpoint after the last
    assert again.stats["n_steps_run"] == first.stats["n_steps_run"]
    assert again.stats["stop_reason"] == reason
    steps = [int(p.name) for p in (tmp_path / "ck").iterdir() if p.name.isdigit()]
    assert max(steps) == last


def test_an_uncreatable_checkpoint_folder_fails_before_any_compile(tmp_path):
    (tmp_path / "file").write_text("")
    bad = search(checkpoint_dir=str(tmp_path / "file" / "ck"))
    with pytest.raises(ms.CheckpointError, match="cannot be created"):
        bad.fit(multimodal, MULTIMODAL_SPACE)


def test_a_failed_checkpoint_write_keeps_the_search_and_the_previous_checkpoint(
    tmp_path, monkeypatch, x64
):
    # float64: the program of ``uninterrupted`` (checkpoint settings are not in the program)
    original = Checkpointer.save

    def full_disk(self, step, state, meta):
        if step >= 30:
            raise ms.CheckpointError(f"could not write a checkpoint of step {step}: disk full")
        return original(self, step, state, meta)

    monkeypatch.setattr(Checkpointer, "save", full_disk)
    with pytest.raises(ms.CheckpointError, match="disk full") as info:
        search(tmp_path, convergence=None).fit(multimodal, MULTIMODAL_SPACE)
    partial = info.value.result
    assert partial is not None and partial.stats["n_steps_run"] == 30
    assert all(s is ms.Status.INTERRUPTED for s in partial.status)
    assert np.all(np.isfinite(partial.foms))
    assert Checkpointer(tmp_path / "ck").steps() == [10, 20]


def test_checkpoint_arguments_are_checked():
    with pytest.raises(ValueError, match="checkpoint_every"):
        search(checkpoint_dir="x", checkpoint_every=0)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        search(checkpoint_dir=3)


# -- fault tests: the search survives what objectives do ----------------------------------------


# a band of each kind to the right of 1, side by side in one objective (one compile, not three)
_BANDS = {"inf": (1.0, 1.5), "-inf": (1.5, 2.0), "nan": (2.0, np.inf)}


def test_nonfinite_regions_of_every_kind_are_isolated():
    def objective(p):
        x = p["x"]
        bowl = (x + 1.0) ** 2
        return jnp.where(
            x > 2.0, jnp.nan, jnp.where(x > 1.5, -jnp.inf, jnp.where(x > 1.0, jnp.inf, bowl))
        )

    result = ms.MultiStartAdam(n_starts=8, n_steps=200, seed=0, n_candidates=0).fit(
        objective, {"x": ms.Uniform(-4.0, 4.0)}
    )
    dead = np.array([s is ms.Status.NONFINITE for s in result.status])
    start = result.start_params["x"]
    assert dead.any() and not dead.all()
    assert np.all(start[dead] > 1.0)
    for kind, (lo, hi) in _BANDS.items():
        band = (start > lo) & (start <= hi)
        assert band.any(), f"no start began in the {kind} band: the case is not tested"
        assert np.all(dead[band]), f"a start beginning in the {kind} band is not dead"
    np.testing.assert_allclose(result.best_params["x"], -1.0, atol=1e-2)


@jax.custom_jvp
def _nan_slope_above_one(x):
    """Zero everywhere, with a nan derivative for x > 1: a finite value, a nan gradient."""
    return jnp.zeros_like(x)


@_nan_slope_above_one.defjvp
def _nan_slope_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _nan_slope_above_one(x), jnp.where(x > 1.0, jnp.nan, 0.0) * t


def test_nan_gradient_with_a_finite_value_is_isolated():
    def objective(p):
        return (p["x"] + 1.0) ** 2 + _nan_slope_above_one(p["x"])

    result = ms.MultiStartAdam(n_starts=8, n_steps=200, seed=0, n_candidates=0).fit(
        objective, {"x": ms.Uniform(-4.0, 4.0)}
    )
    dead = np.array([s is ms.Status.NONFINITE for s in result.status])
    assert dead.any() and np.all(result.start_params["x"][dead] > 1.0)
    # their values were finite: each keeps the point it began at as its best
    np.testing.assert_array_equal(result.params["x"][dead], result.start_params["x"][dead])
    assert np.all(np.isfinite(result.foms))
    np.testing.assert_allclose(result.best_params["x"], -1.0, atol=1e-2)
