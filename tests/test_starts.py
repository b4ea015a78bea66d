"""Start strategies, user starts and the broad-start filter."""

import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    MULTIMODAL_SPACE,
    NoCompile,
    multimodal,
    same_result,
)

import multistart as ms
from multistart.common.monitor import CompileCounter
from multistart.device.evaluator import FILTER_NAME
from multistart.model.priors import Space
from multistart.starts.strategies import (
    MLSL_GAMMA,
    StartStream,
    critical_distance,
    diverse_candidates,
    rank_candidates,
    uniform_band_starts,
    unit_coords,
)

SPACE = {
    "a": ms.Uniform(-4.0, 4.0, shape=(3,)),
    "s": ms.LogUniform(0.1, 30.0),
    "n": {"m": ms.Normal(1.0, 2.0, shape=(2,))},
}


def stream(strategy, seed=0, band=(0.15, 0.85), space=SPACE):
    return StartStream(Space(space), strategy, band, np.random.default_rng(seed))


# -- strategies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ms.START_STRATEGIES)
def test_strategies_draw_the_space_shapes_inside_the_band(strategy):
    band = (0.2, 0.7)
    x = stream(strategy, band=band).draw(37)
    assert x["a"].shape == (37, 3) and x["s"].shape == (37,) and x["n"]["m"].shape == (37, 2)
    q = unit_coords(Space(SPACE), x)
    assert q.shape == (37, 6)
    assert np.all(q >= band[0] - 1e-12) and np.all(q <= band[1] + 1e-12)
    # the band is covered, not a corner of it
    assert np.all(q.min(axis=0) < 0.3) and np.all(q.max(axis=0) > 0.6)


@pytest.mark.parametrize("strategy", ms.START_STRATEGIES)
def test_same_seed_same_starts_other_seed_other_starts(strategy):
    a, b, c = (
        stream(strategy, 3).draw(16),
        stream(strategy, 3).draw(16),
        stream(strategy, 4).draw(16),
    )
    assert np.array_equal(a["a"], b["a"]) and np.array_equal(a["n"]["m"], b["n"]["m"])
    assert not np.array_equal(a["a"], c["a"])


def test_band_draws_are_those_of_uniform_band_starts():
    space = Space(SPACE)
    expected = uniform_band_starts(space, 9, np.random.default_rng(5), (0.1, 0.9))
    got = stream("band", 5, band=(0.1, 0.9)).draw(9)
    assert np.array_equal(got["a"], expected["a"]) and np.array_equal(got["s"], expected["s"])


def _one_per_slice(q: np.ndarray, band) -> bool:
    """Each coordinate has exactly one point in each of len(q) equal slices of the band."""
    lo, hi = band
    m = len(q)
    slices = np.floor((q - lo) / (hi - lo) * m).astype(int)
    return all(sorted(col) == list(range(m)) for col in slices.T)


def test_sobol_power_of_two_prefix_is_stratified_and_draws_continue_one_sequence():
    band = (0.15, 0.85)
    space = Space(SPACE)
    q64 = unit_coords(space, stream("sobol", 1).draw(64))
    assert _one_per_slice(q64, band)
    # drawing 40 then 24 continues the same sequence
    s = stream("sobol", 1)
    q_split = np.concatenate([unit_coords(space, s.draw(40)), unit_coords(space, s.draw(24))])
    np.testing.assert_array_equal(q_split, q64)
    # a uniform band draw of 64 is almost never stratified like that
    assert not _one_per_slice(unit_coords(space, stream("band", 1).draw(64)), band)


def test_latin_hypercube_has_one_point_per_slice_in_every_draw():
    space = Space(SPACE)
    s = stream("lhs", 2)
    assert _one_per_slice(unit_coords(space, s.draw(50)), (0.15, 0.85))
    assert _one_per_slice(unit_coords(space, s.draw(7)), (0.15, 0.85))


def test_strategy_errors():
    with pytest.raises(ValueError, match="start_strategy must be one of 'band', 'sobol', 'lhs'"):
        ms.MultiStartAdam(start_strategy="halton")
    big = {"x": ms.Uniform(0.0, 1.0, shape=(30_000,))}
    search = ms.MultiStartAdam(n_starts=2, n_steps=5, start_strategy="sobol")
    with NoCompile(), pytest.raises(ValueError, match="at most 21201 parameters"):
        search.fit(lambda p: jnp.sum(p["x"]), big)


# -- user starts ---------------------------------------------------------------------------------


def parabola3(p):
    return jnp.sum((p["a"] - 1.0) ** 2) + jnp.log(p["s"]) ** 2 + jnp.sum(p["n"]["m"] ** 2)


