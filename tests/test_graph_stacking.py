"""A graph's factors of one kind are one kernel over a factor axis: the traced program does not
grow with the number of factors, and the figure of merit is the one factor by factor."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.model.plates import GraphParams, GraphSpace
from multistart.model.priors import Prior

SHARED = {"slope": ms.Uniform(-5.0, 5.0), "scale": ms.LogUniform(0.1, 10.0)}


def loglike(p, d):
    model = p["scale"] * (p["slope"] * d["x"] + p["offset"]) + p["tilt"][0] * d["x"] ** 2
    return -0.5 * jnp.sum(((d["y"] - model) * d["w"]) ** 2) + 0.0 * p["tilt"][1]


def factors(n, *, seed=0, own=None):
    """``n`` factors of 5-9 points each, own ``offset`` and a 2-vector ``tilt``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        m = int(rng.integers(5, 10))
        x = np.sort(rng.uniform(-1.0, 1.0, m))
        y = 1.3 * x + rng.normal(0.0, 0.5) + rng.normal(0.0, 0.05, m)
        space = (
            own(i)
            if own
            else {
                "offset": ms.Normal(0.0, 1.0 + 0.01 * i),
                "tilt": ms.Uniform(-1.0, 1.0 + 0.1 * i, shape=(2,)),
            }
        )
        out.append(
            ms.Factor(loglike, {"x": x, "y": y, "w": np.full(m, 20.0)}, space=space, name=f"f{i}")
        )
    return out


def graph(n, **kwargs):
    kwargs.setdefault("pad_to_common_shape", True)
    return ms.FactorGraphModel(
        factors(n, **{k: kwargs.pop(k) for k in ("own",) if k in kwargs}), space=SHARED, **kwargs
    )


def random_params(space, rng):
    q = [rng.uniform(0.2, 0.8, p.shape) for p in space.priors]
    return space.from_unit(q)


def n_eqns(fn, *args):
    return len(jax.make_jaxpr(fn)(*args).jaxpr.eqns)


def test_the_traced_figure_of_merit_does_not_grow_with_the_factors():
    counts = []
    for n in (10, 100):
        problem = graph(n).multistart_problem()
        space = problem.space
        example = space.example(jnp.float32)
        assert isinstance(example, GraphParams)
        assert example.own[0]["offset"].shape == (n,)
        assert example.own[0]["tilt"].shape == (n, 2)

        def fom_flat(vec, data, problem=problem):  # the search's flat vector, as the model's view
            return problem.fom(problem.space.unravel(vec), data)

        vec = jax.ShapeDtypeStruct((space.n_dims,), jnp.float32)
        counts.append(
            (
                n_eqns(problem.fom, example, problem.data),
                n_eqns(jax.value_and_grad(fom_flat), vec, problem.data),
            )
        )
    assert counts[0] == counts[1]


def test_a_graph_that_stacks_nothing_is_called_with_its_params_pytree():
    g = graph(3, vmap_factors=False)  # three groups of one: nothing to stack
    assert isinstance(g.space, GraphSpace) and not g.space.stacking
    example = g.space.example(jnp.float32)
    assert isinstance(example, dict) and set(example) == {"slope", "scale", "f0", "f1", "f2"}
    assert g.space.example_names() == [
        "f0.offset",
        "f0.tilt",
        "f1.offset",
        "f1.tilt",
        "f2.offset",
        "f2.tilt",
        "scale",
        "slope",
    ]


def test_stacked_fom_equals_the_factor_by_factor_fom(x64):
    stacked = graph(12)
    plain = graph(12, vmap_factors=False)
    assert stacked.space.stacking and not plain.space.stacking
    rng = np.random.default_rng(3)
    for _ in range(3):
        p = random_params(plain.space, rng)
        expected = plain.fom(p)
        np.testing.assert_allclose(stacked.fom(p), expected, rtol=1e-13)
        problem = stacked.multistart_problem()
        np.testing.assert_allclose(problem.fom(p, problem.data), expected, rtol=1e-13)
        np.testing.assert_allclose(stacked.log_prior(p), plain.log_prior(p), rtol=1e-13)


