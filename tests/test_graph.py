import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NoCompile, assert_same_result
from scipy import stats
from test_search import RULES

import multistart as ms

# A line y = slope * x + offset seen by several "instruments" with different sample counts; the
# slope is shared, each instrument has its own offset and noise level.
SLOPE, OFFSETS = 1.7, {"short": -0.4, "mid": 0.8, "long": 0.25}
LENGTHS = {"short": 7, "mid": 12, "long": 20}


def line_loglike(p, d):
    r = (d["y"] - (p["slope"] * d["x"] + p["offset"])) * d["w"]
    return -0.5 * jnp.sum(r**2)


def line_data(name, noise=0.05, seed=0):
    rng = np.random.default_rng(seed + LENGTHS[name])
    x = np.linspace(-1.0, 2.0, LENGTHS[name])
    y = SLOPE * x + OFFSETS[name] + rng.normal(0.0, noise, x.size)
    return {"x": x, "y": y, "w": np.full(x.size, 1.0 / noise)}


def line_factors():
    return [
        ms.Factor(line_loglike, line_data(n), space={"offset": ms.Normal(0.0, 2.0)}, name=n)
        for n in LENGTHS
    ]


SHARED = {"slope": ms.Uniform(-5.0, 5.0)}


def line_graph(**kwargs):
    return ms.FactorGraphModel(line_factors(), space=SHARED, **kwargs)


# One search of the line graph, shared: the fit that recovers the parameters is the unpadded run
# of the padding test (one compile fewer, one fit fewer). 100 steps recover the parameters as
# well as 600 did (errors about 0.012 against tolerances of 0.05 and 0.08); no convergence
# test, so that the padded run's steps can be compared one for one.
LINE_SEARCH = dict(n_starts=3, n_steps=100, seed=2, convergence=None)


@pytest.fixture(scope="module")
def line_fit():
    """``line_fit(pad)``: (graph, result) of the float64 search of ``line_graph()`` (pad=False:
    the default graph) or of the padded and stacked one (pad=True). Built inside a test."""

    @functools.cache
    def fit(pad):
        with jax.enable_x64(True):
            graph = line_graph(pad_to_common_shape=True, vmap_factors=True) if pad else line_graph()
            return graph, ms.MultiStartAdam(**LINE_SEARCH).fit(graph)

    return fit


def random_params(rng):
    return {
        "slope": rng.uniform(-4.0, 4.0),
        **{n: {"offset": rng.normal(0.0, 1.5)} for n in LENGTHS},
    }


# -- semantics -------------------------------------------------------------------------------


def test_fom_is_minus_two_times_loglikes_plus_logprior_by_hand(x64):
    graph = line_graph(vmap_factors=False)
    problem = graph.multistart_problem()
    rng = np.random.default_rng(1)
    for _ in range(3):
        p = random_params(rng)
        loglikes = 0.0
        for n in LENGTHS:
            d = line_data(n)
            r = (d["y"] - (p["slope"] * d["x"] + p[n]["offset"])) * d["w"]
            loglikes += -0.5 * np.sum(r**2)
        logprior = stats.uniform(-5.0, 10.0).logpdf(p["slope"]) + sum(
            stats.norm(0.0, 2.0).logpdf(p[n]["offset"]) for n in LENGTHS
        )
        expected = -2.0 * (loglikes + logprior)
        np.testing.assert_allclose(graph.fom(p), expected, rtol=1e-12)
        np.testing.assert_allclose(problem.fom(p, problem.data), expected, rtol=1e-12)
        np.testing.assert_allclose(graph.log_prior(p), logprior, rtol=1e-12)
        np.testing.assert_allclose(sum(graph.log_likelihoods(p).values()), loglikes, rtol=1e-12)


