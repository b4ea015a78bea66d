import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import MULTIMODAL_SPACE, PARABOLA_SPACE, NoCompile, multimodal, parabola
from scipy.optimize import curve_fit

import multistart as ms

X = np.linspace(0.0, 20.0, 120)
SIGMA = 0.3


def peak(x, amp, centre, width):
    return amp * np.exp(-0.5 * ((x - centre) / width) ** 2)


def test_covariance_matches_curve_fit_on_a_peak_fit(x64):
    data = peak(X, 3.0, 8.0, 1.5) + np.random.default_rng(1).normal(0, SIGMA, X.size)
    popt, pcov = curve_fit(
        peak, X, data, p0=[2.5, 7.5, 1.2], sigma=np.full(X.size, SIGMA), absolute_sigma=True
    )

    def chi2(p):
        model = p["amp"] * jnp.exp(-0.5 * ((X - p["centre"]) / p["width"]) ** 2)
        return jnp.sum(((model - data) / SIGMA) ** 2)

    space = {
        "amp": ms.Uniform(0.0, 10.0),
        "centre": ms.Uniform(0.0, 20.0),
        "width": ms.LogUniform(0.1, 10.0),
    }
    point = dict(zip(["amp", "centre", "width"], popt, strict=True))
    fit = ms.laplace(chi2, space, point)
    assert fit.names == ("amp", "centre", "width")  # the space's (sorted) order, as popt here
    # curve_fit's pcov is the Gauss-Newton (J^T J) inverse; the exact Hessian differs from it
    # only by the residuals' curvature, small at a good fit
    np.testing.assert_allclose(
        fit.covariance, pcov, rtol=0.02, atol=0.02 * np.sqrt(np.outer(*[np.diag(pcov)] * 2)).max()
    )
    np.testing.assert_allclose(fit.std, np.sqrt(np.diag(pcov)), rtol=0.02)
    assert fit.errors["width"] == pytest.approx(np.sqrt(pcov[2, 2]), rel=0.02)
    assert not np.allclose(fit.correlation, np.eye(3), atol=0.1)  # amp and width correlate
    np.testing.assert_allclose(np.diag(fit.correlation), 1.0)


def test_a_quadratic_gives_its_exact_inverse_hessian_times_two(x64):
    a = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, -0.2], [0.5, -0.2, 2.0]])
    m = np.array([1.0, -2.0, 0.5])

    def fom(p):
        v = jnp.concatenate([p["u"], p["w"][None]]) - m
        return v @ a @ v

    space = {"u": ms.Uniform(-5.0, 5.0, shape=(2,)), "w": ms.Normal(0.0, 3.0)}
    fit = ms.laplace(fom, space, {"u": np.array([0.3, 0.1]), "w": 2.0})
    np.testing.assert_allclose(fit.hessian, 2 * a, rtol=1e-12)
    np.testing.assert_allclose(fit.covariance, 2 * np.linalg.inv(2 * a), rtol=1e-12)
    assert fit.names == ("u[0]", "u[1]", "w")
    assert fit.errors["u"].shape == (2,) and isinstance(fit.errors["w"], float)
    np.testing.assert_allclose(fit.errors["u"], np.sqrt(np.diag(np.linalg.inv(a)))[:2])
    one = ms.laplace(fom, space, {"u": np.array([0.3, 0.1]), "w": 2.0}, scale=1.0)
    np.testing.assert_allclose(one.covariance, np.linalg.inv(2 * a), rtol=1e-12)


def test_a_graph_fits_without_a_space(x64):
    """fom = ((a - 1) / 0.5)^2 + ((b + 2) / 3)^2 (uniform priors add no curvature)."""

    def loglike(p, d):
        return -0.5 * (((p["a"] - 1.0) / d[0]) ** 2 + ((p["b"] + 2.0) / d[1]) ** 2)

    graph = ms.FactorGraphModel(
        [ms.Factor(loglike, np.array([0.5, 3.0]))],
        space={"a": ms.Uniform(-10, 10), "b": ms.Uniform(-20, 20)},
    )
    point = {"a": 1.0, "b": -2.0}
    np.testing.assert_allclose(ms.laplace(graph, point).std, [0.5, 3.0], rtol=1e-9)
    np.testing.assert_allclose(ms.laplace(graph, params=point).std, [0.5, 3.0], rtol=1e-9)
    with pytest.raises(TypeError, match="space must not be given"):
        ms.laplace(graph, {"a": ms.Uniform(0, 1)}, point)


