"""ms.curve_fit(..., batched=True): a stack of fits in one search, each fit's answer the one
fitting it alone gives, new data without a compile, bad input refused before a compile."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from conftest import NoCompile

import multistart as ms
from multistart.common.monitor import CompileCounter
from multistart.device import programs as fixed_width

X = np.linspace(0.0, 5.0, 40)
TRUTHS = np.array([[3.0, 1.5, 0.2], [1.0, 0.7, -0.1], [2.0, 3.0, 0.5], [0.5, 1.0, 0.3]])
SIGMA = np.linspace(0.03, 0.08, 40)
BOX = ([0.0, 0.1, -1.0], [10.0, 10.0, 1.0])
P0 = [1.0, 1.0, 0.0]
FAST = dict(n_starts=3, seed=0, log_every=0, batch_size=4)


def decay(x, a, tau, c):
    return a * jnp.exp(-x / tau) + c


def decay_np(x, a, tau, c):
    return a * np.exp(-x / tau) + c


def data(seed=0, truths=TRUTHS):
    noise = np.random.default_rng(seed).normal(0.0, SIGMA, (len(truths), X.size))
    return np.stack([decay_np(X, *t) for t in truths]) + noise


Y = data()


def alone(i, y=Y, **kw):
    """Fit ``i`` of the stack on its own, as the batch says it fits it."""
    kw = {**FAST, **kw, "start_strategy": "band", "n_candidates": 0, "rediscoveries": 3}
    popt, pcov, info, _, _ = ms.curve_fit(decay, X, y[i], full_output=True, **kw)
    return popt, pcov, info["result"]


def batch(*args, **kw):
    """``(popt, pcov, fits)`` of a batched fit (scipy's five values with ``full_output``)."""
    popt, pcov, info, _, _ = ms.curve_fit(*args, batched=True, full_output=True, **kw)
    return popt, pcov, info["fits"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(p0=P0, bounds=BOX),
        dict(p0=P0, bounds=([0.0, 0.1, -np.inf], np.inf), sigma=SIGMA, absolute_sigma=True),
        dict(p0=P0),  # unbounded: the batch steps in x itself, a fit alone around its p0
        dict(p0=P0, bounds=BOX, method="dogleg"),
        dict(p0=P0, bounds=BOX, method="gauss-newton"),
    ],
    ids=["box", "one-sided", "free", "box-dogleg", "box-gauss-newton"],
)
def test_each_fit_is_the_fit_alone(kw):
    popt, pcov, fits = batch(decay, X, Y, **FAST, **kw)
    assert popt.shape == (4, 3) and pcov.shape == (4, 3, 3) and popt.dtype == np.float64
    for i in range(len(Y)):
        one, one_cov, result = alone(i, **kw)
        if "bounds" in kw and all(np.all(np.isfinite(b)) for b in kw["bounds"]):  # boxed
            np.testing.assert_array_equal(popt[i], one)
            # the same arithmetic (gram_inverse of the same J), one program for the batch and
            # the Result's own for a fit alone: equal to rounding, and exactly the Result's
            np.testing.assert_allclose(pcov[i], one_cov, rtol=1e-12, atol=0)
            np.testing.assert_array_equal(one_cov, result.covariance)
            assert fits.best_fom[i] == result.best_fom
        # elsewhere the coordinates differ by an affine map: the same minimum, to tolerance
        np.testing.assert_allclose(popt[i], one, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(pcov[i], one_cov, rtol=1e-6)
        assert fits.best_fom[i] == pytest.approx(result.best_fom, rel=1e-9)
        # the same starts: p0, then the same band draws through this fit's own priors
        rows = slice(3 * i, 3 * i + 3)
        for k in ("a", "tau", "c"):
            np.testing.assert_allclose(
                np.asarray(fits.result.start_params[k])[rows], result.start_params[k], rtol=1e-12
            )


def test_a_batch_checkpoints_and_resumes_to_the_uninterrupted_answer(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    kw = dict(p0=P0, bounds=BOX, **FAST)
    popt, pcov, whole = batch(decay, X, Y, n_steps=12, **kw)
    folder = dict(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2)
    _, _, first = batch(decay, X, Y, n_steps=12, max_evals=20, **folder, **kw)
    stopped = first.result.stats
    assert stopped["stop_reason"] == "max_evals" and 0 < stopped["n_steps_run"] < 12
    popt2, pcov2, resumed = batch(decay, X, Y, n_steps=12, resume=True, **folder, **kw)
    assert resumed.result.stats["resumed_from"] == stopped["checkpoints"][-1] > 0
    np.testing.assert_array_equal(popt2, popt)
    np.testing.assert_array_equal(pcov2, pcov)
    np.testing.assert_array_equal(resumed.n_evals, whole.n_evals)
    with pytest.raises(TypeError, match="resume must be True or False"):
        ms.curve_fit(decay, X, Y, resume="yes", batched=True, **folder, **kw)


def test_a_single_fit_checkpoints_and_resumes_to_the_uninterrupted_answer(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    kw = dict(p0=P0, bounds=BOX, full_output=True, **FAST)
    popt, pcov, info, _, _ = ms.curve_fit(decay, X, Y[0], n_steps=12, **kw)
    whole = info["result"]
    folder = dict(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=1)
    first = ms.curve_fit(decay, X, Y[0], n_steps=12, max_evals=8, **folder, **kw)[2]["result"]
    stopped = first.stats
    assert stopped["stop_reason"] == "max_evals" and 0 < stopped["n_steps_run"] < 12
    popt2, pcov2, info2, _, _ = ms.curve_fit(
        decay, X, Y[0], n_steps=12, resume=True, **folder, **kw
    )
    resumed = info2["result"]
    assert resumed.stats["resumed_from"] == stopped["checkpoints"][-1] > 0
    np.testing.assert_array_equal(popt2, popt)
    np.testing.assert_array_equal(pcov2, pcov)
    np.testing.assert_array_equal(resumed.n_evals, whole.n_evals)


def test_each_fits_best_is_its_lowest_finite_start_the_first_on_ties_as_alone():
    """A batch picks each fit's best as a fit alone picks its own (``Result.of``)."""
    from types import SimpleNamespace

    from multistart.curve_fit.batch import _per_fit
    from multistart.result.merge import best_fit

    nan = np.nan
    foms = np.array([[2.0, 1.0, 1.0], [nan, 3.0, 3.0], [nan, nan, nan], [0.5, 0.5, 0.5]])
    params = {"a": np.arange(12.0), "b": -np.arange(12.0)}
    ones = np.ones(12, int)
    record = SimpleNamespace(
        foms=foms.reshape(-1), params=params, status=np.array(["converged"] * 12), n_evals=ones
    )
    popt, best_row = _per_fit(record, ["a", "b"], 4, 3)
    best_fom = foms.reshape(-1)[best_row]
    np.testing.assert_array_equal(best_row, [1, 4, 6, 9])
    np.testing.assert_array_equal(best_fom[[0, 1, 3]], [1.0, 3.0, 0.5])
    assert not np.isfinite(best_fom[2])  # nan here; a fit alone says inf
    np.testing.assert_array_equal(popt[[0, 1, 3]], [[1.0, -1.0], [4.0, -4.0], [9.0, -9.0]])
    assert np.all(np.isnan(popt[2]))  # no finite start: nan, as alone
    for i in (0, 1, 3):  # alone: the same row of its own three
        rows = slice(3 * i, 3 * i + 3)
        index, fom, _ = best_fit(foms[i], {k: v[rows] for k, v in params.items()})
        assert 3 * i + index == best_row[i] and fom == best_fom[i]
    assert best_fit(foms[2], {"a": params["a"][6:9]})[0] == -1


def test_the_answers_are_scipys_and_the_record_says_which_start_won():
    sigma = np.tile(SIGMA, (4, 1)) * np.array([[1.0], [2.0], [0.5], [1.0]])
    y = data(1)
    popt, pcov, fits = batch(decay, X, y, p0=P0, sigma=sigma, bounds=BOX, **FAST)
    for i in range(4):
        ref, ref_cov = scipy.optimize.curve_fit(
            decay_np, X, y[i], p0=P0, sigma=sigma[i], bounds=BOX, xtol=1e-14, ftol=1e-14
        )
        np.testing.assert_allclose(popt[i], ref, rtol=1e-6)
        np.testing.assert_allclose(pcov[i], ref_cov, rtol=1e-4)
    result = fits.result
    assert isinstance(fits, ms.BatchFits) and result.n_starts == 12
    foms = result.foms.reshape(4, 3)
    np.testing.assert_array_equal(fits.best_row, np.arange(4) * 3 + np.argmin(foms, axis=1))
    np.testing.assert_array_equal(fits.best_fom, foms.min(axis=1))
    np.testing.assert_array_equal(fits.n_evals, result.n_evals.reshape(4, 3).sum(axis=1))
    assert all(s is ms.Status.CONVERGED for s in fits.status)
    np.testing.assert_array_equal(popt[:, 1], np.asarray(result.params["tau"])[fits.best_row])
    assert result.history.shape == (1, 12)  # a small Result: one row of history per start


def test_xdata_p0_and_sigma_may_differ_between_fits():
    x = np.stack([X, 2.0 * X, X + 1.0, 0.5 * X])
    y = np.stack([decay_np(xi, *t) for xi, t in zip(x, TRUTHS, strict=True)])
    p0 = TRUTHS * 1.1
    cov = np.stack([np.diag(SIGMA**2) * s for s in (1.0, 2.0, 3.0, 4.0)])
    kw = dict(p0=p0, sigma=cov, bounds=BOX, batched=True, absolute_sigma=True, **FAST)
    popt, pcov = ms.curve_fit(decay, x, y, **kw)
    np.testing.assert_allclose(popt, TRUTHS, rtol=1e-7)
    for i in range(4):
        ref = scipy.optimize.curve_fit(
            decay_np, x[i], y[i], p0=p0[i], sigma=cov[i], absolute_sigma=True
        )[1]
        np.testing.assert_allclose(pcov[i], ref, rtol=1e-5)


def test_new_data_of_the_same_shapes_compiles_nothing_batched_or_not():
    kw = dict(p0=P0, bounds=BOX, **FAST)
    ms.curve_fit(decay, X, data(2), batched=True, **kw)
    ms.curve_fit(decay, X, data(2)[0], **kw)
    with NoCompile():
        popt, _ = ms.curve_fit(decay, X, data(3), batched=True, **kw)
        one, _ = ms.curve_fit(decay, X, data(3)[1], **kw)
        p0 = ms.curve_fit(decay, X, data(3), batched=True, **{**kw, "p0": TRUTHS * 1.1})[0]
        ms.curve_fit(decay, X, data(3)[1], **{**kw, "p0": [2.0, 2.0, 0.1]})  # boxed: nothing
    np.testing.assert_allclose(popt[1], one, rtol=1e-9)
    np.testing.assert_allclose(p0, popt, rtol=1e-6)
    # the counter sees compiles: a stack of another number of fits is another program
    with CompileCounter() as compiles:
        ms.curve_fit(decay, X, data(3)[:2], batched=True, **kw)
    assert compiles.count("multistart_chunk_step") == 1


def test_a_single_fit_from_another_p0_compiles_its_step_again_where_a_parameter_is_free():
    def free(x, a, tau, c):  # this test's own f: no other test kept a program for it
        return decay(x, a, tau, c)

    ms.curve_fit(free, X, Y[0], p0=P0, **FAST)
    with CompileCounter() as compiles:  # its coordinates are centred on p0
        ms.curve_fit(free, X, Y[0], p0=[2.0, 2.0, 0.1], **FAST)
    assert compiles.count("multistart_chunk_step") == 1


def test_a_refit_keeps_the_batch_width_its_first_fit_chose(monkeypatch):
    from multistart.host import engine

    def kept(x, a, tau, c):  # this test's own f: its first fit chooses a width
        return decay(x, a, tau, c)

    kw = dict(p0=P0, bounds=BOX, n_starts=3, seed=0, log_every=0, batched=True, full_output=True)
    first = ms.curve_fit(kept, X, data(4), batch_size="auto", **kw)[2]["fits"].result.stats
    assert first["width_choice"]["selected_by"].startswith("auto")

    def choose_again(*args, **kwargs):
        raise AssertionError("a refit chose its batch width again")

    monkeypatch.setattr(engine, "resolve_width", choose_again)
    with NoCompile():
        second = ms.curve_fit(kept, X, data(5), batch_size="auto", **kw)[2]["fits"].result.stats
    assert second["batch_size"] == first["batch_size"]
    assert second["width_choice"]["selected_by"] == first["width_choice"]["selected_by"] + (
        " (earlier fit)"
    )


def test_a_batch_prices_its_width_at_the_share_of_steps_a_stack_runs(monkeypatch):
    """The width choice is told a stack's fits end early (STACK_RUN_SHARE of n_steps); a
    single fit is priced at all its steps (the gate's arithmetic: test_width.py)."""
    from multistart.host import engine
    from multistart.width.timing import STACK_RUN_SHARE

    shares = []
    real = engine.resolve_width

    def spy(*args, **kwargs):
        shares.append(kwargs["run_share"])
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "resolve_width", spy)

    def priced(x, a, tau, c):  # this test's own f: its fits choose their widths
        return decay(x, a, tau, c)

    kw = dict(p0=P0, bounds=BOX, n_starts=3, seed=0, log_every=0, batch_size="auto")
    ms.curve_fit(priced, X, Y, batched=True, **kw)
    ms.curve_fit(priced, X, Y[0], **kw)
    assert shares == [STACK_RUN_SHARE, 1.0]


def test_a_kept_program_is_never_another_models():
    """Programs are kept per f, bounds and options: a change in any runs its own program."""
    kw = dict(p0=P0, **FAST)
    ms.curve_fit(decay, X, Y, batched=True, bounds=BOX, **kw)

    def shifted(x, a, tau, c):  # another f, the same shapes
        return decay(x, a, tau, c) + 1.0

    popt = ms.curve_fit(shifted, X, Y + 1.0, batched=True, bounds=BOX, **kw)[0]
    np.testing.assert_allclose(popt, ms.curve_fit(decay, X, Y, batched=True, bounds=BOX, **kw)[0])
    narrow = ([0.0, 0.1, -1.0], [10.0, 10.0, 0.15])  # c <= 0.15 binds fit 0 (c = 0.2)
    with pytest.warns(scipy.optimize.OptimizeWarning, match="on a bound"):
        assert ms.curve_fit(decay, X, Y, batched=True, bounds=narrow, **kw)[0][0, 2] <= 0.15
    # shifted's lm program is kept (shifted is this test's own, so no other test kept one for
    # it): the same f, bounds and shapes, only the method differs, so dogleg compiles its own
    # step, where a reuse of lm's would compile nothing
    with CompileCounter() as compiles:
        dogleg = ms.curve_fit(shifted, X, Y + 1.0, batched=True, bounds=BOX, method="dogleg", **kw)
    assert compiles.count("multistart_chunk_step") == 1
    np.testing.assert_allclose(dogleg[0], popt, rtol=1e-6)


def test_a_fit_whose_covariance_cannot_be_estimated_is_inf_with_one_warning():
    x = np.tile(X, (4, 1))
    x[[1, 3]] = 0.0  # every point at x = 0: tau never enters, a and c only as a + c
    with pytest.warns(scipy.optimize.OptimizeWarning, match="for 2 of 4 fits") as caught:
        _, pcov = ms.curve_fit(decay, x, Y, p0=P0, bounds=BOX, batched=True, **FAST)
    assert len(caught) == 1
    assert np.all(np.isinf(pcov[[1, 3]])) and np.all(np.isfinite(pcov[[0, 2]]))


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(ydata=Y[0]), ValueError, r"leading axis of fits, shape \(n_fits, m\)"),
        (dict(sigma=np.ones((5, 40))), ValueError, r"sigma must have ydata's shape \(4, 40\)"),
        (dict(sigma=-np.ones(40)), ValueError, "sigma must be positive"),
        (dict(xdata=np.ones((4, 39))), ValueError, r"must return one fit's ydata shape \(40,\)"),
        (dict(p0=[1.0, 1.0]), ValueError, r"p0 must have one value per parameter of f \(3"),
        (dict(p0=np.ones((5, 3))), ValueError, r"one per fit \(4, 3\); got shape \(5, 3\)"),
        (dict(p0=[P0, P0, [1.0, 1.0, 5.0], P0], bounds=BOX), ValueError, r"p0 of fit 2 .*\['c'\]"),
        (dict(p0=[P0, [np.nan, 1.0, 0.0], P0, P0]), ValueError, r"p0 of fit 1 is not finite"),
        (dict(n_starts=1.5), ValueError, "n_starts must be an int >= 1; got 1.5"),
        (dict(n_starts=True), ValueError, "n_starts must be an int >= 1; got True"),
        (dict(bounds=([0, 0], [1, 1, 1])), ValueError, "bounds' lower must have one value"),
        (dict(fixed={"w": 1.0}), ValueError, r"fixed: \['w'\] are not parameters of f"),
        (dict(maxfev=100), TypeError, "pass n_steps=100"),
        (dict(f=lambda x, a, b, c: a * x[:10]), ValueError, "must return one fit's ydata shape"),
        (dict(start_strategy="tiktak"), ValueError, "start_strategy='tiktak' ranks or replaces"),
        (dict(n_candidates=30), ValueError, "runs no broad-start filter"),
        (dict(resurrect=2), ValueError, "resurrect=2 would rank or replace starts"),
        (dict(schedule="halving"), ValueError, "schedule='halving' would rank"),
        (dict(nan_policy="propagate"), ValueError, "nan_policy must be None, 'raise' or 'omit'"),
        (dict(ydata=[Y[0], Y[1][:30]]), ValueError, r"ydata must be one array; got a list of "),
        (dict(p0={"a": 1.0, "tau": 1.0, "c": 0.0}), TypeError, r"p0 must be .* in f's order"),
        (dict(mask=np.zeros(Y.shape)), TypeError, "mask must be booleans, True where a point"),
        (
            dict(mask=np.zeros((4, 39), bool)),
            ValueError,
            r"mask must have ydata's shape \(4, 40\) or one fit's shape \(40,\)",
        ),
        (
            dict(tied={"c": lambda p: p["C"]}),
            ValueError,
            r"tied\['c'\] \(<lambda>\) raised KeyError\('C'\); it may read 'a', 'tau'",
        ),
        (
            dict(tied={"c": lambda p: np.exp(p["a"])}),
            ValueError,
            r"tied\['c'\] .* raised TracerArrayConversionError.* jnp.exp",
        ),
        (
            dict(ydata=np.where(X < 4.95, np.nan, Y), nan_policy="omit"),
            ValueError,
            "ydata: no fit of the batch has 3 points left",
        ),
        (dict(batched=1), TypeError, "batched must be True or False"),
    ],
)
def test_bad_batches_are_refused_before_any_compile(kw, error, match):
    args = dict(f=decay, xdata=X, ydata=Y, p0=P0, batched=True, **FAST)
    with NoCompile(), pytest.raises(error, match=match):
        ms.curve_fit(**{**args, **kw})


