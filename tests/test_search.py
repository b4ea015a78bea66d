import dataclasses
import functools
import inspect
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import (
    MULTIMODAL_SPACE,
    PARABOLA_MIN,
    PARABOLA_SPACE,
    ROSENBROCK_SPACE,
    NoCompile,
    assert_same_result,
    multimodal,
    parabola,
    rosenbrock,
)

import multistart as ms
from multistart.model.priors import Space

RULES = [ms.MultiStartAdam, ms.MultiStartProdigy, ms.MultiStartADABelief, ms.MultiStartLion]


# -- fits shared by several tests (each compiles the filter and the chunk step once) ----------


@pytest.fixture(scope="module")
def parabola_fit():
    """``parabola_fit(rule)``: 6 starts of ``rule`` on the parabola in chunks of 4 (ragged)."""

    @functools.cache
    def fit(rule):
        return rule(n_starts=6, batch_size=4, n_steps=400, seed=1).fit(parabola, PARABOLA_SPACE)

    return fit


def bowl_and_multimodal(p):
    """Separable: a bowl in a vector leaf plus the multimodal term; minimum about -0.974."""
    return jnp.sum((p["x"] - 1.0) ** 2) + multimodal(p)


BOWL_AND_MULTIMODAL_SPACE = {**ROSENBROCK_SPACE, **MULTIMODAL_SPACE}


@pytest.fixture(scope="module")
def width_run():
    """``width_run(rule, bs)``: the same float64 search of 12 starts at width ``bs`` (``None``:
    one chunk of 12; 4: three even chunks; 5: ragged, 5 + 5 + 2), each fitted once."""

    @functools.cache
    def run(rule, bs):
        with jax.enable_x64(True):
            return rule(n_starts=12, batch_size=bs, n_steps=300, seed=0).fit(
                bowl_and_multimodal, BOWL_AND_MULTIMODAL_SPACE
            )

    return run


# -- finding minima --------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_finds_the_parabola_minimum(rule, parabola_fit):
    result = parabola_fit(rule)
    np.testing.assert_allclose(result.best_params["x"], PARABOLA_MIN["x"], atol=2e-2)
    np.testing.assert_allclose(result.best_params["y"], PARABOLA_MIN["y"], atol=2e-2)
    assert result.best_fom < 1e-3
    assert result.stats["n_compiles"] == 1


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_finds_the_global_multimodal_minimum(rule, width_run):
    result = width_run(rule, 5)
    # global minimum of sin(3n) + 0.1 n^2 is near n = -0.51, value about -0.974
    assert abs(float(result.best_params["n"]) + 0.51) < 0.05
    assert abs(np.log(float(result.best_params["s"])) - 0.3) < 0.05
    np.testing.assert_allclose(result.best_params["x"], 1.0, atol=2e-2)
    assert result.best_fom < -0.95
    # several starts end in other local minima: the record keeps them all
    assert np.ptp(result.foms) > 0.1


def test_adam_on_rosenbrock_float64(x64):
    result = ms.MultiStartAdam(n_starts=8, batch_size=3, n_steps=1500, seed=0).fit(
        rosenbrock, ROSENBROCK_SPACE
    )
    np.testing.assert_allclose(result.best_params["x"], [1.0, 1.0], atol=1e-2)


def test_lbfgs_rule_with_line_search_fits_without_a_second_code_path(x64):
    search = ms.MultiStartGradient(optax.lbfgs(), n_starts=5, batch_size=2, n_steps=60, seed=0)
    result = search.fit(rosenbrock, ROSENBROCK_SPACE)
    np.testing.assert_allclose(result.best_params["x"], [1.0, 1.0], atol=1e-5)
    assert result.stats["n_compiles"] == 1


def test_value_is_passed_to_rules_that_take_it():
    seen = []

    def scale_by_value():
        def init(params):
            return optax.EmptyState()

        def update(updates, state, params=None, *, value):
            seen.append(value)
            return jax.tree_util.tree_map(lambda g: -0.1 * g, updates), state

        return optax.GradientTransformationExtraArgs(init, update)

    search = ms.MultiStartGradient(scale_by_value(), n_starts=2, n_steps=3, convergence=None)
    search.fit(parabola, PARABOLA_SPACE)
    assert seen and seen[0].shape == ()  # traced once, per start, as a scalar


# -- per-start independence and parity with plain optax -----------------------------------------


def _plain_optax_loop(optimizer, space, objective, x0, n_steps):
    """The reference: one start, a plain optax loop in the same unconstrained coordinates."""
    sp = Space(space)
    u = jax.tree_util.tree_map(lambda a: jnp.asarray(a[0]), sp.to_unconstrained(x0))
    f = jax.jit(jax.value_and_grad(lambda u: objective(sp.to_physical(u))))

    @jax.jit  # one compile, not one per eager operation of the rule (Prodigy has many)
    def update(grad, state, u):
        updates, state = optimizer.update(grad, state, u)
        return optax.apply_updates(u, updates), state

    state = optimizer.init(u)
    foms = []
    for _ in range(n_steps):
        value, grad = f(u)
        u, state = update(grad, state, u)
        foms.append(float(value))
    return np.array(foms)


def _run_from(search, objective, space, x0):
    return search.fit(objective, space, starts=x0)  # every slot given: no filter


def scaled(p):
    """A bowl scaled by ``w``: starts at very different ``w`` see very different gradients."""
    return p["w"] * jnp.sum((p["x"] - 1.0) ** 2)


SCALED_SPACE = {"w": ms.LogUniform(1e-3, 1e3), "x": ms.Uniform(-4.0, 4.0, shape=(2,))}
SCALED_STARTS = {
    "a": {"w": np.array([1e-3 * 1.5]), "x": np.array([[-3.0, 2.0]])},
    "b": {"w": np.array([900.0]), "x": np.array([[3.0, -1.0]])},
}


