"""The driver's stops (targets, budgets), bound flags, progress output, logging, and identity."""

from __future__ import annotations

import functools
import json
import logging

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import PARABOLA_SPACE, NoCompile, assert_same_result, parabola

import multistart as ms
import multistart.host.driver as driver_module
import multistart.host.engine as engine_module
import multistart.host.identity as identity_module

KW = dict(n_starts=4, batch_size=2, n_steps=300, seed=0, log_every=0, n_candidates=0)
# The Adam searches of this file share one program (one compile): the default Adam, 50 steps,
# no convergence test. What a test tests (a stop, a resume, the progress bar) does not depend on
# these settings; only test_a_larger_n_steps_continues_a_finished_search needs a second n_steps.
ADAM = dict(KW, n_steps=50, convergence=None)


@pytest.fixture(scope="module")
def fits():
    """``fits(name)``: fits the tests share, each run once (inside a test: its environment)."""

    @functools.cache
    def fit(name):
        if name == "adam":  # 50 uninterrupted steps of every start
            return ms.MultiStartAdam(**ADAM).fit(parabola, PARABOLA_SPACE)
        if name == "lbfgs":  # L-BFGS to the parabola's minimum, inside the prior
            return ms.MultiStartLBFGS(**KW).fit(parabola, PARABOLA_SPACE)
        raise KeyError(name)

    return fit


def test_target_fom_stops_the_search_with_its_reason(fits):
    full = fits("adam")
    target = float(np.median(full.history[40]))  # reached by some start around step 40
    result = ms.MultiStartAdam(**ADAM, target_fom=target).fit(parabola, PARABOLA_SPACE)
    assert result.stats["stop_reason"] == "target_fom"
    assert result.best_fom <= target
    assert result.stats["n_steps_run"] < ADAM["n_steps"]
    assert all(s is ms.Status.STOPPED for s in result.status)
    # the steps it took are the uninterrupted run's
    k = result.stats["n_steps_run"]
    np.testing.assert_array_equal(result.history, full.history[:k])


def test_max_evals_and_max_time_s_stop_the_search():
    result = ms.MultiStartAdam(**ADAM, max_evals=40).fit(parabola, PARABOLA_SPACE)
    assert result.stats["stop_reason"] == "max_evals"
    assert 40 <= result.stats["n_evals"] < 40 + KW["n_starts"]
    quick = ms.MultiStartAdam(**ADAM, max_time_s=1e-6).fit(parabola, PARABOLA_SPACE)
    assert quick.stats["stop_reason"] == "max_time_s"
    assert quick.stats["n_steps_run"] == 1  # checked at the first sync


def test_a_search_that_ends_reports_why(fits):
    result = fits("adam")  # no convergence test: every start runs its n_steps
    assert result.stats["stop_reason"] == "n_steps"
    assert result.stats["n_steps_run"] == ADAM["n_steps"]
    assert all(s is ms.Status.MAX_STEPS for s in result.status)
    done = fits("lbfgs")
    assert done.stats["stop_reason"] == "all ended"


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"target_fom": float("nan")}, "target_fom"),
        ({"max_evals": 0}, "max_evals"),
        ({"max_time_s": -1.0}, "max_time_s"),
        ({"progress": "yes"}, "progress"),
        ({"log_every": -1}, "log_every"),
    ],
)
def test_bad_stops_fail_before_any_compile(kw, word):
    with NoCompile(), pytest.raises(ValueError, match=word):
        ms.MultiStartAdam(**kw)


def test_a_best_fit_on_a_bound_is_flagged(caplog, fits):
    def objective(p):  # the optimum x = 2 lies outside the prior [0, 1]
        return (p["x"] - 2.0) ** 2 + (p["y"] - 0.5) ** 2

    space = {"x": ms.Uniform(0.0, 1.0), "y": ms.Uniform(0.0, 1.0)}
    with caplog.at_level(logging.WARNING, logger="multistart"):
        result = ms.MultiStartLBFGS(**KW).fit(objective, space)
    assert result.at_bound.all()
    assert "x at a bound" in caplog.text
    inside = fits("lbfgs")  # the parabola's minimum x = 1.5 is well inside Uniform(-4, 4)
    assert not inside.at_bound.any()
    assert "at_bound" in result.to_dataframe().columns


def test_near_bound_names_the_elements():
    space = ms.model.priors.Space({"a": ms.Uniform(0.0, 1.0, shape=(3,)), "n": ms.Normal(0.0, 1.0)})
    params = {"a": np.array([[0.5, 1.0, 0.2], [0.5, 0.5, 0.5]]), "n": np.array([1e9, 0.0])}
    flags, names = space.near_bound(params)
    assert flags.tolist() == [True, False]
    assert names == {0: ["a[1]"]}  # only the starts at a bound
    assert space.at_bound(params).tolist() == flags.tolist()  # the flags alone


