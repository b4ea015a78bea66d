"""A fit's fixed cost, counted (issue 38): traces of the user's function and compile requests,
never times."""

import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.common.monitor import CompileCounter
from multistart.device.evaluator import FILTER_NAME as FILTER

T = np.linspace(0.0, 4.0, 20)
SPACE = {"a": ms.Uniform(0.1, 5.0), "k": ms.Uniform(0.1, 3.0)}


class Counted:
    """Residuals of a decay through ``y``, counting the calls from Python (its traces)."""

    def __init__(self, y):
        self.y, self.n = y, 0

    def __call__(self, p):
        self.n += 1
        return p["a"] * jnp.exp(-p["k"] * T) - self.y


def _search():
    return ms.MultiStartLeastSquares(n_starts=8, seed=0, n_steps=50)


def _fit(search, residuals):
    residuals.n = 0
    with CompileCounter() as compiles:
        result = search.fit(residuals, SPACE)
    return result, residuals.n, compiles.total


def _jax_traces(fit) -> int:
    """How many functions JAX traced (to a jaxpr) while ``fit()`` ran."""
    import jax.monitoring

    events: list[str] = []

    def listen(name, duration, **kwargs):
        events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        fit()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return events.count("/jax/core/compile/jaxpr_trace_duration")


def test_a_second_fit_of_the_same_function_traces_once_and_compiles_nothing():
    y = 2.0 * np.exp(-0.7 * T) + 1e-3 * np.sin(7.0 * T)  # a model no other test fits
    residuals, search = Counted(y), _search()
    first, _, n_compiles = _fit(search, residuals)
    assert n_compiles >= 1
    second, traces, n_compiles = _fit(search, residuals)
    assert traces == 1  # the one trace that tells the same model from another
    assert n_compiles == 0
    # and JAX traces nothing else: not the rule's init for the population's shapes
    assert _jax_traces(lambda: _fit(search, residuals)) == 1
    np.testing.assert_array_equal(second.best_fom, first.best_fom)
    assert second.stats["batch_size"] == first.stats["batch_size"]
    # a new closure over the same arrays, in a new search of the same options: the same programs
    other, traces, n_compiles = _fit(_search(), Counted(y))
    assert (traces, n_compiles) == (1, 0)
    np.testing.assert_array_equal(other.best_fom, first.best_fom)


def test_a_refit_over_changed_captured_data_fits_the_new_data():
    y = 1.5 * np.exp(-0.4 * T) + 1e-3 * np.cos(5.0 * T)
    residuals, search = Counted(y), _search()
    first = search.fit(residuals, SPACE)
    residuals.y = 3.0 * np.exp(-1.2 * T)  # what the function reads changed: not the same model
    second = search.fit(residuals, SPACE)
    assert float(second.best_params["a"]) == pytest.approx(3.0, rel=1e-6)
    assert float(second.best_params["k"]) == pytest.approx(1.2, rel=1e-6)
    assert float(first.best_params["a"]) == pytest.approx(1.5, rel=1e-2)


def test_a_fit_traces_the_users_function_once():
    # least squares: the residuals' one trace serves the checks, the filter, the step, the map
    residuals = Counted(0.8 * np.exp(-1.3 * T) + 2e-3 * np.sin(3.0 * T))
    result, traces, _ = _fit(_search(), residuals)
    assert traces == 1
    assert result.stats["n_compiles"] == 1  # and the step it replays was compiled

    # a scalar objective: the same, through the figure of merit's trace
    y = 0.6 * np.exp(-0.9 * T)
    n = []

    def chi2(p):
        n.append(1)
        return jnp.sum((p["a"] * jnp.exp(-p["k"] * T) - y) ** 2)

    ms.MultiStartLBFGS(n_starts=4, seed=0, n_steps=20).fit(chi2, SPACE)
    assert len(n) == 1


@pytest.mark.parametrize(
    "n_candidates, programs",
    [(0, {"to_physical", "multistart_chunk_step"}), (None, {FILTER, "multistart_chunk_step"})],
)
def test_a_cold_fit_compiles_two_programs_the_filters_serving_the_results_map(
    n_candidates, programs
):
    """Without the filter: the step and the map to physical parameters; with it (and TikTak's
    refills, the default) the filter and the step: the filter's program maps the rows for the
    Result and for TikTak's blends alike, and the population's start and the refill writer
    are the step's own work."""
    y = 1.1 * np.exp(-0.5 * T) + 1e-3 * (n_candidates is None)  # a model no other test fits
    search = ms.MultiStartLeastSquares(n_starts=8, seed=1, n_steps=40, n_candidates=n_candidates)
    with CompileCounter() as compiles:
        result = search.fit(Counted(y), SPACE)
    assert dict(compiles.counts) == {f"jit({name})": 1 for name in programs}
    if n_candidates is None:  # TikTak refilled slots: their records were mapped by the filter
        assert result.incarnations and all(
            np.isfinite(r["params"]["a"]) for r in result.incarnations
        )