@pytest.fixture(scope="module")
def scaled_fit():
    """``scaled_fit(rule, "a")``, ``"b"`` or ``"ab"``: 60 float64 steps on ``scaled`` from those
    starts, no convergence test (one program per rule and number of starts)."""

    @functools.cache
    def fit(rule, which):
        x0 = {k: np.concatenate([SCALED_STARTS[c][k] for c in which]) for k in SCALED_SPACE}
        with jax.enable_x64(True):
            search = rule(n_starts=len(which), n_steps=60, convergence=None)
            return _run_from(search, scaled, SCALED_SPACE, x0)

    return fit


@pytest.mark.parametrize(
    "search_cls, optimizer",
    [
        (ms.MultiStartAdam, optax.adam(0.05, b1=0.9, b2=0.999, eps=1e-8)),
        (ms.MultiStartProdigy, optax.contrib.prodigy(1.0, betas=(0.9, 0.999))),
    ],
)
def test_one_start_equals_a_plain_optax_loop(search_cls, optimizer, scaled_fit, x64):
    result = scaled_fit(search_cls, "a")
    reference = _plain_optax_loop(optimizer, SCALED_SPACE, scaled, SCALED_STARTS["a"], 60)
    np.testing.assert_allclose(result.history[:, 0], np.minimum.accumulate(reference), rtol=1e-12)


def test_prodigy_step_size_estimate_is_per_start(scaled_fit):
    """Two starts on very differently scaled objectives behave exactly as each would alone.

    Prodigy's ``d`` is a statistic over the whole parameter tree: if it were shared by the
    stack of starts, each start's trajectory would depend on the other's.
    """
    together = scaled_fit(ms.MultiStartProdigy, "ab")
    alone_a = scaled_fit(ms.MultiStartProdigy, "a")
    alone_b = scaled_fit(ms.MultiStartProdigy, "b")
    np.testing.assert_allclose(together.history[:, 0], alone_a.history[:, 0], rtol=1e-12)
    np.testing.assert_allclose(together.history[:, 1], alone_b.history[:, 0], rtol=1e-12)


# -- one compile, chunking, determinism --------------------------------------------------------


@pytest.mark.parametrize("rule", RULES)
def test_batch_widths_give_bit_identical_results(rule, width_run):
    """One chunk and a ragged 5 (chunks 5, 5, 2) agree bit for bit in float64 on CPU, for
    every rule; for Adam also three even chunks of 4 (a third width costs a compile a rule)."""
    widths = (None, 4, 5) if rule is ms.MultiStartAdam else (None, 5)
    runs = {bs: width_run(rule, bs) for bs in widths}
    assert [r.stats["batch_size"] for r in runs.values()] == [bs or 12 for bs in widths]
    for bs in widths[1:]:
        assert_same_result(runs[None], runs[bs])


def test_same_seed_same_result_other_seed_other_starts(width_run, x64):
    a = width_run(ms.MultiStartAdam, 4)
    run = lambda seed: ms.MultiStartAdam(  # noqa: E731
        n_starts=12, batch_size=4, n_steps=300, seed=seed
    ).fit(bowl_and_multimodal, BOWL_AND_MULTIMODAL_SPACE)
    assert_same_result(a, run(0))
    other = run(1)
    assert not np.array_equal(a.start_params["n"], other.start_params["n"])
    assert not np.array_equal(a.start_params["x"], other.start_params["x"])


# 10 starts throughout: the programs test_compiles_do_not_grow_... reuses; a width of 16 is
# clipped to the 10 starts, the program of batch_size=None
@pytest.mark.parametrize("n_starts, batch_size", [(10, 3), (10, 4), (10, 16), (10, 1), (10, None)])
def test_exactly_one_chunk_step_compile_however_ragged(n_starts, batch_size):
    result = ms.MultiStartAdam(n_starts=n_starts, batch_size=batch_size, n_steps=4, seed=0).fit(
        parabola, PARABOLA_SPACE
    )
    assert result.stats["n_compiles"] == 1
    assert result.stats["n_filter_compiles"] == 1
    # the filter, the chunk step, the population's init, the population copy the
    # out-of-memory back-off keeps and the final parameter map: nothing per chunk
    assert result.stats["n_compiles_total"] <= 5
    assert result.stats["batch_size"] == min(batch_size or n_starts, n_starts)


def test_compiles_do_not_grow_with_the_number_of_chunks():
    def total(bs):
        return (
            ms.MultiStartAdam(n_starts=10, batch_size=bs, n_steps=4, seed=0)
            .fit(parabola, PARABOLA_SPACE)
            .stats["n_compiles_total"]
        )

    total(4)  # the first search of these shapes also compiles shared helpers (the state copy)
    totals = {bs: total(bs) for bs in (1, 3, 10)}  # 10 chunks, 4 (ragged: 3+3+3+1), 1
    assert len(set(totals.values())) == 1, totals