def test_a_singular_hessian_gives_nan_and_a_warning_naming_the_parameters(x64):
    def fom(p):  # only a + b is constrained; c is on its own
        return ((p["a"] + p["b"] - 1.0) / 0.1) ** 2 + ((p["c"] - 2.0) / 0.5) ** 2

    space = {k: ms.Uniform(-5.0, 5.0) for k in "abc"}
    with pytest.warns(RuntimeWarning, match=r"directions of a, b:"):
        fit = ms.laplace(fom, space, {"a": 0.5, "b": 0.5, "c": 2.0})
    assert np.isnan(fit.errors["a"]) and np.isnan(fit.errors["b"])
    assert fit.errors["c"] == pytest.approx(0.5, rel=1e-9)
    assert np.isnan(fit.correlation[0, 2]) and fit.correlation[2, 2] == pytest.approx(1.0)


def test_a_saddle_is_not_a_minimum(x64):
    space = {"a": ms.Uniform(-5.0, 5.0), "b": ms.Uniform(-5.0, 5.0)}
    with pytest.warns(RuntimeWarning, match=r"directions of b:"):
        fit = ms.laplace(lambda p: p["a"] ** 2 - p["b"] ** 2, space, {"a": 0.0, "b": 0.0})
    assert fit.errors["a"] == pytest.approx(np.sqrt(2 / 2)) and np.isnan(fit.errors["b"])


def test_a_non_finite_hessian_is_nan_not_a_crash():
    space = {"a": ms.Uniform(-5.0, 5.0), "b": ms.Uniform(-5.0, 5.0)}
    with pytest.warns(RuntimeWarning, match=r"directions of a:"):
        fit = ms.laplace(lambda p: jnp.sqrt(p["a"]) + p["b"] ** 2, space, {"a": 0.0, "b": 0.0})
    assert np.isnan(fit.errors["a"]) and fit.errors["b"] == pytest.approx(1.0)


def test_bad_arguments_fail_before_any_compile():
    space = {"x": ms.Uniform(-1.0, 1.0, shape=(2,))}
    f = lambda p: jnp.sum(p["x"] ** 2)  # noqa: E731
    with NoCompile():
        with pytest.raises(ValueError, match=r"params\['x'\] must have the shape \(2,\)"):
            ms.laplace(f, space, {"x": np.zeros(3)})
        with pytest.raises(TypeError, match="needs the point"):
            ms.laplace(f, space)
        with pytest.raises(ValueError, match="structure"):
            ms.laplace(f, space, {"y": np.zeros(2)})
        with pytest.raises(ValueError, match="scale"):
            ms.laplace(f, space, {"x": np.zeros(2)}, scale=-1.0)


# -- on the Result --------------------------------------------------------------------------


def small_fit():
    """A parabola's Hessian is the same everywhere: a few steps are enough."""
    search = ms.MultiStartAdam(n_starts=2, batch_size=2, n_steps=5, n_candidates=0, log_every=0)
    return search.fit(parabola, PARABOLA_SPACE)


def test_result_covariance_is_lazy_and_needs_a_problem(tmp_path):
    result = small_fit()  # a search attaches its problem, and computes nothing for it
    assert result.problem is not None and result._uncertainty.laplace is None
    small_fit().save(tmp_path / "r.npz")
    loaded = ms.Result.load(tmp_path / "r.npz")
    loaded._uncertainty.laplace = None  # as a Result saved without its covariance
    with pytest.raises(ValueError, match="attach_problem"):
        _ = loaded.covariance
    with NoCompile():  # attaching computes nothing, and changes no Result
        attached = loaded.attach_problem(parabola, PARABOLA_SPACE)
        result = result.attach_problem(parabola, PARABOLA_SPACE)
    assert result._uncertainty.laplace is None and attached is not loaded
    assert loaded.problem is None and attached.problem is not None
    # parabola = sum (x - 1.5)^2 + (y + 0.5)^2: H = 2 I, covariance 2 H^-1 = I
    np.testing.assert_allclose(result.covariance, np.eye(3), atol=1e-4)
    np.testing.assert_allclose(result.errors["x"], [1.0, 1.0], rtol=1e-4)
    np.testing.assert_allclose(result.correlation, np.eye(3), atol=1e-4)
    assert result.laplace.names == ("x[0]", "x[1]", "y")
    with NoCompile():  # cached
        assert result.covariance is result.covariance
    with pytest.raises(ValueError, match="not this Result's"):
        result.attach_problem(parabola, {"z": ms.Uniform(0, 1)})


