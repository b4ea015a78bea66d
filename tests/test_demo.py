import jax
import numpy as np
import pytest

import multistart as ms
from multistart import demo


def test_bands_are_deterministic_and_cover_one_field():
    a, b = demo.make_bands(), demo.make_bands()
    assert list(a) == ["g", "r", "i"]
    for name, band in zip(a, demo.BANDS, strict=True):
        assert a[name]["image"].shape == (band.n_pix, band.n_pix)
        np.testing.assert_array_equal(a[name]["image"], b[name]["image"])
        x = a[name]["x"]
        step = x[1] - x[0]
        assert x[0] - step / 2 == pytest.approx(-demo.FIELD / 2)
        assert x[-1] + step / 2 == pytest.approx(demo.FIELD / 2)
    assert [a[n]["image"].shape for n in a] == [(24, 24), (32, 32), (48, 48)]
    other = demo.make_bands(seed=1)
    assert not np.array_equal(other["g"]["image"], a["g"]["image"])


def test_noise_level_matches_the_band(x64):
    data = demo.make_bands()
    for band in demo.BANDS:
        d = data[band.name]
        clean = demo.render(demo.band_params(demo.TRUTH, band.name), d, xp=np)
        resid = (d["image"] - clean) / band.noise
        assert abs(resid.std() - 1.0) < 0.1 and abs(resid.mean()) < 0.1


def test_render_in_jax_equals_numpy_and_conserves_flux(x64):
    d = demo.make_bands()["i"]
    p = demo.band_params(demo.TRUTH, "i")
    np.testing.assert_allclose(np.asarray(demo.render(p, d)), demo.render(p, d, xp=np), rtol=1e-12)
    # on a field wide enough to hold the whole source, pixels sum to the total flux
    wide = dict(d, x=np.linspace(-15, 15, 241), y=np.linspace(-15, 15, 241))
    wide["pixel_area"] = (30 / 240) ** 2
    total = demo.render(p, wide, xp=np).sum()
    assert total == pytest.approx(p["flux"].sum(), rel=1e-3)


def test_demo_fom_is_chi2_minus_two_log_prior_by_hand(x64):
    graph = demo.demo_graph()
    data = demo.make_bands()
    chi2 = 0.0
    for name, d in data.items():
        model = demo.render(demo.band_params(demo.TRUTH, name), d, xp=np)
        chi2 += np.sum(((d["image"] - model) * d["inv_sigma"]) ** 2)
    log_prior = graph.log_prior(demo.TRUTH)
    assert graph.fom(demo.TRUTH) == pytest.approx(chi2 - 2 * log_prior, rel=1e-12)


def test_padded_stacked_demo_graph_matches_the_plain_one(x64):
    padded = demo.demo_graph()
    plain = demo.demo_graph(pad_to_common_shape=False, vmap_factors=False)
    rng = np.random.default_rng(3)
    space = plain.space
    for _ in range(3):
        q = [rng.uniform(0.1, 0.9, size=p.shape) for p in space.priors]
        p = space.from_unit(q)
        assert padded.fom(p) == pytest.approx(plain.fom(p), rel=1e-12)
    assert padded.check_padding(demo.TRUTH) < 1e-6


def test_report_prints_the_library_errors(x64):
    """The table's sigma column is ``result.errors`` (ms.laplace on the demo graph)."""
    graph = demo.demo_graph()
    space = graph.space
    n = 2
    params = jax.tree_util.tree_map(lambda *v: np.stack(v), *[demo.TRUTH] * n)
    result = ms.Result(
        best_params=demo.TRUTH,
        best_fom=graph.fom(demo.TRUTH),
        best_index=0,
        foms=np.full(n, graph.fom(demo.TRUTH)),
        params=params,
        start_params=params,
        status=np.array([ms.Status.CONVERGED] * n, dtype=object),
        n_steps=np.array([10, 10]),
        best_step=np.array([9, 9]),
        history=np.zeros((1, n)),
        history_steps=np.array([10]),
        stats={"compile_s": 0.0, "wall_s": 0.0, "n_evals": 20},
        paths=list(space.paths),
    )
    text = demo.report(graph, result, graph.fom(demo.TRUTH))
    sigma_q = ms.laplace(graph, demo.TRUTH).errors["q"]
    (row,) = [line for line in text.splitlines() if line.startswith("q ")]
    assert f"{sigma_q:.4f}" in row.split()
    np.testing.assert_array_equal(result.attach_problem(graph).errors["q"], sigma_q)
    assert result.problem is None  # the report attached its own copy: the Result is unchanged


def test_a_stalled_demo_says_why_and_whether_its_errors_hold(x64):
    graph = demo.demo_graph()
    space = graph.space
    params = jax.tree_util.tree_map(lambda v: np.stack([v, v]), demo.TRUTH)
    records = dict(
        best_params=demo.TRUTH,
        best_fom=graph.fom(demo.TRUTH),
        best_index=0,
        foms=np.full(2, graph.fom(demo.TRUTH)),
        params=params,
        start_params=params,
        n_steps=np.array([10, 10]),
        best_step=np.array([9, 9]),
        history=np.zeros((1, 2)),
        history_steps=np.array([10]),
        stats={"compile_s": 0.0, "wall_s": 0.0, "n_evals": 20},
        paths=list(space.paths),
    )
    stalled = ms.Result(status=np.array([ms.Status.STALLED] * 2, dtype=object), **records)
    converged = ms.Result(status=np.array([ms.Status.CONVERGED] * 2, dtype=object), **records)
    assert demo.stall_note(graph, converged) is None
    # the truth is not the data's minimum (fom 4068 against 4060): far from it in sigmas
    d = demo.distance_to_minimum(graph, stalled)
    assert d > 0.1
    note = demo.stall_note(graph, stalled)
    assert note.startswith("why no start converged (stalled 2): Prodigy is a first-order rule")
    assert f"lies {d:.2g} sigma from the minimum: fit longer (n_steps)" in note
    assert note in demo.report(graph, stalled, graph.fom(demo.TRUTH))