def test_ended_starts_leave_the_sweep():
    search = ms.MultiStartAdam(
        n_starts=10,
        batch_size=2,
        n_steps=2000,
        seed=0,
        convergence=ms.Convergence(window=20, rtol=0.0, atol=1e-9),
    )
    result = search.fit(parabola, PARABOLA_SPACE)
    assert all(s is ms.Status.STALLED for s in result.status)  # Adam's end: the window guard
    assert result.n_steps.max() < 2000
    assert result.stats["n_evals"] == result.n_steps.sum()
    # repacking: chunk calls track the running starts, not n_starts every step
    steps_run = result.stats["n_steps_run"]
    assert steps_run == result.n_steps.max() == result.history.shape[0]
    assert result.stats["n_chunk_calls"] < steps_run * 5
    running = [(result.n_steps > t).sum() for t in range(steps_run)]
    assert result.stats["n_chunk_calls"] <= sum(-(-r // 2) for r in running) + 5


def test_results_do_not_depend_on_when_the_host_syncs(width_run, x64):
    every_step = width_run(ms.MultiStartAdam, 4)  # sync_every=1, the default
    assert every_step.config["sync_every"] == 1
    rarely = ms.MultiStartAdam(n_starts=12, batch_size=4, n_steps=300, seed=0, sync_every=1000)
    rarely = rarely.fit(bowl_and_multimodal, BOWL_AND_MULTIMODAL_SPACE)
    assert_same_result(every_step, rarely)
    # without syncs, converged starts keep costing calls until the end
    assert rarely.stats["n_chunk_calls"] > every_step.stats["n_chunk_calls"]


# -- the record ------------------------------------------------------------------------------


def test_result_record_shapes_and_history(parabola_fit):
    result = parabola_fit(ms.MultiStartAdam)
    steps_run = result.stats["n_steps_run"]
    assert result.foms.shape == (6,)
    assert result.params["x"].shape == (6, 2) and result.params["y"].shape == (6,)
    assert result.start_params["x"].shape == (6, 2)
    assert result.status.shape == (6,) and all(isinstance(s, ms.Status) for s in result.status)
    assert result.history.shape == (steps_run, 6)
    np.testing.assert_array_equal(result.history_steps, np.arange(1, steps_run + 1))
    assert np.all(np.diff(result.history, axis=0) <= 0)  # best-so-far never rises
    np.testing.assert_array_equal(result.history[-1], result.foms)
    np.testing.assert_array_equal(result.best_history, result.history.min(axis=1))
    assert result.best_fom == result.foms.min() == result.foms[result.best_index]
    assert np.all(result.best_step < result.n_steps)
    # each start's best is where its history last improved
    for i in range(6):
        assert result.history[result.best_step[i], i] == result.foms[i]
    # the stats agree with the record they describe
    stats = result.stats
    assert stats["n_evals"] == result.n_steps.sum() and steps_run == result.n_steps.max()
    # a rule without a line search spends one evaluation a step (contrast: optax's L-BFGS in
    # test_lbfgs.py::test_optax_line_search_evaluations_are_counted)
    np.testing.assert_array_equal(result.n_evals, result.n_steps)
    assert stats["n_compiles"] == 1 and stats["n_compiles_total"] >= stats["n_compiles"]
    assert stats["batch_size"] == 4
    assert (
        0 < stats["compile_s"] <= stats["wall_s"] and 0 < stats["first_step_s"] <= stats["wall_s"]
    )


def _nudged(result: ms.Result, name: str) -> ms.Result:
    """A copy of ``result`` with one per-start entry of field ``name`` changed."""
    value = jax.tree_util.tree_map(np.array, getattr(result, name))
    leaf = jax.tree_util.tree_leaves(value)[0]
    if leaf.dtype == object:
        leaf[0] = ms.Status.NONFINITE if leaf[0] is not ms.Status.NONFINITE else ms.Status.CONVERGED
    else:
        leaf.flat[0] = leaf.flat[0] + 1 if leaf.dtype.kind == "i" else np.nextafter(leaf.flat[0], 9)
    return dataclasses.replace(result, **{name: value})


@pytest.mark.parametrize("name", ["start_params", "best_step", "params", "status", "history"])
def test_the_equality_helper_sees_every_per_start_field(name, parabola_fit):
    result = parabola_fit(ms.MultiStartAdam)
    assert_same_result(result, dataclasses.replace(result))
    with pytest.raises(AssertionError, match=name):
        assert_same_result(result, _nudged(result, name))
    if name != "status" and name != "best_step":  # one ulp is within any rtol
        assert_same_result(result, _nudged(result, name), exact=False, rtol=1e-6)


# the strided-history and logging tests share this configuration (one chunk-step program)
LOGGED = dict(n_starts=2, n_steps=100, max_history=30, convergence=None, seed=0)


def test_history_is_strided_when_long():
    result = ms.MultiStartAdam(**LOGGED).fit(parabola, PARABOLA_SPACE)
    assert result.history.shape == (25, 2)  # stride 4
    assert result.history_steps[-1] == 100
    np.testing.assert_array_equal(result.history[-1], result.foms)


def test_the_objective_only_sees_values_inside_the_bounds():
    lower = 1.0

    def pushes_below_lower(p):
        x = p["x"]
        outside = jnp.any(x < lower) | jnp.any(x > 2.0)
        return jnp.where(outside, jnp.nan, jnp.sum(x))

    result = ms.MultiStartAdam(n_starts=4, n_steps=600, seed=0, learning_rate=0.5).fit(
        pushes_below_lower, {"x": ms.Uniform(lower, 2.0, shape=(3,))}
    )
    assert all(s is not ms.Status.NONFINITE for s in result.status)
    np.testing.assert_allclose(result.best_params["x"], lower, atol=1e-3)


# -- non-finite starts -----------------------------------------------------------------------


def test_a_nan_region_kills_only_the_starts_that_begin_there():
    def nan_right(p):
        return jnp.where(p["x"] > 1.0, jnp.nan, (p["x"] + 1.0) ** 2)

    x0 = {"x": np.array([-3.0, 2.0, -0.5, 3.0, 0.2])}
    search = ms.MultiStartAdam(n_starts=5, batch_size=2, n_steps=300, seed=0)
    result = _run_from(search, nan_right, {"x": ms.Uniform(-4.0, 4.0)}, x0)
    dead = np.array([s is ms.Status.NONFINITE for s in result.status])
    assert dead.tolist() == [False, True, False, True, False]
    assert np.all(np.isinf(result.foms[dead])) and np.all(result.n_steps[dead] == 1)
    assert np.all(np.abs(result.params["x"][~dead] + 1.0) < 1e-2)
    assert result.best_index in (0, 2, 4)


def test_a_step_into_a_nan_region_is_rolled_back_and_retried_smaller(x64):
    # the minimum sits on the edge of a region where the objective is nan
    def edge(p):
        return jnp.where(p["x"] < 0.0, jnp.nan, (p["x"] - 0.01) ** 2)

    search = ms.MultiStartAdam(
        n_starts=3, n_steps=400, seed=0, learning_rate=0.3, start_band=(0.3, 0.9)
    )
    result = search.fit(edge, {"x": ms.Uniform(-1.0, 3.0)})
    assert all(s is not ms.Status.NONFINITE for s in result.status)
    np.testing.assert_allclose(result.best_params["x"], 0.01, atol=1e-3)
    assert np.all(np.isfinite(result.foms))


def test_inf_gradient_with_a_finite_value_keeps_the_value_and_ends_the_start():
    def kink(p):
        return jnp.sqrt(jnp.abs(p["x"]))  # d/dx at 0 is inf

    x0 = {"x": np.array([0.0, 0.5])}
    search = ms.MultiStartAdam(n_starts=2, n_steps=50, max_nonfinite=3, seed=0)
    result = _run_from(search, kink, {"x": ms.Uniform(-1.0, 1.0)}, x0)
    assert result.status[0] is ms.Status.NONFINITE
    assert result.n_steps[0] == 4  # the first evaluation, then three failed retries
    assert result.foms[0] == 0.0 and result.best_step[0] == 0  # its finite value is kept
    assert result.status[1] is not ms.Status.NONFINITE


def test_a_start_never_finite_ends_at_once():
    x0 = {"x": np.array([0.3])}
    search = ms.MultiStartAdam(n_starts=1, n_steps=50, seed=0)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        result = _run_from(search, lambda p: jnp.nan * p["x"], {"x": ms.Uniform(-1.0, 1.0)}, x0)
    assert result.status[0] is ms.Status.NONFINITE and result.n_steps[0] == 1


def test_a_start_bouncing_off_a_nan_wall_ends_after_max_nonfinite_tries(x64):
    def wall(p):
        return jnp.where(p["x"] > 0.2, jnp.nan, -p["x"])  # pushes right, into the wall

    x0 = {"x": np.array([0.2 - 1e-7])}
    search = ms.MultiStartAdam(n_starts=1, n_steps=50, max_nonfinite=3, seed=0)
    result = _run_from(search, wall, {"x": ms.Uniform(-1.0, 1.0)}, x0)
    assert result.status[0] is ms.Status.NONFINITE
    # ok, fail (rolled back, half step), ok again from the same point, fail, ok, fail: ended
    assert result.n_steps[0] == 6
    np.testing.assert_allclose(result.best_params["x"], 0.2 - 1e-7, rtol=1e-9)


def test_every_start_nonfinite_gives_a_result_and_a_warning():
    # without the filter (with it, no finite candidate raises NoFiniteStartsError: test_starts)
    search = ms.MultiStartAdam(n_starts=4, batch_size=3, n_steps=20, seed=0, n_candidates=0)
    with pytest.warns(RuntimeWarning, match="every one of the 4 starts was non-finite"):
        result = search.fit(lambda p: jnp.log(-(p["x"] ** 2) - 1.0), {"x": ms.Uniform(0.0, 1.0)})
    assert all(s is ms.Status.NONFINITE for s in result.status)
    assert result.best_index == -1 and result.best_fom == np.inf
    assert np.isnan(result.best_params["x"])


# -- bad input: clear errors before any compile ---------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_starts": 0}, "n_starts must be an int >= 1"),
        ({"n_starts": 2.0}, "n_starts must be an int >= 1"),
        ({"n_steps": 0}, "n_steps must be an int >= 1"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"batch_size": -3}, "batch_size must be a positive int"),
        ({"batch_size": 2.5}, "batch_size must be a positive int"),
        ({"batch_size": True}, "batch_size must be a positive int"),
        ({"batch_size": "fast"}, "batch_size must be a positive int"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"max_nonfinite": 0}, "max_nonfinite"),
        ({"start_band": (0.9, 0.1)}, "start_band"),
    ],
)
def test_bad_search_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ms.MultiStartAdam(**kwargs)


