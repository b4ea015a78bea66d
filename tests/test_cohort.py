"""A cohort's fit as a user reads it: a table of its factors, a figure of each factor against
its model, L-BFGS's steps sized by the parameters, and an end-of-search line that says when
no start converged."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.host.config import steps_for

SHARED = {"slope": ms.Normal(1.0, 2.0)}


def line(p, d):
    return -0.5 * jnp.sum(((d["y"] - p["slope"] * d["x"] - p["b"]) * d["w"]) ** 2)


def cohort(n=6, seed=0):
    rng = np.random.default_rng(seed)
    fs = []
    for i in range(n):
        m = 5 + i % 3
        x = np.sort(rng.uniform(0.0, 2.0, m))
        y = 1.5 * x + 0.2 * i + rng.normal(0.0, 0.1, m)
        fs.append(
            ms.Factor(
                line,
                {"x": x, "y": y, "w": np.full(m, 10.0)},
                space={"b": ms.Normal(0.0, 1.0)},
                name=f"p{i}",
            )
        )
    fs.append(
        ms.Factor(
            line,
            {"x": np.arange(3.0), "y": np.arange(3.0), "w": np.ones(3)},
            space={"b": ms.Uniform(-1.0, 1.0)},
            name="ref",
        )
    )
    return ms.FactorGraphModel(fs, space=SHARED, pad_to_common_shape=True)


@pytest.fixture(scope="module")
def fitted():
    with jax.enable_x64(True):
        graph = cohort()
        return graph, ms.MultiStartLBFGS(n_starts=2, n_steps=400, seed=0).fit(graph)


def test_the_factor_table_has_a_row_a_factor_with_its_parameters_and_errors(x64, fitted):
    graph, result = fitted
    table = result.factor_table()
    assert list(table.index) == list(graph.names)
    assert list(table.columns) == ["group", "log_likelihood", "log_prior", "fom", "b", "error:b"]
    assert table.loc["ref", "group"] != table.loc["p0", "group"]  # another prior kind
    for name in ("p2", "ref"):
        assert table.loc[name, "b"] == pytest.approx(float(result.best_params[name]["b"]))
        assert table.loc[name, "error:b"] == pytest.approx(float(result.errors[name]["b"]))
    views = graph.factor_views(result, names=["p4"])
    assert table.loc["p4", "log_likelihood"] == pytest.approx(views["p4"].log_likelihood, rel=1e-12)
    assert table.loc["p4", "log_prior"] == pytest.approx(
        float(ms.Normal(0.0, 1.0).log_prob(result.best_params["p4"]["b"])), rel=1e-12
    )
    # the factors' contributions and the shared priors make the figure of merit
    shared = float(SHARED["slope"].log_prob(result.best_params["slope"]))
    assert table["fom"].sum() - 2 * shared == pytest.approx(result.best_fom, rel=1e-12)


def test_the_factor_table_of_another_start_and_without_errors(x64, fitted):
    graph, result = fitted
    i = int(result.ranked()[-1])
    table = result.factor_table(start=i, errors=False)
    assert "error:b" not in table.columns
    assert table.loc["p1", "b"] == pytest.approx(float(result.params["p1"]["b"][i]))
    with pytest.raises(ValueError, match=r"start must be an int in \[0, 2\)"):
        result.factor_table(start=5)


def test_a_factor_table_needs_a_graphs_result(tmp_path, x64, fitted):
    graph, result = fitted
    result.save(tmp_path / "fit.npz")
    loaded = ms.Result.load(tmp_path / "fit.npz")
    with pytest.raises(ValueError, match=r"attach_problem\(graph\)"):
        loaded.factor_table()
    assert loaded.attach_problem(graph).factor_table(errors=False).shape == (7, 5)
    plain = ms.MultiStartLBFGS(n_starts=2, n_steps=5).fit(
        lambda p: (p["x"] - 1.0) ** 2, {"x": ms.Uniform(-2.0, 2.0)}
    )
    with pytest.raises(ValueError, match="is not a factor graph"):
        plain.factor_table()


def test_a_figure_of_each_factors_data_against_its_model(x64, fitted):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    graph, result = fitted

    def curve(p, d, x):
        return p["slope"] * x + p["b"]

    fig = result.plot_factors(curve, x="x", y="y", factors=["p1", "ref", "p3"], ncols=2)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title().split()[0] for ax in panels] == ["p1", "ref", "p3"]
    x, y = panels[0].lines[1].get_data()  # the model's line across p1's x
    b = float(result.best_params["p1"]["b"])
    np.testing.assert_allclose(y, float(result.best_params["slope"]) * x + b)
    np.testing.assert_array_equal(panels[0].lines[0].get_data()[1], graph._by_name["p1"].data["y"])
    assert len(result.plot_factors(curve, x="x", y="y", factors=4).axes) == 4
    with pytest.raises(KeyError, match="no data key 't'"):
        result.plot_factors(curve, x="t", y="y")
    with pytest.raises(KeyError, match="no factor named 'nope'"):
        result.plot_factors(curve, x="x", y="y", factors=["nope"])
    with pytest.raises(TypeError, match="curve must be callable"):
        result.plot_factors("line", x="x", y="y")
    matplotlib.pyplot.close("all")


def test_lbfgs_steps_are_sized_by_the_parameters_when_the_fit_starts(x64):
    assert [steps_for(n) for n in (1, 500, 501, 3005, 7500, 9005)] == [
        1000,
        1000,
        1002,
        6010,
        15000,
        15000,
    ]
    search = ms.MultiStartLBFGS(n_starts=2)
    assert search.n_steps == "auto" and ms.MultiStartAdam().n_steps == 1000

    def bowl(p):
        return jnp.sum((p["x"] - 0.5) ** 2)

    for n, steps in ((3, 1000), (600, 1200)):
        result = search.fit(bowl, {"x": ms.Uniform(-1.0, 1.0, shape=(n,))})
        assert result.config["n_steps"] == steps
    assert ms.MultiStartLBFGS(n_steps=7).n_steps == 7


def test_the_end_of_search_line_says_no_start_converged(caplog, monkeypatch):
    def bowl(p):
        return jnp.sum((p["x"] - 0.5) ** 2)

    space = {"x": ms.Uniform(-1.0, 1.0, shape=(3,))}
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    with caplog.at_level(logging.INFO, logger="multistart"):
        ms.MultiStartLBFGS(n_starts=3, n_steps=2, n_candidates=0, log_every=0).fit(bowl, space)
        ms.MultiStartLBFGS(n_starts=3, n_steps=200, n_candidates=0, log_every=0).fit(bowl, space)
    short, long = [r.getMessage() for r in caplog.records if r.getMessage().startswith("done")]
    assert "no start converged" in short and "max_steps 3" in short
    assert "distinct minim" not in short
    assert "1 distinct minimum" in long and "no start converged" not in long