def test_a_covariance_shaped_like_per_fit_sigma_is_refused_and_its_broadcast_is_used():
    x = np.linspace(0.0, 1.0, 4)  # 4 fits of 4 points: (4, 4) could be either

    def line(x, a, b):
        return a + b * x

    ys = np.stack([1 + 2 * x + 0.1 * k * np.array([1, -1, 1, -1]) for k in range(1, 5)])
    cov = 0.01 * (np.eye(4) + 0.5 * np.ones((4, 4)))
    kw = dict(p0=[1.0, 1.0], absolute_sigma=True, **FAST)
    with NoCompile(), pytest.raises(ValueError, match="symmetric, as a covariance is"):
        ms.curve_fit(line, x, ys, sigma=cov, batched=True, **kw)
    _, pcov = ms.curve_fit(line, x, ys, sigma=np.broadcast_to(cov, (4, 4, 4)), batched=True, **kw)
    _, alone = ms.curve_fit(line, x, ys[0], sigma=cov, **kw)
    np.testing.assert_allclose(pcov[0], alone, rtol=1e-6)


def test_non_finite_data_are_refused_naming_the_fit():
    y = Y.copy()
    y[2, 5] = np.nan
    y[3, 0] = np.inf
    with NoCompile():
        with pytest.raises(
            ValueError,
            match=r"ydata of fit 2 \(and 1 other fit\) holds non-finite .* nan_policy='omit' to "
            "leave those points out of their own fit",
        ):
            ms.curve_fit(decay, X, y, p0=P0, batched=True, **FAST)
        x = np.tile(X, (4, 1))
        x[1, 3] = np.nan
        with pytest.raises(ValueError, match="xdata of fit 1 holds"):
            ms.curve_fit(decay, x, Y, p0=P0, batched=True, **FAST)
        with pytest.raises(ValueError, match="xdata holds 1 non-finite"):
            ms.curve_fit(decay, np.where(X == X[4], np.nan, X), Y, p0=P0, batched=True, **FAST)