SEARCHES = [
    ms.MultiStartAdam,
    ms.MultiStartProdigy,
    ms.MultiStartADABelief,
    ms.MultiStartLion,
    ms.MultiStartLBFGS,
    ms.MultiStartLeastSquares,
]


@pytest.mark.parametrize("rule", SEARCHES)
def test_every_option_is_keyword_only(rule):
    # MultiStartLBFGS(4) once set memory=4 and left n_starts at 32
    with pytest.raises(TypeError, match="positional"):
        rule(4)
    with pytest.raises(TypeError, match="positional"):
        ms.MultiStartGradient(optax.adam(0.1), 4)


def test_an_unknown_option_is_named_with_the_nearest():
    # a constructor binds its call to its signature: Python's words, the class and the nearest
    with pytest.raises(TypeError, match=r"MultiStartLBFGS\(\): got an unexpected keyword "):
        ms.MultiStartLBFGS(n_start=4)
    with pytest.raises(TypeError, match="argument 'n_start' .did you mean 'n_starts'"):
        ms.MultiStartLBFGS(n_start=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'$"):
        ms.MultiStartAdam(colour="blue")
    with pytest.raises(TypeError, match="positional arguments .every option is keyword-only"):
        ms.MultiStartLeastSquares("lm")
    # replace() names the nearest option, a rule's own hyperparameters and a least-squares
    # search's options included
    with pytest.raises(TypeError, match="unknown option 'n_start' .did you mean 'n_starts'"):
        ms.MultiStartLBFGS().replace(n_start=4)
    with pytest.raises(TypeError, match="'learning_rat' .did you mean 'learning_rate'"):
        ms.MultiStartAdam().replace(learning_rat=0.1)
    with pytest.raises(TypeError, match="'covarianc' .did you mean 'covariance'"):
        ms.MultiStartLeastSquares().replace(covarianc="hessian")


def test_options_are_one_frozen_configuration():
    search = ms.MultiStartLBFGS(n_starts=8, memory=4)
    assert isinstance(search.options, ms.SearchConfig)
    assert search.n_starts == search.options.n_starts == 8
    assert search.options.n_candidates == 120  # derived defaults (15 a slot under band_tiktak)
    with pytest.raises(AttributeError, match=r"search.replace\(n_steps=5\)"):
        search.n_steps = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        search.options.n_steps = 5  # type: ignore[misc]
    bigger = search.replace(n_starts=16)
    assert bigger.options.n_candidates == 240 and bigger.solver.memory == 4
    assert type(bigger) is ms.MultiStartLBFGS and search.n_starts == 8
    assert search.config() == {**search.config(), **{"n_starts": 8}}
    assert set(search.options.record()) <= set(search.config())


SEARCHES = [ms.MultiStartGradient, *RULES, ms.MultiStartLBFGS, ms.MultiStartLeastSquares]


@pytest.mark.parametrize("rule", SEARCHES)
def test_every_option_is_in_the_signature_and_the_docs(rule):
    """What a user sees: ``inspect.signature`` (an IDE in a live session, ``help()``) lists the
    rule's own arguments and then every option, keyword-only, as the configuration declares it
    (name, order, type, default); ``help()`` shows that signature and every option's doc; and
    the stub static tools read (an IDE, mypy) states the same signature."""
    import pydoc

    from api_snapshot import SEARCH, STUBS, stub

    names = list(ms.host.config.ORDER)
    params = inspect.signature(rule).parameters
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names)
    assert params["n_starts"].default == 32
    declared = [(p.name, p.annotation, p.default) for p in params.values()][-len(names) :]
    fields = [(f.name, f.type, f.default) for f in ms.host.config.ordered_fields()]
    assert declared == fields
    own = list(params)[: -len(names)]
    assert own == list(inspect.signature(rule._rule).parameters)  # its rule's, then the options
    assert inspect.signature(rule.__init__).parameters.keys() == {"self", *params}
    text = pydoc.render_doc(rule, renderer=pydoc.plaintext)
    assert f"{rule.__name__}{inspect.signature(rule)}" in text.replace("\n |  ", "")
    doc = pydoc.render_doc(ms.MultiStartGradient, renderer=pydoc.plaintext)
    entries = re.findall(r"^ \|    (\w+): ", doc.split("Args:")[1], flags=re.MULTILINE)
    assert entries == ["optimizer", *names]  # each once, in the signature's order
    module = rule.__module__.rpartition(".")[2]
    assert (SEARCH / f"{module}.pyi").read_text() == stub(module)
    assert rule.__name__ in STUBS[module][1]


