import numpy as np
import pytest

from multistart.convergence import Convergence, window_converged


def test_window_rule_on_literal_arrays():
    old = np.array([10.0, 10.0, 10.0, np.inf, np.inf])
    new = np.array([9.0, 10.0, 10.0 - 5e-4, 3.0, np.inf])
    got = window_converged(old, new, 7, window=5, rtol=0.0, atol=1e-3, min_steps=0)
    assert got.tolist() == [False, True, True, False, False]


def test_relative_tolerance_scales_with_the_value():
    old, new = np.array([1000.5, 1.5]), np.array([1000.0, 1.0])
    got = window_converged(old, new, 10, window=5, rtol=1e-3, atol=0.0, min_steps=0)
    assert got.tolist() == [True, False]


def test_no_convergence_before_window_or_min_steps():
    old, new = np.array([1.0]), np.array([1.0])
    kw = dict(rtol=0.0, atol=1.0)
    assert not window_converged(old, new, 4, window=5, min_steps=0, **kw)[0]
    assert window_converged(old, new, 5, window=5, min_steps=0, **kw)[0]
    assert not window_converged(old, new, 5, window=5, min_steps=10, **kw)[0]
    assert window_converged(old, new, 9, window=5, min_steps=10, **kw)[0]


@pytest.mark.parametrize(
    "kwargs", [{"window": 0}, {"window": 2.5}, {"rtol": -1.0}, {"atol": "x"}, {"min_steps": -1}]
)
def test_bad_convergence_settings(kwargs):
    with pytest.raises(ValueError, match="Convergence"):
        Convergence(**kwargs)
