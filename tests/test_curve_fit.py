"""ms.curve_fit: scipy's interface and meaning, many starts, bad input refused before a compile."""

from __future__ import annotations

import traceback
import warnings
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from conftest import NoCompile

import multistart as ms

X = np.linspace(0.0, 5.0, 50)
TRUTH = (3.0, 1.5, 0.2)
SIGMA = np.linspace(0.03, 0.08, 50)
Y = TRUTH[0] * np.exp(-X / TRUTH[1]) + TRUTH[2] + np.random.default_rng(0).normal(0.0, SIGMA)
FAST = dict(n_starts=4, seed=0, log_every=0)


def decay(x, a, tau, c):
    return a * jnp.exp(-x / tau) + c


def decay_np(x, a, tau, c):
    return a * np.exp(-x / tau) + c


@pytest.mark.parametrize(
    "kw",
    [
        dict(p0=[1.0, 1.0, 0.0]),
        dict(bounds=(0.0, 10.0)),
        dict(p0=[1.0, 1.0, 0.0], sigma=SIGMA, absolute_sigma=True),
        dict(p0=[1.0, 1.0, 0.0], sigma=SIGMA),
        dict(p0=[1.0, 1.0, 0.1], bounds=([0.0, 0.0, -np.inf], [np.inf, np.inf, np.inf])),
        dict(p0=[1.0, 1.0, 0.0], sigma=np.diag(SIGMA**2)),  # a covariance matrix
    ],
    ids=["p0", "box", "absolute", "relative", "one-sided", "covariance"],
)
def test_the_answer_and_pcov_are_scipys(kw):
    popt, pcov = ms.curve_fit(decay, X, Y, **FAST, **kw)
    ref, ref_cov = scipy.optimize.curve_fit(decay_np, X, Y, **kw, xtol=1e-14, ftol=1e-14)
    np.testing.assert_allclose(popt, ref, rtol=1e-7)
    np.testing.assert_allclose(pcov, ref_cov, rtol=1e-5)
    assert popt.dtype == pcov.dtype == np.float64 and pcov.shape == (3, 3)


def test_full_output_returns_the_result_and_one_start_is_p0():
    p0 = [2.0, 1.0, 0.0]
    popt, pcov, info, mesg, ier = ms.curve_fit(decay, X, Y, p0=p0, n_starts=1, full_output=True)
    result = info["result"]
    assert isinstance(result, ms.Result) and result.n_starts == 1
    np.testing.assert_array_equal([result.start_params[k][0] for k in "a tau c".split()], p0)
    assert result.status[0] is ms.Status.CONVERGED
    np.testing.assert_allclose(popt, [result.best_params[k] for k in ("a", "tau", "c")])
    # p0 is the first of several starts too
    many = ms.curve_fit(decay, X, Y, p0=p0, full_output=True, start_strategy="band", **FAST)[2]
    many = many["result"]
    assert many.n_starts == 4 and float(many.start_params["tau"][0]) == 1.0


def test_starts_stay_inside_bounds_and_a_one_sided_bound_holds():
    lower, upper = [0.0, 0.5, -1.0], [10.0, 10.0, 1.0]
    result = ms.curve_fit(decay, X, Y, bounds=(lower, upper), full_output=True, **FAST)[2]
    result = result["result"]
    for k, lo, hi in zip(("a", "tau", "c"), lower, upper, strict=True):
        v = np.asarray(result.params[k])
        assert np.all((v >= lo) & (v <= hi))
    # c >= 0.5 excludes the truth (0.2): the fit ends on the bound, never below it, and an
    # OptimizeWarning (scipy's category, as a batch's) says so; the Result flags its best
    # start on the one-sided bound too (Result.at_bound and curve_fit share one bound test)
    with pytest.warns(scipy.optimize.OptimizeWarning, match=r"parameter on a bound \(c\)"):
        popt, _, info, *_ = ms.curve_fit(
            decay, X, Y, p0=[1.0, 1.0, 0.6], bounds=([0, 0, 0.5], np.inf), full_output=True, **FAST
        )
    assert popt[2] >= 0.5 and popt[2] == pytest.approx(0.5, abs=1e-6)
    assert info["result"].at_bound[info["result"].best_index]