def test_the_docs_state_the_constants_they_name():
    """An option's doc states the defaults its check derives from constants (in the modules
    that decide with them), and each search class is declared without a copy of the options,
    ``locals()`` or a docstring rewritten after the class is made."""
    from multistart.host import config, driver, engine, iterate
    from multistart.search import core, gradient, least_squares, residuals

    doc = " ".join(ms.MultiStartGradient.__doc__.split())
    for phrase in [
        f"at most {engine.TIKTAK_SHORT_SEARCH} evaluations on average",
        f"ranking of {driver.TIKTAK_EXPLORE_PER_START} x ``n_starts`` further",
        f"and {driver.TIKTAK_EXPLORE_BOUND_PER_START} x ``n_starts`` more",
        f"``{config.CANDIDATES_PER_START} * n_starts``",
        f"``{config.BAND_TIKTAK_CANDIDATES_PER_START} * n_starts``",
        f"(default ``{config.TIKTAK_LOCAL_PER_START} * n_starts``",
        f"``{config.BAND_TIKTAK_CYCLES * config.TIKTAK_LOCAL_PER_START} * n_starts``, TikTak's "
        f"weights run {config.BAND_TIKTAK_CYCLES} times",
        f"(default): {config.TIKTAK_DISCOVERIES} under TikTak",
        f"Checked every {iterate.REFOUND_EVERY} steps",
        f"(default {config.DEFAULT_FILTER_BATCH_SIZE}, at most",
    ]:
        assert phrase in doc, phrase
    for module in (core, gradient, least_squares, residuals):
        source = inspect.getsource(module)
        assert "locals()" not in source and ".__doc__ =" not in source
        assert "n_starts: int = 32" not in source  # the options are the configuration's fields


def test_bad_optimizer_and_convergence():
    with pytest.raises(TypeError, match="optimizer must be an optax"):
        ms.MultiStartGradient("adam")
    with pytest.raises(TypeError, match="convergence must be"):
        ms.MultiStartAdam(convergence={"window": 3})


@pytest.mark.parametrize(
    "objective, space, error, match",
    [
        (
            lambda p: p["x"] * jnp.ones(3),
            {"x": ms.Uniform(0, 1)},
            TypeError,
            r"scalar; got shape \(3,\)",
        ),
        (lambda p: jnp.int32(1), {"x": ms.Uniform(0, 1)}, TypeError, "floating-point scalar"),
        (lambda p: (p["x"], p["x"]), {"x": ms.Uniform(0, 1)}, TypeError, "single scalar"),
        (parabola, {}, ValueError, "space is empty"),
        (parabola, None, TypeError, "space is required"),
        (parabola, {"x": (0.0, 1.0)}, TypeError, r"space\['x'\] must be a prior"),
        ("not callable", {"x": ms.Uniform(0, 1)}, TypeError, "objective must be a callable"),
    ],
)
def test_bad_objectives_fail_before_any_compile(objective, space, error, match):
    search = ms.MultiStartAdam(n_starts=2, n_steps=5)
    with NoCompile(), pytest.raises(error, match=match):
        search.fit(objective, space)