def test_save_stores_the_covariance_and_load_restores_it(tmp_path):
    result = small_fit().attach_problem(parabola, PARABOLA_SPACE)
    assert result._uncertainty.laplace is None
    result.save(tmp_path / "r.npz")  # computable, so computed and stored
    loaded = ms.Result.load(tmp_path / "r.npz")
    np.testing.assert_array_equal(loaded.covariance, result.covariance)
    np.testing.assert_array_equal(loaded.errors["x"], result.errors["x"])
    assert loaded.errors["y"] == result.errors["y"]
    assert loaded.laplace.names == result.laplace.names
    bare = small_fit()
    bare._uncertainty.problem = (
        None  # e.g. a merged or hand-made Result: nothing to compute it from
    )
    bare.save(tmp_path / "bare.npz")  # no problem: saved without, and says how to get it
    with pytest.raises(ValueError, match="attach_problem"):
        _ = ms.Result.load(tmp_path / "bare.npz").errors


def test_attaching_a_problem_replaces_the_covariance_computed_before(tmp_path):
    result = small_fit().attach_problem(parabola, PARABOLA_SPACE)
    result.save(tmp_path / "r.npz")  # with parabola's covariance, the identity
    loaded = ms.Result.load(tmp_path / "r.npz")
    np.testing.assert_allclose(loaded.covariance, np.eye(3), atol=1e-4)

    def steeper(p):  # four times parabola: H = 8 I, covariance 2 H^-1 = I / 4
        return 4.0 * parabola(p)

    steep = loaded.attach_problem(steeper, PARABOLA_SPACE)
    np.testing.assert_allclose(steep.covariance, np.eye(3) / 4, atol=1e-4)
    np.testing.assert_allclose(loaded.covariance, np.eye(3), atol=1e-4)  # unchanged


def test_each_distinct_minimum_gets_its_errors_with_one_compile(x64):
    result = ms.MultiStartAdam(n_starts=8, batch_size=8, n_steps=600, seed=0).fit(
        multimodal, MULTIMODAL_SPACE
    )
    result = result.attach_problem(multimodal, MULTIMODAL_SPACE)
    with pytest.raises(ValueError, match="errors=True"):
        _ = result.distinct_minima()[0].errors
    from multistart.common.monitor import CompileCounter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an unconverged start may be a saddle
        with CompileCounter() as compiles:
            minima = result.distinct_minima(errors=True)
    assert len(minima) >= 2
    assert compiles.total == 1
    for m in minima:
        # d2/dn2 [sin 3n + 0.1 n^2] = -9 sin 3n + 0.2; fom in s: (log s - 0.3)^2
        curvature = -9 * np.sin(3 * m.params["n"]) + 0.2
        assert m.errors["n"] == pytest.approx(np.sqrt(2 / curvature), rel=1e-3)
        assert m.covariance.shape == (2, 2)