def test_user_starts_fill_the_first_slots_as_given():
    mine = [
        {"a": [0.5, -1.0, 2.0], "s": 3.0, "n": {"m": [0.0, 1.0]}},
        {"a": [3.9, 3.9, -3.9], "s": 0.1001, "n": {"m": [-7.0, 9.0]}},  # near bounds: fine
    ]
    stacked = {
        "a": np.array([m["a"] for m in mine]),
        "s": np.array([m["s"] for m in mine]),
        "n": {"m": np.array([m["n"]["m"] for m in mine])},
    }
    search = ms.MultiStartAdam(n_starts=5, n_steps=20, seed=0)
    from_list = search.fit(parabola3, SPACE, starts=mine)
    from_tree = search.fit(parabola3, SPACE, starts=stacked)
    assert same_result(from_list, from_tree)
    np.testing.assert_allclose(from_list.start_params["a"][:2], stacked["a"], rtol=1e-5)
    np.testing.assert_allclose(from_list.start_params["s"][:2], stacked["s"], rtol=1e-5)
    assert from_list.stats["n_user_starts"] == 2
    # the other three are filtered draws, different from the user's
    assert not np.allclose(from_list.start_params["a"][2:], stacked["a"][:1])


def test_as_many_user_starts_as_slots_runs_no_filter():
    # the search of test_the_filter_compiles_once_however_ragged: one chunk-step program
    x = {"n": np.array([-3.0, 0.5, 2.0]), "s": np.array([1.0, 0.2, 7.0])}
    r = ms.MultiStartAdam(n_starts=3, n_steps=2, seed=0).fit(multimodal, MULTIMODAL_SPACE, starts=x)
    assert "n_filter_compiles" in r.stats and r.stats["n_filter_compiles"] == 0
    np.testing.assert_allclose(r.start_params["n"], x["n"], rtol=1e-6)
    np.testing.assert_allclose(r.start_params["s"], x["s"], rtol=1e-6)


GOOD = {"a": [0.5, -1.0, 2.0], "s": 3.0, "n": {"m": [0.0, 1.0]}}


def stacked(a=(2, 3), s=(2,), m=(2, 2), s_value=1.0):
    return {"a": np.zeros(a), "s": np.full(s, s_value), "n": {"m": np.zeros(m)}}


BAD_STARTS = [
    (
        [GOOD, {**GOOD, "a": [0.0, 4.5, 0.0]}],
        ValueError,
        r"starts\[1\]\['a'\]\[1\] = 4.5 is outside the bounds \[-4, 4\]",
    ),
    (
        [GOOD, GOOD, {**GOOD, "s": 0.01}],
        ValueError,
        r"starts\[2\]\['s'\] = 0.01 is outside the bounds \[0.1, 30\] of LogUniform",
    ),
    (
        [{**GOOD, "n": {"m": [np.nan, 0.0]}}],
        ValueError,
        r"starts\[0\]\['n.m'\]\[0\] is nan: starts must be finite",
    ),
    ([GOOD, {"a": GOOD["a"], "s": 1.0}], ValueError, r"starts\[1\] is missing 'n.m'"),
    ([{**GOOD, "b": 1.0}], ValueError, r"starts\[0\] has 'b', not in the space"),
    ([{**GOOD, "a": [1.0, 2.0]}], ValueError, r"starts\[0\]\['a'\] must have shape \(3,\)"),
    ([{**GOOD, "s": "big"}], TypeError, r"starts\[0\]\['s'\] must be a real number"),
    ([], ValueError, "starts is an empty list"),
    ([GOOD] * 4, ValueError, "starts gives 4 starts but the search has n_starts=3"),
    (stacked(s=(3,)), ValueError, r"starts\['s'\] has 3 starts but 'a' has 2"),
    (stacked(a=(3,)), ValueError, r"starts\['a'\] must have shape \(n, \*\(3,\)\)"),
    (
        {**stacked(), "s": np.array([1.0, 50.0])},
        ValueError,
        r"starts\[1\]\['s'\] = 50 is outside",
    ),
    ("params", TypeError, "starts must be a params dict"),
    # Issue 24, item 7: a start on a bound was accepted and stayed there, "converged"
    (
        [GOOD, {**GOOD, "s": 0.1}],
        ValueError,
        r"starts\[1\]\['s'\] = 0.1 is on the lower bound 0.1 of LogUniform\(0.1, 30.0\).*"
        r"start it inside, e.g. at 0.10000057, or widen the prior",
    ),
    (
        [{**GOOD, "a": [0.0, 4.0, 0.0]}],
        ValueError,
        r"starts\[0\]\['a'\]\[1\] = 4 is on the upper bound 4 .* e.g. at 3.999992",
    ),
    (
        {**stacked(), "a": np.array([[0.0, 0.0, 0.0], [-4.0 + 1e-7, 0.0, 0.0]])},
        ValueError,
        r"starts\[1\]\['a'\]\[0\] = -3.9999999 is on the lower bound -4 ",
    ),
]


