import jax
import numpy as np
import pytest
from conftest import MULTIMODAL_SPACE, multimodal
from readme_model import make_problem
from reference_minima import cluster_minima_all_pairs

import multistart as ms
from multistart.result.minima import LOCATED, cluster_minima, default_tolerances


def test_cluster_minima_on_literal_points():
    x = np.array([[0.0, 1.0], [5.0, 5.0], [1e-8, 1.0], [5.0, 5.0 + 1e-4], [9.0, 9.0]])
    f = np.array([1.0, 3.0, 1.0 + 1e-9, 3.0, np.nan])
    labels = cluster_minima(x, f, xtol=1e-6, ftol=1e-6)
    assert labels.tolist() == [0, 1, 0, 2, -1]  # 1e-4 apart is another minimum at xtol 1e-6
    assert cluster_minima(x, f, xtol=1e-3, ftol=1e-6).tolist() == [0, 1, 0, 1, -1]


def test_tolerances_are_relative_above_one():
    x = np.array([[1000.0], [1000.5]])
    f = np.array([2000.0, 2000.5])
    assert cluster_minima(x, f, xtol=1e-3, ftol=1e-3).tolist() == [0, 0]
    assert cluster_minima(x, f, xtol=1e-4, ftol=1e-3).tolist() == [0, 1]
    assert cluster_minima(x, f, xtol=1e-3, ftol=1e-4).tolist() == [0, 1]


@pytest.mark.parametrize("tol", [-1.0, "a", None])
def test_bad_tolerances(tol):
    with pytest.raises(ValueError, match="xtol"):
        cluster_minima(np.zeros((1, 1)), np.zeros(1), xtol=tol, ftol=0.1)


def test_result_distinct_minima_of_a_multimodal_search(x64):
    result = ms.MultiStartAdam(n_starts=16, batch_size=4, n_steps=800, seed=0).fit(
        multimodal, MULTIMODAL_SPACE
    )
    minima = result.distinct_minima(xtol=1e-3, ftol=1e-4)
    assert len(minima) >= 2  # sin(3n) + 0.1 n^2 has several local minima in the start band
    assert minima[0].fom == result.best_fom and minima[0].starts[0] == result.best_index
    assert sorted(i for m in minima for i in m.starts) == list(range(16))
    foms = [m.fom for m in minima]
    assert foms == sorted(foms)
    for m in minima:  # every start of a minimum really is close to its best one
        n = result.params["n"][list(m.starts)]
        assert np.all(np.abs(n - m.params["n"]) <= 1e-3 * np.maximum(1, abs(m.params["n"])))
    # the count alone (what the fit records) is the list's length, whatever the arguments
    assert result.stats["n_distinct_minima"] == len(result.distinct_minima()) >= 2
    for kw in (dict(xtol=1e-3, ftol=1e-4), dict(xtol=10.0, ftol=10.0), dict(xtol=0.0, ftol=0.0),
               dict(include_unconverged=True), dict(include_nonfinite=True)):  # fmt: skip
        assert result.n_distinct_minima(**kw) == len(result.distinct_minima(**kw)), kw
    assert result.n_distinct_minima(xtol=10.0, ftol=10.0) == 1
    for bad in (dict(xtol=-1.0), dict(ftol="a")):  # nonsense named, as distinct_minima's
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"{name} must be a number >= 0"):
            result.n_distinct_minima(**bad)


def peak_fit():
    """A Gaussian peak fitted by Adam, whose 64 starts converge loosely (the window rule) on one
    minimum: the case the default tolerances must group and MATLAB's 1e-6 splits."""
    chi2, space = make_problem()  # the README's peak, as a χ²
    return ms.MultiStartAdam(n_starts=64, batch_size=8, n_steps=500, seed=0).fit(chi2, space)


@pytest.mark.parametrize("x64_on", [False, True], ids=["float32", "float64"])
def test_a_peak_s_loosely_converged_starts_are_one_minimum_by_default(x64_on):
    with jax.enable_x64(x64_on):
        result = peak_fit()
    assert result.fit_dtype == (np.float64 if x64_on else np.float32)
    minima = result.distinct_minima()
    converged = [i for i, s in enumerate(result.status) if s.settled]
    assert len(minima) == 1 and list(minima[0].starts) == sorted(
        converged, key=lambda i: result.foms[i]
    )
    assert minima[0].fom == pytest.approx(result.best_fom)
    # starts still moving when the search ended are not minima unless asked for
    moving = result.distinct_minima(include_unconverged=True)
    assert len(moving) >= 1 + (result.n_starts - len(converged) > 0)
    # explicit tolerances still win: MATLAB's 1e-6 splits the one peak
    assert len(result.distinct_minima(xtol=1e-6, ftol=1e-6)) > 10


def test_default_tolerances_follow_the_rule_and_the_float_type():
    rule = {"window": 50, "rtol": 1e-6, "atol": 1e-8, "min_steps": 0}
    assert default_tolerances(np.float64, rule)[0] == pytest.approx(np.sqrt(1.01e-6))
    loose = dict(rule, rtol=1e-4)
    assert default_tolerances(np.float64, loose)[0] == pytest.approx(np.sqrt(1.0001e-4))
    # without a window guard (a rule's own tests), or with one tighter than the float type
    # resolves, the type decides, never finer than the rules' own tests locate a minimum
    eps32 = np.finfo(np.float32).eps
    assert default_tolerances(np.float32, None)[0] == pytest.approx(np.sqrt(10 * eps32))
    assert default_tolerances(np.float32, dict(rule, rtol=0.0, atol=0.0)) == (
        default_tolerances(np.float32, None)
    )
    assert default_tolerances(np.float64, None)[0] == pytest.approx(np.sqrt(LOCATED))


def test_windowed_grouping_labels_as_the_all_pairs_rule_does():
    # Near-ties in f and x, magnitudes above and below 1, non-finite rows, tolerances from 0
    # to above 1 (no window): the bisection window must never drop a matching minimum.
    rng = np.random.default_rng(0)
    for _ in range(300):
        n, d = rng.integers(1, 60), rng.integers(1, 4)
        x = rng.choice([0.0, 1e-4, 1.0, 1.0005, 2.0, -3.0], size=(n, d))
        x = x + rng.normal(0, rng.choice([0, 1e-5, 1e-3]), size=(n, d))
        f = rng.choice([0.0, 1e-4, 1.0, 1.0001, 5.0, -2.0, np.nan, np.inf, 1e6, 1e6 + 0.5], n)
        f = f + rng.normal(0, rng.choice([0, 1e-5, 1e-2]), size=n)
        xtol, ftol = (float(v) for v in rng.choice([0.0, 1e-4, 1e-3, 0.1, 0.5, 2.0], size=2))
        got = cluster_minima(x, f, xtol=xtol, ftol=ftol)
        np.testing.assert_array_equal(got, cluster_minima_all_pairs(x, f, xtol=xtol, ftol=ftol))
