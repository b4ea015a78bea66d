"""The batched L-BFGS rule and the solver interface it is built on."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.optimize
from conftest import (
    ROSENBROCK_SPACE,
    NoCompile,
    _assert_record_equal,
    rosenbrock,
    same_result,
    signal_at_step,
)

import multistart as ms
from multistart.solvers import LBFGS, Minimiser, SolverStep

# Normal priors map affinely to the unconstrained coordinates, so the engine steps the same
# problem scipy sees (no logit in between) and the minima can be compared directly.
ROSEN_SPACE = {"x": ms.Normal(0.0, 1.0, shape=(4,))}
ROSEN_STARTS = {
    "x": np.array([[-1.2, 1.0, -0.5, 0.3], [0.5, -0.7, 1.3, 0.9], [1.5, 1.5, 0.2, -1.0]])
}

_A = np.diag(np.logspace(0.0, 4.0, 6))  # condition number 1e4
_B = np.linspace(-1.0, 1.0, 6)


def quadratic(p):
    x = p["x"]
    return 0.5 * x @ jnp.asarray(_A) @ x - jnp.asarray(_B) @ x


QUAD_SPACE = {"x": ms.Normal(0.0, 1.0, shape=(6,))}
QUAD_STARTS = {"x": np.array([[1.0, -1.0, 0.5, 0.2, -0.3, 0.8], [-2.0, 1.5, 0.0, 1.0, 1.0, -1.0]])}


def _scipy(objective, starts):
    vg = jax.jit(jax.value_and_grad(lambda v: objective({"x": v})))
    out = []
    for x0 in starts["x"]:
        r = scipy.optimize.minimize(
            lambda v: tuple(np.asarray(a, np.float64) for a in vg(v)),
            x0,
            jac=True,
            method="L-BFGS-B",
        )
        out.append(r)
    return out


def _lbfgs(**kw):
    base = dict(batch_size=4, n_steps=2000, seed=0, log_every=0, n_candidates=0)
    return ms.MultiStartLBFGS(**{**base, **kw})


# -- fits shared by several tests (each program compiled once per file) ------------------------


@pytest.fixture(scope="module")
def rosen_runs():
    """``rosen_runs(batch_size)``: 3 random starts (seed 2) on the 4-d Rosenbrock in float64.

    Width 3 (one chunk) is the program the scipy comparison compiles: 3 starts, 2000 steps.
    """

    @functools.cache
    def fit(batch_size):
        with jax.enable_x64(True):
            search = _lbfgs(n_starts=3, batch_size=batch_size, seed=2)
            return search.fit(rosenbrock, ROSEN_SPACE)

    return fit


@pytest.mark.parametrize(
    "objective, space, starts",
    [(rosenbrock, ROSEN_SPACE, ROSEN_STARTS), (quadratic, QUAD_SPACE, QUAD_STARTS)],
    ids=["rosenbrock", "ill-conditioned quadratic"],
)
def test_reaches_scipy_lbfgsb_minimum_from_the_same_starts(objective, space, starts, x64):
    n = len(starts["x"])
    result = _lbfgs(n_starts=n).fit(objective, space, starts=starts)
    ref = _scipy(objective, starts)
    for i, r in enumerate(ref):
        assert abs(result.foms[i] - r.fun) <= 1e-8 * max(1.0, abs(r.fun)), (
            i,
            result.foms[i],
            r.fun,
        )
        # stopped by its own tests, not by running out of steps, in a scipy-like number of evals
        assert result.status[i] is ms.Status.CONVERGED
        assert result.n_evals[i] <= 3 * r.nfev + 20, (result.n_evals[i], r.nfev)
    # one evaluation per engine step
    np.testing.assert_array_equal(result.n_evals, result.n_steps)
    assert result.stats["n_evals"] == int(np.sum(result.n_steps))


def test_widths_agree_and_compile_once(rosen_runs):
    results = {w: rosen_runs(w) for w in (1, 2, 3)}  # chunks 1+1+1, a ragged 2+1, and 3
    for w, r in results.items():
        # once: 0 where an earlier fit of the same model in this process compiled that width
        assert r.stats["n_compiles"] in (0, 1), w
        assert r.stats["batch_size"] == w
        np.testing.assert_allclose(r.foms, results[1].foms, rtol=1e-9, atol=1e-12)
        assert list(r.status) == list(results[1].status)


def test_float32_stays_finite():
    for objective, space, starts in [
        (rosenbrock, ROSEN_SPACE, ROSEN_STARTS),
        (quadratic, QUAD_SPACE, QUAD_STARTS),
    ]:
        result = _lbfgs(n_starts=len(starts["x"])).fit(objective, space, starts=starts)
        assert result.foms.dtype == np.float64  # recorded as float64, computed in float32
        assert np.all(np.isfinite(result.foms))
        assert all(s is ms.Status.CONVERGED for s in result.status), result.status_counts()
        assert result.best_fom < 1e-3


def _walled(p):
    """A pseudo-Huber valley at x = 2 with nan beyond x = 2.5.

    Far from the minimum the slope is almost constant, so the first secant pair sees almost
    no curvature and the quasi-Newton trial from x = -10 lands hundreds of units away, in the
    nan region: the line search must back off through nan values.
    """
    x = p["x"]
    f = jnp.sum(jnp.sqrt(1.0 + (x - 2.0) ** 2))
    return jnp.where(jnp.any(x > 2.5), jnp.nan, f)


@pytest.fixture(scope="module")
def walled_fit():
    """``walled_fit(x0)``: float64 L-BFGS on ``_walled`` from x0, 1 and 0, in chunks of 2.

    Only the first start's value changes from one call to the next: one program serves them all.
    """

    @functools.cache
    def fit(x0):
        with jax.enable_x64(True):
            starts = {"x": np.array([[x0], [1.0], [0.0]])}
            search = _lbfgs(n_starts=3, batch_size=2)
            return search.fit(_walled, {"x": ms.Normal(0.0, 1.0, shape=(1,))}, starts=starts)

    return fit


def _assert_same_records(a, b, rows):
    """The starts ``rows`` have the same record (``Result.start``) in ``a`` and ``b``, exactly."""
    for i in rows:
        _assert_record_equal(a.start(i), b.start(i), f"start {i}", rtol=None, atol=0.0)


def test_a_line_search_into_nan_recovers_without_touching_the_others(walled_fit):
    result = walled_fit(-10.0)
    assert all(s is ms.Status.CONVERGED for s in result.status), result.status_counts()
    np.testing.assert_allclose(result.params["x"][:, 0], 2.0, atol=1e-4)
    # the other two starts beside a harmless first start (1.5, which also ends at another
    # step, so the chunks are repacked differently): identical records
    _assert_same_records(result, walled_fit(1.5), (1, 2))


def test_a_start_that_only_sees_nan_ends_nonfinite_and_others_carry_on(walled_fit):
    result = walled_fit(3.0)  # beyond the wall at 2.5: nan from the first evaluation on
    assert result.status[0] is ms.Status.NONFINITE
    assert all(s is ms.Status.CONVERGED for s in result.status[1:]), result.status_counts()
    np.testing.assert_allclose(result.params["x"][1:, 0], 2.0, atol=1e-6)
    # and exactly as they do beside a harmless first start
    _assert_same_records(result, walled_fit(1.5), (1, 2))


def test_optax_line_search_evaluations_are_counted(x64):
    # the search of test_lbfgs_rule_with_line_search_fits_without_a_second_code_path in
    # test_search.py: one program for both files (the suite's compilation cache is shared)
    search = ms.MultiStartGradient(optax.lbfgs(), n_starts=5, batch_size=2, n_steps=60, seed=0)
    result = search.fit(rosenbrock, ROSENBROCK_SPACE)
    assert np.all(result.n_evals > result.n_steps)
    assert result.stats["n_evals"] == int(np.sum(result.n_evals))
    # an optax rule without a line search spends one evaluation a step: asserted on Adam's
    # record in test_search.py (test_result_record_shapes_and_history), on a fit shared there


class _GradientDescent(Minimiser):
    """A third rule written against the interface alone: fixed-step gradient descent."""

    name = "gd"

    def __init__(self, rate):
        self.rate = rate

    def hyperparameters(self):
        return {"rate": self.rate}

    def init(self, u):
        return jnp.zeros((), u.dtype)

    def step(self, value, grad, u, state, *, scale, value_fn):
        return SolverStep(u - scale * self.rate * grad, state + 1)


def test_a_new_rule_needs_only_the_solver_interface(x64):
    search = ms.MultiStartGradient(
        _GradientDescent(0.1), n_starts=3, batch_size=2, n_steps=400, log_every=0, seed=0
    )
    result = search.fit(
        lambda p: jnp.sum((p["x"] - 0.25) ** 2), {"x": ms.Normal(0.0, 1.0, shape=(3,))}
    )
    np.testing.assert_allclose(result.best_params["x"], 0.25, atol=1e-4)
    assert result.config["rule"] == "gd" and result.config["hyperparameters"] == {"rate": 0.1}


def test_resurrection_and_the_scan_backend_work_with_lbfgs(x64):
    def objective(p):  # nan on a band of x: starts die there and are replaced
        x = p["x"]
        return jnp.where(x[1] > 1.0, jnp.nan, jnp.sum((x - 0.3) ** 2) + 0.1 * jnp.sin(4 * x[0]))

    space = {"x": ms.Uniform(-3.0, 3.0, shape=(2,))}
    kw = dict(n_starts=6, batch_size=3, n_steps=200, seed=1, resurrect=2)
    loop = _lbfgs(**kw).fit(objective, space)
    assert loop.stats["n_resurrections"] > 0
    scan = _lbfgs(**kw, backend="scan").fit(objective, space)
    assert same_result(loop, scan) or np.allclose(loop.foms, scan.foms, rtol=1e-12)
    assert np.all(np.isfinite(loop.foms))


def test_bad_hyperparameters_fail_before_any_compile():
    with NoCompile():
        for kw, word in [
            ({"memory": 0}, "memory"),
            ({"rtol": -1.0}, "rtol"),
            ({"xtol": float("nan")}, "xtol"),
            ({"ftol": "x"}, "ftol"),
            ({"diagonal": 1}, "diagonal"),
        ]:
            with pytest.raises(ValueError, match=word):
                ms.MultiStartLBFGS(**kw)
        with pytest.raises(ValueError, match="c1"):
            LBFGS(c1=1.5)


def test_a_signal_mid_line_search_resumes_bit_identically(rosen_runs, tmp_path, monkeypatch, x64):
    pytest.importorskip("orbax.checkpoint")
    kw = dict(n_starts=3, batch_size=2, seed=2)  # rosen_runs(2): ragged chunks, 2 + 1
    full = rosen_runs(2)
    # the premise: a start still running had its trial at step 23 rejected (its best did not
    # improve; an accepted trial always does), so it is inside a line search there
    h = full.history
    assert np.any((h[22] == h[21]) & (full.n_steps > 23)), "no line search open at step 23"
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=10)
    # a context, not monkeypatch.undo(): that would also undo the autouse fixtures' environment
    with monkeypatch.context() as mp, pytest.raises(ms.SearchInterrupted):
        signal_at_step(mp, 23)  # one step a call: the search stops after step 23
        _lbfgs(**kw, **ck, steps_per_call=1).fit(rosenbrock, ROSEN_SPACE)
    resumed = _lbfgs(**kw, **ck).fit(rosenbrock, ROSEN_SPACE, resume=True)
    assert resumed.stats["resumed_from"] == 23
    assert same_result(full, resumed)


def _numpy_two_loop(g, pairs, gamma):
    """The textbook two-loop recursion (Nocedal & Wright, algorithm 7.4) over ``pairs``,
    oldest first."""
    q, alphas = g.copy(), []
    for s, y in reversed(pairs):
        a = (s @ q) / (s @ y)
        q = q - a * y
        alphas.append(a)
    r = gamma * q
    for (s, y), a in zip(pairs, reversed(alphas), strict=True):
        b = (y @ r) / (s @ y)
        r = r + (a - b) * s
    return r


def test_the_memory_keeps_the_newest_pairs_oldest_first_and_the_direction_is_the_two_loop(x64):
    from multistart.solvers.lbfgs import LBFGSFields, LBFGSState, _Dots

    solver, n = LBFGS(memory=3), 4
    state = solver.init(jnp.zeros(n))
    assert isinstance(state, LBFGSState) and len(jax.tree_util.tree_leaves(state)) == 3
    st = LBFGSFields.unpack(state)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n, n))
    hessian = a @ a.T + n * np.eye(n)
    pairs = []
    for _ in range(5):  # two more than the memory holds
        s = rng.normal(size=n)
        y = hessian @ s
        pairs.append((s, y))
        dots = _Dots.of(jnp.asarray(s), jnp.asarray(y), jnp.zeros(n), st)
        mem = solver._remember(st, jnp.asarray(s), jnp.asarray(y), dots, jnp.bool_(True))
        st = st._replace(**mem._asdict())
        kept = pairs[-3:]
        assert int(st.n_pairs) == len(kept)
        np.testing.assert_array_equal(np.asarray(st.s[3 - len(kept) :]), [p[0] for p in kept])
        np.testing.assert_array_equal(np.asarray(st.y[3 - len(kept) :]), [p[1] for p in kept])
        assert np.all(np.asarray(st.rho[: 3 - len(kept)]) == 0)  # empty rows first
        g = rng.normal(size=n)
        got = np.asarray(LBFGS._two_loop(jnp.asarray(g), mem, mem.gamma))
        gamma = kept[-1][0] @ kept[-1][1] / (kept[-1][1] @ kept[-1][1])
        np.testing.assert_allclose(got, _numpy_two_loop(g, kept, gamma), rtol=1e-12)
    again = LBFGSFields.unpack(st.pack())  # the three arrays hold every field
    for name in LBFGSFields._fields:
        np.testing.assert_array_equal(
            np.asarray(getattr(again, name)), np.asarray(getattr(st, name))
        )


def test_diagonal_scales_each_coordinate_by_its_own_secant_within_range(x64):
    from multistart.solvers.lbfgs import _DIAGONAL_RANGE, LBFGSFields, _Dots

    solver, n = LBFGS(memory=3, diagonal=True), 5
    st = LBFGSFields.unpack(solver.init(jnp.zeros(n)))
    rng = np.random.default_rng(1)
    # coordinate 3 of the pairs shows negative curvature, coordinate 4 none at all (y = 0)
    curvature = np.array([1e-1, 1e3, 1e6, -1.0, 0.0])  # gamma: about 1e-6, the largest's
    pairs = []
    for _ in range(3):
        s = rng.normal(size=n)
        y = curvature * s
        y[0] += 0.1 * s[1]  # a little coupling, so the secants are estimates
        pairs.append((s, y))
        dots = _Dots.of(jnp.asarray(s), jnp.asarray(y), jnp.zeros(n), st)
        mem = solver._remember(st, jnp.asarray(s), jnp.asarray(y), dots, jnp.bool_(True))
        st = st._replace(**mem._asdict())
    s_rows, y_rows = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    gamma = s_rows[-1] @ y_rows[-1] / (y_rows[-1] @ y_rows[-1])
    secant = np.sum(s_rows * y_rows, axis=0) / np.where(np.any(y_rows, 0), (y_rows**2).sum(0), 1)
    want = np.where(secant > 0, secant, gamma)
    want = np.clip(want, gamma / _DIAGONAL_RANGE, gamma * _DIAGONAL_RANGE)
    h0 = np.asarray(solver._h0(mem))
    np.testing.assert_allclose(h0, want, rtol=1e-12)
    assert h0[3] == h0[4] == gamma  # no positive curvature seen: the scalar scale
    assert h0[1] == pytest.approx(1e-3, rel=1e-3)  # 1 / the coordinate's curvature
    assert h0[2] == pytest.approx(1e-6, rel=1e-6)
    assert h0[0] == pytest.approx(gamma * _DIAGONAL_RANGE)  # about 10 is past the range
    g = rng.normal(size=n)
    got = np.asarray(LBFGS._two_loop(jnp.asarray(g), mem, solver._h0(mem)))
    np.testing.assert_allclose(got, _numpy_two_loop(g, pairs, want), rtol=1e-12)
    # off, the initial inverse Hessian is the scalar gamma
    assert float(LBFGS(memory=3)._h0(mem)) == pytest.approx(gamma, rel=1e-12)


# A quadratic whose curvatures span 1e4, shuffled over its 40 coordinates: what the diagonal is
# for (a cohort's shared parameters against thousands of factors' own)
_SCALED = np.random.default_rng(3).permutation(np.logspace(0.0, 4.0, 40))


def _badly_scaled(p):
    return 1.0 + 0.5 * jnp.sum(jnp.asarray(_SCALED) * (p["x"] - 0.5) ** 2)


def test_the_diagonal_converges_in_far_fewer_steps_on_a_badly_scaled_quadratic(x64):
    space = {"x": ms.Normal(0.0, 1.0, shape=(40,))}
    fits = {
        diagonal: _lbfgs(n_starts=4, n_steps=5000, diagonal=diagonal).fit(_badly_scaled, space)
        for diagonal in (False, True)
    }
    for fit in fits.values():
        assert list(fit.status) == ["converged"] * 4
        assert np.all(np.asarray(fit.foms) - 1.0 <= 1e-9)
        np.testing.assert_allclose(np.asarray(fit.params["x"]), 0.5, atol=1e-5)
    plain, diagonal = (int(np.sum(fits[d].n_steps)) for d in (False, True))
    assert diagonal < plain / 3, (diagonal, plain)
    assert "diagonal" not in fits[False].config["hyperparameters"]  # recorded only when on
    assert fits[True].config["hyperparameters"]["diagonal"] is True


def _on_a_corner(p):  # minimum at a = (1, 1), b = 0.1: on bounds of a Uniform and a LogUniform
    return -p["a"][0] - 2.0 * p["a"][1] + p["b"] + 0.3 * jnp.sin(p["a"][0])


CORNER_SPACE = {"a": ms.Uniform(-1.0, 1.0, shape=(2,)), "b": ms.LogUniform(0.1, 100.0)}


def test_a_minimum_on_a_bound_is_reached_to_rounding_in_as_few_evaluations_as_lbfgsb(x64):
    # the band: these 8 local searches only, as scipy runs (the default would start more)
    search = ms.MultiStartLBFGS(n_starts=8, seed=0, progress=False, start_strategy="band")
    result = search.fit(_on_a_corner, CORNER_SPACE)
    eps = np.finfo(np.float64).eps
    assert np.all(result.status == "converged")
    # every start on the bound to rounding of the prior's range
    np.testing.assert_allclose(result.params["a"], 1.0, rtol=0, atol=32 * eps * 2.0)
    np.testing.assert_allclose(result.params["b"], 0.1, rtol=32 * eps * np.log(1000.0))
    # scipy's L-BFGS-B from the same starts, its box the priors' (b in log coordinates)
    starts = np.column_stack([result.start_params["a"], np.log(result.start_params["b"])])

    def fun(x):
        value = -x[0] - 2.0 * x[1] + np.exp(x[2]) + 0.3 * np.sin(x[0])
        return value, np.array([-1.0 + 0.3 * np.cos(x[0]), -2.0, np.exp(x[2])])

    box = [(-1.0, 1.0), (-1.0, 1.0), (np.log(0.1), np.log(100.0))]
    scipy_evals = sum(
        scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=box).nfev
        for x0 in starts
    )
    # the logistic coordinate alone takes some 45 evaluations a start to get there (issue 41)
    assert result.stats["n_evals"] <= 2 * scipy_evals, (result.stats["n_evals"], scipy_evals)


def test_a_minimum_just_inside_a_bound_is_not_pulled_onto_it(x64):
    centre = 1.0 - 2e-4  # a ten-thousandth of the range inside: within the projection's reach
    result = ms.MultiStartLBFGS(n_starts=8, seed=0, progress=False).fit(
        lambda p: jnp.sum((p["a"] - centre) ** 2), {"a": ms.Uniform(-1.0, 1.0, shape=(2,))}
    )
    assert np.all(result.status == "converged")
    np.testing.assert_allclose(result.params["a"], centre, rtol=0, atol=1e-10)


def test_a_projected_trial_failing_on_other_coordinates_does_not_end_the_projecting(x64):
    # a[0] starts within 1 % of its bound: its first trial is projected, and fails on b's step;
    # before, the start then projected no more and crept to the corner in 46 steps
    start = {"a": np.array([0.995, 0.96]), "b": 0.3532947117350681}
    search = ms.MultiStartLBFGS(n_starts=1, n_candidates=0, progress=False)
    result = search.fit(_on_a_corner, CORNER_SPACE, starts=[start])
    assert result.status[0] == "converged" and int(result.n_steps[0]) <= 16, result.n_steps
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(result.params["a"], 1.0, rtol=0, atol=32 * eps * 2.0)
