"""Missing data in curve_fit (issue 72): nan with nan_policy="omit", a mask, a masked array
and an infinite sigma leave points out of their own fit only; a fit with too few points is
not run ("no_data"); a batch stopped early keeps the fits that ended; a bound is an
OptimizeWarning and says so in mesg."""

from __future__ import annotations

import signal
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NoCompile, signal_at_step
from scipy.optimize import OptimizeWarning

import multistart as ms

X = np.linspace(0.0, 5.0, 40)
TRUTHS = np.array(
    [[3.0, 1.5, 0.2], [1.0, 0.7, -0.1], [2.0, 3.0, 0.5], [0.5, 1.0, 0.3], [2.5, 0.3, 0.0]]
)
BOX = ([0.0, 0.1, -1.0], [10.0, 10.0, 1.0])
P0 = [1.0, 1.0, 0.0]
SIGMA = 0.05
FAST = dict(p0=P0, bounds=BOX, n_starts=3, seed=0, log_every=0, batch_size=4)


def decay(x, a, tau, c):
    return a * jnp.exp(-x / tau) + c


def _data(seed=0):
    noise = np.random.default_rng(seed).normal(0.0, SIGMA, (len(TRUTHS), X.size))
    return np.stack([a * np.exp(-X / t) + c for a, t, c in TRUTHS]) + noise


Y = _data()


def batch(y, **kw):
    """``(popt, pcov, fits, mesg, ier, fvec)`` of a batched fit."""
    popt, pcov, info, mesg, ier = ms.curve_fit(
        decay, X, y, batched=True, full_output=True, **{**FAST, **kw}
    )
    return popt, pcov, info["fits"], mesg, ier, info["fvec"]


@pytest.fixture(scope="module")
def whole():
    """The batch with no point missing."""
    return batch(Y, sigma=np.full(Y.shape, SIGMA))


@pytest.fixture(scope="module")
def holed():
    """Fit 1 with two nan channels, fit 3 with every channel nan (no data), under
    nan_policy="omit"; the others as in :func:`whole`."""
    y = Y.copy()
    y[1, [4, 21]] = np.nan
    y[3] = np.nan
    return batch(y, sigma=np.full(Y.shape, SIGMA), nan_policy="omit")


def test_the_fits_without_missing_points_are_bit_for_bit_those_of_the_whole_batch(whole, holed):
    untouched = [0, 2, 4]
    for got, want in zip(holed[:3], whole[:3], strict=True):
        if isinstance(got, ms.BatchFits):
            for name in ("best_fom", "dof", "n_evals", "best_row", "at_bound", "n_points"):
                a, b = getattr(got, name), getattr(want, name)
                np.testing.assert_array_equal(a[untouched], b[untouched], err_msg=name)
            assert got.status[untouched].tolist() == want.status[untouched].tolist()
        else:
            np.testing.assert_array_equal(got[untouched], want[untouched])


def test_a_fit_with_nan_channels_leaves_them_out_as_scipy_drops_them(holed):
    popt, pcov, fits, mesg, ier, fvec = holed
    keep = np.ones(X.size, dtype=bool)
    keep[[4, 21]] = False
    kw = {**FAST, "start_strategy": "band", "n_candidates": 0, "rediscoveries": 3}
    alone, alone_cov = ms.curve_fit(decay, X[keep], Y[1, keep], sigma=SIGMA, **kw)
    np.testing.assert_allclose(popt[1], alone, rtol=1e-9)
    np.testing.assert_allclose(pcov[1], alone_cov, rtol=1e-7)  # s² over 38 - 3 dof
    assert fits.n_points[1] == 38 and fits.dof[1] == 35
    assert fits.redchi[1] == fits.best_fom[1] / 35
    assert np.isnan(fvec[1, [4, 21]]).all() and np.isfinite(np.delete(fvec[1], [4, 21])).all()
    assert ier[1] == 1 and str(fits.status[1]) == "converged"
    assert "data points        38" in fits.report(1)


