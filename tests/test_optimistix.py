"""optimistix's solvers inside the engine: parity with optimistix's own loop, and refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NoCompile, rosenbrock

import multistart as ms

optx = pytest.importorskip("optimistix")

# A Normal(0, 1) prior maps to the unconstrained coordinates as the identity, so the engine
# steps exactly the problem optimistix is given.
SPACE = {"x": ms.Normal(0.0, 1.0, shape=(2,))}
X0 = np.array([[-1.2, 1.0], [0.5, -0.7]])

T = np.linspace(0.0, 3.0, 30)
Y = 2.0 * np.exp(-T / 0.7) + 0.1 * np.sin(3 * T)


def decay(p):
    return p["x"][0] * jnp.exp(-T / p["x"][1]) - Y


def _search(cls, rule, **kw):
    base = dict(n_starts=2, batch_size=2, seed=0, log_every=0, n_candidates=0, convergence=None)
    return cls(rule, **{**base, **kw}) if rule is not None else cls(**{**base, **kw})


def own_steps(solver, fn, y0, fom, max_steps=200):
    """optimistix's own loop (``init``, then ``step`` until ``terminate``) from ``y0``: the
    best figure of merit so far after each step (the engine's ``history``: step ``k``
    evaluates the point the ``k - 1`` steps before it reached) and the number of steps."""
    import equinox as eqx

    f_struct, aux_struct = jax.eval_shape(fn, y0, None)
    state = solver.init(fn, y0, None, {}, f_struct, aux_struct, frozenset())
    step = eqx.filter_jit(lambda y, s: solver.step(fn, y, None, {}, s, frozenset()))
    done = eqx.filter_jit(lambda y, s: solver.terminate(fn, y, None, {}, s, frozenset())[0])
    y, evaluated = y0, [fom(y0)]
    while not done(y, state) and len(evaluated) <= max_steps:
        y, state, _ = step(y, state)
        evaluated.append(fom(state.y_eval))
    best = np.minimum.accumulate(evaluated)
    return best[:-1], len(evaluated) - 1


def assert_same_steps(result, i, best, n_steps, *, steps_apart=0):
    """Start ``i`` of ``result`` went through optimistix's own iterates (``best``, one a step,
    to rounding: relative to the start's first figure of merit) for as many steps."""
    k = min(int(result.n_steps[i]), n_steps)
    np.testing.assert_array_equal(result.history_steps[:k], np.arange(1, k + 1))
    np.testing.assert_allclose(result.history[:k, i], best[:k], rtol=1e-7, atol=1e-9 * best[0])
    assert abs(int(result.n_steps[i]) - n_steps) <= steps_apart, (i, result.n_steps[i], n_steps)


def test_a_minimiser_takes_optimistixs_own_steps(x64):
    solver = optx.BFGS(rtol=1e-8, atol=1e-8)
    result = _search(ms.MultiStartGradient, solver, n_steps=200).fit(
        rosenbrock, SPACE, starts={"x": X0}
    )
    np.testing.assert_array_equal(result.n_evals, result.n_steps)  # one evaluation a step
    for i, x0 in enumerate(X0):
        best, n_steps = own_steps(
            solver,
            lambda y, _: (rosenbrock({"x": y}), None),
            jnp.asarray(x0),
            lambda y: float(rosenbrock({"x": y})),
        )
        # the same iterates, step by step, as many of them, and the same end
        assert_same_steps(result, i, best, n_steps)
        ref = optx.minimise(lambda y, _: rosenbrock({"x": y}), solver, jnp.asarray(x0), throw=False)
        assert int(ref.stats["num_steps"]) == n_steps
        np.testing.assert_allclose(result.params["x"][i], ref.value, rtol=1e-10, atol=1e-12)
        assert result.status[i] is ms.Status.CONVERGED


def test_a_least_squares_solver_takes_optimistixs_own_steps(x64):
    solver = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8)
    starts = {"x": np.array([[1.0, 1.0], [3.0, 0.3]])}
    search = _search(ms.MultiStartLeastSquares, None, method=solver, n_steps=200)
    result = search.fit(decay, SPACE, starts=starts)
    np.testing.assert_array_equal(result.n_evals, 2 * result.n_steps)  # a 2-column Jacobian
    assert result.config["rule"] == "optimistix.LevenbergMarquardt"
    for i, x0 in enumerate(starts["x"]):
        best, n_steps = own_steps(
            solver,
            lambda y, _: (decay({"x": y}), None),
            jnp.asarray(x0),
            lambda y: float(jnp.sum(decay({"x": y}) ** 2)),
        )
        # optimistix multiplies by the Jacobian through its own linearisation, the adapter by
        # the materialised one: the iterates agree to rounding, and a tolerance test at the
        # end may pass a step apart
        assert_same_steps(result, i, best, n_steps, steps_apart=1)
        ref = optx.least_squares(lambda y, _: decay({"x": y}), solver, jnp.asarray(x0), throw=False)
        np.testing.assert_allclose(result.params["x"][i], ref.value, rtol=1e-9)


def test_solvers_that_cannot_keep_one_evaluation_a_step_are_refused():
    with NoCompile():
        for solver, word in [
            (optx.NelderMead(1e-6, 1e-6), "simplex"),
            (optx.BestSoFarMinimiser(optx.BFGS(1e-6, 1e-6)), "best so far"),
            (optx.LevenbergMarquardt(1e-6, 1e-6), "MultiStartLeastSquares"),
        ]:
            with pytest.raises(ValueError, match=word):
                ms.MultiStartGradient(solver)
        with pytest.raises(ValueError, match=r"method=optx\.BFGS\(...\).*not a Gauss-Newton"):
            ms.MultiStartLeastSquares(method=optx.BFGS(1e-6, 1e-6))
        with pytest.raises(ValueError, match="own rtol"):
            ms.MultiStartLeastSquares(method=optx.Dogleg(1e-6, 1e-6), ftol=1e-3)


@pytest.mark.parametrize("minimiser", ["BFGS", "DFP", "LBFGS", "GradientDescent", "NonlinearCG"])
def test_a_minimiser_as_a_least_squares_method_is_refused_before_any_compile(minimiser):
    from multistart.common.monitor import CompileCounter

    kwargs = {"learning_rate": 0.1} if minimiser == "GradientDescent" else {}
    solver = getattr(optx, minimiser)(rtol=1e-6, atol=1e-6, **kwargs)
    named = rf"method=optx\.{minimiser}\(...\): .* MultiStartGradient\(optx\.{minimiser}"
    with CompileCounter() as counter:
        with pytest.raises(ValueError, match=named):
            ms.MultiStartLeastSquares(method=solver, n_starts=4, n_steps=10)
        with pytest.raises(ValueError, match=named):
            ms.MultiStartLeastSquares(n_starts=4).replace(method=solver)
    assert counter.total == 0, dict(counter.counts)


def test_fit_leaves_the_search_as_it_was(x64):
    """The adapter is bound to the residuals' number in a copy: the search fitted is unchanged."""
    solver = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8)
    search = _search(ms.MultiStartLeastSquares, None, method=solver, n_steps=3)
    before = search.solver
    result = search.fit(decay, SPACE)
    assert search.solver is before and before.residual_size is None
    assert result.config == search.config()