def test_log_likelihood_sees_one_flat_dict_of_shared_and_own_params():
    seen = {}

    def spy(name):
        def loglike(p, d):
            seen[name] = sorted(p)
            return -jnp.sum((d - p["a"]) ** 2)

        return loglike

    factors = [
        ms.Factor(spy("f"), np.zeros(3), space={"b": ms.Uniform(0, 1)}, name="f"),
        ms.Factor(spy("g"), np.zeros(4), name="g"),  # no parameters of its own
    ]
    graph = ms.FactorGraphModel(factors, space={"a": ms.Uniform(-1, 1)})
    assert seen == {"f": ["a", "b"], "g": ["a"]}
    assert graph.space.paths == ["a", "f.b"]  # own params under the factor's name
    assert [f"{n}" for n in graph.names] == ["f", "g"]


def test_unnamed_factors_are_named_by_position():
    factors = [
        ms.Factor(line_loglike, line_data(n), space={"offset": ms.Normal(0, 2)}) for n in LENGTHS
    ]
    graph = ms.FactorGraphModel(factors, space=SHARED)
    assert graph.names == ("factor_0", "factor_1", "factor_2")
    assert graph.space.paths == ["factor_0.offset", "factor_1.offset", "factor_2.offset", "slope"]


def test_fit_recovers_shared_and_per_factor_params_with_views(x64, line_fit):
    graph, result = line_fit(False)
    assert result.stats["n_compiles"] == 1
    assert abs(float(result.best_params["slope"]) - SLOPE) < 0.05
    for n, offset in OFFSETS.items():
        assert abs(float(result.best_params[n]["offset"]) - offset) < 0.08
    views = graph.factor_views(result)
    assert list(views) == list(LENGTHS)
    for n, v in views.items():
        assert v.name == n and v.factor.name == n
        assert v.own_params["offset"] == result.best_params[n]["offset"]
        assert set(v.params) == {"slope", "offset"}
        np.testing.assert_allclose(v.log_likelihood, float(line_loglike(v.params, v.data)))
        assert v.data["x"].shape == (LENGTHS[n],)  # its own data, unpadded
    logprior = graph.log_prior(result.best_params)
    total = sum(v.log_likelihood for v in views.values())
    np.testing.assert_allclose(result.best_fom, -2 * (total + logprior), rtol=1e-9)
    # another start's view
    i = int(result.ranked()[-1])
    other = graph.factor_views(result, start=i)["mid"]
    assert other.own_params["offset"] == result.params["mid"]["offset"][i]
    with pytest.raises(KeyError, match="no factor named 'nope'"):
        graph.factor_params(result.best_params, "nope")


def _mixed_graph():
    """Factors of different log-likelihoods, data structures and shapes, one without params."""

    def image_loglike(p, d):
        model = p["amp"] * jnp.exp(-0.5 * (d[0][:, None] ** 2 + d[0][None, :] ** 2))
        return -0.5 * jnp.sum((d[1] - model) ** 2)

    def prior_like(p, d):
        return -0.5 * ((p["amp"] - d["amp"]) / d["sigma"]) ** 2

    grid = np.linspace(-2, 2, 9)
    image = 3.0 * np.exp(-0.5 * (grid[:, None] ** 2 + grid[None, :] ** 2))
    factors = [
        ms.Factor(image_loglike, (grid, image), name="image"),
        ms.Factor(prior_like, {"amp": np.float64(2.5), "sigma": np.float64(1.0)}, name="cal"),
        *line_factors()[:2],
    ]
    return ms.FactorGraphModel(factors, space={"amp": ms.Uniform(0, 10), **SHARED})


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_fits_a_graph_of_heterogeneous_factors(rule):
    result = rule(n_starts=3, batch_size=2, n_steps=20, seed=0).fit(_mixed_graph())
    assert result.stats["n_compiles"] == 1
    assert np.isfinite(result.best_fom)
    assert result.params["short"]["offset"].shape == (3,)
    assert set(result.best_params) == {"amp", "slope", "short", "mid"}


