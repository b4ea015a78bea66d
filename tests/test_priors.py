import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.model.priors import Space


@pytest.mark.parametrize(
    "prior",
    [
        ms.Uniform(-3.0, 5.0),
        ms.Uniform([0.0, 1.0, 2.0], 10.0),
        ms.LogUniform(0.01, 100.0, shape=(2, 2)),
        ms.Normal(1.0, 3.0, shape=4),
    ],
)
def test_bijection_round_trip_and_support(prior, x64):
    rng = np.random.default_rng(0)
    q = rng.uniform(0.01, 0.99, size=(50, *prior.shape))
    x = prior.from_unit(q)
    assert x.shape == (50, *prior.shape)
    assert np.all(prior.contains(x))
    np.testing.assert_allclose(prior.to_unit(x), q, rtol=1e-9, atol=1e-12)
    u = prior.inverse(x)
    # jitted, as the engine calls it: one compile instead of one per eager op
    np.testing.assert_allclose(np.asarray(jax.jit(prior.forward)(u)), x, rtol=1e-9)


@pytest.mark.parametrize("prior", [ms.Uniform(2.0, 3.0), ms.LogUniform(1e-3, 1e3)])
def test_bounded_forward_never_leaves_the_box(prior):
    u = np.array([-1e6, -80.0, -30.0, 0.0, 30.0, 80.0, 1e6], np.float32)
    x = np.asarray(jax.jit(prior.forward)(u))  # jitted, as the engine calls it
    assert np.all(np.isfinite(x))
    assert np.all((x >= prior.lower) & (x <= prior.upper))


def test_log_prob_matches_scipy(x64):
    from scipy import stats

    n = ms.Normal(1.0, 2.0, shape=(3,))
    u = ms.Uniform(0.0, 4.0)
    lu = ms.LogUniform(1.0, 100.0)
    x = np.array([0.0, 1.0, 4.0])

    @jax.jit  # the three log-densities in one program, not one compile per eager op
    def log_probs(x, one, five):
        return n.log_prob(x), u.log_prob(one), lu.log_prob(five)

    got_n, got_u, got_lu = log_probs(x, np.float64(1.0), np.float64(5.0))
    np.testing.assert_allclose(float(got_n), stats.norm(1.0, 2.0).logpdf(x).sum())
    np.testing.assert_allclose(float(got_u), -np.log(4.0))
    expected = stats.loguniform(1.0, 100.0).logpdf(5.0)
    np.testing.assert_allclose(float(got_lu), expected)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ms.Uniform(1.0, 1.0), "lower must be < upper"),
        (lambda: ms.Uniform(2.0, 1.0), "lower must be < upper"),
        (lambda: ms.Uniform(0.0, np.inf), "upper must be finite"),
        (lambda: ms.Uniform(np.nan, 1.0), "lower must be finite"),
        (lambda: ms.LogUniform(0.0, 1.0), "lower must be > 0"),
        (lambda: ms.Normal(0.0, 0.0), "sigma must be > 0"),
        (lambda: ms.Uniform([0.0, 0.0], [1.0, 1.0, 1.0]), "do not broadcast"),
        (
            lambda: ms.Uniform(0.0, 1.0, shape=(2,)).__class__(0.0, [1.0, 2.0], shape=(3,)),
            "broadcast",
        ),
    ],
)
def test_bad_priors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_space_flattening_names_and_errors():
    space = Space({"b": {"s": ms.Uniform(0, 1)}, "a": ms.Normal(0, 1, shape=(2,))})
    assert space.paths == ["a", "b.s"]
    assert space.n_dims == 3
    with pytest.raises(ValueError, match="space is empty"):
        Space({})
    with pytest.raises(TypeError, match="space must be a dict"):
        Space([ms.Uniform(0, 1)])
    with pytest.raises(TypeError, match=r"space\['b.s'\] must be a prior"):
        Space({"b": {"s": 3.0}})


def test_space_maps_whole_pytrees(x64):
    space = Space({"a": ms.Uniform(0.0, 2.0), "b": {"c": ms.LogUniform(1.0, 10.0, shape=(3,))}})
    x = {"a": np.array([0.5, 1.5]), "b": {"c": np.array([[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]])}}
    u = space.to_unconstrained(x)
    back = jax.jit(jax.vmap(space.to_physical))(u)
    for got, want in zip(
        jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(x), strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_flat_map_equals_the_per_leaf_map_and_keeps_gradients_finite(x64):
    space = Space(
        {
            "wide": ms.Uniform(0.0, 1e4, shape=(2,)),  # exp of these bounds would overflow
            "log": ms.LogUniform(1e-3, 1e3),
            "n": ms.Normal([0.0, 5.0], 2.0),
            "m": {"u": ms.Uniform(-1.0, 1.0, shape=(2, 2))},
        }
    )
    rng = np.random.default_rng(0)
    u = rng.normal(size=space.n_dims) * 3

    @jax.jit  # both maps in one program, as the engine runs them: not one compile per eager op
    def both_maps(v):
        return space.unravel(space.forward_flat(v)), space.to_physical(space.unravel(v))

    flat, per_leaf = both_maps(u)
    for got, want in zip(
        jax.tree_util.tree_leaves(flat),
        jax.tree_util.tree_leaves(per_leaf),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(space.forward_flat(v))))(u)
    assert np.all(np.isfinite(np.asarray(grad)))
    x = {k: v for k, v in per_leaf.items()}
    back = space.ravel(space.to_unconstrained(x), batch_ndim=0)
    np.testing.assert_allclose(back, np.asarray(u), rtol=1e-9)