def test_programs_kept_are_bounded_and_keyed():
    kept = fixed_width.programs_for(("test", 0))
    assert fixed_width.programs_for(("test", 0)) is kept
    assert fixed_width.programs_for(None) is not fixed_width.programs_for(None)
    made = []
    assert kept.get("f", lambda: made.append(1) or "v") == "v"
    assert kept.get("f", lambda: made.append(1) or "w") == "v" and made == [1]
    for i in range(1, fixed_width.PROGRAMS_KEPT + 1):
        fixed_width.programs_for(("test", i))
    assert fixed_width.programs_for(("test", 0)) is not kept  # the least recent was dropped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(fixed_width._kept) <= fixed_width.PROGRAMS_KEPT


def test_kept_programs_do_not_keep_the_data_alive():
    import gc
    import weakref

    y = data(4)
    ms.curve_fit(decay, X, y, p0=P0, bounds=BOX, batched=True, **FAST)
    ms.curve_fit(decay, X, y[0], p0=P0, bounds=BOX, **FAST)
    alive = weakref.ref(y)
    del y
    gc.collect()
    assert alive() is None


NARROW = ([0.0, 0.1, -1.0], [10.0, 10.0, 0.15])  # c <= 0.15 binds fits 0, 2, 3


ON_NARROW = (
    "3 of 4 fits have a parameter on a bound (c): fits 0, 2, 3; see fits.at_bound (the "
    "optimum may lie outside the bounds: widen them, or the parameter is not determined there)"
)


