"""A factor graph's Laplace errors from the arrow of its Hessian: the blocks and their Schur
complement give what the dense ``jax.hessian`` gives, in memory linear in the factors."""

import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.result import laplace as lap
from multistart.result.arrow import ArrowCurvature, safe_inverses
from multistart.result.uncertainty import Uncertainty

SHARED = {"slope": ms.Normal(1.0, 2.0), "curve": {"c2": ms.Uniform(-2.0, 2.0)}}


def line(p, d):
    model = p["slope"] * d["x"] + p["curve"]["c2"] * d["x"] ** 2 + p.get("offset", 0.0)
    model = model + (p["tilt"] @ jnp.stack([d["x"] ** 3, jnp.sin(d["x"])]) if "tilt" in p else 0)
    return -0.5 * jnp.sum(((d["y"] - model) * d["w"]) ** 2)


def data(rng, m):
    x = np.sort(rng.uniform(-1.0, 1.0, m))
    y = 1.2 * x + 0.3 * x**2 + rng.normal(0.0, 0.1, m)
    return {"x": x, "y": y, "w": np.full(m, 10.0)}


def mixed_graph(n=6, seed=0, **kwargs):
    """Factors of three kinds: an offset and a tilt of their own (stacked), an offset of their
    own with a fixed tilt, and none of their own; a nested shared space."""
    rng = np.random.default_rng(seed)
    fs = []
    for i in range(n):
        own = {"offset": ms.Normal(0.0, 1.0), "tilt": ms.Normal(0.0, 0.5, shape=(2,))}
        fs.append(ms.Factor(line, data(rng, 6 + i % 3), space=own, name=f"a{i}"))
    for i in range(3):
        own = {"offset": ms.Uniform(-3.0, 3.0), "tilt": ms.Fixed([0.1, 0.0])}
        fs.append(ms.Factor(line, data(rng, 7), space=own, name=f"b{i}"))
    fs.append(ms.Factor(line, data(rng, 9), name="c"))
    return ms.FactorGraphModel(fs, space=SHARED, pad_to_common_shape=True, **kwargs)


def dense(graph, params):
    """The dense Hessian (``jax.hessian``) and ``2 H⁻¹`` at ``params``, in written order."""
    problem = graph.multistart_problem()
    space = problem.space
    vec = lap._ravel_point(space, params)
    hess = np.asarray(
        jax.hessian(lambda v: problem.fom(space.unravel_tree(v), problem.data))(jnp.asarray(vec))
    )
    ends = np.cumsum([0] + [p.size for p in space.priors])
    order = np.concatenate([np.arange(ends[i], ends[i + 1]) for i in space.written_order])
    rows = np.ix_(order, order)
    if np.linalg.matrix_rank(hess) < len(hess):
        return hess[rows], None
    return hess[rows], 2.0 * np.linalg.inv(hess)[rows]


@pytest.fixture(scope="module")
def fitted():
    """A fit of the mixed graph, at its minimum (float64)."""
    with jax.enable_x64(True):
        graph = mixed_graph()
        result = ms.MultiStartLBFGS(n_starts=2, n_steps=600, seed=0).fit(graph)
        return graph, result


def test_the_arrows_errors_are_jax_hessians(x64, fitted):
    graph, result = fitted
    fit = ms.laplace(graph, result.best_params)
    assert isinstance(fit, lap.ArrowLaplace)
    hess, cov = dense(graph, result.best_params)
    np.testing.assert_allclose(fit.std, np.sqrt(np.diag(cov)), rtol=1e-9)
    assert "_covariance" not in fit.__dict__  # the errors never made the n x n covariance
    np.testing.assert_allclose(fit.hessian, hess, rtol=1e-9, atol=1e-9 * np.abs(hess).max())
    np.testing.assert_allclose(fit.covariance, cov, rtol=1e-8, atol=1e-10 * np.abs(cov).max())
    np.testing.assert_allclose(fit.correlation, cov / np.outer(fit.std, fit.std), atol=1e-8)
    assert fit.names[:2] == ("slope", "curve.c2")  # the order the space was written in