def test_the_view_of_the_flat_vector_is_the_view_of_its_pytree(x64):
    space = graph(7).space
    vec = jnp.asarray(np.random.default_rng(0).normal(size=space.n_dims))
    direct = space.unravel(vec)
    from_tree = space.view(space.unravel_tree(vec))
    for a, b in zip(
        jax.tree_util.tree_leaves(direct), jax.tree_util.tree_leaves(from_tree), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    # and factor f3's row of the stack is its own coordinates
    tree = space.unravel_tree(vec)
    np.testing.assert_array_equal(direct.own[0]["tilt"][3], tree["f3"]["tilt"])


def test_factors_whose_priors_differ_in_kind_are_not_stacked_together(x64):
    def own(i):
        kind = ms.Normal(0.0, 1.0) if i % 2 else ms.Uniform(-3.0, 3.0)
        return {"offset": kind, "tilt": ms.Uniform(-1.0, 1.0, shape=(2,))}

    g = graph(6, own=own)
    assert [p.names for p in g.space.plates] == [("f0", "f2", "f4"), ("f1", "f3", "f5")]
    plain = graph(6, own=own, vmap_factors=False)
    p = random_params(plain.space, np.random.default_rng(1))
    np.testing.assert_allclose(g.fom(p), plain.fom(p), rtol=1e-13)


def test_fixed_and_half_bounded_own_parameters_stack(x64):
    def own(i):
        return {
            "offset": ms.HalfBounded(-2.0, 0.5 + 0.1 * i),
            "tilt": ms.Fixed([0.01 * i, 0.0]),
        }

    g = graph(5, own=own)
    plain = graph(5, own=own, vmap_factors=False)
    assert g.space.stacking
    example = g.space.example(jnp.float64)
    assert example.own[0]["tilt"].shape == (5, 2)
    assert g.space.example_names()[-1] is None  # the fixed tilt: not a stepped parameter
    vec = jnp.asarray(np.random.default_rng(0).normal(size=g.space.n_dims))
    np.testing.assert_allclose(g.space.unravel(vec).own[0]["tilt"][:, 0], 0.01 * np.arange(5))
    p = random_params(plain.space, np.random.default_rng(2))
    np.testing.assert_allclose(g.fom(p), plain.fom(p), rtol=1e-13)


class Laplacian(Prior):
    """A prior of a user's own kind (a Laplace density, affine map): no stacked form known."""

    def __init__(self, scale):
        self.scale, self.shape = float(scale), ()

    lower_bound = property(lambda self: np.array(-np.inf))
    upper_bound = property(lambda self: np.array(np.inf))

    def from_unit(self, q):
        return self.scale * (np.asarray(q) - 0.5)

    def to_unit(self, x):
        return np.asarray(x) / self.scale + 0.5

    def forward(self, u):
        return self.scale * u

    def inverse(self, x):
        return np.asarray(x, dtype=np.float64) / self.scale

    def log_prob(self, x):
        return jnp.sum(-jnp.abs(x) / self.scale - jnp.log(2 * self.scale))


def test_priors_of_a_users_own_kind_stack_their_parameters_not_their_densities(x64):
    def own(i):
        return {"offset": Laplacian(1.0 + i), "tilt": ms.Uniform(-1.0, 1.0, shape=(2,))}

    g = graph(4, own=own)
    plain = graph(4, own=own, vmap_factors=False)
    assert g.space.stacking
    p = random_params(plain.space, np.random.default_rng(4))
    np.testing.assert_allclose(g.fom(p), plain.fom(p), rtol=1e-13)


def test_a_parameter_with_no_gradient_is_named_for_its_stacked_factors(x64):
    def flat(p, d):
        return -0.5 * jnp.sum((d["y"] - p["slope"] * d["x"] - jnp.round(p["offset"])) ** 2)

    fs = [
        ms.Factor(
            flat,
            {"x": np.arange(3.0), "y": np.arange(3.0)},
            space={"offset": ms.Uniform(-1, 1)},
            name=f"f{i}",
        )
        for i in range(4)
    ]
    g = ms.FactorGraphModel(fs, space={"slope": ms.Uniform(-2, 2)})
    with pytest.warns(RuntimeWarning, match=r"zero everywhere along \{f0, \.\.\., f3\}\.offset"):
        ms.MultiStartLBFGS(n_starts=2, n_steps=3, n_candidates=0).fit(g)


@pytest.fixture(scope="module")
def fits():
    """The same small search of a stacked and of the factor-by-factor graph (float64)."""
    with jax.enable_x64(True):
        search = dict(n_starts=3, n_steps=60, seed=1, n_candidates=0)
        out = {}
        for vmap in (True, False):
            out[vmap] = ms.MultiStartLBFGS(**search).fit(graph(8, vmap_factors=vmap))
        out["tree"] = ms.MultiStartLBFGS(**search, flat=False).fit(graph(8))
        return out


def test_a_stacked_graphs_fit_is_the_factor_by_factor_fit_in_the_params_pytree(x64, fits):
    stacked, plain = fits[True], fits[False]
    assert stacked.best_params["f5"]["tilt"].shape == (2,)
    assert stacked.params["f5"]["offset"].shape == (3,)
    np.testing.assert_allclose(stacked.foms, plain.foms, rtol=1e-9)
    for a, b in zip(
        jax.tree_util.tree_leaves(stacked.params),
        jax.tree_util.tree_leaves(plain.params),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_a_stacked_graph_steps_its_params_pytree_with_flat_false(x64, fits):
    np.testing.assert_allclose(fits["tree"].best_fom, fits[True].best_fom, rtol=1e-9)
    assert fits["tree"].best_params["f2"]["tilt"].shape == (2,)


def test_lbfgs_scales_each_coordinate_on_a_cohort_past_500_parameters():
    """``MultiStartLBFGS(diagonal="auto")``: on for a graph whose factors own parameters past
    500 parameters (170 factors of 3 and 2 shared: 512), the same steps as ``diagonal=True``;
    off at 100 factors (302), and off where the user says so; the figure of merit is the
    explicit option's bit for bit either way."""
    from multistart.host.driver import DIAGONAL_FROM_DIMS, diagonal_for

    kw = dict(n_starts=2, n_steps=4, seed=0, log_every=0)
    big, small = graph(170), graph(100)
    assert big.space.n_dims > DIAGONAL_FROM_DIMS >= small.space.n_dims
    assert diagonal_for(big.space) and not diagonal_for(small.space)
    auto = ms.MultiStartLBFGS(**kw).fit(big)
    on = ms.MultiStartLBFGS(diagonal=True, **kw).fit(big)
    off = ms.MultiStartLBFGS(diagonal=False, **kw).fit(big)
    assert auto.config["hyperparameters"]["diagonal"] is True
    assert "diagonal" not in off.config["hyperparameters"]
    np.testing.assert_array_equal(np.asarray(auto.foms), np.asarray(on.foms))
    assert not np.array_equal(np.asarray(auto.foms), np.asarray(off.foms))
    assert ms.MultiStartLBFGS(**kw).left_auto("diagonal")
    assert not ms.MultiStartLBFGS(diagonal=False, **kw).left_auto("diagonal")
    small_auto = ms.MultiStartLBFGS(**kw).fit(small)
    small_off = ms.MultiStartLBFGS(diagonal=False, **kw).fit(small)
    assert "diagonal" not in small_auto.config["hyperparameters"]
    np.testing.assert_array_equal(np.asarray(small_auto.foms), np.asarray(small_off.foms))


def test_a_diagonal_that_is_not_a_bool_or_auto_is_refused_by_name_before_any_compile():
    from conftest import NoCompile

    for bad in ("yes", 1, None, "Auto"):
        with NoCompile(), pytest.raises(ValueError, match="diagonal must be True, False or 'auto'"):
            ms.MultiStartLBFGS(diagonal=bad).fit(graph(3))