def test_one_bound_test_a_space_applies_in_each_priors_uniform_coordinate():
    """Space.near_bound is near_bound (curve_fit's test of its box) in the coordinate each
    bounded prior is uniform in: log x for a LogUniform; x for a one-sided prior, as curve_fit
    flags a one-sided bound."""
    from multistart.model.priors import Space, near_bound

    space = Space({"u": ms.Uniform(1.0, 1e4), "g": ms.LogUniform(1.0, 1e4)})
    x = np.array([9995.0, 9999.5, 5000.0, 1.00001])  # 5e-4, 5e-5, 0.5, 1e-9 of [1, 1e4]
    flags, _ = space.near_bound({"u": x, "g": np.full(4, 50.0)})
    assert flags.tolist() == near_bound(x, 1.0, 1e4).tolist() == [False, True, False, True]
    flags, _ = space.near_bound({"u": np.full(4, 50.0), "g": x})  # log x: 9995 is near
    assert flags.tolist() == near_bound(np.log(x), 0.0, np.log(1e4)).tolist()
    assert flags.tolist() == [True, True, False, True]
    h = np.array([1.00001, 1.0002, 50.0])  # 1e-5 and 2e-4 of max(|1|, 1) above the bound
    below = np.array([-100.005, -100.1, -150.0])  # 5e-5 and 1e-3 of |-100| below a bound
    one_sided = Space({"h": ms.HalfBounded(1.0, 2.0), "b": ms.HalfBounded(-100.0, -150.0, "upper")})
    flags, names = one_sided.near_bound({"h": h, "b": below})
    assert flags.tolist() == [True, False, False]
    assert names == {0: ["b", "h"]}  # in the space's order (sorted paths)
    # the same flags as curve_fit's test of its box, with one-sided bounds
    assert (near_bound(h, 1.0, np.inf) | near_bound(below, -np.inf, -100.0)).tolist() == [
        True,
        False,
        False,
    ]


def test_near_bounds_shortcuts_flag_what_its_elementwise_form_flags():
    """near_bound decides a scalar box's cases once and takes a box per column column by
    column: the flags are those of its elementwise form (bounds shaped ``(1, m)`` take it), for
    two-sided, one-sided, open and empty boxes, at, near and off each bound, nan and inf."""
    from multistart.model.priors import near_bound

    lower = np.array([0.0, 0.0, -np.inf, 1.0, -np.inf, 5.0])
    upper = np.array([10.0, np.inf, 10.0, 20.0, np.inf, 5.0])
    column = np.array([0.0, 5e-4, 9.9995, 10.0, 19.9999, 5.0, 1.0, np.nan, np.inf, -np.inf, 3.0])
    x = np.repeat(column[:, None], lower.size, axis=1)
    x[:, 1] = column * 100  # a one-sided bound in max(|bound|, 1): 0.0 and 0.05 are near
    elementwise = near_bound(x, lower[None, :], upper[None, :])
    assert elementwise.any() and not elementwise.all()
    assert elementwise.tolist() == near_bound(x, lower, upper).tolist()  # a box per column
    for j in range(lower.size):  # a scalar box
        assert near_bound(x[:, j], lower[j], upper[j]).tolist() == elementwise[:, j].tolist()
    assert not near_bound(x[:, 4], lower[4], upper[4]).any()  # no bound: never near one


def test_progress_bar_is_off_when_output_is_not_a_terminal(capsys):
    ms.MultiStartAdam(**ADAM).fit(parabola, PARABOLA_SPACE)
    assert "step/s" not in capsys.readouterr().err
    ms.MultiStartAdam(**ADAM, progress=True).fit(parabola, PARABOLA_SPACE)
    err = capsys.readouterr().err
    assert "multistart" in err and "50/50" in err


def test_default_logging_is_two_info_lines(caplog, monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    with caplog.at_level(logging.INFO, logger="multistart"):
        ms.MultiStartAdam(n_starts=4, batch_size=2, n_steps=30, seed=0).fit(
            parabola, PARABOLA_SPACE
        )
    lines = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) <= 2, [r.getMessage() for r in lines]
    assert lines[0].getMessage().startswith("fitting") and "done" in lines[-1].getMessage()


def test_both_log_lines_name_the_width_the_search_ran_at(caplog, monkeypatch):
    # issue 24 item 9: the first line named the width asked for ('auto', or 100 for 4 starts)
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    with caplog.at_level(logging.INFO, logger="multistart"):
        ms.MultiStartAdam(n_starts=4, batch_size=100, n_steps=3, seed=0).fit(
            parabola, PARABOLA_SPACE
        )
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "4 starts a chunk" in lines[0] and "100" not in lines[0], lines[0]
    assert "(4 starts a chunk," in lines[-1], lines[-1]