def test_the_shared_and_a_factors_blocks_are_the_dense_covariances(x64, fitted):
    graph, result = fitted
    fit = ms.laplace(graph, result.best_params)
    _, cov = dense(graph, result.best_params)
    where = {n: i for i, n in enumerate(fit.names)}
    assert fit.shared_names == ("slope", "curve.c2")
    pick = [where[n] for n in fit.shared_names]
    np.testing.assert_allclose(fit.shared_covariance, cov[np.ix_(pick, pick)], rtol=1e-9)
    for name in ("a4", "b1"):
        names, block = fit.factor_covariance(name)
        pick = [where[n] for n in names]
        np.testing.assert_allclose(block, cov[np.ix_(pick, pick)], rtol=1e-9)
    assert fit.factor_covariance("b1")[0] == ("b1.offset",)  # its fixed tilt has no error
    with pytest.raises(KeyError, match="no factor named 'c' has parameters of its own"):
        fit.factor_covariance("c")


def test_a_graphs_result_gets_its_errors_from_the_arrow(x64, fitted):
    graph, result = fitted
    assert isinstance(result.laplace, lap.ArrowLaplace)
    _, cov = dense(graph, result.best_params)
    i = result.laplace.names.index("a2.tilt[1]")
    assert result.errors["a2"]["tilt"][1] == pytest.approx(np.sqrt(cov[i, i]), rel=1e-9)
    assert result.errors["b0"]["tilt"].tolist() == [0.0, 0.0]  # fixed


def test_the_products_do_not_grow_with_the_factors(x64):
    shapes = []
    for n in (4, 40):
        curvature = ArrowCurvature(mixed_graph(n).multistart_problem())
        t = curvature.tangents()
        shapes.append(t.shape[0])
        assert t.shape[1] == curvature.n
    assert shapes == [2 + 3, 2 + 3]  # two shared coordinates, three own a factor at most


def test_the_dense_hessian_a_chunk_of_columns_a_call_is_jax_hessians(x64, monkeypatch):
    monkeypatch.setattr("multistart.result.arrow.COLUMNS", 5)  # several calls, a ragged last
    graph = mixed_graph(3)
    problem = graph.multistart_problem()
    p = graph.space.from_unit([np.full(q.shape, 0.4) for q in graph.space.priors])
    vec = lap._ravel_point(problem.space, p)
    got, value = ArrowCurvature(problem).dense(jnp.asarray(vec), problem.data)
    expected = jax.hessian(lambda v: problem.fom(problem.space.unravel(v), problem.data))(
        jnp.asarray(vec)
    )
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert value == pytest.approx(graph.fom(p), rel=1e-13)


def test_a_graph_without_shared_parameters_is_block_diagonal(x64):
    rng = np.random.default_rng(2)

    def own_line(p, d):
        return -0.5 * jnp.sum(((d["y"] - p["a"] * d["x"] - p["b"]) * d["w"]) ** 2)

    fs = [
        ms.Factor(
            own_line, data(rng, 5), space={"a": ms.Normal(0, 3), "b": ms.Normal(0, 3)}, name=f"f{i}"
        )
        for i in range(4)
    ]
    graph = ms.FactorGraphModel(fs)
    p = graph.space.from_unit([np.full(q.shape, 0.5) for q in graph.space.priors])
    fit = ms.laplace(graph, p)
    assert isinstance(fit, lap.ArrowLaplace) and fit.shared_names == ()
    _, cov = dense(graph, p)
    np.testing.assert_allclose(fit.covariance, cov, rtol=1e-9, atol=1e-14)


def _unconstrained_graph():
    """A factor's own parameter the data do not reach, under a flat prior: singular there."""

    def loglike(p, d):
        return -0.5 * jnp.sum(((d["y"] - p["slope"] * d["x"] - p["b"]) * d["w"]) ** 2)

    rng = np.random.default_rng(3)
    fs = [
        ms.Factor(
            loglike,
            data(rng, 6),
            space={"b": ms.Normal(0, 1), "ghost": ms.Uniform(0, 1)},
            name=f"f{i}",
        )
        for i in range(3)
    ]
    graph = ms.FactorGraphModel(fs, space={"slope": ms.Normal(0, 2)})
    return graph, {"slope": 1.0, **{f"f{i}": {"b": 0.1, "ghost": 0.5} for i in range(3)}}