def test_nan_policy_omit_drops_the_points_and_raise_refuses_them():
    y = Y.copy()
    y[[3, 17]] = np.nan
    popt, _ = ms.curve_fit(decay, X, y, p0=[1.0, 1.0, 0.0], nan_policy="omit", **FAST)
    keep = np.isfinite(y)
    ref, _ = scipy.optimize.curve_fit(decay_np, X[keep], y[keep], p0=[1.0, 1.0, 0.0])
    np.testing.assert_allclose(popt, ref, rtol=1e-6)
    with NoCompile(), pytest.raises(ValueError, match="ydata holds 2 non-finite"):
        ms.curve_fit(decay, X, y, p0=[1.0, 1.0, 0.0], **FAST)


def test_an_undetermined_parameter_gives_an_inf_pcov_with_a_warning():
    def flat(x, a, b):  # b never enters: no curvature along it
        return a + 0.0 * b * x

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, pcov, info, _, _ = ms.curve_fit(flat, X, Y, p0=[1.0, 1.0], full_output=True, **FAST)
    # curve_fit's one warning, not the Result's own RuntimeWarning beside it
    assert [w.category for w in caught] == [scipy.optimize.OptimizeWarning], caught
    assert "could not be estimated" in str(caught[0].message)
    assert np.all(np.isinf(pcov))
    # the Result's covariance, which pcov is made from, says which one is undetermined
    cov = info["result"].covariance
    assert np.all(np.isnan(cov[1])) and np.all(np.isnan(cov[:, 1])) and np.isfinite(cov[0, 0])


def test_pcov_is_the_results_covariance_in_fs_order():
    def backwards(x, tau, c, a):  # f's order is not the sorted one
        return decay(x, a, tau, c)

    popt, pcov, info, _, _ = ms.curve_fit(
        backwards, X, Y, p0=[1.0, 0.0, 1.0], full_output=True, **FAST
    )
    result = info["result"]
    assert result.laplace.names == ("tau", "c", "a")
    np.testing.assert_array_equal(pcov, result.covariance)
    order = [1, 2, 0]  # (a, tau, c) of decay in backwards' order
    np.testing.assert_allclose(pcov, ms.curve_fit(decay, X, Y, **FAST)[1][np.ix_(order, order)])


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(p0=[1.0, 1.0]), ValueError, r"p0 must have one value per parameter of f \(3: a"),
        (dict(bounds=([0, 0], [1, 1, 1])), ValueError, "bounds' lower must have one value"),
        (dict(bounds=(1.0, 0.0)), ValueError, "each lower must be below its upper"),
        (
            dict(bounds=([0, 2, 0], [1, 1, 1])),
            ValueError,
            "parameter 'tau' has lower 2.0 and upper 1.0",
        ),
        (dict(maxfev=500), TypeError, r"maxfev=500: .* pass n_steps=500 \(max_evals caps"),
        (dict(max_nfev=50), TypeError, "pass n_steps=50"),
        (dict(fixed={"b": 1.0}), ValueError, r"fixed: \['b'\] are not parameters of f \(its"),
        (dict(fixed={"a": np.nan}), ValueError, r"fixed\['a'\] must be a finite number"),
        (dict(fixed={"a": 5.0}, bounds=(0, 1)), ValueError, r"fixed\['a'\] = 5.0 lies outside"),
        (dict(tied={"c": "tau", "tau": "a"}), ValueError, r"tied\['c'\] = 'tau' must name"),
        (dict(tied={"c": 3.0}), TypeError, r"tied\['c'\] must be another parameter's name"),
        (dict(fixed={"c": 0.0}, tied={"c": "a"}), ValueError, "'c' is both fixed and tied"),
        (dict(fixed={"a": 1.0, "tau": 1.0, "c": 0.0}), ValueError, "leave at least one free"),
        (dict(bounds=(0.0, 1.0), p0=[2.0, 0.5, 0.5]), ValueError, r"outside bounds .* \['a'\]"),
        (dict(p0=[np.nan, 1.0, 0.0]), ValueError, r"p0 is not finite .* \['a'\]"),
        (
            dict(nan_policy="raise", check_finite=False, p0=[1, 1, 0], sigma=[np.nan] * 50),
            ValueError,
            "sigma holds 50 non-finite",
        ),
        (dict(sigma=np.ones(7)), ValueError, "sigma must have ydata's shape"),
        (dict(sigma=-np.ones(50)), ValueError, "sigma must be positive"),
        (dict(method="trf"), ValueError, "method must be 'lm'"),
        (dict(jac=lambda x: x), ValueError, "jac: the Jacobian comes from JAX"),
        (dict(nan_policy="propagate"), ValueError, "nan_policy must be"),
        (dict(absolute_sigma=1), TypeError, "absolute_sigma must be True or False"),
        (dict(n_starts=0), ValueError, "n_starts"),
        (dict(learning_rate=0.1), TypeError, "unknown option 'learning_rate'"),
    ],
)
def test_bad_arguments_are_refused_before_any_compile(kw, error, match):
    with NoCompile(), pytest.raises(error, match=match):
        ms.curve_fit(decay, X, Y, **kw)


