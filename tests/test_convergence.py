import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.solvers.convergence import Convergence, window_converged


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


# -- the scale of the figure of merit decides nothing -------------------------------------------
#
# A decay fitted as c * sum(r^2) (or residuals c * r). L-BFGS's and the least-squares rules'
# tests are relative, and so is the window guard that ends the optax rules (its atol is 0), so
# the fit ends at the same parameters with the same status whatever c. For L-BFGS, Lion (sign
# steps) and the least-squares rules the steps are scale-free too: a power of two scales every
# value, gradient and curvature exactly, so those fits are the c = 1 fit bit for bit; c = 1e-6
# and 1e6 round differently and end within the rule's tolerance of it. Adam, AdaBelief and
# Prodigy divide by sqrt(v) + eps, an absolute floor: scale-free where the gradients dwarf eps
# (below), not at c = 1e-6 (measured: the same statuses, other step counts, the parameters
# 1e-4 apart). optimistix's solvers keep optimistix's own absolute atol: not scale-free.

DECAY_T = np.linspace(0.0, 4.0, 40)
DECAY_Y = 2.66 * np.exp(-DECAY_T / 1.43) + 0.088 + 0.01 * np.sin(7.0 * DECAY_T)  # small, fixed
DECAY_SPACE = {
    "a": ms.Uniform(0.0, 10.0),
    "tau": ms.LogUniform(0.1, 10.0),
    "c": ms.Uniform(-1.0, 1.0),
}
DECAY_STARTS = {"a": [1.0, 6.0, 3.0], "tau": [0.3, 4.0, 1.0], "c": [0.5, -0.5, 0.0]}
SCALES = (2.0**-20, 2.0**-10, 1.0, 2.0**10, 2.0**20, 1e-6, 1e6)
KW = dict(n_starts=3, batch_size=3, n_steps=400, seed=0, n_candidates=0, log_every=0)


def _decay_residuals(c):
    t, y = jnp.asarray(DECAY_T), jnp.asarray(DECAY_Y)

    def residuals(p):
        return c * (p["a"] * jnp.exp(-t / p["tau"]) + p["c"] - y)

    return residuals


def _decay_sum(c):
    r = _decay_residuals(np.sqrt(c))
    return lambda p: jnp.sum(r(p) ** 2)


RULES = {
    "lbfgs": lambda c: ms.MultiStartLBFGS(**KW).fit(
        _decay_sum(c), DECAY_SPACE, starts=DECAY_STARTS
    ),
    "lion": lambda c: ms.MultiStartLion(**KW).fit(_decay_sum(c), DECAY_SPACE, starts=DECAY_STARTS),
    **{
        method: (
            lambda c, m=method: ms.MultiStartLeastSquares(method=m, **KW).fit(
                _decay_residuals(np.sqrt(c)), DECAY_SPACE, starts=DECAY_STARTS
            )
        )
        for method in ("lm", "dogleg", "gauss-newton")
    },
}


def _params(result):
    return np.stack([np.asarray(result.params[k], np.float64) for k in ("a", "tau", "c")], 1)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_scaled_figure_of_merit_ends_where_the_unscaled_one_does(rule, x64):
    fits = {c: RULES[rule](c) for c in SCALES}
    reference = fits[1.0]
    ended = {"lion": ms.Status.STALLED}.get(rule, ms.Status.CONVERGED)
    assert all(s is ended for s in reference.status), reference.status_counts()
    for c, fit in fits.items():
        assert list(fit.status) == list(reference.status), (c, fit.status_counts())
        if np.log2(c) == round(np.log2(c)):  # exact scaling: the same run
            np.testing.assert_array_equal(_params(fit), _params(reference), err_msg=str(c))
            np.testing.assert_array_equal(fit.n_steps, reference.n_steps, err_msg=str(c))
        else:
            tol = 1e-3 if rule == "lion" else 1e-7  # Lion's sign steps locate to lr
            np.testing.assert_allclose(_params(fit), _params(reference), rtol=tol, err_msg=str(c))
        np.testing.assert_allclose(fit.foms / c, reference.foms, rtol=1e-6)


# the smallest scale measured to end alike: Prodigy's steps differ already at c = 2^-10
ADAPTIVE = {
    "adam": (ms.MultiStartAdam, 2.0**-10),
    "adabelief": (ms.MultiStartADABelief, 2.0**-10),
    "prodigy": (ms.MultiStartProdigy, 1.0),
}


@pytest.mark.parametrize("rule", sorted(ADAPTIVE))
def test_an_adaptive_rule_ends_alike_at_scales_where_its_gradients_dwarf_its_eps(rule, x64):
    """Adam's family steps by m / (sqrt(v) + eps): scale-free while |g| >> eps (1e-8 for Adam
    and Prodigy, 1e-16 for AdaBelief), and the window guard that ends them is relative."""
    make, smallest = ADAPTIVE[rule]
    run = make(**KW).fit
    scales = sorted({smallest, 1.0, 2.0**10, 1e6})
    fits = {c: run(_decay_sum(c), DECAY_SPACE, starts=DECAY_STARTS) for c in scales}
    reference = fits[1.0]
    assert ms.Status.STALLED in list(reference.status)  # the window guard ended it
    for c, fit in fits.items():
        assert list(fit.status) == list(reference.status), (c, fit.status_counts())
        np.testing.assert_array_equal(fit.n_steps, reference.n_steps, err_msg=str(c))
        np.testing.assert_allclose(_params(fit), _params(reference), rtol=1e-6, err_msg=str(c))
        np.testing.assert_allclose(fit.foms / c, reference.foms, rtol=1e-6)