@pytest.mark.filterwarnings("ignore:the gradient of")  # the ghosts: they are
def test_a_singular_factor_block_gives_the_dense_verdict_where_it_is_small(x64):
    graph, p = _unconstrained_graph()
    with pytest.warns(RuntimeWarning, match=r"directions of f0\.ghost, f1\.ghost, f2\.ghost:"):
        fit = ms.laplace(graph, p)
    assert type(fit) is lap.Laplace  # the dense Hessian, a chunk of columns a call
    hess, _ = dense(graph, p)
    inverse, bad = lap._safe_inverse(hess, np.finfo(np.float64).eps)
    np.testing.assert_allclose(fit.covariance, 2 * inverse, rtol=1e-10, equal_nan=True)


@pytest.mark.filterwarnings("ignore:the gradient of")  # the ghosts: they are
def test_a_singular_factor_block_past_the_dense_bound_keeps_the_blocks(x64, monkeypatch):
    monkeypatch.setattr(lap, "DENSE_BYTES", 0)
    graph, p = _unconstrained_graph()
    with pytest.warns(RuntimeWarning, match=r"directions of f0\.ghost, f1\.ghost, f2\.ghost:"):
        fit = ms.laplace(graph, p)
    assert isinstance(fit, lap.ArrowLaplace)
    errors = dict(zip(fit.names, fit.std, strict=True))
    assert np.isnan(errors["f1.ghost"])
    # the others: the errors with the ghosts held, which is the dense verdict here (the ghosts
    # do not meet the other parameters at all)
    hess, _ = dense(graph, p)
    keep = [i for i, n in enumerate(fit.names) if "ghost" not in n]
    held = 2 * np.linalg.inv(hess[np.ix_(keep, keep)])
    np.testing.assert_allclose(fit.std[keep], np.sqrt(np.diag(held)), rtol=1e-10)


def test_batched_safe_inverses_judge_as_the_single_one(x64):
    rng = np.random.default_rng(5)
    a = rng.normal(size=(4, 3, 3))
    stack = a @ np.swapaxes(a, 1, 2) + 0.1 * np.eye(3)
    stack[1] = np.diag([2.0, 0.0, 1.0])  # a zero curvature
    stack[2, 0, 1] = stack[2, 1, 0] = np.nan  # a non-finite cross term
    stack[3] = [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 3.0]]  # singular, no zero diagonal
    got, bad = safe_inverses(stack, np.finfo(np.float64).eps)
    for i in range(4):
        one, one_bad = lap._safe_inverse(stack[i], np.finfo(np.float64).eps)
        np.testing.assert_array_equal(bad[i], one_bad)
        np.testing.assert_allclose(got[i], one, rtol=1e-12, equal_nan=True)