@pytest.mark.parametrize("starts, error, match", BAD_STARTS)
def test_bad_user_starts_name_the_start_and_parameter_before_any_compile(starts, error, match):
    search = ms.MultiStartAdam(n_starts=3, n_steps=5)
    with NoCompile(), pytest.raises(error, match=match):
        search.fit(parabola3, SPACE, starts=starts)


def one_dataset_priors(i):
    return {
        "a": ms.Uniform(-4.0 + i, 4.0 + 2 * i, shape=(3,)),
        "s": ms.LogUniform(0.1 * (i + 1), 30.0),
        "n": {"m": ms.Normal(float(i), 1.0 + i, shape=(2,))},
    }


@pytest.mark.parametrize("strategy", ["band", "sobol", "lhs"])
def test_a_stack_of_datasets_starts_each_as_plan_starts_starts_a_single_fit(strategy):
    """stack_starts (a batch of curve fits): dataset i's rows are its own start, then the draws
    plan_starts makes a single fit after one user start, mapped by dataset i's priors."""
    from types import SimpleNamespace

    from multistart.starts.strategies import plan_starts, stack_starts

    n, k = 3, 5
    alone = [one_dataset_priors(i) for i in range(n)]
    stack = {  # each prior with a leading axis of datasets
        "a": ms.Uniform([[-4.0 + i] * 3 for i in range(n)], [[4.0 + 2 * i] * 3 for i in range(n)]),
        "s": ms.LogUniform([0.1 * (i + 1) for i in range(n)], 30.0),
        "n": {
            "m": ms.Normal([[float(i)] * 2 for i in range(n)], [[1.0 + i] * 2 for i in range(n)])
        },
    }
    first = {"a": np.full((n, 3), 0.5), "s": np.arange(1.0, n + 1), "n": {"m": np.ones((n, 2))}}
    draws = dict(strategy=strategy, band=(0.2, 0.7), seed=7)
    x = stack_starts(Space(SPACE), first, Space(stack), k, **draws)
    assert x["a"].shape == (n * k, 3) and x["n"]["m"].shape == (n * k, 2)
    for i in range(n):
        user = jax.tree_util.tree_map(lambda a, i=i: a[i : i + 1], first)
        single = SimpleNamespace(space=Space(alone[i]))  # (no filter: only its space is read)
        plan = plan_starts(
            single, "float64", n_starts=k, n_candidates=0, filter_width=1, user=user, **draws
        )
        mine = jax.tree_util.tree_map(lambda a, i=i: a[i * k : (i + 1) * k], x)
        assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, mine, plan.x0))


class ScanCounted(list):
    """A list that counts the elements its lookups scan (``in``, ``index``, ``count``)."""

    scanned = 0

    def __contains__(self, item):
        ScanCounted.scanned += len(self)
        return super().__contains__(item)

    def index(self, *args):
        ScanCounted.scanned += len(self)
        return super().index(*args)

    def count(self, item):
        ScanCounted.scanned += len(self)
        return super().count(item)


