"""The batched L-BFGS rule and the solver interface it is built on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.optimize
from conftest import NoCompile, rosenbrock, same_result, signal_at_step

import multistart as ms
from multistart.solvers import LBFGS, Solver, SolverStep

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


def test_widths_agree_and_compile_once(x64):
    kw = dict(n_starts=7, n_steps=300, n_candidates=0, seed=3)
    results = {w: _lbfgs(batch_size=w, **kw).fit(rosenbrock, ROSEN_SPACE) for w in (1, 4, 5)}
    for w, r in results.items():
        assert r.stats["n_compiles"] == 1, w
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


def test_a_line_search_into_nan_recovers_without_touching_the_others(x64):
    space = {"x": ms.Normal(0.0, 1.0, shape=(1,))}
    starts = {"x": np.array([[-10.0], [1.0], [0.0]])}
    result = _lbfgs(n_starts=3, batch_size=2).fit(_walled, space, starts=starts)
    assert all(s is ms.Status.CONVERGED for s in result.status), result.status_counts()
    np.testing.assert_allclose(result.params["x"][:, 0], 2.0, atol=1e-4)
    # the other two starts alone: identical records
    alone = _lbfgs(n_starts=2, batch_size=2).fit(_walled, space, starts={"x": starts["x"][1:]})
    np.testing.assert_array_equal(result.foms[1:], alone.foms)
    np.testing.assert_array_equal(result.n_steps[1:], alone.n_steps)


def test_a_start_that_only_sees_nan_ends_nonfinite_and_others_carry_on(x64):
    def objective(p):
        x = p["x"]
        return jnp.where(x[0] < -1.0, jnp.nan, jnp.sum((x - 0.5) ** 2))

    space = {"x": ms.Normal(0.0, 1.0, shape=(2,))}
    starts = {"x": np.array([[-2.0, 0.0], [0.0, 0.0]])}
    result = _lbfgs(n_starts=2, batch_size=2).fit(objective, space, starts=starts)
    assert result.status[0] is ms.Status.NONFINITE
    assert result.status[1] is ms.Status.CONVERGED
    np.testing.assert_allclose(result.params["x"][1], [0.5, 0.5], atol=1e-6)


def test_optax_line_search_evaluations_are_counted(x64):
    kw = dict(n_starts=2, batch_size=2, n_steps=30, seed=0, log_every=0, n_candidates=0)
    result = ms.MultiStartGradient(optax.lbfgs(), **kw).fit(rosenbrock, ROSEN_SPACE)
    assert np.all(result.n_evals > result.n_steps)
    assert result.stats["n_evals"] == int(np.sum(result.n_evals))
    adam = ms.MultiStartAdam(**kw).fit(rosenbrock, ROSEN_SPACE)
    np.testing.assert_array_equal(adam.n_evals, adam.n_steps)


class _GradientDescent(Solver):
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
            ({"gtol": -1.0}, "gtol"),
            ({"ftol": "x"}, "ftol"),
        ]:
            with pytest.raises(ValueError, match=word):
                ms.MultiStartLBFGS(**kw)
        with pytest.raises(ValueError, match="c1"):
            LBFGS(c1=1.5)


def test_a_signal_mid_line_search_resumes_bit_identically(tmp_path, monkeypatch, x64):
    pytest.importorskip("orbax.checkpoint")
    kw = dict(n_starts=5, batch_size=2, n_steps=60, convergence=None)
    full = _lbfgs(**kw).fit(rosenbrock, ROSEN_SPACE)
    signal_at_step(monkeypatch, 23)
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=10)
    with pytest.raises(ms.SearchInterrupted):
        _lbfgs(**kw, **ck).fit(rosenbrock, ROSEN_SPACE)
    monkeypatch.undo()
    resumed = _lbfgs(**kw, **ck).fit(rosenbrock, ROSEN_SPACE, resume=True)
    assert resumed.stats["resumed_from"] == 23
    assert same_result(full, resumed)