def test_a_fit_with_no_point_left_is_not_run_and_says_no_data(holed):
    popt, pcov, fits, mesg, ier, fvec = holed
    assert fits.status[3] is ms.Status.NO_DATA
    assert ms.Status.NO_DATA == "no_data" and list(ms.Status)[-1] is ms.Status.NO_DATA
    assert np.isnan(popt[3]).all() and np.isnan(pcov[3]).all() and np.isnan(fits.errors[3]).all()
    assert np.isnan(fits.best_fom[3]) and np.isnan(fits.redchi[3]) and np.isnan(fvec[3]).all()
    assert fits.n_points[3] == 0 and fits.dof[3] == 0 and fits.n_evals[3] == 0
    assert ier[3] == 0 and mesg[3] == ms.Status.NO_DATA.message and "No data" in mesg[3]
    rows = fits.result.status.reshape(5, 3)
    assert all(s is ms.Status.NO_DATA for s in rows[3])  # its starts never ran
    assert not np.any(fits.result.n_steps.reshape(5, 3)[3])
    assert np.isnan(fits.result.start_params["a"].reshape(5, 3)[3]).all()
    assert "no_data 1" in fits.report() and "no covariance      0 fits" in fits.report()
    assert "starts             3 (none run: no data)" in fits.report(3)


def test_too_few_points_left_is_no_data_and_as_many_as_parameters_is_run():
    y = Y.copy()
    y[0, 2:] = np.nan  # 2 points for 3 parameters
    y[2, 3:] = np.nan  # 3 points: run, no degree of freedom left
    with pytest.warns(OptimizeWarning) as caught:  # (fit 2's 3 points also put c on a bound)
        popt, pcov, fits, *_ = batch(y, nan_policy="omit")
    said = [str(w.message) for w in caught]
    assert "Covariance of the parameters could not be estimated for 1 of 5 fits" in said
    assert [str(s) for s in fits.status[[0, 2]]] != ["no_data", "no_data"]
    assert fits.status[0] is ms.Status.NO_DATA and fits.status[2] is not ms.Status.NO_DATA
    assert np.isfinite(popt[2]).all() and np.isinf(pcov[2]).all()  # s² = SSR / 0, as scipy
    assert fits.n_points[[0, 2]].tolist() == [2, 3] and fits.dof[[0, 2]].tolist() == [0, 0]


def test_a_mask_a_masked_array_an_infinite_sigma_and_nan_leave_out_the_same_points(holed):
    gone = np.zeros(Y.shape, dtype=bool)
    gone[1, [4, 21]] = True
    gone[3] = True
    sigma = np.full(Y.shape, SIGMA)
    ways = {
        "mask": batch(Y, sigma=sigma, mask=gone),
        "masked array": batch(np.ma.masked_array(Y, gone), sigma=sigma),
        "masked sigma": batch(Y, sigma=np.ma.masked_array(sigma, gone)),
        "infinite sigma": batch(Y, sigma=np.where(gone, np.inf, SIGMA)),
        "garbage under the mask": batch(np.where(gone, -1e300, Y), sigma=sigma, mask=gone),
    }
    for way, got in ways.items():
        np.testing.assert_array_equal(got[0], holed[0], err_msg=way)
        np.testing.assert_array_equal(got[1], holed[1], err_msg=way)
        assert got[2].status.tolist() == holed[2].status.tolist(), way
        np.testing.assert_array_equal(got[2].dof, holed[2].dof, err_msg=way)


def test_a_mask_shared_by_every_fit_leaves_those_channels_out_of_each():
    channels = np.zeros(X.size, dtype=bool)
    channels[[0, 1, 30]] = True  # a sky line, say: the same channels in every spaxel
    _, _, fits, *_ = batch(Y, mask=channels)
    assert fits.n_points.tolist() == [37] * 5 and fits.dof.tolist() == [34] * 5
    popt, *_ = batch(np.where(channels, np.nan, Y), nan_policy="omit")
    np.testing.assert_array_equal(popt, batch(Y, mask=channels)[0])


def test_a_covariance_sigma_with_points_left_out_whitens_the_others_as_their_own():
    cov = SIGMA**2 * (np.eye(X.size) + 0.3 * np.exp(-np.abs(np.subtract.outer(X, X))))
    y = Y[:2].copy()
    y[0, [5, 6]] = np.nan
    popt, pcov = ms.curve_fit(
        decay,
        X,
        y,
        sigma=np.broadcast_to(cov, (2, X.size, X.size)),
        batched=True,
        nan_policy="omit",
        **FAST,
    )
    keep = np.isfinite(y[0])
    kw = {**FAST, "start_strategy": "band", "n_candidates": 0, "rediscoveries": 3}
    alone, alone_cov = ms.curve_fit(decay, X[keep], y[0, keep], sigma=cov[np.ix_(keep, keep)], **kw)
    np.testing.assert_allclose(popt[0], alone, rtol=1e-8)
    np.testing.assert_allclose(pcov[0], alone_cov, rtol=1e-6)