# -- one identity: resume only the same search; a larger n_steps runs on -------------------------

pytest.importorskip("orbax.checkpoint")


def _ck(tmp_path, **kw):
    return dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=10, **kw)


def test_resuming_with_another_learning_rate_is_a_mismatch_naming_it(tmp_path):
    base = ADAM  # 0.05 is MultiStartAdam's default learning rate: this file's one Adam program
    ms.MultiStartGradient(optax.adam(0.05), **base, **_ck(tmp_path)).fit(parabola, PARABOLA_SPACE)
    with NoCompile(), pytest.raises(ms.CheckpointMismatch, match="another rule"):
        ms.MultiStartGradient(optax.adam(0.5), **base, **_ck(tmp_path)).fit(
            parabola, PARABOLA_SPACE, resume=True
        )
    # a named rule's hyperparameters are in its configuration: the mismatch names them
    ms.MultiStartAdam(learning_rate=0.05, **base, **_ck(tmp_path / "named")).fit(
        parabola, PARABOLA_SPACE
    )
    with NoCompile(), pytest.raises(ms.CheckpointMismatch, match="learning_rate"):
        ms.MultiStartAdam(learning_rate=0.5, **base, **_ck(tmp_path / "named")).fit(
            parabola, PARABOLA_SPACE, resume=True
        )


def test_a_larger_n_steps_continues_a_finished_search(tmp_path, fits):
    base = ADAM
    assert base["n_steps"] == 50
    full = fits("adam")
    ms.MultiStartAdam(**{**base, "n_steps": 30}, **_ck(tmp_path)).fit(parabola, PARABOLA_SPACE)
    longer = ms.MultiStartAdam(**{**base, "n_steps": 50}, **_ck(tmp_path)).fit(
        parabola, PARABOLA_SPACE, resume=True
    )
    assert longer.stats["resumed_from"] == 30
    np.testing.assert_array_equal(longer.foms, full.foms)
    np.testing.assert_array_equal(longer.history, full.history)
    np.testing.assert_array_equal(longer.n_steps, full.n_steps)
    with pytest.raises(ms.CheckpointMismatch, match="n_steps >= 50"):
        ms.MultiStartAdam(**{**base, "n_steps": 40}, **_ck(tmp_path)).fit(
            parabola, PARABOLA_SPACE, resume=True
        )


def test_resume_replays_replacements_due_at_the_checkpointed_step(tmp_path):
    def objective(p):
        x = p["x"]
        return jnp.where(x[1] > 0.5, jnp.nan, jnp.sum((x - 0.3) ** 2) + 0.1 * jnp.sin(4 * x[0]))

    space = {"x": ms.Uniform(-3.0, 3.0, shape=(2,))}
    base = dict(n_starts=6, batch_size=3, seed=2, log_every=0, n_candidates=0, resurrect=2)
    full = ms.MultiStartAdam(**base, n_steps=40).fit(objective, space)
    # stop the first run exactly on a step where the uninterrupted run replaced dead starts
    replaced_at = sorted({r["replaced_at"] for r in full.incarnations} - {None})
    assert replaced_at, "the objective must kill some starts"
    k = replaced_at[-1]
    ms.MultiStartAdam(**base, n_steps=k, **_ck(tmp_path)).fit(objective, space)
    longer = ms.MultiStartAdam(**base, n_steps=40, **_ck(tmp_path)).fit(
        objective, space, resume=True
    )
    assert longer.stats["resumed_from"] == k
    assert_same_result(full, longer)


def test_another_configuration_is_refused_before_the_filter_compiles(tmp_path):
    base = dict(ADAM, n_candidates=8)  # the broad-start filter on: it compiles in plan()
    ms.MultiStartAdam(**base, **_ck(tmp_path)).fit(parabola, PARABOLA_SPACE)
    with NoCompile(), pytest.raises(ms.CheckpointMismatch, match="seed 0 -> 1"):
        ms.MultiStartAdam(**{**base, "seed": 1}, **_ck(tmp_path)).fit(
            parabola, PARABOLA_SPACE, resume=True
        )


def test_budgets_may_change_on_resume(tmp_path, fits):
    """max_evals, max_time_s and target_fom only decide when a search stops: a preempted job
    resumed with new ones continues, and ends as an uninterrupted run would."""
    full = fits("adam")
    first = ms.MultiStartAdam(**ADAM, max_evals=40, **_ck(tmp_path)).fit(parabola, PARABOLA_SPACE)
    assert first.stats["stop_reason"] == "max_evals" and first.stats["n_steps_run"] == 10
    resumed = ms.MultiStartAdam(**ADAM, max_time_s=3600.0, target_fom=-1.0, **_ck(tmp_path)).fit(
        parabola, PARABOLA_SPACE, resume=True
    )
    assert resumed.stats["resumed_from"] == 10
    assert resumed.stats["stop_reason"] == "n_steps"
    assert_same_result(full, resumed)