def test_a_model_of_the_wrong_shape_or_data_of_another_length_is_refused_before_a_compile():
    with NoCompile():
        with pytest.raises(ValueError, match=r"must return ydata's shape \(50,\)"):
            ms.curve_fit(lambda x, a: a * x[:10], X, Y, p0=[1.0])
        with pytest.raises(ValueError, match=r"must return ydata's shape \(40,\)"):
            ms.curve_fit(decay, X, Y[:40], p0=[1.0, 1.0, 0.0])
        with pytest.raises(ValueError, match="2 point.*fewer than f's 3 parameters"):
            ms.curve_fit(decay, X[:2], Y[:2], p0=[1.0, 1.0, 0.0])
        with pytest.raises(ValueError, match="p0 is needed"):
            ms.curve_fit(lambda x, *p: p[0] * x, X, Y)
        with pytest.raises(ValueError, match="xdata holds 1 non-finite"):
            ms.curve_fit(decay, np.where(X == X[4], np.inf, X), Y, p0=[1.0, 1.0, 0.0])


def test_a_model_written_with_numpy_is_told_to_use_jax_numpy_before_a_compile():
    def numpy_decay(x, a, tau, c):
        return a * np.exp(-x / tau) + c

    with NoCompile(), pytest.raises(jax.errors.TracerArrayConversionError) as raised:
        ms.curve_fit(numpy_decay, X, Y, p0=[1.0, 1.0, 0.0])
    note = " ".join(getattr(raised.value, "__notes__", []))
    assert "tracing f(xdata, a, tau, c)" in note and "jnp.exp" in note
    assert "numpy_decay" in "".join(traceback.format_tb(raised.value.__traceback__))


def test_p0_on_a_bound_starts_just_inside_it_and_a_list_xdata_is_an_array():
    box = ([0.0, 0.1, -1.0], [10.0, 10.0, 1.0])
    popt, _, info, _, _ = ms.curve_fit(
        decay, list(X), list(Y), p0=[0.0, 1.0, 0.0], bounds=box, full_output=True, **FAST
    )
    result = info["result"]
    assert 0.0 < result.start_params["a"][0] < 1e-4  # p0's a was on the bound 0
    expected, _ = scipy.optimize.curve_fit(decay_np, X, Y, p0=[0.0, 1.0, 0.0], bounds=box)
    np.testing.assert_allclose(popt, expected, rtol=1e-5)


def test_a_start_on_a_bound_moves_inside_by_a_margin_of_the_box_or_of_itself():
    """``_inside`` (column by column) moves a start on a bound inside by ``4 BOUND_MARGIN`` of
    the box's width, or of ``max(|p0|, 1)`` on a one-sided bound, and leaves the rest: the
    elementwise form's values, for one fit and a stack of fits."""
    from multistart.curve_fit.starts import BOUND_MARGIN, _inside

    lower = np.array([0.0, 1.0, -np.inf, -np.inf, 2.0])
    upper = np.array([10.0, np.inf, 5.0, np.inf, 2.5])
    p0 = np.array([[0.0, 1.0, 5.0, -7.0, 2.5], [3.0, 400.0, -2.0, 0.0, 2.2]])
    span = np.where(np.isfinite(upper - lower), upper - lower, np.maximum(np.abs(p0), 1.0))
    expected = np.clip(p0, lower + 4 * BOUND_MARGIN * span, upper - 4 * BOUND_MARGIN * span)
    assert _inside(p0, lower, upper).tolist() == expected.tolist()
    assert _inside(p0[0], lower, upper).tolist() == expected[0].tolist()  # one fit
    moved = expected != p0
    assert moved.tolist() == [[True, True, True, False, True], [False] * 5]


