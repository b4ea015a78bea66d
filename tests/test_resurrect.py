"""Resurrection: dead starts replaced from the filter's reserve or by fresh draws."""

import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_result

import multistart as ms
from multistart.common.monitor import CompileCounter
from multistart.model.priors import Space
from multistart.starts.strategies import (
    MLSL_GAMMA,
    StartStream,
    critical_distance,
    diverse_candidates,
    unit_coords,
)

NAN_SPACE = {"x": ms.Uniform(-4.0, 4.0, shape=(2,))}


def nan_right(p):
    """A bowl at (0.5, 0.5), nan wherever x[0] > 1: starts beginning there die at once."""
    x = p["x"]
    return jnp.where(x[0] > 1.0, jnp.nan, jnp.sum((x - 0.5) ** 2))


def nan_search(**kw):
    base = dict(n_starts=6, n_steps=150, seed=0, n_candidates=0, log_every=0)
    return ms.MultiStartAdam(**{**base, **kw})


@pytest.fixture(scope="module")
def resurrected_and_compiles():
    """Six float64 starts on ``nan_right`` in chunks of 4, each slot resurrected up to twice,
    and the programs the fit compiled (by name)."""
    with jax.enable_x64(True), CompileCounter() as compiles:
        result = nan_search(batch_size=4, resurrect=2).fit(nan_right, NAN_SPACE)
    return result, dict(compiles.counts)


@pytest.fixture(scope="module")
def resurrected(resurrected_and_compiles):
    return resurrected_and_compiles[0]


def test_resurrection_replaces_starts_dying_in_a_nan_region_and_finds_finite_fits(
    resurrected_and_compiles, x64
):
    without = nan_search(batch_size=4).fit(nan_right, NAN_SPACE)
    dead = np.array([s is ms.Status.NONFINITE for s in without.status])
    assert dead.any() and not dead.all()  # the case under test: some starts begin in the nan

    result, compiled = resurrected_and_compiles
    assert not any(s is ms.Status.NONFINITE for s in result.status)
    assert np.all(np.isfinite(result.foms))
    np.testing.assert_allclose(result.params["x"], 0.5, atol=2e-2)
    # counted per slot and in stats, one record per replaced start
    assert np.all(result.resurrections[dead] >= 1) and np.all(result.resurrections[~dead] == 0)
    assert result.stats["n_resurrections"] == result.resurrections.sum()
    replaced = [r for r in result.incarnations if r["replaced_at"] is not None]
    assert len(replaced) == result.resurrections.sum()
    assert all(r["status"] is ms.Status.NONFINITE and r["fom"] == np.inf for r in replaced)
    assert {r["slot"] for r in result.incarnations} == set(np.flatnonzero(dead))
    # no writer of its own: the chunk step, taking no step, writes the new starts (one
    # compile of it, however many replacements and syncs; the Result's map the only other)
    assert result.stats["n_compiles"] == 1
    assert compiled == {"jit(multistart_chunk_step)": 1, "jit(to_physical)": 1}
    # every evaluation is counted, the replaced starts' too
    assert result.stats["n_evals"] == result.n_steps.sum() + sum(r["n_steps"] for r in replaced)
    # the replaced slots began later, from fresh draws, and their starts are recorded
    for r in result.incarnations:
        if r["replaced_at"] is None:
            np.testing.assert_allclose(r["start_params"]["x"], result.start_params["x"][r["slot"]])
            assert r["started_at"] >= 1
        else:
            assert r["start_params"]["x"][0] > 1.0  # it began in the nan region


def test_resurrection_is_deterministic_and_independent_of_batch_size(resurrected, x64):
    # ``resurrected`` (width 4: two slots queue) against a second fit of it and the full width
    # (6, batch_size=None: no slot queues); only the full width is a program of its own
    a = resurrected
    b = nan_search(batch_size=4, resurrect=2).fit(nan_right, NAN_SPACE)
    c = nan_search(batch_size=None, resurrect=2).fit(nan_right, NAN_SPACE)
    assert a.stats["batch_size"] == 4 and c.stats["batch_size"] == 6
    assert a.stats["n_resurrections"] > 0
    assert_same_result(a, b)
    assert_same_result(a, c)


def wall(p):
    """The gradient pushes every start right, into a nan wall at x = 0.2."""
    return jnp.where(p["x"] > 0.2, jnp.nan, -p["x"])


WALL_SPACE = {"x": ms.Uniform(-1.0, 1.0)}


def wall_search(n_steps, **kw):
    base = dict(n_starts=2, batch_size=1, seed=0, n_candidates=6, resurrect=2, max_nonfinite=2)
    return ms.MultiStartAdam(n_steps=n_steps, log_every=0, **{**base, **kw})


@pytest.fixture(scope="module")
def long_wall_fit():
    """``long_wall_fit()``: the float64 300-step ``wall`` search, long enough to use up the
    filter's reserve, and the messages it logged at WARNING and above (lazy: it runs inside
    the first test that asks, with that test's log level)."""

    @functools.cache
    def run():
        class Keep(logging.Handler):
            def emit(self, record):
                messages.append(record.getMessage())

        messages = []
        logger = logging.getLogger("multistart")
        handler = Keep(logging.WARNING)
        logger.addHandler(handler)
        try:
            with jax.enable_x64(True):
                result = wall_search(300).fit(wall, WALL_SPACE)
        finally:
            logger.removeHandler(handler)
        return result, messages

    return run


