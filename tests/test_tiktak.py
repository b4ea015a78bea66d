"""TikTak inside the one-compile engine: the blend, the queue, stops, determinism, resume."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NoCompile, same_result, signal_at_step

import multistart as ms
from multistart.common.monitor import CompileCounter
from multistart.common.status import Status
from multistart.device.evaluator import FILTER_NAME
from multistart.host.config import BAND_TIKTAK_CANDIDATES_PER_START
from multistart.model.priors import Space
from multistart.model.problem import as_problem
from multistart.starts.strategies import CandidateReserve, Explore, StartStream, plan_starts
from multistart.starts.tiktak import TikTakQueue, theta


def rastrigin(p):
    x = p["x"]
    return jnp.sum(x**2 - 10.0 * jnp.cos(2.0 * jnp.pi * x)) + 10.0 * x.size


SPACE = {"x": ms.Uniform(-5.12, 5.12, shape=(3,))}
KW = dict(n_starts=8, batch_size=4, n_steps=300, seed=0, log_every=0)


def test_blended_starts_follow_the_formula():
    space = Space({"a": ms.Uniform(0.0, 10.0), "b": ms.LogUniform(1.0, 100.0, shape=(2,))})
    cand = {"a": np.array([2.0, 8.0, 5.0]), "b": np.array([[1.0, 10.0], [100.0, 1.0], [5.0, 5.0]])}
    best = {"a": np.array(6.0), "b": np.array([10.0, 10.0])}
    queue = TikTakQueue(cand, space, n_local=20, n_first=4)
    out = queue.take(2, best)
    for j, i in enumerate((5, 6)):  # the 5th and 6th of 20 local searches
        w = theta(i, 20)
        assert w == pytest.approx(np.sqrt(i / 20))
        np.testing.assert_allclose(out["a"][j], (1 - w) * cand["a"][j] + w * 6.0)
        # LogUniform: blended in log x
        want = np.exp((1 - w) * np.log(cand["b"][j]) + w * np.log(10.0))
        np.testing.assert_allclose(out["b"][j], want)
    assert queue.available() == 1  # 3 candidates queued, 2 taken
    assert theta(1, 1000) == 0.1 and theta(1000, 1000) == 0.995


def test_a_cycled_schedule_restarts_the_weights_and_keeps_its_first_cycle():
    """``cycle``: the weights run TikTak's schedule over ``cycle`` searches, then again; the
    first cycle's starts are those of a queue with ``n_local = cycle`` (so a search that ends
    within it runs exactly as before)."""
    space = Space({"a": ms.Uniform(0.0, 10.0)})
    cand = {"a": np.linspace(0.5, 9.5, 12)}
    best = {"a": np.array(5.0)}
    cycled = TikTakQueue(cand, space, n_local=16, n_first=2, cycle=8)
    short = TikTakQueue(cand, space, n_local=8, n_first=2)
    np.testing.assert_array_equal(cycled.take(6, best)["a"], short.take(6, best)["a"])
    assert short.available() == 0 and cycled.available() == 6
    later = cycled.take(3, best)["a"]  # the 9th-11th local searches: the 1st-3rd of cycle 2
    for j, i in enumerate((1, 2, 3)):
        w = theta(i, 8)
        assert later[j] == pytest.approx((1 - w) * cand["a"][6 + j] + w * 5.0)


def test_the_queue_stops_at_n_local():
    space = Space({"a": ms.Uniform(0.0, 1.0)})
    queue = TikTakQueue({"a": np.linspace(0.1, 0.9, 9)}, space, n_local=6, n_first=4)
    assert len(queue.take(5)["a"]) == 2 and queue.take(1) is None


@pytest.fixture(scope="module")
def tiktak_fit():
    """``tiktak_fit()``: the float64 TikTak L-BFGS search of ``KW`` on Rastrigin, fitted once
    for the tests that only read it (lazy: it runs inside the first test that asks)."""

    @functools.cache
    def run():
        with jax.enable_x64(True):
            return ms.MultiStartLBFGS(**KW, start_strategy="tiktak").fit(rastrigin, SPACE)

    return run


def test_tiktak_finds_what_independent_starts_miss_and_runs_n_local_searches(x64, tiktak_fit):
    independent = ms.MultiStartLBFGS(**KW, start_strategy="band").fit(rastrigin, SPACE)
    tiktak = tiktak_fit()
    assert tiktak.best_fom < independent.best_fom
    assert tiktak.best_fom < 1e-8  # the global minimum
    assert tiktak.stats["n_local"] == 32  # the default, 4 per slot
    assert len(tiktak.incarnations) >= 32 - 8
    # the step's program is the independent fit's (the same model and rule: compiled once)
    assert tiktak.stats["n_compiles"] in (0, 1)


def test_tiktak_does_not_depend_on_the_batch_width(x64, tiktak_fit):
    a = tiktak_fit()
    assert a.stats["batch_size"] == 4
    b = ms.MultiStartLBFGS(**{**KW, "batch_size": 3}, start_strategy="tiktak").fit(rastrigin, SPACE)
    np.testing.assert_allclose(a.foms, b.foms, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(a.resurrections, b.resurrections)


def test_local_steps_end_each_local_search(x64):
    r = ms.MultiStartAdam(**KW, start_strategy="tiktak", local_steps=15, n_local=16).fit(
        rastrigin, SPACE
    )
    assert all(inc["n_steps"] <= 15 for inc in r.incarnations)
    assert r.stats["n_local"] == 16


def test_max_discoveries_starts_no_new_search_and_lets_the_running_ones_end(x64):
    r = ms.MultiStartLBFGS(**KW, start_strategy="tiktak", max_discoveries=2, n_local=64).fit(
        rastrigin, SPACE
    )
    assert r.stats["stop_reason"] == "max_discoveries"
    assert r.stats["discoveries"] >= 2
    assert r.stats["n_local"] < 64
    # the local searches running when the best was re-found ran to their own ends
    ended = [str(s) for s in r.status] + [str(inc["status"]) for inc in r.incarnations]
    assert "stopped" not in ended and "running" not in ended, ended
    assert str(r.status[r.best_index]) == "converged"


def bowl_residuals(p):
    return p["x"] - jnp.array([0.3, -0.2])


BOWL = {"x": ms.Uniform(-1.0, 1.0, shape=(2,))}


def test_tiktak_ends_at_its_default_discoveries_and_runs_every_search_without():
    kw = dict(n_starts=8, batch_size=8, seed=0, log_every=0)  # TikTak: the least-squares default
    search = ms.MultiStartLeastSquares(**kw)
    assert search.options.max_discoveries == 4  # "auto" under TikTak
    band = ms.MultiStartLBFGS(**kw, start_strategy="band").options
    assert band.max_discoveries is None  # the band: no such rule
    lbfgs = ms.MultiStartLBFGS(**kw).options  # L-BFGS's default: the band's, refilled
    assert lbfgs.start_strategy == "band_tiktak" and lbfgs.max_discoveries == 4
    for cannot in ({"n_candidates": 0}, {"resurrect": 2}):  # no queue to refill from: the band
        assert ms.MultiStartLBFGS(**kw, **cannot).options.start_strategy == "band"
    assert ms.MultiStartAdam(**kw).options.start_strategy == "band"  # long local searches
    short = search.fit(bowl_residuals, BOWL)
    full = search.replace(max_discoveries=None).fit(bowl_residuals, BOWL)
    assert short.stats["stop_reason"] == "max_discoveries"
    assert short.stats["discoveries"] >= 4
    assert full.stats["stop_reason"] == "all ended"
    assert full.stats["n_local"] == 4 * 8  # every one of n_local = 4 x n_starts
    assert short.stats["n_local"] < full.stats["n_local"]
    assert short.stats["n_evals"] < full.stats["n_evals"]
    np.testing.assert_allclose(short.best_params["x"], [0.3, -0.2], atol=1e-5)


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"n_local": 8, "start_strategy": "band"}, "only apply with start_strategy='tiktak'"),
        ({"start_strategy": "tiktak", "n_candidates": 0}, "n_candidates"),
        ({"start_strategy": "band_tiktak", "n_candidates": 0}, "'band_tiktak' hands out"),
        ({"start_strategy": "band_tiktak", "resurrect": 2}, "drop resurrect"),
        ({"start_strategy": "band tiktak"}, "start_strategy must be one of"),
        ({"start_strategy": "tiktak", "resurrect": 2}, "drop resurrect"),
        ({"start_strategy": "tiktak", "n_local": 4}, "n_local"),
        ({"start_strategy": "tiktak", "n_local": 1000}, "raise n_candidates"),
        ({"start_strategy": "tiktak", "local_steps": 0}, "local_steps"),
        ({"max_discoveries": 3, "start_strategy": "sobol"}, "only apply with start_strategy="),
        ({"start_strategy": "tiktak", "max_discoveries": "often"}, 'must be "auto", None'),
        ({"start_strategy": "tiktak", "max_discoveries": 0}, "max_discoveries"),
    ],
)
def test_bad_tiktak_options_fail_before_any_compile(kw, word):
    with NoCompile(), pytest.raises(ValueError, match=word):
        ms.MultiStartLBFGS(n_starts=8, **kw)


def test_resume_mid_wave_equals_an_uninterrupted_run(tmp_path, monkeypatch, x64, tiktak_fit):
    pytest.importorskip("orbax.checkpoint")
    # the uninterrupted run is ``tiktak_fit``'s: checkpointing is not part of the program
    kw = dict(KW, start_strategy="tiktak")
    full = tiktak_fit()
    assert full.stats["n_resurrections"] > 0
    later = [inc["started_at"] for inc in full.incarnations if inc["incarnation"] > 0]
    assert min(later) < 17 < max(later)  # step 17 falls among the replacements: mid wave
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=5)
    # a context, not monkeypatch.undo(): that would also undo the autouse fixtures' environment
    with monkeypatch.context() as mp, pytest.raises(ms.SearchInterrupted):
        signal_at_step(mp, 17)
        ms.MultiStartLBFGS(**kw, **ck).fit(rastrigin, SPACE)
    resumed = ms.MultiStartLBFGS(**kw, **ck).fit(rastrigin, SPACE, resume=True)
    assert resumed.stats["resumed_from"] == 17
    assert same_result(full, resumed)


def test_the_defaults_explore_refills_resume_bit_identically(tmp_path, monkeypatch, x64):
    """L-BFGS's default: some refills start beyond the band (the second pool's draws over the
    box), and a search interrupted among them resumes to the uninterrupted Result."""
    pytest.importorskip("orbax.checkpoint")
    full = ms.MultiStartLBFGS(**KW).fit(rastrigin, SPACE)
    later = [inc for inc in full.incarnations if inc["incarnation"] > 0]
    unit = (np.array([inc["start_params"]["x"] for inc in later]) + 5.12) / 10.24
    assert np.any((unit < 0.15) | (unit > 0.85))  # beyond the band: the pool's
    step = sorted(inc["started_at"] for inc in later)[len(later) // 2]  # among the refills
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=3)
    with monkeypatch.context() as mp, pytest.raises(ms.SearchInterrupted):
        signal_at_step(mp, step)
        ms.MultiStartLBFGS(**KW, **ck).fit(rastrigin, SPACE)
    resumed = ms.MultiStartLBFGS(**KW, **ck).fit(rastrigin, SPACE, resume=True)
    assert resumed.stats["resumed_from"] == step
    assert same_result(full, resumed)


def _ended(n_evals: int, status: Status = Status.CONVERGED):
    return SimpleNamespace(n_evals=n_evals, status=status.code, best_fom=1.0, best_u=np.zeros(1))


def test_band_tiktak_hands_out_starts_only_while_the_local_searches_are_short():
    space = Space({"a": ms.Uniform(0.0, 1.0)})
    queue = TikTakQueue({"a": np.linspace(0.1, 0.9, 9)}, space, n_local=12, n_first=3, short=10)
    assert queue.available() == 9 and queue.mean_evals is None  # none ended yet: open
    queue.observe([_ended(4), _ended(12)])  # 8 on average
    assert queue.short_searches and queue.available() == 9
    queue.observe([_ended(20)])  # 12 on average: long, and no new local search starts
    assert queue.mean_evals == 12 and not queue.short_searches
    assert queue.available() == 0 and queue.take(3) is None
    assert queue.stop_reason is None  # the searches end by their own ends ("all ended")
    plain = TikTakQueue({"a": np.linspace(0.1, 0.9, 9)}, space, n_local=12, n_first=3)
    plain.observe([_ended(10_000)])
    assert plain.short_searches and plain.available() == 9  # "tiktak": however long


# (records the queue observes, in turn; then: mean_evals, short_searches, refills_pruned)
RACED = [
    ("nothing ended yet: open, but no pruned slot taken", [], (None, True, False)),
    (
        "pruned starts are the race's cuts, not lengths",
        [(4, "pruned"), (40, "pruned")],
        (None, True, False),
    ),
    ("a short search that ended on its own", [(4, "pruned"), (8, "converged")], (8, True, True)),
    ("one that died counts as its own end", [(6, "nonfinite")], (6, True, True)),
    ("long ones, with the pruned left out", [(4, "pruned"), (30, "max_steps")], (30, False, False)),
    ("short on average", [(30, "stalled"), (2, "converged"), (400, "pruned")], (16, True, True)),
]


@pytest.mark.parametrize("name, records, expected", RACED, ids=[r[0] for r in RACED])
def test_the_length_gate_counts_searches_that_ended_on_their_own(name, records, expected):
    """Under a race, band_tiktak's gate measures the local searches' own lengths: a pruned
    start's evaluations are where the race cut it. A slot the race pruned takes a start only
    once searches that ended on their own have shown they are short (issue 73)."""
    space = Space({"a": ms.Uniform(0.0, 1.0)})
    queue = TikTakQueue({"a": np.linspace(0.1, 0.9, 9)}, space, n_local=12, n_first=3, short=20)
    queue.observe([_ended(n, Status(word)) for n, word in records])
    assert (queue.mean_evals, queue.short_searches, queue.refills_pruned) == expected
    assert queue.available() == (9 if expected[1] else 0)
    plain = TikTakQueue({"a": np.linspace(0.1, 0.9, 9)}, space, n_local=12, n_first=3)
    plain.observe([_ended(n, Status(word)) for n, word in records])
    assert plain.refills_pruned  # TikTak's own n_local: every freed slot, as without a race


def test_every_second_start_comes_from_the_explore_pool_as_is_and_a_replay_advances_it():
    space = Space({"a": ms.Uniform(0.0, 10.0)})
    cand = {"a": np.linspace(1.0, 9.0, 8)}
    best = {"a": np.array(5.0)}

    def queue(pool):
        explore = CandidateReserve(pool, np.zeros(3))
        return TikTakQueue(cand, space, n_local=20, n_first=4, explore=explore, explore_every=2)

    pool = {"a": np.array([0.2, 9.9, 0.5])}
    q = queue(pool)
    out = q.take(5, best)["a"]
    np.testing.assert_array_equal(out[[1, 3]], [0.2, 9.9])  # the pool's, unblended
    for j in (0, 2, 4):  # the others: the queue's candidates, blended towards the best
        w = theta(5 + j, 20)
        assert out[j] == pytest.approx((1 - w) * cand["a"][j] + w * 5.0)
    later = q.take(3, best)["a"]  # the 6th-8th: the 6th and 8th explore, the pool has one
    assert later[0] == 0.5 and q.explore.available() == 0
    w = theta(12, 20)  # the 8th handed out, the 12th local search
    assert later[2] == pytest.approx((1 - w) * cand["a"][7] + w * 5.0)  # pool spent: blended
    replayed = queue(pool)
    replayed.take(5)  # a checkpoint replayed: no best, the same advance
    assert replayed.taken == 5 and replayed.explore.taken == 2
    np.testing.assert_array_equal(replayed.take(3, best)["a"], later)


def test_the_explore_pool_ranks_box_draws_and_leaves_the_first_wave_alone(x64):
    problem = as_problem(lambda p: jnp.sum((p["x"] - 2.9) ** 2), {"x": SPACE["x"]})
    kw = dict(
        n_starts=4, strategy="band", band=(0.15, 0.85), n_candidates=40, filter_width=16, seed=3
    )
    with CompileCounter() as without:
        plain = plan_starts(problem, jnp.float64, **kw)
    with CompileCounter() as with_pool:
        plan = plan_starts(problem, jnp.float64, **kw, explore=Explore(30, (0.01, 0.99)))
    assert with_pool.count(FILTER_NAME) == without.count(FILTER_NAME) == 1  # none for the pool
    np.testing.assert_array_equal(plan.x0["x"], plain.x0["x"])  # the band's first wave
    np.testing.assert_array_equal(plan.reserve.x["x"], plain.reserve.x["x"])
    assert plain.explore is None and plan.stats["n_explore_candidates"] == 30
    want = StartStream(problem.space, "band", (0.01, 0.99), np.random.default_rng([3, 41]))
    drawn = want.draw(30)["x"]
    foms = np.sum((drawn - 2.9) ** 2, axis=1)
    got = plan.explore.x["x"]  # every draw (all finite), the best first, then one a basin
    np.testing.assert_allclose(np.sort(plan.explore.foms), np.sort(foms), rtol=1e-12)
    np.testing.assert_allclose(got[0], drawn[np.argmin(foms)], rtol=1e-12)
    np.testing.assert_allclose(np.sort(got, axis=0), np.sort(drawn, axis=0), rtol=1e-12)
    assert np.max(plan.explore.x["x"]) > 5.12 - 0.15 * 10.24  # beyond the band: the box


def test_the_explore_pool_adds_candidates_with_half_their_coordinates_on_a_bound(x64):
    """The pool's box draws as before, and more draws (their own stream) with about half their
    coordinates on a bound, either side: the bound itself, its unconstrained coordinate the
    inverse map's clip; every other coordinate one of the draws."""
    problem = as_problem(lambda p: jnp.sum((p["x"] - 2.9) ** 2), {"x": SPACE["x"]})
    kw = dict(n_starts=4, strategy="band", band=(0.15, 0.85), n_candidates=40, filter_width=64)
    box = (0.01, 0.99)
    plan = plan_starts(problem, jnp.float64, **kw, seed=3, explore=Explore(40, box, 400, 0.5))
    x = plan.explore.x["x"]
    assert x.shape == (440, 3) and plan.stats["n_explore_candidates"] == 440
    lower, upper = x == -5.12, x == 5.12
    assert 0.4 < (lower | upper).sum() / (400 * 3) < 0.6  # of the 400 more draws' coordinates
    assert 0.4 < lower.sum() / (lower | upper).sum() < 0.6
    u = problem.space.to_unconstrained(plan.explore.x)["x"]
    np.testing.assert_allclose(np.abs(u[lower | upper]), np.log(1e12), rtol=1e-5)
    draws = [
        StartStream(problem.space, "band", box, np.random.default_rng([3, k])).draw(n)["x"]
        for k, n in ((41, 40), (43, 400))
    ]
    assert np.isin(draws[0], x).all()  # the box's draws, every one (all finite)
    assert np.isin(x[~(lower | upper)], np.concatenate(draws)).all()