def test_an_objective_raising_while_traced_keeps_its_exception_with_context():
    def broken(p):
        raise KeyError("amplitude")

    with NoCompile(), pytest.raises(KeyError, match="amplitude") as info:
        ms.MultiStartAdam(n_starts=2, n_steps=5).fit(broken, {"x": ms.Uniform(0, 1)})
    assert any("raised while tracing 'broken'" in n for n in info.value.__notes__)
    assert any("MultiStartAdam(n_starts=2" in n for n in info.value.__notes__)


# -- logging -------------------------------------------------------------------------------------


def test_progress_lines_every_log_every_steps(monkeypatch, caplog):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    with caplog.at_level(logging.INFO, logger="multistart"):
        ms.MultiStartAdam(**LOGGED, log_every=25).fit(parabola, PARABOLA_SPACE)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split()[1] for line in lines] == ["25/100", "50/100", "75/100", "100/100"]
    assert all("best" in line and "running 2/2" in line and "evals/s" in line for line in lines)


def test_log_level_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "WARNING")
    with caplog.at_level(logging.DEBUG, logger="multistart"):
        ms.MultiStartAdam(**LOGGED, log_every=5).fit(parabola, PARABOLA_SPACE)
    assert not [r for r in caplog.records if r.levelno < logging.WARNING]
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "chatty")
    with pytest.raises(ValueError, match="MULTISTART_LOG_LEVEL"):
        ms.MultiStartAdam(n_starts=2, n_steps=10).fit(parabola, PARABOLA_SPACE)


def test_tree_mode_serves_rules_keyed_to_the_parameter_tree():
    """flat=False hands optax the space's pytree, so label-based rules work."""
    optimizer = optax.multi_transform(
        {"move": optax.adam(0.05), "frozen": optax.set_to_zero()}, {"x": "move", "y": "frozen"}
    )
    search = ms.MultiStartGradient(optimizer, n_starts=3, n_steps=300, seed=0, flat=False)
    result = search.fit(parabola, PARABOLA_SPACE)
    np.testing.assert_allclose(result.params["x"], 1.5, atol=1e-2)
    np.testing.assert_array_equal(result.params["y"], result.start_params["y"])


def test_flat_and_tree_modes_agree(width_run, x64):
    flat = width_run(ms.MultiStartAdam, 4)
    assert flat.config["flat"] is True
    tree = ms.MultiStartAdam(n_starts=12, batch_size=4, n_steps=300, seed=0, flat=False)
    tree = tree.fit(bowl_and_multimodal, BOWL_AND_MULTIMODAL_SPACE)
    assert tree.config["flat"] is False
    assert_same_result(flat, tree, exact=False, rtol=1e-10)


def test_the_search_classes_read_as_they_did():
    """Every search class's signature and docstrings, and those of its public methods, are the
    snapshot taken before the options were declared in groups (``tests/api_snapshot.py``)."""
    import json

    from api_snapshot import PATH, snapshot

    expected, now = json.loads(PATH.read_text()), snapshot()
    assert list(now) == list(expected)
    for name, entry in expected.items():
        assert now[name] == entry, name


GROUPS = [
    ms.host.config.Starts,
    ms.host.config.TikTak,
    ms.host.config.Stopping,
    ms.host.config.Execution,
]
GROUPS += [ms.host.config.Uncertainty, ms.host.config.Output]


def test_the_configuration_is_its_typed_groups_each_of_few_fields():
    """Every option is declared in exactly one small group, with its doc, resume rule and
    program flag; the configuration is the groups, and lists its options in the public order."""
    names = [f.name for f in dataclasses.fields(ms.SearchConfig)]
    own = [list(g.__dataclass_fields__) for g in GROUPS]
    assert sorted(sum(own, [])) == sorted(names) and len(set(names)) == len(names)
    assert all(1 <= len(fields) <= 8 for fields in own), [len(f) for f in own]
    assert all(issubclass(ms.SearchConfig, g) for g in GROUPS)
    assert (
        list(ms.host.config.ORDER) == list(inspect.signature(ms.MultiStartGradient).parameters)[1:]
    )
    assert list(ms.SearchConfig().record()) == [
        f.name for f in ms.host.config.ordered_fields() if f.metadata["rec"]
    ]
    for f in dataclasses.fields(ms.SearchConfig):
        assert isinstance(f.metadata["on_resume"], ms.host.config.OnResume)
        assert isinstance(f.metadata["program"], bool)
    # a group is a type of its own, checked on its own
    with pytest.raises(ValueError, match="n_candidates must be None"):
        ms.host.config.Starts(n_starts=8, n_candidates=3)
    assert ms.host.config.Stopping(schedule="halving").halving is not None


def test_absolute_sigma_is_resolved_in_one_place_by_the_rule():
    resolve = ms.host.config.resolve_absolute_sigma
    assert resolve(None, least_squares=True, n_data=None) is False
    assert resolve(None, least_squares=False, n_data=None) is True
    assert resolve(None, least_squares=None, n_data=None) is None  # no rule: left as given
    with pytest.raises(TypeError, match="absolute_sigma must be True, False or None"):
        resolve(1, least_squares=False, n_data=None)
    with pytest.raises(ValueError, match="give n_data"):
        resolve(False, least_squares=False, n_data=None)
    with pytest.raises(ValueError, match="drop n_data"):
        resolve(None, least_squares=True, n_data=10)
    assert ms.MultiStartLeastSquares().options.absolute_sigma is False
    assert ms.MultiStartLBFGS().options.absolute_sigma is True
    assert ms.MultiStartLBFGS(absolute_sigma=False, n_data=9).options.absolute_sigma is False