def test_the_covariance_keeps_the_order_the_space_was_written_in():
    # Issue 24, item 13: rows followed the sorted paths; curve_fit's pcov keeps p0's order.
    space = {"slope": ms.Uniform(-5.0, 5.0), "band": {"z": ms.Uniform(-5.0, 5.0, shape=(2,))}}
    space["amp"] = ms.Uniform(-5.0, 5.0)
    widths = {"slope": 0.5, "z": np.array([2.0, 4.0]), "amp": 1.0}

    def chi2(p):
        z = (p["band"]["z"] - 1.0) / widths["z"]
        return ((p["slope"] - 1) / 0.5) ** 2 + jnp.sum(z**2) + (p["amp"] / 1.0) ** 2

    point = {"slope": 1.0, "band": {"z": np.ones(2)}, "amp": 0.0}
    fit = ms.laplace(chi2, space, point)
    assert fit.names == ("slope", "band.z[0]", "band.z[1]", "amp")
    np.testing.assert_allclose(fit.std, [0.5, 2.0, 4.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(np.diag(fit.hessian), 2 / np.array([0.5, 2.0, 4.0, 1.0]) ** 2)
    assert "slope = 1 +/- 0.5" in repr(fit) and "amp = 0 +/- 1" in repr(fit)
    assert "band.z[1] = 1 +/- 4" in repr(fit)


# -- absolute_sigma on every search: the same errors whatever the scale of the figure of merit --

PEAK_DATA = peak(X, 3.0, 8.0, 1.5) + np.random.default_rng(1).normal(0, SIGMA, X.size)
PEAK_SPACE = {
    "amp": ms.Uniform(0.0, 10.0),
    "centre": ms.Uniform(0.0, 20.0),
    "width": ms.LogUniform(0.1, 10.0),
}
PEAK_STARTS = {"amp": [2.5], "centre": [7.5], "width": [1.2]}


def _peak_residuals(scale):
    def residuals(p):
        model = p["amp"] * jnp.exp(-0.5 * ((X - p["centre"]) / p["width"]) ** 2)
        return scale * (model - PEAK_DATA)

    return residuals


def test_every_rule_scales_an_unweighted_fit_by_its_reduced_chi_squared(x64):
    """Unweighted residuals (sigma unknown): curve_fit's default errors, from L-BFGS on the sum
    of squares as from least squares, and the same at any scale of the figure of merit."""
    popt, pcov = curve_fit(peak, X, PEAK_DATA, p0=[2.5, 7.5, 1.2], xtol=1e-14, ftol=1e-14)
    kw = dict(n_starts=1, seed=0, log_every=0, n_candidates=0)
    for scale in (1.0, 1e-3, 1e3):
        residuals = _peak_residuals(scale)
        ls = ms.MultiStartLeastSquares(**kw).fit(residuals, PEAK_SPACE, starts=PEAK_STARTS)
        search = ms.MultiStartLBFGS(**kw, absolute_sigma=False, n_data=X.size)
        lbfgs = search.fit(
            lambda p, r=residuals: jnp.sum(r(p) ** 2), PEAK_SPACE, starts=PEAK_STARTS
        )
        for fit, rtol in ((ls, 1e-6), (lbfgs, 0.02)):  # L-BFGS: the full Hessian, not JᵀJ
            laplace = fit.laplace
            assert not laplace.absolute_sigma and laplace.dof == X.size - 3
            assert "absolute_sigma=False" in laplace.convention
            np.testing.assert_allclose(laplace.std, np.sqrt(np.diag(pcov)), rtol=rtol)
            chi2 = float(np.sum((peak(X, *popt) - PEAK_DATA) ** 2)) / (X.size - 3)
            assert laplace.reduced_chi2 == pytest.approx(scale**2 * chi2, rel=1e-6)
    # as given (absolute_sigma=True, a scalar's default): 2 H⁻¹ of scale² * SSR, so errors / scale
    search = ms.MultiStartLBFGS(**kw)
    given = search.fit(
        lambda p: jnp.sum(_peak_residuals(1e3)(p) ** 2), PEAK_SPACE, starts=PEAK_STARTS
    )
    assert given.laplace.absolute_sigma and given.laplace.dof is None
    np.testing.assert_allclose(given.laplace.std * 1e3, np.sqrt(np.diag(pcov / chi2)), rtol=0.02)


def test_the_convention_is_saved_with_the_result(tmp_path, x64):
    search = ms.MultiStartLBFGS(n_starts=2, seed=0, log_every=0, absolute_sigma=False, n_data=120)
    result = search.fit(lambda p: jnp.sum(_peak_residuals(1.0)(p) ** 2), PEAK_SPACE)
    laplace = result.laplace
    result.save(tmp_path / "fit.npz")
    loaded = ms.Result.load(tmp_path / "fit.npz").laplace
    assert (loaded.absolute_sigma, loaded.dof) == (False, 117)
    assert loaded.reduced_chi2 == pytest.approx(laplace.reduced_chi2)
    assert loaded.convention == laplace.convention


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: ms.MultiStartLBFGS(absolute_sigma=False), ValueError, "give n_data"),
        (lambda: ms.MultiStartAdam(absolute_sigma="no"), TypeError, "absolute_sigma must be"),
        (lambda: ms.MultiStartAdam(n_data=0), ValueError, "n_data"),
        (lambda: ms.MultiStartLeastSquares(n_data=10), ValueError, "counts its residuals"),
    ],
)
def test_bad_sigma_options_are_refused_when_the_search_is_made(make, error, match):
    with NoCompile(), pytest.raises(error, match=match):
        make()


def test_a_best_fit_on_a_bound_warns_naming_the_parameter_when_its_errors_are_read(x64):
    space = dict(PEAK_SPACE, amp=ms.Uniform(0.0, 2.0))  # the peak's amplitude, 3, is outside
    search = ms.MultiStartLeastSquares(n_starts=4, seed=0, log_every=0)
    result = search.fit(_peak_residuals(1.0), space)
    assert result.at_bound[result.best_index]
    with pytest.warns(RuntimeWarning, match="the best fit has amp on a bound of its prior"):
        errors = result.errors
    assert np.isfinite(errors["amp"])  # kept, as curve_fit keeps it, with the warning
