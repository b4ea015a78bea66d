"""ms.Fixed: a parameter held at a value in any search's space (lmfit's ``vary=False``)."""

import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.model.priors import Space

T = np.linspace(0.0, 4.0, 40)
Y = 3.0 * np.exp(-T / 1.3) + 0.4 + 0.05 * np.random.default_rng(0).normal(size=T.size)
QUIET = dict(progress=False, log_every=0)


def residuals(p):
    return (p["a"] * jnp.exp(-T / p["tau"]) + p["c"] - Y) / 0.05


def residuals_c_constant(p):  # the same model with c = 0.4 written in: the reference
    return (p["a"] * jnp.exp(-T / p["tau"]) + 0.4 - Y) / 0.05


def chi2(p):
    return jnp.sum(residuals(p) ** 2)


SPACE = {"tau": ms.LogUniform(0.1, 10.0), "a": ms.Uniform(0.0, 10.0), "c": ms.Fixed(0.4)}
FREE = {"tau": ms.LogUniform(0.1, 10.0), "a": ms.Uniform(0.0, 10.0)}


@pytest.mark.parametrize(
    "value, error, match",
    [
        (np.nan, ValueError, "Fixed: value must be finite"),
        (np.inf, ValueError, "Fixed: value must be finite"),
        ("a", TypeError, "Fixed: value must be a real number"),
        (True, TypeError, "Fixed: value must be a real number"),
        (None, TypeError, "Fixed: value must be a real number"),
    ],
)
def test_bad_values_are_refused_naming_the_argument(value, error, match):
    with pytest.raises(error, match=match):
        ms.Fixed(value)


def test_a_space_steps_only_its_free_parameters_and_fills_in_the_fixed_ones():
    space = Space({"b": ms.Uniform(0.0, 1.0), "a": ms.Fixed([1.0, 2.0]), "c": ms.Normal(0, 1)})
    assert space.paths == ["b", "c"] and space.n_dims == 2
    assert space.all_paths == ["b", "a", "c"]  # as written
    assert repr(space) == "Space(a: Fixed([1.0, 2.0]), b: Uniform(0.0, 1.0), c: Normal(0.0, 1.0))"
    tree = space.unflatten([np.zeros(5), np.ones(5)])  # 5 starts of the free ones
    np.testing.assert_array_equal(tree["a"], np.tile([1.0, 2.0], (5, 1)))
    assert space.ravel(tree).shape == (5, 2)
    with pytest.raises(ValueError, match="every parameter is multistart.Fixed"):
        Space({"a": ms.Fixed(1.0)})


@pytest.mark.parametrize("search", ["lm", "lbfgs", "adam"])
def test_every_search_holds_a_fixed_parameter_and_reports_it(search, x64):
    if search == "lm":
        fit = ms.MultiStartLeastSquares(n_starts=4, seed=0, **QUIET).fit(residuals, SPACE)
        ref = ms.MultiStartLeastSquares(n_starts=4, seed=0, **QUIET).fit(residuals_c_constant, FREE)
    else:
        rule = ms.MultiStartLBFGS if search == "lbfgs" else ms.MultiStartAdam
        make = dict(n_starts=4, seed=0, n_steps=400, **QUIET)
        fit = rule(**make).fit(chi2, SPACE)
        ref = rule(**make).fit(lambda p: jnp.sum(residuals_c_constant(p) ** 2), FREE)
    assert fit.best_params["c"] == 0.4 and np.all(fit.params["c"] == 0.4)
    assert np.all(fit.start_params["c"] == 0.4)
    assert fit.paths == ["tau", "a", "c"]  # every parameter, as the space was written
    # the free parameters' errors and covariance, as a fit without c: lmfit's report
    assert fit.laplace.names == ("tau", "a") and fit.covariance.shape == (2, 2)
    np.testing.assert_allclose(fit.covariance, ref.covariance, rtol=1e-3)
    assert fit.errors["c"] == 0.0
    np.testing.assert_allclose(fit.best_params["tau"], ref.best_params["tau"], rtol=1e-4)
    table = fit.to_dataframe()
    assert list(table.columns[-6:]) == ["tau", "a", "c", "start:tau", "start:a", "start:c"]
    assert np.all(table["c"] == 0.4)
    assert "(fixed)" in fit.report().split("[[Correlations]]")[0].splitlines()[-1]


def test_a_fixed_parameter_in_the_unconstrained_pytree_layout(x64):
    fit = ms.MultiStartAdam(n_starts=3, seed=1, n_steps=30, flat=False, **QUIET).fit(chi2, SPACE)
    assert np.all(fit.params["c"] == 0.4)


def test_user_starts_may_give_a_fixed_parameter_only_at_its_value(x64):
    search = ms.MultiStartLeastSquares(n_starts=2, seed=0, **QUIET)
    fit = search.fit(
        residuals, SPACE, starts=[{"tau": 1.0, "a": 2.0}, {"tau": 2, "a": 1, "c": 0.4}]
    )
    np.testing.assert_allclose(fit.start_params["tau"], [1.0, 2.0], rtol=1e-12)
    assert np.all(fit.start_params["c"] == 0.4)
    with pytest.raises(ValueError, match=r"starts\[0\]\['c'\] is 0.5, but the space holds 'c'"):
        search.fit(residuals, SPACE, starts=[{"tau": 1.0, "a": 2.0, "c": 0.5}])


def test_a_saved_fit_keeps_the_fixed_parameter_and_its_free_errors(tmp_path, x64):
    fit = ms.MultiStartLeastSquares(n_starts=3, seed=0, **QUIET).fit(residuals, SPACE)
    fit.save(tmp_path / "fit.npz")
    loaded = ms.Result.load(tmp_path / "fit.npz")
    assert loaded.best_params["c"] == 0.4 and loaded.errors["c"] == 0.0
    assert loaded.errors["tau"] == fit.errors["tau"] and loaded.errors["a"] == fit.errors["a"]
    loaded = loaded.attach_problem(residuals, SPACE)  # the space's parameters are the Result's