def test_replacements_come_from_the_filters_reserve_best_first(x64, long_wall_fit):
    cand = StartStream(Space(WALL_SPACE), "band", (0.15, 0.85), np.random.default_rng(0))
    x = cand.draw(6)["x"]
    foms = np.where(x <= 0.2, -x, np.nan)
    # the filter's choice (best, thinned by the distance rule), then its reserve, best first
    unit = unit_coords(Space(WALL_SPACE), {"x": x}, (0.15, 0.85))
    reduced = math.ceil(MLSL_GAMMA * np.isfinite(foms).sum())  # MLSL's reduced sample
    chosen, reserve, _ = diverse_candidates(unit, foms, 2, critical_distance(6, 1), reduced)
    assert len(reserve) >= 1 and np.all(np.diff(foms[reserve]) >= 0)
    # the 300-step search of the next test: its replacements (both of the reserve, at steps 4
    # and 25) are made in its first 40 steps, as in a 40-step search, which compiled apart
    result, _ = long_wall_fit()
    firsts = sorted(
        (r for r in result.incarnations if r["incarnation"] == 0), key=lambda r: r["slot"]
    )
    later = sorted(
        (r for r in result.incarnations if r["incarnation"] > 0), key=lambda r: r["started_at"]
    )
    assert len(firsts) >= 1 and len(later) >= 1
    for r in firsts:  # the slots that died began from the filter's choice
        np.testing.assert_allclose(r["start_params"]["x"], x[chosen[r["slot"]]])
    np.testing.assert_allclose([r["start_params"]["x"] for r in later], x[reserve[: len(later)]])


def test_an_exhausted_reserve_leaves_the_rest_dead_and_says_so(x64, long_wall_fit):
    result, messages = long_wall_fit()
    reserve = result.stats["n_finite_candidates"] - 2
    assert result.stats["n_resurrections"] == reserve
    assert all(s is ms.Status.NONFINITE for s in result.status)
    assert any("reserve is exhausted" in m for m in messages)


def test_a_replaced_start_that_was_better_is_not_lost(x64):
    # slot 0's first start reaches the wall and dies there; its replacement has too few steps
    # left to get as far, so the slot shows the first, replaced, start
    result = wall_search(12).fit(wall, WALL_SPACE)
    slot0 = [r for r in result.incarnations if r["slot"] == 0]
    assert [r["incarnation"] for r in slot0] == [0, 1]
    first, final = slot0
    assert first["fom"] < final["fom"] and final["replaced_at"] is None
    assert result.foms[0] == first["fom"] and result.status[0] is ms.Status.NONFINITE
    np.testing.assert_array_equal(result.params["x"][0], first["params"]["x"])
    np.testing.assert_array_equal(result.start_params["x"][0], first["start_params"]["x"])
    assert result.best_fom == min(r["fom"] for r in result.incarnations)
    # the slot's history is its best over its incarnations: never rises, ends at foms
    assert np.all(np.diff(result.history, axis=0) <= 0)
    np.testing.assert_array_equal(result.history[-1], result.foms)


def test_resurrection_with_the_filter_default_on():
    def bowl_with_a_cliff(p):
        # finite at every start, but steps to the right of 1 fall into nan
        x = p["x"]
        return jnp.where(x > 1.0, jnp.nan, (x - 1.0) ** 2 - 3.0 * x)

    result = ms.MultiStartAdam(
        n_starts=4, n_steps=200, seed=0, resurrect=3, learning_rate=0.3, log_every=0
    ).fit(bowl_with_a_cliff, {"x": ms.Uniform(-2.0, 2.0)})
    assert np.all(np.isfinite(result.foms))
    assert result.stats["n_resurrections"] > 0 and result.stats["n_filter_compiles"] == 1
    assert result.best_fom <= -2.99


def bowl(p):
    return jnp.sum((p["x"] - 0.5) ** 2)


@pytest.fixture(scope="module")
def plain_bowl_fit():
    """A float64 search where no start dies, without resurrection."""
    with jax.enable_x64(True):
        return ms.MultiStartAdam(n_starts=5, batch_size=2, n_steps=80, seed=1).fit(bowl, NAN_SPACE)


@pytest.mark.parametrize("resurrect", [0, 3])
def test_resurrect_off_or_unneeded_changes_nothing(resurrect, plain_bowl_fit, x64):
    other = ms.MultiStartAdam(
        n_starts=5, batch_size=2, n_steps=80, seed=1, resurrect=resurrect
    ).fit(bowl, NAN_SPACE)
    assert_same_result(plain_bowl_fit, other)
    assert other.incarnations == [] and not other.resurrections.any()


def test_resurrection_in_tree_mode_matches_flat_mode(resurrected, x64):
    tree = nan_search(batch_size=4, resurrect=2, flat=False).fit(nan_right, NAN_SPACE)
    assert resurrected.config["flat"] is True and tree.config["flat"] is False
    assert tree.stats["n_resurrections"] == resurrected.stats["n_resurrections"] > 0
    assert_same_result(resurrected, tree, exact=False, rtol=1e-8, atol=1e-14)