def test_user_starts_of_many_leaves_are_matched_by_name_in_linear_work(monkeypatch):
    """Matching a start's leaves to the space's looked each name up in a list: a start of n
    leaves cost n² comparisons (8 starts of 9,005 parameters, 7 s before any compile). Counted,
    not timed: the lists' lookups scan no more than a few elements a leaf."""
    from multistart.starts import strategies

    n, k = 3000, 3
    space = Space({f"p{i}": ms.Uniform(-1.0, float(n)) for i in range(n)} | {"f": ms.Fixed(2.0)})
    space.paths = ScanCounted(space.paths)
    flat = strategies._flat_paths
    monkeypatch.setattr(strategies, "_flat_paths", lambda t: tuple(map(ScanCounted, flat(t))))
    rows = [{f"p{i}": i + j / 4 for i in reversed(range(n))} for j in range(k)]
    ScanCounted.scanned = 0
    x = strategies.user_starts(space, [*rows[:-1], {**rows[-1], "f": 2.0}], k)
    assert ScanCounted.scanned <= 4 * n * k  # a quadratic match: n² k = 27,000,000
    for i in (0, 1, n // 2, n - 1):  # every leaf where its name says, whatever the order
        np.testing.assert_array_equal(x[f"p{i}"], i + np.arange(k) / 4)
    assert np.all(x["f"] == 2.0)
    columns = strategies.user_starts(space, {f"p{i}": np.full(2, 0.5) for i in range(n)}, k)
    assert all(np.all(columns[f"p{i}"] == 0.5) for i in range(n)) and columns["f"][0] == 2.0
    wrong = {f"p{i}": 0.5 for i in range(n) if i != 1234} | {"q": 0.5}
    with pytest.raises(ValueError, match=r"starts\[1\] is missing 'p1234' and has 'q', not in"):
        strategies.user_starts(space, [rows[0], wrong], k)
    assert ScanCounted.scanned <= 4 * n * (k + 1 + 2)


# -- the filter ----------------------------------------------------------------------------------


def test_rank_candidates_best_finite_first_then_the_reserve():
    foms = np.array([5.0, np.nan, 1.0, -np.inf, 3.0, 1.0, np.inf, 2.0])
    chosen, reserve = rank_candidates(foms, 3)
    assert chosen.tolist() == [2, 5, 7]  # ties keep candidate order
    assert reserve.tolist() == [4, 0]
    chosen, reserve = rank_candidates(foms, 10)
    assert chosen.tolist() == [2, 5, 7, 4, 0] and reserve.size == 0


def nan_walled(p):
    """A multimodal objective that is nan where x > 1.5."""
    x = p["x"]
    value = jnp.sum(jnp.sin(3.0 * x) + 0.1 * x**2)
    return jnp.where(jnp.any(x > 1.5), jnp.nan, value)


def nan_walled_np(x):
    value = np.sum(np.sin(3.0 * x) + 0.1 * x**2, axis=-1)
    return np.where(np.any(x > 1.5, axis=-1), np.nan, value)


@pytest.mark.parametrize("strategy", ms.START_STRATEGIES)
def test_filter_keeps_the_best_finite_candidates(strategy, x64):
    space = {"x": ms.Uniform(-3.0, 3.0, shape=(2,))}
    n_starts, n_candidates = 6, 201
    search = ms.MultiStartAdam(
        n_starts=n_starts,
        n_steps=3,
        seed=11,
        start_strategy=strategy,
        n_candidates=n_candidates,
        filter_batch_size=16,  # ragged: 12 full chunks and one of 9
    )
    result = search.fit(nan_walled, space)
    # brute force: the same candidates, evaluated one by one in NumPy
    cand = stream(strategy, 11, space=space).draw(n_candidates)["x"]
    foms = nan_walled_np(cand)
    finite = np.isfinite(foms)
    assert 0 < finite.sum() < n_candidates  # some candidates are in the nan region
    unit = unit_coords(Space(space), {"x": cand}, (0.15, 0.85))
    radius = critical_distance(n_candidates, 2)
    reduced = math.ceil(MLSL_GAMMA * finite.sum())
    best, _, n_kept = diverse_candidates(unit, foms, n_starts, radius, reduced)
    np.testing.assert_allclose(result.start_params["x"], cand[best], rtol=1e-12)
    assert result.stats["critical_distance"] == pytest.approx(radius)
    assert result.stats["n_diverse"] == n_kept
    # the distance rule changed the choice: plain ranking would have kept close neighbours
    ranked = np.argsort(np.where(finite, foms, np.inf), kind="stable")[:n_starts]
    assert set(best.tolist()) != set(ranked.tolist())
    assert result.stats["n_finite_candidates"] == finite.sum()
    assert result.stats["n_candidates"] == n_candidates
    assert result.stats["n_filter_compiles"] == 1


@pytest.mark.parametrize("n_candidates, width", [(10, 3), (64, 64), (65, 8), (12, 100), (30, 1)])
def test_the_filter_compiles_once_however_ragged(n_candidates, width):
    search = ms.MultiStartAdam(
        n_starts=3, n_steps=2, n_candidates=n_candidates, filter_batch_size=width
    )
    result = search.fit(multimodal, MULTIMODAL_SPACE)
    assert result.stats["n_filter_compiles"] == 1
    assert result.stats["filter_batch_size"] == min(width, n_candidates)
    assert result.stats["n_compiles"] == 1


@pytest.fixture(scope="module")
def multimodal_fit():
    """``multimodal_fit(batch_size, n_candidates)``: one float64 search of 8 starts on the
    multimodal objective (filter on unless n_candidates=0); width None and 0-candidate runs
    share one chunk-step program. Built inside a test, under its environment."""

    @functools.cache
    def fit(batch_size, n_candidates=None):
        with jax.enable_x64(True):
            return ms.MultiStartAdam(
                n_starts=8, batch_size=batch_size, n_steps=60, seed=0, n_candidates=n_candidates
            ).fit(multimodal, MULTIMODAL_SPACE)

    return fit


def test_filter_on_gives_results_independent_of_batch_size(multimodal_fit):
    one_chunk, ragged = multimodal_fit(None), multimodal_fit(3)  # chunks of 3, 3 and 2
    assert one_chunk.stats["batch_size"] == 8 and ragged.stats["batch_size"] == 3
    assert same_result(one_chunk, ragged)


def test_filter_makes_starts_better_than_plain_draws(multimodal_fit):
    plain, filtered = multimodal_fit(None, 0), multimodal_fit(None)
    assert plain.stats["n_filter_compiles"] == 0 and filtered.stats["n_candidates"] == 80
    # the first row of the history is each start's value at its start (what a one-step search
    # returns as foms). The filter's are better as a whole and at the top, though not each
    # one: the distance rule trades some for diversity.
    start_plain, start_filtered = plain.history[0], filtered.history[0]
    assert np.median(start_filtered) < np.median(start_plain)
    assert np.min(start_filtered) < np.min(start_plain)


def only_near_zero(p):
    """Finite only where x < 0.2: a sliver of the band (0.15, 0.85) of Uniform(0, 1)."""
    return jnp.where(p["x"] < 0.2, (p["x"] - 0.17) ** 2, jnp.nan)


def test_fewer_finite_candidates_than_starts_runs_those_and_marks_the_rest(caplog, monkeypatch):
    space = {"x": ms.Uniform(0.0, 1.0)}
    cand = stream("band", 0, space=space).draw(24)["x"]
    n_finite = int(np.sum(cand < 0.2))
    assert 1 <= n_finite < 8  # the case under test
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    search = ms.MultiStartAdam(
        n_starts=8, batch_size=3, n_steps=50, seed=0, n_candidates=24, max_candidates=24
    )
    with caplog.at_level(logging.INFO, logger="multistart"):
        result = search.fit(only_near_zero, space)
    unstarted = np.array([s is ms.Status.UNSTARTED for s in result.status])
    assert unstarted.sum() == 8 - n_finite and not unstarted[:n_finite].any()
    assert result.foms.shape == (8,) and np.all(np.isinf(result.foms[unstarted]))
    assert np.all(np.isnan(result.params["x"][unstarted]))
    assert np.all(np.isnan(result.start_params["x"][unstarted]))
    assert np.all(result.n_steps[unstarted] == 0)
    assert np.all(np.isfinite(result.foms[~unstarted]))
    assert result.best_fom < 1e-4 and result.stats["n_unstarted"] == 8 - n_finite
    assert "Never started" in ms.Status.UNSTARTED.message
    assert any(
        r.levelno == logging.WARNING and f"only {n_finite} of 24 candidates" in r.getMessage()
        for r in caplog.records
    )


def test_no_finite_candidate_raises_naming_the_region_before_the_step_compiles():
    search = ms.MultiStartAdam(
        n_starts=4, n_steps=5, start_strategy="sobol", start_band=(0.2, 0.8), n_candidates=16
    )
    with CompileCounter() as compiles, pytest.raises(ms.NoFiniteStartsError) as info:
        search.fit(lambda p: jnp.log(-(p["x"] ** 2) - 1.0), {"x": ms.Uniform(-2.0, 2.0)})
    message = str(info.value)
    # it topped up to max_candidates (100 x n_starts) before giving up, with one filter compile
    assert "400 candidate starts" in message and "'sobol'" in message
    assert compiles.count(FILTER_NAME) == 1
    assert "(0.2, 0.8)" in message and "x in [-1.2, 1.2] of Uniform(-2.0, 2.0" in message
    assert compiles.count("multistart_chunk_step") == 0
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_starts": 4, "n_candidates": 3}, r"n_candidates must be None \(10 x n_starts\), 0"),
        ({"n_candidates": 2.5}, "n_candidates must be"),
        ({"n_candidates": True}, "n_candidates must be"),
        ({"n_candidates": 0, "filter_batch_size": 8}, "filter_batch_size has no effect"),
        ({"filter_batch_size": 0}, "filter_batch_size must be an int >= 1"),
        ({"n_candidates": 0, "max_candidates": 100}, "max_candidates has no effect"),
        ({"n_starts": 4, "max_candidates": 39}, r"max_candidates must be None \(100 x n_starts\)"),
        ({"max_candidates": 1e4}, "max_candidates must be"),
        ({"resurrect": -1}, "resurrect must be an int >= 0"),
        ({"resurrect": 9, "max_nonfinite": 8}, r"resurrect must be <= max_nonfinite \(8\)"),
    ],
)
def test_bad_start_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ms.MultiStartAdam(**kwargs)