def _identities_made(fit) -> list[str]:
    """The configurations (their hash) of the identities a call of ``fit`` makes."""
    made: list[str] = []
    real = identity_module.search_identity

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        made.append(out.hashes["config"])
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module, "search_identity", spy)
        patch.setattr(driver_module, "search_identity", spy)
        fit()
    return made


def test_a_fit_makes_its_identity_once_and_a_resumed_one_once_more_early(tmp_path):
    """Issue 39's "identity entered once": a fit makes its identity once, after its starts are
    planned, and the Result and the checkpoints record that one; only a resumed fit makes one
    more, before the plan (without the starts), to refuse another search's checkpoint early."""
    search = ms.MultiStartAdam(**ADAM, **_ck(tmp_path))
    made = _identities_made(lambda: search.fit(parabola, PARABOLA_SPACE))
    result = search.fit(parabola, PARABOLA_SPACE)  # (what the Result records)
    assert len(made) == 1 and made[0] == result.stats["identity"]["config"]
    made = _identities_made(lambda: search.fit(parabola, PARABOLA_SPACE, resume=True))
    assert len(made) == 2 and made[1] == result.stats["identity"]["config"] != made[0]


def test_large_data_are_hashed_on_a_worker_thread_to_the_same_identity(monkeypatch, tmp_path):
    """A fit whose data pass HASH_LATER_BYTES and that writes no checkpoint hashes them on the
    identity's worker thread while it runs; its Result records the identity hashed at once.
    A fit that writes checkpoints hashes at once (its checkpoint records the identity)."""
    import threading

    from multistart.common import digest

    t = np.linspace(0.0, 3.0, 12)
    ys = np.stack([a * np.exp(-t / 0.7) for a in (1.0, 2.0, 3.0)])

    def decay(x, a, tau):
        return a * jnp.exp(-x / tau)

    threads: list[str] = []
    real = digest.hash_array

    def spy(h, a):
        threads.append(threading.current_thread().name)
        return real(h, a)

    monkeypatch.setattr(identity_module, "hash_array", spy)

    def fit(**kw):
        threads.clear()
        info = ms.curve_fit(
            decay, t, ys, p0=[1.0, 1.0], batched=True, n_starts=2, full_output=True,
            log_every=0, progress=False, **kw,
        )[2]  # fmt: skip
        return info["fits"].result.stats["identity"], set(threads)

    at_once, where = fit()
    assert where == {threading.current_thread().name}  # a few hundred bytes: hashed at once
    monkeypatch.setattr(identity_module, "HASH_LATER_BYTES", 0)
    later, where = fit()
    assert later == at_once and where and all(n.startswith("multistart-identity") for n in where)
    checkpointed, where = fit(**_ck(tmp_path))
    assert checkpointed == at_once and where == {threading.current_thread().name}


_IDENTITIES = """
import json, sys
sys.path.insert(0, sys.argv[1])
import test_driver
print(json.dumps(test_driver.identities()))
"""


def identities() -> dict:
    """The identity hashes of three fits of different rules and steps (the L-BFGS rule, Adam,
    least squares behind its bounds), each a few steps; the same in every process."""
    t = np.linspace(0.0, 3.0, 12)

    def residuals(p):
        return p["a"] * jnp.exp(-t / p["tau"]) - 2.0 * jnp.exp(-t / 0.7)

    space = {"a": ms.Uniform(0.1, 5.0), "tau": ms.LogUniform(0.1, 3.0)}
    fits = {
        "lbfgs": lambda: ms.MultiStartLBFGS(**{**KW, "n_steps": 3}).fit(parabola, PARABOLA_SPACE),
        "adam": lambda: ms.MultiStartAdam(**{**ADAM, "n_steps": 3}).fit(parabola, PARABOLA_SPACE),
        "least_squares": lambda: ms.MultiStartLeastSquares(**{**KW, "n_steps": 3}).fit(
            residuals, space
        ),
    }
    return {name: fit().stats["identity"] for name, fit in fits.items()}


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_fits_identity_is_the_same_in_another_process():
    """The identity hashes lowered text (no object address in it), so a checkpoint is resumed,
    and a tuned width found, by another process: the same three fits hash alike in a fresh
    process and in this one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "MULTISTART_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join([str(here.parent / "src"), str(here.parent)]),
    }
    out = subprocess.run(
        [sys.executable, "-c", _IDENTITIES, str(here)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    theirs, ours = json.loads(out.stdout.strip().splitlines()[-1]), identities()
    assert theirs == ours
    assert len({v["rule"] for v in ours.values()}) == 3  # three steps, three hashes