def test_pcov_of_an_ill_conditioned_fit_is_the_exact_inverse():
    x = np.linspace(1000.0, 1001.0, 20)  # J's columns 1, x, x² nearly parallel: cond ~ 5e7

    def quad(x, a, b, c):
        return a + b * x + c * x**2

    y = quad(x, 1.0, 2.0, 3.0) + np.random.default_rng(0).normal(0.0, 0.01, x.size)
    kw = dict(p0=[1.0, 2.0, 3.0], sigma=np.full(x.size, 0.01), absolute_sigma=True)
    _, pcov = ms.curve_fit(quad, x, y, n_starts=1, log_every=0, **kw)
    # the model is linear: (JᵀJ)⁻¹ in exact rational arithmetic (JᵀJ = Σ [1, x, x²]ᵀ[1, x, x²] / σ²)
    powers = [[Fraction(float(v)) ** k for k in range(3)] for v in x]
    gram = [[sum(r[i] * r[j] for r in powers) * 10_000 for j in range(3)] for i in range(3)]
    exact = np.array(_exact_inverse(gram), dtype=float)
    np.testing.assert_allclose(pcov, exact, rtol=1e-6)  # scipy's SVD cut gives 16, not 7.4e8


def _exact_inverse(a):
    """Gauss-Jordan on a list of lists of Fractions."""
    n = len(a)
    rows = [list(r) + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(a)]
    for c in range(n):
        pivot = next(r for r in range(c, n) if rows[r][c] != 0)
        rows[c], rows[pivot] = rows[pivot], rows[c]
        rows[c] = [v / rows[c][c] for v in rows[c]]
        for r in range(n):
            if r != c:
                rows[r] = [v - rows[r][c] * w for v, w in zip(rows[r], rows[c], strict=True)]
    return [r[n:] for r in rows]