def test_the_errors_of_a_graph_survive_save_and_load_as_the_arrows_blocks(x64, fitted, tmp_path):
    graph, result = fitted
    result = result.attach_problem(graph)  # a copy whose errors are computed afresh
    fit = result.laplace
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result.save(tmp_path / "fit.npz")
    assert "_covariance" not in fit.__dict__ and "_hessian" not in fit.__dict__  # not made
    with np.load(tmp_path / "fit.npz") as z:
        kept = set(z.files)
    assert "laplace/covariance" not in kept and "laplace/hessian" not in kept
    assert {"laplace/arrow/S", "laplace/arrow/B/0", "laplace/arrow/order"} <= kept
    loaded = ms.Result.load(tmp_path / "fit.npz")
    again = loaded.laplace
    assert isinstance(again, lap.ArrowLaplace)
    np.testing.assert_array_equal(again.std, fit.std)  # inverted again: the same bits
    assert again.names == fit.names and again.scale == fit.scale
    for got, want in zip(
        jax.tree_util.tree_leaves(loaded.errors),
        jax.tree_util.tree_leaves(result.errors),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(again.shared_covariance, fit.shared_covariance)
    np.testing.assert_array_equal(again.factor_covariance("a3")[1], fit.factor_covariance("a3")[1])
    # the report from the blocks: no n x n made for it, the dense correlation's pairs
    text = loaded.report()
    assert "_covariance" not in again.__dict__ and "_covariance" not in fit.__dict__
    mine = result.report()  # the priors are named where the graph is attached
    assert text.split("[[Correlations]]")[1] == mine.split("[[Correlations]]")[1]
    corr = fit.correlation  # now made, to compare with
    upper = np.triu(np.isfinite(corr) & (np.abs(corr) > 0.1), k=1)
    want = {(fit.names[i], fit.names[j]) for i, j in zip(*np.nonzero(upper), strict=True)}
    got = {(fit.names[i], fit.names[j]) for i, j, _ in fit.correlated_pairs(0.1)}
    assert got == want and len(want) > 10
    for i, j, r in fit.correlated_pairs(0.1):
        assert r == pytest.approx(corr[i, j], rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(loaded.covariance, fit.covariance, rtol=1e-12)  # when asked


def test_rows_of_the_inverse_are_the_dense_inverses_rows(x64, fitted):
    graph, result = fitted
    fit = ms.laplace(graph, result.best_params)
    whole = fit.inverse.dense()
    which = np.array([0, 5, 1, fit.inverse.blocks.n - 1, 7, 2])  # shared and own, any order
    np.testing.assert_allclose(fit.inverse.rows(which), whole[which], rtol=1e-12, atol=1e-15)


def test_a_plain_laplace_file_stays_version_one(x64, fitted, tmp_path):
    graph, result = fitted
    fit = ms.laplace(graph, result.best_params)
    plain = lap.Laplace(
        params=fit.params,
        covariance=fit.covariance,
        names=fit.names,
        hessian=fit.hessian,
        scale=fit.scale,
        errors=fit.errors,
    )
    dataclasses.replace(result, uncertainty=Uncertainty(laplace=plain)).save(tmp_path / "plain.npz")
    with np.load(tmp_path / "plain.npz") as z:
        assert json.loads(z["__meta__"].tobytes())["version"] == 1
        assert "laplace/covariance" in z.files
    loaded = ms.Result.load(tmp_path / "plain.npz").laplace
    assert type(loaded) is lap.Laplace
    np.testing.assert_array_equal(loaded.std, plain.std)


def decay(p, d):  # one series: an amplitude of its own on a shared decay time and floor
    return d["w"] * (p["amp"] * jnp.exp(-d["t"] / p["tau"]) + p["floor"] - d["y"]) / 0.05


def decay_graph(n=5, seed=3):
    rng = np.random.default_rng(seed)
    factors = []
    for i in range(n):
        t = np.linspace(0.0, 4.0, 12 + i)
        y = (1.0 + 0.3 * i) * np.exp(-t / 1.3) + 0.4 + rng.normal(0.0, 0.05, t.size)
        own = {"amp": ms.Uniform(0.0, 5.0)}
        data = {"t": t, "y": y, "w": np.ones(t.size)}  # w: 0 where the graph pads
        factors.append(ms.Factor.from_residuals(decay, data, space=own, name=f"s{i}"))
    shared = {"tau": ms.LogUniform(0.1, 10.0), "floor": ms.Uniform(-2.0, 2.0)}
    return ms.FactorGraphModel(factors, space=shared, pad_to_common_shape=True)


@pytest.mark.parametrize("absolute_sigma", [True, False])
def test_a_least_squares_graph_past_the_dense_bound_gets_its_errors_from_the_arrow(
    x64, absolute_sigma, monkeypatch, tmp_path
):
    graph = decay_graph()
    search = ms.MultiStartLeastSquares(
        n_starts=2, seed=0, log_every=0, absolute_sigma=absolute_sigma
    )
    result = search.fit(graph)
    dense = result.laplace  # J is small: the dense path, as before
    assert type(dense) is lap.Laplace and dense.kind == "gauss-newton"
    monkeypatch.setattr(lap, "DENSE_BYTES", 0)  # now J "does not fit"
    arrow = result.attach_problem(result.problem).laplace  # the least-squares problem afresh
    assert isinstance(arrow, lap.ArrowLaplace) and arrow.kind == "gauss-newton"
    assert arrow.names == dense.names
    np.testing.assert_allclose(arrow.std, dense.std, rtol=1e-9)
    np.testing.assert_allclose(arrow.hessian, dense.hessian, rtol=1e-9, atol=1e-12)
    assert (arrow.dof, arrow.absolute_sigma) == (dense.dof, dense.absolute_sigma)
    assert arrow.reduced_chi2 == pytest.approx(dense.reduced_chi2, rel=1e-12)
    np.testing.assert_allclose(arrow.residuals, dense.residuals, rtol=1e-12, atol=1e-12)
    # the file keeps the kind; loading gives the same errors
    path = tmp_path / "ls.npz"
    dataclasses.replace(result, uncertainty=Uncertainty(laplace=arrow)).save(path)
    loaded = ms.Result.load(path).laplace
    assert isinstance(loaded, lap.ArrowLaplace) and loaded.kind == "gauss-newton"
    np.testing.assert_array_equal(loaded.std, arrow.std)