def _first_starts(result) -> np.ndarray:
    """Each slot's first start (incarnation 0), as the slot began the search."""
    x = np.array(result.start_params["x"], dtype=np.float64)
    for inc in result.incarnations:
        if inc["incarnation"] == 0:
            x[inc["slot"]] = inc["start_params"]["x"]
    return x


def test_lbfgs_default_keeps_the_bands_first_wave_and_refills_short_searches(x64):
    """L-BFGS's default (``"band_tiktak"``): the band's 8 starts (the filter's pick of its
    ``15 x n_starts`` candidates) run as they are, and the slots that end get TikTak's blended
    starts while the local searches are short (Rastrigin's take a few dozen evaluations): a
    better best than the band's 8 alone (never a worse one: they are among its local
    searches)."""
    n_candidates = BAND_TIKTAK_CANDIDATES_PER_START * KW["n_starts"]
    band = ms.MultiStartLBFGS(**KW, start_strategy="band", n_candidates=n_candidates)
    band = band.fit(rastrigin, SPACE)
    auto = ms.MultiStartLBFGS(**KW).fit(rastrigin, SPACE)
    assert auto.stats["start_strategy"] == "band_tiktak"
    assert auto.config["n_candidates"] == 15 * KW["n_starts"]
    np.testing.assert_allclose(_first_starts(auto), band.start_params["x"], rtol=1e-12)
    assert auto.stats["short_searches"] and auto.stats["n_local"] > KW["n_starts"]
    assert auto.config["n_local"] == 3 * 4 * KW["n_starts"]  # three of TikTak's cycles
    assert auto.best_fom < band.best_fom  # a deeper minimum than any of the band's 8 found


def test_lbfgs_defaults_later_rounds_keep_the_first_rounds_searches_and_never_a_worse_best(x64):
    """L-BFGS's default runs three rounds of TikTak's weights (``n_local = 12 x n_starts``);
    its first round is the one-round search's (``n_local = 4 x n_starts``), local search for
    local search, so its best is never worse (docs/starts.md, issue 41). The rediscovery stop is
    off here, so both run every local search."""
    kw = dict(KW, n_steps=200, max_discoveries=None)
    three = ms.MultiStartLBFGS(**kw).fit(rastrigin, SPACE)
    one = ms.MultiStartLBFGS(**kw, n_local=4 * KW["n_starts"]).fit(rastrigin, SPACE)
    assert (one.stats["n_local"], three.stats["n_local"]) == (32, 96)

    def searches(result):
        return {(i["slot"], i["incarnation"]): i for i in result.incarnations}

    first, both = searches(one), searches(three)
    assert len(first) == 32 and set(first) < set(both)
    for key, a in first.items():  # the same start, the same end
        np.testing.assert_array_equal(both[key]["start_params"]["x"], a["start_params"]["x"])
        assert both[key]["fom"] == a["fom"]
    assert three.best_fom <= one.best_fom
