import numpy as np
import pytest
from conftest import MULTIMODAL_SPACE, multimodal

import multistart as ms
from multistart.minima import cluster_minima


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