@pytest.mark.parametrize(
    "prior, text",
    [
        (ms.LogUniform(0.1, 30.0), "LogUniform(0.1, 30.0)"),
        (ms.Uniform(0, 1, shape=(3,)), "Uniform(0.0, 1.0, shape=(3,))"),
        (ms.LogUniform([0.05, 0.8], [0.8, 3.0]), "LogUniform([0.05, 0.8], [0.8, 3.0])"),
        (ms.Normal(np.float64(0.0), 2), "Normal(0.0, 2.0)"),
        (ms.Normal([[0.0, 1.0]], 1.0), "Normal([[0.0, 1.0]], 1.0)"),
    ],
)
def test_reprs_are_plain_python(prior, text):
    assert repr(prior) == text
    rebuilt = eval(text, {"Uniform": ms.Uniform, "LogUniform": ms.LogUniform, "Normal": ms.Normal})
    assert type(rebuilt) is type(prior) and rebuilt.shape == prior.shape


def test_messages_print_numbers_as_numbers():
    with pytest.raises(ValueError, match=r"lower must be > 0; got 0.0$"):
        ms.LogUniform(np.float64(0.0), 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fusion_boundary_changes_no_bit_of_values_or_gradients(dtype):
    from multistart.model.priors import fusion_boundary

    with jax.enable_x64(dtype == np.float64):
        rng = np.random.default_rng(0)
        finfo = np.finfo(dtype)
        extremes = [0.0, -0.0, finfo.tiny, -finfo.tiny, finfo.max, finfo.smallest_subnormal]
        tree = {
            "a": np.concatenate([rng.normal(size=13) * 1e3, extremes]).astype(dtype),  # ragged
            "b": rng.normal(size=(3, 4)).astype(dtype),
            "c": np.asarray(rng.normal(), dtype),
            "n": np.arange(5, dtype=np.int32),  # not floating: passed through
        }
        out = jax.jit(fusion_boundary)(tree)
        for key in tree:
            assert out[key].dtype == tree[key].dtype and out[key].shape == tree[key].shape
            got, want = np.asarray(out[key]), tree[key]
            if key == "a":  # a subnormal may be flushed to zero (documented), nothing else
                assert got[-1] in (want[-1], 0.0)
                got, want = got[:-1], want[:-1]
            np.testing.assert_array_equal(got, want)

        def f(t):
            return jnp.sum(jnp.sin(t["a"][:13]) * 3.0) + jnp.sum(t["b"] ** 3) + t["c"] * 2.0

        floats = {k: v for k, v in tree.items() if k != "n"}
        g0 = jax.jit(jax.grad(f))(floats)
        g1 = jax.jit(jax.grad(lambda t: f(fusion_boundary(t))))(floats)
        for key in floats:
            np.testing.assert_array_equal(np.asarray(g1[key]), np.asarray(g0[key]))


def test_the_model_sees_the_map_behind_one_boundary_bit_for_bit(x64):
    space = Space(
        {
            "log": ms.LogUniform(1e-3, 1e3, shape=(3,)),
            "n": ms.Normal([0.0, 5.0], 2.0),
            "m": {"u": ms.Uniform(-1.0, 1.0, shape=(2, 2))},
        }
    )
    u = np.random.default_rng(1).normal(size=space.n_dims) * 2

    def f(p):  # a model that broadcasts its parameters, as an image model does
        grid = jnp.linspace(0.0, 1.0, 50)
        return jnp.sum(jnp.exp(-grid[:, None] * p["log"]) * p["m"]["u"].sum() + p["n"].sum())

    @jax.jit
    def both(v):
        plain = jax.value_and_grad(lambda w: f(space.unravel(space.forward_flat(w))))(v)
        flat = jax.value_and_grad(lambda w: f(space.to_model(w)))(v)
        tree = jax.value_and_grad(lambda w: f(space.to_model(w)))(space.unravel(v))
        return plain, flat, tree[1], tree[0], space.to_model(v)

    (v0, g0), (v1, g1), g2, v2, x = both(u)
    g2 = space.ravel(jax.tree_util.tree_map(np.asarray, g2), batch_ndim=0)
    assert v0 == v1 == v2  # one boundary on the flat vector, or one per leaf: the same bits
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g0))
    np.testing.assert_array_equal(np.asarray(g2), np.asarray(g0))
    want = jax.jit(lambda v: space.unravel(space.forward_flat(v)))(u)
    for got, ref in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_a_half_bounded_prior_never_crosses_its_bound_and_starts_around_typical():
    lower = ms.HalfBounded(0.5, 2.0)
    upper = ms.HalfBounded(1.0, -3.0, side="upper")
    u = np.linspace(-30.0, 30.0, 13)
    assert np.all(np.asarray(lower.forward(jnp.asarray(u))) >= 0.5)
    assert np.all(np.asarray(upper.forward(jnp.asarray(u))) <= 1.0)
    assert float(lower.forward(jnp.asarray(0.0))) == 2.0
    x = np.array([0.6, 2.0, 40.0])
    np.testing.assert_allclose(np.asarray(lower.forward(jnp.asarray(lower.inverse(x)))), x)
    q = lower.to_unit(lower.from_unit(np.array([0.15, 0.5, 0.85])))
    np.testing.assert_allclose(q, [0.15, 0.5, 0.85])
    assert lower.lower_bound == 0.5 and np.isinf(lower.upper_bound)
    assert upper.upper_bound == 1.0 and np.isinf(upper.lower_bound)
    for bad, match in [
        (dict(bound=1.0, typical=0.5), "typical must be strictly inside"),
        (dict(bound=0.0, typical=1.0, side="left"), "side must be"),
        (dict(bound=np.nan, typical=1.0), "bound must be finite"),
    ]:
        with pytest.raises(ValueError, match=match):
            ms.HalfBounded(**bad)