def test_the_candidates_error_names_the_default_of_the_strategy_in_use():
    """L-BFGS's default strategy ("band_tiktak") draws 15 candidates a slot, the others 10: the
    refusal of too few names the default that applies."""
    with pytest.raises(ValueError, match=r"n_candidates must be None \(15 x n_starts\), 0"):
        ms.MultiStartLBFGS(n_starts=4, n_candidates=3)
    with pytest.raises(ValueError, match=r"n_candidates must be None \(10 x n_starts\), 0"):
        ms.MultiStartLBFGS(n_starts=4, n_candidates=3, start_strategy="band")


def test_config_records_the_start_options():
    config = ms.MultiStartAdam(n_starts=4, start_strategy="lhs", resurrect=2).config()
    assert config["start_strategy"] == "lhs" and config["n_candidates"] == 40
    assert config["max_candidates"] == 400
    assert ms.MultiStartAdam(n_starts=4, n_candidates=0).config()["max_candidates"] is None
    assert ms.MultiStartAdam(n_starts=4, n_candidates=1000).config()["max_candidates"] == 1000
    assert config["filter_batch_size"] == 64 and config["resurrect"] == 2


def test_the_filter_backs_off_when_a_chunk_runs_out_of_memory(monkeypatch):
    """An allocation failure in a filter chunk halves its width; the values are unchanged."""
    from multistart.device import evaluator as evaluator_mod

    original = evaluator_mod.ValueEvaluator._evaluate

    def evaluate(self, u):
        if self.width > 16:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 123 bytes.")
        return original(self, u)

    # a context, not monkeypatch.undo(): that would also undo the autouse fixtures' environment
    # (MULTISTART_AUTO_WIDTH=memory), and the reference would time chunk widths (2 compiles)
    with monkeypatch.context() as patch:
        patch.setattr(evaluator_mod.ValueEvaluator, "_evaluate", evaluate)
        search = ms.MultiStartAdam(n_starts=3, n_steps=2, seed=0, n_candidates=100)
        result = search.fit(multimodal, MULTIMODAL_SPACE)
    assert result.stats["filter_backoffs"] == [{"from": 64, "to": 32}, {"from": 32, "to": 16}]
    assert result.stats["filter_batch_size"] == 16
    reference = ms.MultiStartAdam(n_starts=3, n_steps=2, seed=0, n_candidates=100).fit(
        multimodal, MULTIMODAL_SPACE
    )
    assert reference.stats["filter_batch_size"] == 64 and reference.stats["filter_backoffs"] == []
    np.testing.assert_array_equal(result.start_params["n"], reference.start_params["n"])
    np.testing.assert_array_equal(result.start_params["s"], reference.start_params["s"])