def test_the_program_key_is_made_of_the_configuration_s_own_fields():
    """An option added to the configuration is part of the program cache's key unless it
    says it shapes no program, so a forgotten one can never serve a stale program."""
    from multistart.host.config import option

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Extended(ms.SearchConfig):
        new_option: int = option(0)  # an option added later
        display_only: int = option(0, program=False)  # one that shapes no program

    base = Extended()
    assert base.program_key() != Extended(new_option=1).program_key()
    assert base.program_key() == Extended(display_only=1).program_key()
    assert ms.SearchConfig().program_key() != ms.SearchConfig(n_steps=7).program_key()
    assert ms.SearchConfig().program_key() == ms.SearchConfig(seed=7).program_key()
    # the model's key holds it: a search differing in a program option gets other programs
    from multistart.host.identity import programs_key
    from multistart.model.problem import as_problem

    problem = dataclasses.replace(as_problem(parabola, PARABOLA_SPACE), program_key="parabola")
    rule = ms.MultiStartLBFGS().solver
    keys = {
        programs_key(problem, rule, o, np.float32)
        for o in (Extended(), Extended(new_option=1), Extended(display_only=1))
    }
    assert len(keys) == 2


def test_parts_and_stacks_refuse_the_one_list_of_couplings():
    """``SearchConfig.couplings`` is the one list: a part refuses every coupling but the
    filter (each part makes the whole run's), a stack of fits every one that ranks or replaces
    starts (it may share a budget), and ``rediscoveries`` every one that ends starts itself."""
    from multistart.host.parts import check_part, check_stack
    from multistart.model.problem import Problem

    couplings = dict(
        resurrect=2,
        start_strategy="tiktak",
        target_fom=0.5,
        max_evals=100,
        rediscoveries=3,
        schedule="halving",
    )
    stack = Problem(lambda p, d: p, Space(PARABOLA_SPACE), rows_per_datum=2)
    for name, value in couplings.items():
        no_filter = {} if name == "start_strategy" else {"n_candidates": 0}
        o = ms.SearchConfig(n_starts=4, **{name: value, **no_filter})
        *filter_, c = o.couplings()
        assert c.option.startswith(name) and len(filter_) == (name == "start_strategy")
        with pytest.raises(ValueError, match=f"cannot be used with {c.option}"):
            check_part((0, 2), o)
        if c.stack_may_keep:
            assert name in ("max_evals", "rediscoveries")
            check_stack(stack, o, None)
        else:
            with pytest.raises(ValueError, match=f"{c.option} would rank or replace"):
                check_stack(stack, o, None)
        if c.ends_starts:
            assert name in ("resurrect", "start_strategy", "schedule")
            with pytest.raises(ValueError, match=f"which {c.option} does not combine"):
                ms.SearchConfig(n_starts=4, rediscoveries=3, **{name: value, **no_filter})
    # the filter couples a stack's rows, not a part's
    (c,) = ms.SearchConfig(n_starts=4).couplings()
    assert c.part_may_keep and not c.stack_may_keep and c.option.startswith("n_candidates")
    check_part((0, 2), ms.SearchConfig(n_starts=4))
    with pytest.raises(ValueError, match=r"n_candidates \(the broad-start filter\) would rank"):
        check_stack(stack, ms.SearchConfig(n_starts=4), None)
    assert ms.SearchConfig(n_candidates=0).couplings() == []


def test_a_chunk_as_wide_as_the_population_steps_it_where_it_lies_bit_for_bit():
    """A chunk as wide as the population is stepped without a gather or a scatter: the rows
    named are stepped where they lie and the others held. Every row and the history come out
    bit for bit as a gathered chunk of the same width leaves them (its population one row
    longer), through a refill, a start ending mid-call and a running row no call names."""
    from multistart.device.chunking import chunk_indices
    from multistart.device.step import (
        clock,
        init_population,
        init_rows,
        make_chunk_step,
        make_start_step,
    )
    from multistart.solvers import LBFGS

    solver, window, n = LBFGS(), 4, 6
    scales = jnp.array([1.0, 3.0, 0.3, 10.0, 1.0, 2.0, 1.0])

    def fom_u(u, data):
        return jnp.sum(data * (u - 1.0) ** 2) + 0.1 * jnp.sum(u**4)

    start_step = make_start_step(fom_u, solver, ms.Convergence(window=window), 8)
    chunk_step = jax.jit(make_chunk_step(start_step, functools.partial(init_rows, solver, window)))
    u0 = scales[:, None] * jnp.linspace(-2.0, 2.0, 3)[None, :]
    data = jnp.array([1.0, 4.0, 0.5])
    rows = np.array([4, 0, 2, 1, 3])  # row 5 runs but is never named; row 6: the gathered's
    refill = (jnp.arange(n) == 3).astype(jnp.int8), jnp.full((n, 3), 0.7)  # to row rows[3]

    def run(n_total):
        pop = init_population(solver, u0[:n_total], 12, window)
        ((g, s),) = chunk_indices(rows, n, n_total)
        pop = chunk_step(pop, g, s, refill, clock(0, 0), data)  # row 1 starts anew from 0.7
        for t in range(0, 12, 4):
            pop = chunk_step(pop, g, s, (refill[0] * 0, refill[1]), clock(t, 4, t == 4), data)
        starts = jax.tree_util.tree_map(lambda a: np.asarray(a)[:n], pop.starts)
        return pop._replace(starts=starts, history=np.asarray(pop.history)[:, :n])

    in_place, gathered = run(n), run(n + 1)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(in_place), leaves(gathered), strict=True):
        np.testing.assert_array_equal(a, b)
    starts = in_place.starts
    assert starts.status[5] == ms.Status.RUNNING.code and starts.n_steps[5] == 0
    assert np.isnan(in_place.history[:, 5]).all() and not np.isnan(in_place.history[0, :5]).any()
    assert len(set(starts.n_steps[:5].tolist())) > 1  # the starts ended at different steps
    np.testing.assert_array_equal(starts.u[1] != 0.7, True)  # the refilled row has stepped