def test_factors_without_data_share_a_log_likelihood(x64):
    def pull(p, d):  # a constraint term: no data, only the factor's own parameter
        return -0.5 * (p["z"] - p["slope"]) ** 2

    factors = [ms.Factor(pull, {}, space={"z": ms.Normal(0, 1)}, name=n) for n in "ab"]

    def const(p, d):
        return -(p["slope"] ** 2)

    factors += [ms.Factor(const, (), name=n) for n in "cd"]  # nothing to map over: not stacked
    graph = ms.FactorGraphModel(factors, space=SHARED)
    assert repr(graph).endswith("groups: stacked ['a', 'b'], ['c', 'd'])")
    p = {"slope": 0.5, "a": {"z": 1.5}, "b": {"z": -0.5}}
    expected = -0.5 * (1.0 + 1.0) - 2 * 0.25
    assert sum(graph.log_likelihoods(p).values()) == pytest.approx(expected)
    assert graph.fom(p) == pytest.approx(-2 * (expected + graph.log_prior(p)))


def test_graph_data_is_an_argument_not_a_constant():
    """Different data of the same shapes lower to the same program text."""

    def lowered(seed):
        factors = [
            ms.Factor(
                line_loglike, line_data(n, seed=seed), space={"offset": ms.Normal(0, 2)}, name=n
            )
            for n in LENGTHS
        ]
        problem = ms.FactorGraphModel(factors, space=SHARED).multistart_problem()
        params = problem.space.example(jnp.float32)
        return jax.jit(problem.fom).lower(params, problem.data).as_text()

    assert lowered(0) == lowered(1)


# -- padding and stacking --------------------------------------------------------------------


@pytest.mark.parametrize(
    "pad, vmap", [(True, False), (True, True), (False, True)], ids=["pad", "pad+vmap", "vmap"]
)
def test_padded_and_stacked_fom_equals_the_plain_fom(pad, vmap, x64):
    plain = line_graph(vmap_factors=False)
    other = line_graph(pad_to_common_shape=pad, vmap_factors=vmap)
    rng = np.random.default_rng(5)
    for _ in range(4):
        p = random_params(rng)
        np.testing.assert_allclose(other.fom(p), plain.fom(p), rtol=1e-12)
        assert other.log_likelihoods(p) == pytest.approx(plain.log_likelihoods(p), rel=1e-12)
    if pad:
        assert other.check_padding(random_params(rng)) < 1e-9


def test_padding_and_stacking_layout():
    data = line_graph(pad_to_common_shape=True, vmap_factors=True).multistart_problem().data
    (stacked,) = data  # one group: the three factors share a log-likelihood
    assert {k: v.shape for k, v in stacked.items()} == {"x": (3, 20), "y": (3, 20), "w": (3, 20)}
    np.testing.assert_array_equal(stacked["w"][0, 7:], 0.0)  # zero weight: the mask
    padded = line_graph(pad_to_common_shape=True, vmap_factors=False).multistart_problem().data
    assert [d["x"].shape for d in padded[0]] == [(20,), (20,), (20,)]
    plain = line_graph().multistart_problem().data  # vmap alone stacks only equal shapes
    assert [len(group) for group in plain] == [1, 1, 1]


def test_padding_in_the_search_gives_the_same_fit(x64, line_fit):
    (plain, unpadded), (padded, runs_padded) = line_fit(False), line_fit(True)
    assert [len(g) for g in plain.multistart_problem().data] == [1, 1, 1]  # nothing stacked
    assert len(padded.multistart_problem().data) == 1  # one padded group of three
    assert_same_result(unpadded, runs_padded, exact=False, rtol=1e-9)