def test_max_batch_caps_the_filter_width(monkeypatch):
    monkeypatch.setenv("MULTISTART_MAX_BATCH", "8")
    result = ms.MultiStartAdam(n_starts=3, n_steps=2, seed=0, n_candidates=100).fit(
        multimodal, MULTIMODAL_SPACE
    )
    assert result.stats["filter_batch_size"] == 8


# -- the diversity rule (literal arrays, nothing compiled) ---------------------------------------


def two_clusters(n_each=20, seed=0):
    """A tight cluster of good candidates near (0.2, 0.2) and a cluster of worse ones near
    (0.8, 0.8), interleaved in candidate order."""
    rng = np.random.default_rng(seed)
    good = 0.2 + 0.02 * rng.standard_normal((n_each, 2))
    poor = 0.8 + 0.02 * rng.standard_normal((n_each, 2))
    unit = np.empty((2 * n_each, 2))
    unit[0::2], unit[1::2] = good, poor
    foms = np.empty(2 * n_each)
    foms[0::2] = rng.uniform(0.0, 1.0, n_each)
    foms[1::2] = rng.uniform(5.0, 6.0, n_each)
    return unit, foms


def test_critical_distance_is_the_radius_of_a_ball_holding_sigma_log_n_over_n():
    from math import gamma, log, pi

    for n, d in [(100, 1), (2560, 9), (320, 48), (10**6, 3)]:
        r = critical_distance(n, d, sigma=4.0)
        volume = pi ** (d / 2) * r**d / gamma(1 + d / 2)
        assert volume == pytest.approx(4.0 * log(n) / n, rel=1e-9)
    assert critical_distance(1000, 9) < critical_distance(100, 9)  # shrinks as samples grow
    assert critical_distance(1, 5) == 0.0
    assert np.isfinite(critical_distance(10**4, 500))  # no overflow of gamma(1 + d/2)


def test_two_clusters_are_both_represented_where_ranking_takes_one():
    unit, foms = two_clusters()
    ranked, _ = rank_candidates(foms, 4)
    assert np.all(unit[ranked, 0] < 0.5)  # plain ranking: all four from the good cluster
    chosen, reserve, n_kept = diverse_candidates(unit, foms, 4, radius=0.2)
    near_good = unit[chosen, 0] < 0.5
    assert near_good.any() and not near_good.all()
    # one kept per cluster (the best of each), then the best skipped ones fill in
    assert n_kept == 2
    assert chosen[0] == np.argmin(foms)
    assert np.argmin(np.where(unit[:, 0] > 0.5, foms, np.inf)) in chosen