def test_new_data_with_other_points_missing_compiles_nothing(whole):
    y = _data(1)
    y[0, :7] = np.nan
    y[4] = np.nan
    with NoCompile():
        _, _, fits, *_ = batch(y, sigma=np.full(Y.shape, SIGMA), nan_policy="omit")
    assert fits.n_points.tolist() == [33, 40, 40, 40, 0]


def test_nan_is_refused_without_nan_policy_and_propagates_with_check_finite_false():
    y = Y.copy()
    y[2, 9] = np.nan
    with NoCompile(), pytest.raises(ValueError, match=r"ydata of fit 2 holds .* nan_policy='omit'"):
        batch(y)
    with pytest.warns(OptimizeWarning, match="for 1 of 5 fits"):  # scipy's check_finite=False
        popt, *_ = batch(y, check_finite=False)
    assert np.isnan(popt[2]).all() and np.isfinite(np.delete(popt, 2, axis=0)).all()


@pytest.mark.parametrize(
    "way",
    [
        dict(mask=np.isin(np.arange(40), [4, 21])),
        dict(ydata=np.ma.masked_array(Y[1], np.isin(np.arange(40), [4, 21]))),
        dict(sigma=np.where(np.isin(np.arange(40), [4, 21]), np.inf, SIGMA)),
        dict(ydata=np.where(np.isin(np.arange(40), [4, 21]), np.nan, Y[1]), nan_policy="omit"),
    ],
    ids=["mask", "masked array", "infinite sigma", "nan omitted"],
)
def test_a_single_fit_drops_the_points_left_out_as_scipy(way):
    keep = ~np.isin(np.arange(40), [4, 21])
    kw = {"ydata": Y[1], "sigma": SIGMA, **way}
    popt, pcov, info, _, _ = ms.curve_fit(decay, X, full_output=True, **kw, **FAST)
    dropped = ms.curve_fit(decay, X[keep], Y[1, keep], sigma=SIGMA, **FAST)
    np.testing.assert_array_equal(popt, dropped[0])
    np.testing.assert_array_equal(pcov, dropped[1])
    assert info["fvec"].shape == (38,) and info["result"].laplace.dof == 35


def test_a_single_fit_omits_points_of_a_two_row_xdata_as_scipy():
    def plane(xy, a, b, c):
        return a + b * xy[0] + c * xy[1]

    xy = np.stack([X, np.cos(X)])
    z = 1.0 + 2.0 * X - 0.5 * np.cos(X)
    xy[1, 7] = np.nan  # scipy's omit drops a point where any row of xdata is nan
    z[12] = np.nan
    popt, _ = ms.curve_fit(plane, xy, z, p0=[0, 0, 0], nan_policy="omit", n_starts=2)
    keep = np.isfinite(z) & np.isfinite(xy).all(axis=0)
    np.testing.assert_allclose(popt, [1.0, 2.0, -0.5], atol=1e-8)
    with pytest.raises(ValueError, match=r"ydata has 2 point\(s\)"):
        ms.curve_fit(plane, xy[:, keep][:, :2], z[keep][:2], p0=[0, 0, 0], n_starts=2)


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(ydata=np.full(40, np.nan), nan_policy="omit"), ValueError, "no point left"),
        (dict(mask=np.ones(40, dtype=bool)), ValueError, "no point left"),
        (dict(mask=np.zeros(39, dtype=bool)), ValueError, r"mask must have ydata's shape \(40,\)"),
        (dict(mask=[0] * 40), TypeError, "mask must be booleans"),
        (
            dict(ydata=np.ones((5, 8)), xdata=np.ones((5, 8)), mask=np.eye(5, 8, dtype=bool)),
            ValueError,
            "needs 1-D ydata and xdata with the points on its last axis",
        ),
        (
            dict(ydata=np.where(X < 4.9, np.nan, Y[0]), nan_policy="omit"),
            ValueError,
            r"ydata has 1 point\(s\)",
        ),
    ],
)
def test_a_single_fit_with_nothing_left_or_a_bad_mask_is_refused(kw, error, match):
    args = dict(f=decay, xdata=X, ydata=Y[0], **FAST)
    with NoCompile(), pytest.raises(error, match=match):
        ms.curve_fit(**{**args, **kw})


# -- a batch stopped before its end ------------------------------------------------------------