@pytest.mark.parametrize("rows_per_datum", [None, 2])
def test_a_chunk_in_a_window_of_the_population_is_stepped_there_bit_for_bit(
    monkeypatch, rows_per_datum
):
    """On a chip a chunk whose rows lie within its width of each other is sliced from the
    population, stepped and written back (``step.windowed``), and one whose rows do not is
    gathered, in one program. Every row and the history come out bit for bit as the gathered
    program (a CPU's) leaves them: windows in the middle and at the end (the window moved back
    to fit), a chunk spread too wide for one, a refill, starts ending mid-call, per-row data."""
    from multistart.device import step as step_module
    from multistart.device.chunking import chunk_indices
    from multistart.solvers import LBFGS

    solver, window, n_total, width = LBFGS(), 4, 12, 4
    scales = jnp.linspace(0.3, 3.0, n_total)

    def fom_u(u, data):
        return jnp.sum(data * (u - 1.0) ** 2) + 0.1 * jnp.sum(u**4)

    start_step = step_module.make_start_step(fom_u, solver, ms.Convergence(window=window), 8)
    u0 = scales[:, None] * jnp.linspace(-2.0, 2.0, 3)[None, :]
    data = jnp.array([1.0, 4.0, 0.5])
    if rows_per_datum:  # a dataset per pair of rows
        data = data[None, :] * jnp.arange(1.0, 1.0 + n_total // rows_per_datum)[:, None]
    layouts = [
        np.array([5, 6, 8]),  # a window from row 5
        np.array([10, 11]),  # the end: the window is rows 8-11
        np.array([0, 7, 11]),  # too wide for one window: gathered
    ]
    refill = (jnp.arange(width) == 1).astype(jnp.int8), jnp.full((width, 3), 0.7)

    def run(windowed: bool):
        monkeypatch.setattr(step_module, "windowed", lambda: windowed)
        init = functools.partial(step_module.init_rows, solver, window)
        chunk_step = jax.jit(step_module.make_chunk_step(start_step, init, rows_per_datum))
        pop = step_module.init_population(solver, u0, 12, window)
        clock = step_module.clock
        for rows in layouts:
            ((g, s),) = chunk_indices(rows, width, n_total)
            pop = chunk_step(pop, g, s, refill, clock(0, 0), data)  # its 2nd row anew at 0.7
            for t in range(0, 12, 4):
                pop = chunk_step(pop, g, s, (refill[0] * 0, refill[1]), clock(t, 4, t == 4), data)
        return jax.tree_util.tree_map(np.asarray, pop), chunk_step

    windowed, program = run(True)
    gathered, gathering = run(False)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(windowed), leaves(gathered), strict=True):
        np.testing.assert_array_equal(a, b)

    def updates(chunk_step) -> int:  # the program's update slices: one per leaf in a window's
        args = (*chunk_indices(layouts[0], width, n_total)[0], refill, step_module.clock(0), data)
        return chunk_step.lower(windowed, *args).as_text().count("dynamic_update_slice")

    n_leaves = len(leaves(windowed.starts))
    assert updates(program) >= updates(gathering) + n_leaves
    starts = windowed.starts
    stepped = np.concatenate(layouts)
    assert (starts.n_steps[stepped] > 0).all()
    others = np.setdiff1d(np.arange(n_total), stepped)
    assert (starts.n_steps[others] == 0).all() and np.isnan(windowed.history[:, others]).all()
    assert len(set(starts.n_steps[stepped].tolist())) > 1  # the starts ended at different steps
    np.testing.assert_array_equal(starts.u[[6, 11, 7]] != 0.7, True)  # refilled, then stepped


@pytest.mark.parametrize("backend", ["loop", pytest.param("scan", marks=pytest.mark.slow)])
def test_on_a_chip_a_search_with_windows_and_gathers_is_the_gathered_search(monkeypatch, backend):
    """A whole search on a chip's form (the platform injected: its solves entry by entry):
    its first sweeps step windows of the population, its later ones, after starts ended and the
    running rows were repacked, gather the spread ones, in one program. Its Result is the
    search's whose program only gathers (``step.windowed`` off), for each backend: every
    start's steps and status exactly, its numbers to float32's rounding. (Not bit for bit: the
    CPU's AVX code of the two programs rounds one start of these 24 in its last bits; with
    ``XLA_FLAGS=--xla_cpu_max_isa=SSE4_2`` they agree bit for bit, and in float64 too.)"""
    import collections

    from conftest import assert_same_result

    from multistart.common import xla
    from multistart.device import programs as programs_module
    from multistart.device import step as step_module

    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    monkeypatch.setattr(programs_module, "_kept", collections.OrderedDict())  # restored after
    t = np.linspace(0.0, 3.0, 15)

    def residuals(p):
        return p["a"] * jnp.exp(-t / p["tau"]) + p["c"] - (2.0 * jnp.exp(-t / 0.7) + 0.1)

    space = {"a": ms.Uniform(0.1, 5.0), "tau": ms.LogUniform(0.1, 3.0), "c": ms.Uniform(-1, 1)}
    calls = []

    def fit(windowed: bool):
        programs_module._kept.clear()  # the other form's program is not served again
        monkeypatch.setattr(step_module, "windowed", lambda: windowed)
        real = step_module._window

        def spy(scatter, n_rows, width):  # (traced once: what the program can choose)
            calls.append(windowed)
            return real(scatter, n_rows, width)

        monkeypatch.setattr(step_module, "_window", spy)
        search = ms.MultiStartLeastSquares(
            n_starts=24, batch_size=8, n_steps=40, seed=3, backend=backend, n_candidates=0,
            log_every=0, progress=False,
        )  # fmt: skip
        return search.fit(residuals, space)

    windows, gathers = fit(True), fit(False)
    assert calls == [True]  # the first program holds the window's form, the second does not
    assert assert_same_result(windows, gathers, exact=False, rtol=1e-5, atol=1e-8)
    ended = windows.n_steps[windows.n_steps < 40]
    assert len(set(ended.tolist())) > 1  # starts ended at different steps: rows repacked