def test_names_come_from_f_and_the_result_uses_them_in_popts_order():
    result = ms.curve_fit(decay, X, Y, p0=[1.0, 1.0, 0.0], full_output=True, **FAST)[2]["result"]
    assert result.paths == ["a", "tau", "c"]  # f's arguments: popt's order, not sorted
    assert result.laplace.names == ("a", "tau", "c")
    assert list(result.to_dataframe().columns[-6:-3]) == ["a", "tau", "c"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(result.errors) == {"a", "tau", "c"}


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_curve_fit_logs_nothing_at_the_default_level_as_scipy(caplog, monkeypatch, level):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", level)
    with caplog.at_level(level, logger="multistart"):
        ms.curve_fit(decay, X, Y, p0=[1.0, 1.0, 0.0], **FAST)
    said = [r.getMessage() for r in caplog.records if r.levelname in ("INFO", "WARNING")]
    assert said == []
    routine = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    if level == "DEBUG":  # the search's own lines are there, a level down
        assert any(m.startswith("fitting decay: 4 starts") for m in routine)
        assert any(m.startswith("done in") for m in routine)
    else:
        assert routine == []


def test_full_output_unpacks_as_scipys_five_values():
    kw = dict(p0=[1.0, 1.0, 0.0], sigma=SIGMA)
    popt, pcov, info, mesg, ier = ms.curve_fit(decay, X, Y, full_output=True, **FAST, **kw)
    ref = scipy.optimize.curve_fit(decay_np, X, Y, full_output=True, **kw, xtol=1e-14, ftol=1e-14)
    # residuals of order 1: popt agrees to 1e-7 (below), so a residual near zero to ~1e-8
    np.testing.assert_allclose(info["fvec"], ref[2]["fvec"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(popt, ref[0], rtol=1e-7)
    result = info["result"]
    assert info["nfev"] == int(result.n_evals.sum()) > 0 and isinstance(info["nfev"], int)
    assert ier in (1, 2, 3, 4) and ref[4] in (1, 2, 3, 4)  # scipy's test of success holds
    assert mesg == result.status[result.best_index].message
    # a start that runs out of steps says so: MINPACK's maxfev flag, 5
    *_, mesg, ier = ms.curve_fit(decay, X, Y, full_output=True, n_steps=2, **FAST, **kw)
    assert ier == 5 and mesg == ms.Status.MAX_STEPS.message
    # a batch: one flag, message and residual vector per fit, and the BatchFits
    ys = np.stack([Y, Y + 0.1])
    _, _, info, mesg, ier = ms.curve_fit(
        decay, X, ys, batched=True, full_output=True, bounds=([0, 0.1, -1], [10, 10, 1]), **FAST
    )
    assert isinstance(info["fits"], ms.BatchFits) and info["fvec"].shape == (2, 50)
    np.testing.assert_array_equal(info["nfev"], info["fits"].n_evals)
    assert ier.tolist() == [1, 1] and mesg == [ms.Status.CONVERGED.message] * 2


def test_a_scalar_sigma_is_scipys():
    kw = dict(p0=[1.0, 1.0, 0.0], sigma=0.05, absolute_sigma=True)
    popt, pcov = ms.curve_fit(decay, X, Y, **FAST, **kw)
    ref, ref_cov = scipy.optimize.curve_fit(decay_np, X, Y, **kw, xtol=1e-14, ftol=1e-14)
    np.testing.assert_allclose(popt, ref, rtol=1e-7)
    np.testing.assert_allclose(pcov, ref_cov, rtol=1e-5)
    ys = np.stack([Y, Y + 0.1])
    _, bcov = ms.curve_fit(decay, X, ys, batched=True, **FAST, **kw)
    np.testing.assert_allclose(bcov[0], ref_cov, rtol=1e-5)


def _reduced(x, a, tau):  # decay with c held at 0.2
    return decay_np(x, a, tau, 0.2)


@pytest.mark.parametrize(
    "hold",
    [dict(fixed={"c": 0.2}), dict(bounds=([-np.inf, -np.inf, 0.2], [np.inf, np.inf, 0.2]))],
    ids=["fixed", "equal-bounds"],
)
def test_a_fixed_parameter_is_held_and_pcov_is_over_the_free_ones(hold):
    popt, pcov = ms.curve_fit(decay, X, Y, p0=[1.0, 1.0, 0.0], sigma=SIGMA, **FAST, **hold)
    ref, ref_cov = scipy.optimize.curve_fit(
        _reduced, X, Y, p0=[1.0, 1.0], sigma=SIGMA, xtol=1e-14, ftol=1e-14
    )
    assert popt.shape == (3,) and popt[2] == 0.2  # scipy's shape: every parameter
    np.testing.assert_allclose(popt[:2], ref, rtol=1e-7)
    np.testing.assert_allclose(pcov[:2, :2], ref_cov, rtol=1e-5)
    assert np.all(pcov[2] == 0) and np.all(pcov[:, 2] == 0)


def _lines_np(x, a1, w1, a2, w2):  # two lines, at 1.5 and 3.5
    return a1 * np.exp(-0.5 * ((x - 1.5) / w1) ** 2) + a2 * np.exp(-0.5 * ((x - 3.5) / w2) ** 2)


def _lines(x, a1, w1, a2, w2):
    return a1 * jnp.exp(-0.5 * ((x - 1.5) / w1) ** 2) + a2 * jnp.exp(-0.5 * ((x - 3.5) / w2) ** 2)


def test_tied_parameters_follow_their_tie_by_name_or_function_and_carry_its_error():
    y = _lines_np(X, 2.0, 0.4, 0.7, 0.4) + np.random.default_rng(1).normal(0.0, 0.02, X.size)
    box = ([0.0, 0.05, 0.0, 0.05], [10.0, 2.0, 10.0, 2.0])
    kw = dict(p0=[1.0, 0.5, 0.5, 0.5], sigma=0.02, bounds=box, **FAST)
    popt, pcov = ms.curve_fit(_lines, X, y, tied={"w2": "w1"}, **kw)
    ref, ref_cov = scipy.optimize.curve_fit(
        lambda x, a1, w1, a2: _lines_np(x, a1, w1, a2, w1),
        X,
        y,
        p0=[1.0, 0.5, 0.5],
        sigma=np.full(50, 0.02),
        bounds=([0.0, 0.05, 0.0], [10.0, 2.0, 10.0]),
        xtol=1e-14,
        ftol=1e-14,
    )
    assert popt[3] == popt[1]
    np.testing.assert_allclose(popt[:3], ref, rtol=1e-6)
    np.testing.assert_allclose(pcov[:3, :3], ref_cov, rtol=1e-4)
    # w2 = w1: w1's error and covariances (lmfit's error of an expr parameter)
    np.testing.assert_array_equal(pcov[3], pcov[1])
    np.testing.assert_array_equal(pcov[:, 3], pcov[:, 1])
    # a function of the others: a fixed ratio of amplitudes, its error through the tie
    popt, pcov, info, _, _ = ms.curve_fit(
        _lines,
        X,
        y,
        tied={"a2": lambda p: 0.35 * p["a1"] * p["w1"] / p["w1"]},
        full_output=True,
        **kw,
    )
    assert popt[2] == pytest.approx(0.35 * popt[0], rel=1e-12)
    np.testing.assert_allclose(pcov[2, 2], 0.35**2 * pcov[0, 0], rtol=1e-10)
    np.testing.assert_allclose(pcov[2, [0, 1, 3]], 0.35 * pcov[0, [0, 1, 3]], rtol=1e-10)
    assert info["result"].paths == ["a1", "w1", "w2"]  # the Result: the free ones, f's order
    # a batch holds them the same way, and says which are held
    ys = np.stack([y, 1.1 * y])
    bopt, bcov, info, _, _ = ms.curve_fit(
        _lines, X, ys, tied={"w2": "w1"}, batched=True, full_output=True, **kw
    )
    fits = info["fits"]
    np.testing.assert_allclose(bopt[0, :3], ref, rtol=1e-6)
    assert fits.free.tolist() == [True, True, True, False] and fits.held == {"w2": "= w1"}
    assert np.all(fits.dof == 50 - 3)
    np.testing.assert_array_equal(fits.errors[:, 3], fits.errors[:, 1])
    line = next(s for s in fits.report(0).splitlines() if s.strip().startswith("w2:"))
    assert "+/-" in line and line.endswith("(= w1)")
    assert "C(w1, w2)" not in fits.report(0)  # correlations among the free ones, as lmfit's


def _line(x, c, a, m, w):
    return c + a * jnp.exp(-0.5 * ((x - m) / w) ** 2)


def test_unbounded_starts_are_drawn_at_the_spread_the_data_allow_not_at_p0s_magnitude():
    x = np.linspace(6540.0, 6590.0, 200)  # a line centre at 6563 Å, 2 Å wide
    y = 1.0 + 5.0 * np.exp(-0.5 * ((x - 6563.0) / 2.0) ** 2)
    y = y + np.random.default_rng(0).normal(0.0, 0.1, x.size)
    kw = dict(p0=[1.0, 4.0, 6562.0, 1.5], sigma=0.1, seed=0, log_every=0)
    *_, info, _, _ = ms.curve_fit(_line, x, y, n_starts=16, full_output=True, **kw)
    result = info["result"]
    centres = np.asarray(result.start_params["m"])
    assert np.all(np.abs(centres - 6562.0) < 10.0)  # max(|p0|, 1) drew them over ±6562
    assert np.sum(np.isclose(result.foms, result.best_fom, rtol=1e-9)) >= 12
    # a batch draws its starts the same way (per fit, around its own p0)
    ys = np.stack([y, y[::-1]])
    p0 = np.array([kw["p0"], [1.0, 4.0, 6567.0, 1.5]])
    kw = {**kw, "p0": p0}
    *_, info, _, _ = ms.curve_fit(_line, x, ys, n_starts=8, batched=True, full_output=True, **kw)
    centres = np.asarray(info["fits"].result.start_params["m"]).reshape(2, 8)
    assert np.all(np.abs(centres - p0[:, 2:3]) < 10.0)