@pytest.fixture(scope="module")
def steps():
    """The batch to its end, one step a call, and the step each fit's last start ended at."""
    _, _, fits, *_ = batch(Y, steps_per_call=1)
    ends = np.asarray(fits.result.n_steps).reshape(5, 3).max(axis=1)
    return fits, ends


def test_ctrl_c_in_a_batch_keeps_the_fits_that_ended_and_resume_finishes_the_rest(
    steps, tmp_path, monkeypatch
):
    pytest.importorskip("orbax.checkpoint")
    full, ends = steps
    k = int(np.median(ends))
    ended, running = ends < k, ends > k
    assert ended.any() and running.any()
    folder = dict(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=1000)
    with monkeypatch.context() as mp, pytest.raises(ms.SearchInterrupted) as info:
        signal_at_step(mp, k, signal.SIGINT)
        batch(Y, steps_per_call=1, **folder)
    partial = info.value.fits
    assert isinstance(partial, ms.BatchFits) and partial.result is info.value.result
    assert info.value.checkpoint == k and info.value.reason == "SIGINT"
    # the fits that ended: their answers, whole; those still running: said so
    np.testing.assert_array_equal(partial.popt[ended], full.popt[ended])
    np.testing.assert_array_equal(partial.pcov[ended], full.pcov[ended])
    assert partial.status[ended].tolist() == full.status[ended].tolist()
    assert all(s is ms.Status.INTERRUPTED for s in partial.status[running])
    assert np.isfinite(partial.popt[running]).all()  # each one's best so far
    assert "interrupted" in partial.report() and partial.n_fits == 5
    # resumed: the rest finished, the whole batch's answer
    popt, pcov, fits, *_ = batch(Y, resume=True, **folder)
    np.testing.assert_array_equal(popt, full.popt)
    np.testing.assert_array_equal(pcov, full.pcov)
    assert fits.status.tolist() == full.status.tolist()


def test_a_budget_returns_the_fits_that_ended_and_marks_the_others_stopped(steps):
    full, ends = steps
    k = int(np.median(ends))  # the evaluations of every start up to step k (3 a step)
    budget = int(np.minimum(np.asarray(full.result.n_evals), 3 * k).sum())
    popt, pcov, fits, mesg, ier, _ = batch(Y, steps_per_call=1, max_evals=budget)
    assert fits.result.stats["stop_reason"] == "max_evals"
    stopped = np.array([s is ms.Status.STOPPED for s in fits.status])
    assert stopped.any() and not stopped.all()
    starts = fits.result.status.reshape(5, 3)
    np.testing.assert_array_equal(stopped, (starts == ms.Status.STOPPED).any(axis=1))
    assert ier[stopped].tolist() == [0] * stopped.sum()
    assert all(m == ms.Status.STOPPED.message for m in np.array(mesg, object)[stopped])
    np.testing.assert_array_equal(popt[~stopped], full.popt[~stopped])


# -- scipy's habits: a bound is a warning, and mesg says so ------------------------------------


def test_a_bound_is_one_optimize_warning_and_mesg_says_on_a_bound_with_ier_1():
    narrow = ([0.0, 0.1, -1.0], [10.0, 10.0, 0.15])  # c <= 0.15: binds fits 0, 2, 3
    with pytest.warns(OptimizeWarning, match=r"3 of 5 fits have a parameter on a bound \(c\)"):
        _, _, fits, mesg, ier, _ = batch(Y, bounds=narrow)
    hit = fits.on_bound()
    assert hit.tolist() == [0, 2, 3]
    assert ier.tolist() == [1] * 5  # a constrained optimum: settled, as scipy's least_squares
    for i in range(5):
        said = "On a bound: c (the optimum may lie outside the bounds" in mesg[i]
        assert said == (i in hit) and mesg[i].startswith(fits.status[i].message)
    kw = {**FAST, "bounds": narrow}
    with pytest.warns(OptimizeWarning, match=r"the fit has a parameter on a bound \(c\)") as w:
        *_, one_mesg, one_ier = ms.curve_fit(decay, X, Y[0], full_output=True, **kw)
    assert len(w) == 1 and one_ier == 1 and "On a bound: c" in one_mesg
    assert w[0].filename == __file__  # it points at the caller's line, as scipy's warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fit inside its bounds warns of nothing
        *_, one_mesg, _ = ms.curve_fit(decay, X, Y[1], full_output=True, **kw)
    assert "On a bound" not in one_mesg