def test_chosen_and_reserve_are_best_first_and_partition_the_finite_candidates():
    unit, foms = two_clusters()
    foms[[3, 10, 17]] = [np.nan, np.inf, -np.inf]
    chosen, reserve, _ = diverse_candidates(unit, foms, 6, radius=0.2)
    assert np.all(np.diff(foms[chosen]) >= 0) and np.all(np.diff(foms[reserve]) >= 0)
    both = np.concatenate([chosen, reserve])
    assert sorted(both.tolist()) == np.flatnonzero(np.isfinite(foms)).tolist()
    assert len(chosen) == 6


def test_far_apart_candidates_are_kept_and_close_ones_skipped_in_favour_of_the_better():
    unit = np.array([[0.0, 0.0], [0.05, 0.0], [0.5, 0.0], [0.52, 0.0], [1.0, 1.0]])
    foms = np.array([1.0, 0.5, 3.0, 2.0, 9.0])
    chosen, reserve, n_kept = diverse_candidates(unit, foms, 3, radius=0.1)
    assert chosen.tolist() == [1, 3, 4] and reserve.tolist() == [0, 2] and n_kept == 3
    # a radius that reaches everything keeps one and fills with the best skipped
    chosen, reserve, n_kept = diverse_candidates(unit, foms, 3, radius=10.0)
    assert chosen.tolist() == [1, 0, 3] and n_kept == 1


def test_the_diversity_rule_is_deterministic_and_radius_zero_is_plain_ranking():
    unit, foms = two_clusters(seed=3)
    foms[5] = foms[7]  # a tie: candidate order decides
    a = diverse_candidates(unit, foms, 5, radius=0.05)
    b = diverse_candidates(unit.copy(), foms.copy(), 5, radius=0.05)
    assert all(np.array_equal(x, y) for x, y in zip(a[:2], b[:2], strict=True)) and a[2] == b[2]
    chosen, reserve, n_kept = diverse_candidates(unit, foms, 5, radius=0.0)
    ranked, rest = rank_candidates(foms, 5)
    assert chosen.tolist() == ranked.tolist() and reserve.tolist() == rest.tolist()
    assert n_kept == 5


def test_diverse_candidates_checks_its_shapes():
    with pytest.raises(ValueError, match="unit must be"):
        diverse_candidates(np.zeros((3, 2)), np.zeros(4), 2, 0.1)


# -- topping up ----------------------------------------------------------------------------------


def sparse_finite(p):
    """Finite on ~2 % of the start band of Uniform(0, 1): x < 0.164 of the band (0.15, 0.85)."""
    return jnp.where(p["x"] < 0.164, (p["x"] - 0.16) ** 2, jnp.nan)


def test_a_sparse_finite_region_is_found_by_topping_up_with_one_filter_compile():
    space = {"x": ms.Uniform(0.0, 1.0)}
    topped_up = 0
    for seed in range(6):
        search = ms.MultiStartAdam(n_starts=16, n_steps=5, seed=seed, convergence=None)
        with CompileCounter() as compiles:
            result = search.fit(sparse_finite, space)
        assert result.stats["n_unstarted"] == 0 and np.all(np.isfinite(result.foms))
        assert result.stats["n_finite_candidates"] >= 16
        assert compiles.count(FILTER_NAME) == 1
        drawn = result.stats["n_candidates"]
        assert drawn % 160 == 0 and result.stats["n_filter_draws"] == drawn // 160
        topped_up += drawn > 160
    assert topped_up == 6  # 160 candidates hold ~3 finite ones: every seed needed the top-up


@pytest.mark.parametrize("flat", [True, False])
def test_the_filters_program_maps_the_results_rows_as_the_layout_does_bit_for_bit(flat, x64):
    """The Result's parameters come from the filter's program (its second output), not a map
    program of their own: every prior's map, a fixed parameter, both layouts, any row count."""
    from multistart.device.layout import Layout, physical_map
    from multistart.device.programs import Programs
    from multistart.model.problem import as_problem
    from multistart.starts.strategies import filter_evaluator

    space = {
        "w": ms.Uniform(0.0, 1e4, shape=(2,)),
        "log": ms.LogUniform(1e-3, 1e3),
        "n": ms.Normal([0.0, 5.0], 2.0),
        "held": ms.Fixed(0.25),
        "m": {"u": ms.Uniform(-1.0, 1.0, shape=(2, 2))},
    }
    problem = as_problem(lambda p: jnp.sum(p["w"]) * p["log"] + jnp.sum(p["m"]["u"]), space)
    layout = Layout(problem.space, flat, np.float64)
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(11, problem.space.n_dims)) * 12.0  # far into the logistic tails
    if not flat:  # the unconstrained pytree (the fixed leaf's value unused)
        rows = problem.space.unravel_rows(rows)
    evaluator = filter_evaluator(problem, np.float64, 4, Programs())
    by_filter = physical_map(layout, 5, Programs(), evaluator.points)(rows)
    own = physical_map(layout, 5, Programs())(rows)
    reference = jax.jit(jax.vmap(layout.to_physical))(rows)
    for a, b, c in zip(*map(jax.tree_util.tree_leaves, (by_filter, own, reference)), strict=True):
        assert a.shape[0] == 11 and a.dtype == np.float64
        np.testing.assert_array_equal(a, np.asarray(c))
        np.testing.assert_array_equal(b, np.asarray(c))
    assert np.all(by_filter["held"] == 0.25)