def narrow_batch():
    """:func:`batch` in ``NARROW`` bounds, its one bound warning caught."""
    with pytest.warns(scipy.optimize.OptimizeWarning, match=r"3 of 4 fits .* on a bound"):
        return batch(decay, X, Y, p0=P0, sigma=SIGMA, bounds=NARROW, **FAST)


def test_each_fit_has_its_errors_reduced_chi2_status_and_bound_flags(caplog, monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")  # the default level, not the suite's
    with (
        caplog.at_level("INFO", logger="multistart"),
        pytest.warns(scipy.optimize.OptimizeWarning) as caught,
    ):
        popt, pcov, fits = batch(decay, X, Y, p0=P0, sigma=SIGMA, bounds=NARROW, **FAST)
    np.testing.assert_array_equal(fits.errors, np.sqrt(np.diagonal(pcov, axis1=1, axis2=2)))
    np.testing.assert_array_equal(fits.dof, [40 - 3] * 4)
    np.testing.assert_array_equal(fits.redchi, fits.best_fom / 37)
    assert fits.message == [s.message for s in fits.status] and fits.names == ("a", "tau", "c")
    expected = np.zeros((4, 3), dtype=bool)
    expected[:, 2] = np.abs(popt[:, 2] - 0.15) < 1e-4 * 1.15
    assert expected[:, 2].sum() == 3
    np.testing.assert_array_equal(fits.at_bound, expected)
    # one OptimizeWarning for the whole batch (scipy's habit), naming the fits, pointing at
    # the caller's line; no log line at all
    assert [str(w.message) for w in caught] == [ON_NARROW]
    assert caught[0].filename == __file__
    assert not [r for r in caplog.records if r.levelname in ("INFO", "WARNING")]
    for i in range(4):  # the flag is the one a fit alone raises for its best start
        with warnings.catch_warnings(record=True) as alone_caught:
            warnings.simplefilter("always")
            one = alone(i, bounds=NARROW, p0=P0, sigma=SIGMA)[2]
        assert bool(one.at_bound[one.best_index]) == bool(expected[i, 2])
        # a fit alone on a bound warns the same way, for itself
        said = [
            str(w.message) for w in alone_caught if w.category is scipy.optimize.OptimizeWarning
        ]
        assert said == (
            [
                "the fit has a parameter on a bound (c); the optimum may lie outside the bounds: "
                "widen them, or the parameter is not determined there"
            ]
            if expected[i, 2]
            else []
        )


def test_a_fits_report_and_the_batch_report_are_per_fit():
    popt, pcov, fits = narrow_batch()
    text = fits.report(0)
    err = np.sqrt(np.diag(pcov[0]))
    assert f"    a:   {popt[0, 0]: .7g} +/- {err[0]:.5g}" in text
    assert (
        "(on a bound)"
        in text.splitlines()[[ln.strip()[:2] for ln in text.splitlines()].index("c:")]
    )
    assert f"reduced chi-square {fits.redchi[0]:.7g} (37 degrees of freedom)" in text
    r = pcov[0][1, 2] / (err[1] * err[2])
    assert f"C(tau, c) = {r:+.4f}" in text and "status             converged" in text
    summary = fits.report()
    assert "fits by status     converged 4" in summary
    assert "on a bound         3 (fits 0, 2, 3; fits.at_bound)" in summary
    assert f"median {np.median(fits.redchi):.4g}" in summary
    # the search's own report says it is a batch: no best, no minima, no false "no errors"
    whole = fits.result.report()
    assert "4 datasets x 3 starts" in whole and "fits.report(i)" in whole
    for wrong in ("no errors", "distinct minima", "figure of merit"):
        assert wrong not in whole
    with pytest.raises(IndexError, match=r"fit index must be an int in \[0, 4\)"):
        fits.report(4)


def test_to_dataframe_has_one_row_per_fit():
    pytest.importorskip("pandas")
    popt, pcov, fits = narrow_batch()
    df = fits.to_dataframe()
    assert len(df) == 4 and list(df["fit"]) == [0, 1, 2, 3]
    np.testing.assert_array_equal(df["tau"], popt[:, 1])
    np.testing.assert_array_equal(df["error:c"], np.sqrt(pcov[:, 2, 2]))
    np.testing.assert_array_equal(df["at_bound:c"], fits.at_bound[:, 2])
    np.testing.assert_array_equal(df["redchi"], fits.redchi)
    assert list(df["status"]) == ["converged"] * 4 and list(df["at_bound"]) == [
        True,
        False,
        True,
        True,
    ]


def test_a_batchs_progress_line_counts_fits_done_and_left(caplog, monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    kw = {**FAST, "log_every": 1}
    with caplog.at_level("INFO", logger="multistart"):
        ms.curve_fit(decay, X, Y, p0=P0, bounds=BOX, batched=True, **kw)
    lines = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert lines and all("fits done" in ln and "best" not in ln for ln in lines)
    done = [int(ln.split("fits done ")[1].split("/")[0]) for ln in lines]
    left = [int(ln.split(", left ")[1].split()[0]) for ln in lines]
    assert done == sorted(done) and [d + k for d, k in zip(done, left, strict=True)] == [4] * len(
        lines
    )


EIGHT = dict(p0=P0, bounds=BOX, n_starts=8, seed=0, log_every=0, batch_size=16)


def test_a_fits_running_starts_end_once_three_of_its_starts_found_its_best():
    """The batch's default ``rediscoveries=3``: at step 16 a fit whose best minimum 3 settled
    starts found ends its starts still running (``refound``, their best kept); every fit's
    answer is the one of the batch run to every start's end, to rounding, in fewer steps; the
    same at another width, and a fit alone with the rule gives its answer bit for bit."""
    popt, _, fits = batch(decay, X, Y, **EIGHT)
    full, _, every = batch(decay, X, Y, **EIGHT, rediscoveries=None)
    r = fits.result
    status, steps = np.asarray(r.status).reshape(4, 8), np.asarray(r.n_steps).reshape(4, 8)
    foms = np.asarray(r.foms).reshape(4, 8)
    ended = status == "refound"
    assert ended.any() and not (np.asarray(every.result.status) == "refound").any()
    for i in np.flatnonzero(ended.any(axis=1)):
        at = steps[i][ended[i]]
        assert np.all(at % 16 == 0)  # ended at a decision step
        best = foms[i][status[i] == "converged"].min()
        found = (status[i] == "converged") & (foms[i] <= best * (1 + 1e-3)) & (steps[i] <= at.min())
        assert found.sum() >= 3
        assert np.all(foms[i][ended[i]] >= best * (1 - 1e-3))  # none below the best
    assert steps.sum() < np.asarray(every.result.n_steps).sum()
    np.testing.assert_allclose(popt, full, rtol=1e-6)
    np.testing.assert_allclose(fits.best_fom, every.best_fom, rtol=1e-12)
    wide, _, at_32 = batch(decay, X, Y, **{**EIGHT, "batch_size": 32})
    np.testing.assert_array_equal(wide, popt)
    np.testing.assert_array_equal(np.asarray(at_32.result.status), np.asarray(r.status))
    i = int(np.flatnonzero(ended.any(axis=1))[0])
    one, _, result = alone(i, **EIGHT)
    np.testing.assert_array_equal(one, popt[i])
    np.testing.assert_array_equal(np.asarray(result.status), status[i])


def test_the_rediscovery_rule_is_off_where_a_fit_has_too_few_starts_for_it():
    """With fewer starts a fit than the rule counts (3) it could end none: the batch leaves it
    off (no reading of every start's point each 16 steps), with the answer of the rule given
    explicitly off, bit for bit; at 3 starts a fit it is on."""
    two = {**EIGHT, "n_starts": 2}
    popt, _, fits = batch(decay, X, Y, **two)
    assert fits.result.config["rediscoveries"] is None
    off, _, _ = batch(decay, X, Y, **two, rediscoveries=None)
    np.testing.assert_array_equal(popt, off)
    _, _, three = batch(decay, X, Y, **{**EIGHT, "n_starts": 3})
    assert three.result.config["rediscoveries"] == 3


def test_a_batch_resumed_after_its_starts_were_refound_gives_the_uninterrupted_answer(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    popt, _, whole = batch(decay, X, Y, **EIGHT)
    folder = dict(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=4)
    budget = int(whole.n_evals.sum() * 0.97)
    _, _, first = batch(decay, X, Y, max_evals=budget, **folder, **EIGHT)
    stopped = first.result.stats
    assert stopped["stop_reason"] == "max_evals" and stopped["n_steps_run"] > 16
    assert (np.asarray(first.result.status) == "refound").any()  # in the checkpoint
    popt2, _, resumed = batch(decay, X, Y, resume=True, **folder, **EIGHT)
    assert resumed.result.stats["resumed_from"] == stopped["checkpoints"][-1] > 16
    np.testing.assert_array_equal(popt2, popt)
    np.testing.assert_array_equal(
        np.asarray(resumed.result.status), np.asarray(whole.result.status)
    )
    np.testing.assert_array_equal(resumed.n_evals, whole.n_evals)


def test_rediscoveries_is_refused_where_it_cannot_apply():
    for bad in (1, 0, -1, 2.5, "3", True):
        with pytest.raises(ValueError, match=f"rediscoveries must be an int >= 2; got {bad!r}"):
            ms.MultiStartLeastSquares(rediscoveries=bad)
    with NoCompile(), pytest.raises(ValueError, match="rediscoveries must be an int >= 2"):
        batch(decay, X, Y, **{**EIGHT, "rediscoveries": 1})  # a batch: before any compile
    with pytest.raises(ValueError, match="rediscoveries=3 .* start_strategy='tiktak'"):
        ms.MultiStartLeastSquares(rediscoveries=3, start_strategy="tiktak")
    with pytest.raises(ValueError, match="rediscoveries=3 .* schedule='halving'"):
        ms.MultiStartLBFGS(rediscoveries=3, start_strategy="band", schedule="halving")
    with pytest.raises(ValueError, match="rediscoveries=2 .* resurrect"):
        ms.MultiStartAdam(rediscoveries=2, resurrect=1)
    ms.MultiStartLBFGS(rediscoveries=3, start_strategy="band")  # the band: accepted


@pytest.mark.parametrize("scale", [1e3, 1e-3])
def test_the_rediscovery_rule_ends_the_same_starts_at_another_scale_of_chi2(scale):
    """``sigma`` times ``scale`` divides χ² by ``scale²`` (at 1e3 a χ² of about 1e-5, where the
    tolerance is absolute): the same starts end ``refound``, at the same steps, and every
    fit's answer is the one of the batch run to every start's end."""
    _, _, base = batch(decay, X, Y, **EIGHT, sigma=SIGMA)
    popt, _, fits = batch(decay, X, Y, **EIGHT, sigma=SIGMA * scale)
    full, _, _ = batch(decay, X, Y, **EIGHT, sigma=SIGMA * scale, rediscoveries=None)
    status = np.asarray(fits.result.status)
    assert (status == "refound").any()
    np.testing.assert_array_equal(status, np.asarray(base.result.status))
    np.testing.assert_array_equal(fits.result.n_steps, base.result.n_steps)
    np.testing.assert_allclose(popt, full, rtol=1e-6)


def test_the_rediscovery_rule_adds_no_program_and_ends_a_call_at_every_16th_step():
    """The rule is host-side: a batch with it compiles nothing a batch without it did not,
    and with ``steps_per_call=64`` its calls end at steps 16, 32, ...: one chunk of 32 rows,
    so the chunk calls are the steps run over 16, rounded up (a call stops early once its
    starts have all ended); without it, the first call's 64 steps."""
    kw = {**EIGHT, "batch_size": 32, "steps_per_call": 64}
    _, _, every = batch(decay, X, Y, **kw, rediscoveries=None)
    with NoCompile():
        _, _, fits = batch(decay, X, Y, **kw)
    assert (np.asarray(fits.result.status) == "refound").any()
    run = fits.result.stats["n_steps_run"]
    assert fits.result.stats["n_chunk_calls"] == -(-run // 16) > 1
    assert every.result.stats["n_chunk_calls"] == -(-every.result.stats["n_steps_run"] // 64)