def test_check_padding_catches_a_likelihood_that_counts_padded_entries(x64):
    def counts_samples(p, d):  # a normalisation over the array length: padding changes it
        r = (d["y"] - p["slope"] * d["x"] - p["offset"]) * d["w"]
        return -0.5 * jnp.sum(r**2) - d["y"].size * 0.5 * np.log(2 * np.pi)

    factors = [
        ms.Factor(counts_samples, line_data(n), space={"offset": ms.Normal(0, 2)}, name=n)
        for n in LENGTHS
    ]
    graph = ms.FactorGraphModel(factors, space=SHARED, pad_to_common_shape=True)
    with pytest.raises(ValueError, match="factor 'short'.*zero-padded entries must contribute"):
        graph.check_padding()


# -- bad input: clear errors before any compile -----------------------------------------------


def _factor(**kwargs):
    return ms.Factor(line_loglike, line_data("short"), **kwargs)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: ms.FactorGraphModel([], space=SHARED), ValueError, "factors is empty"),
        (lambda: ms.FactorGraphModel(_factor(), space=SHARED), TypeError, "list of multistart"),
        (
            lambda: ms.FactorGraphModel([_factor(), "band"], space=SHARED),
            TypeError,
            r"factors\[1\] must be a multistart.Factor",
        ),
        (
            lambda: ms.FactorGraphModel(
                [_factor(name="g", space={"offset": ms.Normal(0, 1)}), _factor(name="g")],
                space=SHARED,
            ),
            ValueError,
            r"factors\[1\] is named 'g', like factors\[0\]",
        ),
        (
            lambda: ms.FactorGraphModel(
                [_factor(name="g", space={"slope": ms.Normal(0, 1)})], space=SHARED
            ),
            ValueError,
            "own parameter 'slope' collides with the shared parameter",
        ),
        (
            lambda: ms.FactorGraphModel([_factor(name="slope")], space=SHARED),
            ValueError,
            "named 'slope', which is also a shared parameter",
        ),
        (lambda: ms.FactorGraphModel([_factor()]), ValueError, "has no parameters"),
        (
            lambda: ms.FactorGraphModel(
                [ms.Factor(lambda p, d: d["y"] * p["slope"], line_data("mid"), name="vec")],
                space=SHARED,
            ),
            TypeError,
            r"factor 'vec': log_likelihood must return a scalar; got shape \(12,\)",
        ),
        (
            lambda: ms.FactorGraphModel(
                [ms.Factor(lambda p, d: jnp.int32(1), line_data("mid"), name="int")],
                space=SHARED,
            ),
            TypeError,
            "factor 'int': log_likelihood must return a real floating-point scalar",
        ),
        (
            lambda: ms.Factor("loglike", {}, name="g"),
            TypeError,
            "Factor 'g': log_likelihood must be callable",
        ),
        (
            lambda: ms.Factor(line_loglike, {"y": "abc"}),
            TypeError,
            "data leaf 'y' must be a numeric",
        ),
        (lambda: ms.Factor(line_loglike, {}, name=3), TypeError, "name must be a non-empty str"),
        (
            lambda: ms.Factor(line_loglike, {}, space={"a": (0, 1)}, name="g"),
            TypeError,
            r"Factor 'g' space\['a'\] must be a prior",
        ),
        (
            lambda: ms.FactorGraphModel([_factor()], space=SHARED, pad_to_common_shape=1),
            TypeError,
            "pad_to_common_shape must be True or False",
        ),
    ],
)
def test_bad_graphs_fail_clearly_before_any_compile(build, error, match):
    with NoCompile(), pytest.raises(error, match=match):
        build()


def test_a_log_likelihood_raising_while_traced_names_its_factor():
    def broken(p, d):
        return d["missing"]

    with NoCompile(), pytest.raises(KeyError, match="missing") as info:
        ms.FactorGraphModel([ms.Factor(broken, {"y": np.ones(2)}, name="b")], space=SHARED)
    assert any("log_likelihood of factor 'b'" in n for n in info.value.__notes__)


def test_fitting_a_graph_takes_no_space():
    with pytest.raises(TypeError, match="space must not be given"):
        ms.MultiStartAdam(n_starts=2, n_steps=5).fit(line_graph(), SHARED)
