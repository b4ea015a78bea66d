"""Many steps a call (``steps_per_call``): the host dispatches and reads once per call, and no
result depends on how many steps a call takes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from conftest import MULTIMODAL_SPACE, NoCompile, assert_same_result, multimodal, rosenbrock

import multistart as ms

ROSEN = {"x": ms.Uniform(-2.0, 2.0, shape=(2,))}


def residuals(p):
    return jnp.stack([10.0 * (p["x"][1] - p["x"][0] ** 2), 1.0 - p["x"][0]])


# Each kind of search the host loop treats differently: converging starts leaving the sweep
# (Adam's window guard), a rule with line searches (L-BFGS), least squares, refills on the
# sync schedule (TikTak), the halving schedule, and a ragged chunk at width 3.
SEARCHES = {
    "adam": lambda k: ms.MultiStartAdam(
        n_starts=7, batch_size=3, n_steps=300, seed=0, steps_per_call=k
    ).fit(multimodal, MULTIMODAL_SPACE),
    "lbfgs": lambda k: ms.MultiStartLBFGS(
        n_starts=5, batch_size=2, n_steps=200, seed=1, steps_per_call=k
    ).fit(rosenbrock, ROSEN),
    # L-BFGS's default with one refill: its queue is empty from then on
    "lbfgs one refill": lambda k: ms.MultiStartLBFGS(
        n_starts=5, batch_size=2, n_steps=200, seed=1, n_local=6, steps_per_call=k
    ).fit(rosenbrock, ROSEN),
    "least squares": lambda k: ms.MultiStartLeastSquares(
        n_starts=6, batch_size=4, n_steps=100, seed=0, start_strategy="band", steps_per_call=k
    ).fit(residuals, ROSEN),
    "tiktak": lambda k: ms.MultiStartLBFGS(
        n_starts=4,
        batch_size=2,
        n_steps=120,
        seed=2,
        start_strategy="tiktak",
        n_local=10,
        steps_per_call=k,
    ).fit(multimodal, MULTIMODAL_SPACE),
    # refills in one chunk: a call ends at the first step where one of its starts ends
    "tiktak one chunk": lambda k: ms.MultiStartLBFGS(
        n_starts=4,
        batch_size=4,
        n_steps=120,
        seed=2,
        start_strategy="tiktak",
        n_local=10,
        steps_per_call=k,
    ).fit(multimodal, MULTIMODAL_SPACE),
    "least squares tiktak one chunk": lambda k: ms.MultiStartLeastSquares(
        n_starts=3,
        batch_size=3,
        n_steps=100,
        seed=0,
        start_strategy="tiktak",
        n_local=9,
        steps_per_call=k,
    ).fit(residuals, ROSEN),
    "halving": lambda k: ms.MultiStartAdam(
        n_starts=8,
        batch_size=4,
        n_steps=200,
        seed=0,
        schedule="halving",
        convergence=None,
        steps_per_call=k,
    ).fit(multimodal, MULTIMODAL_SPACE),
}


@functools.cache
def fitted(name: str, k):
    with jax.enable_x64(True):
        return SEARCHES[name](k)


@pytest.mark.parametrize("name", list(SEARCHES))
def test_results_do_not_depend_on_the_steps_a_call_takes(name):
    one = fitted(name, 1)
    for k in (5, "auto"):
        assert_same_result(one, fitted(name, k), exact=True)
        if "lbfgs" not in name and name != "tiktak one chunk":  # every step costs alike:
            # evaluations counted to the step the best was found
            assert fitted(name, k).stats["evals_to_best"] == one.stats["evals_to_best"], k


def test_many_steps_a_call_cut_the_calls_and_the_host_reads():
    one, auto = fitted("adam", 1), fitted("adam", "auto")
    assert auto.stats["n_chunk_calls"] < one.stats["n_chunk_calls"] / 4, (
        auto.stats["n_chunk_calls"],
        one.stats["n_chunk_calls"],
    )
    # where the host decides at every step (refills on sync_every=1), a call over several
    # chunks is one step, and one over a single chunk ends where one of its starts ends (the
    # two-chunk search's last running starts fit one chunk)
    assert fitted("tiktak", 5).stats["n_chunk_calls"] < fitted("tiktak", 1).stats["n_chunk_calls"]
    # L-BFGS's default over several chunks: a step a call while its queue hands out starts,
    # then k a call once it has none left (here after its one refill; 98 calls of 105 when
    # the calls stayed a step each with a queue left empty)
    lbfgs = {k: fitted("lbfgs one refill", k).stats for k in (1, 5)}
    assert lbfgs[1]["start_strategy"] == "band_tiktak" and lbfgs[1]["n_resurrections"] == 1
    assert lbfgs[5]["n_chunk_calls"] < 0.8 * lbfgs[1]["n_chunk_calls"], lbfgs
    for name in ("tiktak one chunk", "least squares tiktak one chunk"):
        calls = {k: fitted(name, k).stats["n_chunk_calls"] for k in (1, 5, "auto")}
        assert calls[5] < calls[1] and calls["auto"] < calls[1], (name, calls)
        assert fitted(name, 1).stats["n_resurrections"] > 0  # refills were made


def test_a_refit_of_the_model_starts_from_the_steps_a_call_reached():
    # residuals of this test alone (its constant): no earlier fit in the process taught their
    # programs a k
    def shifted(p):
        return jnp.stack([10.0 * (p["x"][1] - p["x"][0] ** 2), 1.2345 - p["x"][0]])

    def search(k):
        return ms.MultiStartLeastSquares(n_starts=4, batch_size=4, seed=0, steps_per_call=k)

    auto = search("auto")
    with jax.enable_x64(True):
        first, second = (auto.fit(shifted, ROSEN) for _ in range(2))
        fixed = search(1).fit(shifted, ROSEN)  # the option's k, whatever a fit before reached
    calls = [r.stats["n_chunk_calls"] for r in (first, second, fixed)]
    # the first fit's calls take 1, 2, 4, ... steps; the second's start where those ended
    assert calls[1] < calls[0] < calls[2], calls
    assert_same_result(first, second, exact=True)
    assert_same_result(first, fixed, exact=True)


def test_a_fixed_k_makes_exactly_its_calls():
    def calls(k, **kw):
        base = dict(n_starts=4, batch_size=4, n_steps=20, seed=0, convergence=None, log_every=0)
        search = ms.MultiStartAdam(**{**base, **kw}, steps_per_call=k)
        return search.fit(multimodal, MULTIMODAL_SPACE).stats["n_chunk_calls"]

    assert calls(5) == 4  # one chunk, 20 steps, 5 a call
    assert calls(6) == 4  # 6, 6, 6 and the last 2
    assert calls(6, log_every=4) == 5  # and a call ends at each progress line: 4, 4, 4, 4, 4


def test_calls_end_at_each_checkpoint_and_resume_with_another_k(tmp_path):
    kw = dict(n_starts=5, batch_size=2, n_steps=60, seed=3, convergence=None, log_every=0)
    folder = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=10)
    with jax.enable_x64(True):
        full = ms.MultiStartAdam(**kw, steps_per_call=1).fit(multimodal, MULTIMODAL_SPACE)
        partial = ms.MultiStartAdam(**{**kw, "n_steps": 30}, **folder, steps_per_call=7)
        first = partial.fit(multimodal, MULTIMODAL_SPACE)
        assert first.stats["checkpoints"] == [10, 20, 30]  # 7 a call, cut at each checkpoint
        resumed = ms.MultiStartAdam(**kw, **folder, steps_per_call="auto")
        resumed = resumed.fit(multimodal, MULTIMODAL_SPACE, resume=True)
    assert resumed.stats["resumed_from"] == 30
    assert_same_result(full, resumed, exact=True)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "fast", None])
def test_a_bad_steps_per_call_is_refused_before_any_compile(bad):
    with NoCompile(), pytest.raises(ValueError, match="steps_per_call must be 'auto' or an int"):
        ms.MultiStartAdam(steps_per_call=bad)


def _calls_reached(overhead_s: float, step_s: float, n_calls: int = 12) -> int:
    """The ``k`` that ``steps_per_call="auto"`` reaches where a call costs ``overhead_s`` (its
    dispatch, sync and reading) plus ``step_s`` a step, each call taking its ``k`` steps."""
    from types import SimpleNamespace

    from multistart.host.iterate import Calls

    options = SimpleNamespace(
        steps_per_call="auto", halving=None, target_fom=None, max_evals=None, sync_every=1,
        steps=10_000, log_every=0, rediscoveries=None, checkpoint_every=None,
    )  # fmt: skip
    sweeper = SimpleNamespace(width=8, chunks=[0], n_devices=1)
    engine = SimpleNamespace(
        options=options, together=False, sweeper=sweeper, refiller=None, checkpoints=None
    )
    calls = Calls(engine)  # type: ignore[arg-type]
    for _ in range(n_calls):
        k = calls.k
        calls.took(k, k, overhead_s + k * step_s, synced=True)
    return calls.k


def test_auto_steps_grow_while_a_calls_own_cost_is_a_fair_share_of_it():
    """A chip's wide batch (a call's sync and reading 20 ms, a step 6 ms): the steps a call
    double while doubling cuts a step's share of the call by 2 %, until a call would keep the
    host unheard past 0.5 s (64 steps: the call's own cost a twentieth of it); an image fit's
    (2.5 ms a call, 3 ms a step) to 64 steps too, its own cost near 1 % of a call, where it
    stopped at 8 (a tenth) when a doubling had to cut a tenth; a CPU's heavy step (50 ms,
    0.3 ms a call) stops after one try; a step of 0.3 s stays one a call (two would keep the
    host unheard past 0.5 s); a cheap call grows to the cap."""
    from multistart.host import iterate

    chip = _calls_reached(0.020, 0.006)
    assert chip == 64 and 0.020 / (0.020 + chip * 0.006) < 0.05
    assert 2 * chip * (0.006 + 0.020 / chip) > iterate.AUTO_LATENCY_S
    image = _calls_reached(0.0025, 0.003)
    assert image == 64 and 0.0025 / (0.0025 + image * 0.003) < 0.015
    assert _calls_reached(0.0003, 0.050) == 2
    assert _calls_reached(0.0003, 0.300) == 1
    assert _calls_reached(0.0002, 0.00001) == iterate.AUTO_MAX_STEPS


def _auto_calls(learned=None, steps=10_000, k="auto"):
    from types import SimpleNamespace

    from multistart.host.iterate import Calls

    options = SimpleNamespace(
        steps_per_call=k, halving=None, target_fom=None, max_evals=None, sync_every=1,
        steps=steps, log_every=0, rediscoveries=None, checkpoint_every=None,
    )  # fmt: skip
    sweeper = SimpleNamespace(width=8, chunks=[0], n_devices=1)
    engine = SimpleNamespace(
        options=options, together=False, sweeper=sweeper, refiller=None, checkpoints=None,
        rules=SimpleNamespace(tail=None),
    )  # fmt: skip
    return Calls(engine, learned)  # type: ignore[arg-type]


def _run_calls(calls, steps: int, cost) -> list[int]:
    """The steps of each call of a search of ``steps`` steps, a call of ``k`` costing
    ``cost(i, k)`` seconds (``i``: the call's index)."""
    done, taken = 0, []
    while done < steps:
        asked, _ = calls.next(done)
        calls.took(asked, asked, cost(len(taken), asked), synced=True)
        taken.append(asked)
        done += asked
    return taken


def test_a_refit_weighs_its_first_call_and_may_double_where_a_noisy_fit_stopped():
    """An image fit on a chip (4.5 ms a call, 2.5 ms a step): a first fit's call of 32 steps
    slowed by 6 ms does not pay its doubling and stops there; the next fit of the model starts
    at 32, weighs its first call against the share at 16 the first fit measured, and doubles."""
    learned: dict = {}

    def noisy(i, k):
        return 0.0045 + 0.0025 * k + (0.006 if k == 32 else 0.0)

    first = _auto_calls(learned, steps=100)
    _run_calls(first, 100, noisy)
    assert first.k == 32 and learned[(8, 1)][0] == 32
    second = _auto_calls(learned, steps=100)
    taken = _run_calls(second, 100, lambda i, k: 0.0045 + 0.0025 * k)
    assert taken[0] == 32 and second.k == 64
    assert taken == [32, 68]  # the second call takes the 68 left (at most 1.5 k): no third


def test_auto_takes_a_short_last_call_into_the_one_before_and_a_fixed_k_does_not():
    def steps_of(calls) -> list[int]:
        done, steps = 0, []
        while done < 100:
            n, _ = calls.next(done)
            steps.append(n)
            done += n
        return steps

    learned = {(8, 1): (32, (16, 1.0))}  # a fit before reached 32 steps a call
    assert steps_of(_auto_calls(learned, steps=100)) == [32, 32, 36]  # not 32, 32, 32 and 4
    assert steps_of(_auto_calls(steps=100, k=32)) == [32, 32, 32, 4]