def test_the_filter_backs_off_after_its_data_is_released(monkeypatch):
    """The Result's physical map runs the filter's program after the fit let go of the data's
    device copy: a back-off there compiles a narrower program that takes the data as before
    (it once compiled it for ``None`` and failed on the data's own structure)."""
    from multistart.device.evaluator import ValueEvaluator

    def fom_u(u, data):
        return jnp.sum((u - data["c"]) ** 2), 2.0 * u + data["c"]

    u = np.random.default_rng(0).normal(size=(10, 2))
    evaluator = ValueEvaluator(fom_u, width=8, data={"c": np.array([0.5, -1.0])})
    evaluator.compile(2, u.dtype)
    expected = evaluator.points(u)
    evaluator.release()
    original = ValueEvaluator._evaluate

    def evaluate(self, rows):
        if self.width > 2:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes.")
        return original(self, rows)

    monkeypatch.setattr(ValueEvaluator, "_evaluate", evaluate)
    np.testing.assert_array_equal(evaluator.points(u), expected)
    assert evaluator.backoffs == [{"from": 8, "to": 4}, {"from": 4, "to": 2}]


def test_the_filter_maps_rows_on_the_steps_copy_of_the_data_once_shared(monkeypatch):
    """After the fit lets go of the filter's device copy of the data, the Result's and the
    refills' map of rows puts the whole data on the device again at every call, unless it is
    given the steps' own copy of the same data (``share``); another object's data, or a copy
    that does not lie on the program's device, is not taken."""
    import multistart.device.evaluator as evaluator_mod
    from multistart.device.evaluator import ValueEvaluator

    def fom_u(u, data):
        return jnp.sum((u - data["c"]) ** 2), 2.0 * u + data["c"]

    host = {"c": np.array([0.5, -1.0])}
    u = np.random.default_rng(0).normal(size=(10, 2))
    evaluator = ValueEvaluator(fom_u, width=8, data=host)
    evaluator.compile(2, u.dtype)
    expected = evaluator.points(u)
    evaluator.release()
    puts = []
    real = jax.device_put
    monkeypatch.setattr(
        evaluator_mod.jax, "device_put", lambda *a, **k: puts.append(1) or real(*a, **k)
    )
    np.testing.assert_array_equal(evaluator.points(u), expected)
    assert len(puts) == 1  # released: the data put again for the call
    steps_copy = real(host)
    assert not evaluator.share({"c": np.array([0.5, -1.0])}, steps_copy)  # not its data
    assert not evaluator.share(host, {"c": np.array([0.5, -1.0])})  # not on a device
    assert evaluator.share(host, steps_copy)
    puts.clear()
    np.testing.assert_array_equal(evaluator.points(u), expected)
    np.testing.assert_array_equal(evaluator(u), evaluator(u))
    assert puts == []  # the steps' copy serves every call


def test_a_fits_filter_shares_the_steps_copy_of_its_data(monkeypatch):
    """In a fit (curve_fit's data are the model's), the filter's evaluator takes the steps'
    device copy of the data when the search is built, and the fit's answer is the same."""
    import multistart.device.evaluator as evaluator_mod

    taken = []
    share = evaluator_mod.ValueEvaluator.share
    monkeypatch.setattr(
        evaluator_mod.ValueEvaluator,
        "share",
        lambda self, host, device: taken.append(share(self, host, device)) or taken[-1],
    )
    x = np.linspace(0.0, 4.0, 30)
    y = 2.0 * np.exp(-x / 1.3) + 0.1

    def f(x, a, tau, c):
        return a * jnp.exp(-x / tau) + c

    popt, _ = ms.curve_fit(f, x, y, p0=[1.0, 1.0, 0.0], n_starts=4)
    assert taken == [True]
    np.testing.assert_allclose(popt, [2.0, 1.3, 0.1], rtol=1e-6)