def test_a_float32_fit_after_a_float64_fit_of_the_same_model_traces_in_float32():
    """The float64 fit's kept programs are dropped first: while they live, JAX serves the NumPy
    array the model captures as the float64 array it made of it, to a float32 trace too."""
    import jax

    a = np.diag(np.logspace(0.0, 2.0, 3))

    def quadratic(p):
        return 0.5 * p["x"] @ jnp.asarray(a) @ p["x"]

    space = {"x": ms.Normal(0.0, 1.0, shape=(3,))}
    search = ms.MultiStartLBFGS(n_starts=2, seed=0, n_steps=20, n_candidates=0)
    with jax.enable_x64(True):
        assert search.fit(quadratic, space).best_fom < 1e-8
    with jax.enable_x64(False):
        result = search.fit(quadratic, space)  # raised (a float64 constant) before
    assert result.best_fom < 1e-4


def test_the_rules_python_is_traced_once_a_fit(monkeypatch):
    """The identity's trace of the per-start step is the chunk step's: the chunk step replays
    it (``multistart.common.digest.replay``), so the rule's Python runs once, at one width or
    several (the memory bound and the timing compile the chunk step at other widths)."""
    from multistart.solvers.least_squares import LeastSquaresSolver

    calls = []
    step = LeastSquaresSolver.step

    def counted(self, *args, **kwargs):
        calls.append(1)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(LeastSquaresSolver, "step", counted)
    y = 0.9 * np.exp(-1.1 * T) + 1e-3 * np.cos(2.0 * T)  # a model no other test fits
    search = ms.MultiStartLeastSquares(n_starts=6, seed=3, n_steps=30, batch_size=4)
    with CompileCounter() as compiles:
        result = search.fit(Counted(y), SPACE)
    assert len(calls) == 1
    assert compiles.count("multistart_chunk_step") == 1  # it was traced, lowered and compiled
    assert result.best_fom < 1e-4
    assert float(result.best_params["k"]) == pytest.approx(1.1, rel=1e-2)


def test_curve_fit_traces_f_once_and_a_refit_of_it_compiles_nothing():
    """The shape check's trace of ``f`` is replayed by the covariance program, the spreads and
    the search's step (curve_fit's ``_Traced``): the user's Python runs once a fit, a single
    fit, a fit with a held parameter and a batch alike; a refit on new data compiles nothing."""
    x = np.linspace(0.0, 3.0, 25)
    calls = []

    def decay(x, a, k, c):
        calls.append(1)
        return a * jnp.exp(-k * x) + c

    y = decay(x, 2.0, 0.9, 0.3) + 1e-3 * np.sin(11.0 * x)  # a model no other test fits
    calls.clear()
    with CompileCounter() as compiles:
        popt, _ = ms.curve_fit(decay, x, y, p0=[1.0, 1.0, 0.0], n_starts=4)
    assert len(calls) == 1
    # three programs: the filter (which also maps the Result's rows), the step, pcov's
    covariance = "multistart_curvature"
    names = {FILTER, "multistart_chunk_step", covariance}
    assert dict(compiles.counts) == {f"jit({name})": 1 for name in names}
    np.testing.assert_allclose(popt, [2.0, 0.9, 0.3], atol=5e-3)
    y2 = decay(x, 1.5, 0.6, 0.1)
    calls.clear()
    with CompileCounter() as compiles:
        popt, _ = ms.curve_fit(decay, x, y2, p0=[1.0, 1.0, 0.0], n_starts=4)
    assert (len(calls), compiles.total) == (1, 0)
    np.testing.assert_allclose(popt, [1.5, 0.6, 0.1], rtol=1e-6)
    calls.clear()
    ms.curve_fit(decay, x, y, p0=[1.0, 1.0, 0.0], n_starts=4, fixed={"c": 0.3})
    assert len(calls) == 1
    calls.clear()
    ys = np.stack([decay(x, a, 0.8, 0.2) for a in (1.0, 2.0, 3.0)])
    calls.clear()
    popt, _ = ms.curve_fit(decay, x, ys, p0=[1.0, 1.0, 0.0], n_starts=2, batched=True)
    assert len(calls) == 1
    np.testing.assert_allclose(popt[:, 0], [1.0, 2.0, 3.0], rtol=1e-6)
