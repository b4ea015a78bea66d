"""Small dense linear algebra written entry by entry (multistart/solvers/small.py): the same
answers as the library's routines, on the CPU, with the entrywise form a chip takes forced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.common import xla
from multistart.result import laplace
from multistart.solvers import small


def _platform(monkeypatch, name: str) -> None:
    monkeypatch.setattr(xla, "platform", lambda: name)


@pytest.fixture
def on_a_chip(monkeypatch):
    """The entrywise form, as the platform of a TPU traces it."""
    _platform(monkeypatch, "tpu")
    assert small.entrywise(4) and not small.entrywise(small.MAX_N + 1)


def _spd(rng, n, k):
    a = rng.normal(size=(k, 3 * n, n))
    return np.einsum("kmi,kmj->kij", a, a)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_entrywise_solves_are_the_librarys(on_a_chip, n):
    rng = np.random.default_rng(n)
    a, b = _spd(rng, n, 5), rng.normal(size=(5, n))
    jac, r = rng.normal(size=(5, 12, n)), rng.normal(size=(5, 12))
    with jax.enable_x64(True):
        x = jax.vmap(small.cho_solve)(a, b)
        gram, jtr = jax.vmap(small.normal_equations)(jac, r)
        av = jax.vmap(small.matvec)(a, b)
    np.testing.assert_allclose(x, np.linalg.solve(a, b[..., None])[..., 0], rtol=1e-9)
    np.testing.assert_allclose(gram, np.einsum("kmi,kmj->kij", jac, jac), rtol=1e-12)
    np.testing.assert_allclose(jtr, np.einsum("kmi,km->ki", jac, r), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(av, np.einsum("kij,kj->ki", a, b), rtol=1e-12, atol=1e-13)


def test_an_indefinite_system_solves_to_nan_as_cho_solve_does(on_a_chip):
    a = jnp.array([[1.0, 2.0], [2.0, 1.0]])
    assert np.all(np.isnan(small.cho_solve(a, jnp.ones(2))))


@pytest.mark.parametrize("entrywise", [False, True], ids=["library", "entrywise"])
def test_gram_inverse_is_the_svds_where_sure_and_unsure_where_it_is_not(monkeypatch, entrywise):
    """A well-conditioned Jacobian's inverse is the SVD's (scipy's) to rounding and sure; an
    ill-conditioned one (cond 1e6), a zero column and a nan are not sure, and
    ``settle_inverses`` gives them the SVD's own answer, bit for bit."""
    if entrywise:
        _platform(monkeypatch, "tpu")
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(6, 30, 4))
    jac[1, :, 3] = jac[1, :, 2] + 1e-6 * jac[1, :, 3]
    jac[2, :, 1] = 0.0
    jac[3, 4, 0] = np.nan
    jac[4, :, 0] *= 1e8  # units: not ill-conditioned once scaled
    with jax.enable_x64(True):
        inverse, bad, sure = map(np.asarray, jax.jit(jax.vmap(small.gram_inverse))(jac))
    reference, ref_bad = laplace.gram_inverse(jac)
    assert sure.tolist() == [True, False, False, False, True, True]
    np.testing.assert_array_equal(bad[[2, 3]], ref_bad[[2, 3]])
    for i in np.flatnonzero(sure):
        d = np.sqrt(np.diag(reference[i]))
        np.testing.assert_allclose(inverse[i] / np.outer(d, d), reference[i] / np.outer(d, d),
                                   atol=1e-12)  # fmt: skip
    curvature = laplace.Curvature(jac, None, None, None, inverse, bad, sure)
    settled, settled_bad = laplace.settle_inverses(curvature)
    unsure = ~sure
    np.testing.assert_array_equal(settled[unsure], reference[unsure])
    np.testing.assert_array_equal(settled_bad, ref_bad)


def test_settle_inverses_gathers_only_the_unsure_rows_of_a_device_array():
    jac = np.random.default_rng(1).normal(size=(20, 10, 3))
    jac[[3, 11], :, 2] = 0.0
    with jax.enable_x64(True):
        out = jax.jit(jax.vmap(small.gram_inverse))(jnp.asarray(jac))
        curvature = laplace.Curvature(jnp.asarray(jac), None, None, None, *out)
        settled, bad = laplace.settle_inverses(curvature)
    assert np.flatnonzero(~np.asarray(out[2])).tolist() == [3, 11]
    np.testing.assert_array_equal(settled[[3, 11]], laplace.gram_inverse(jac[[3, 11]])[0])
    assert bad[[3, 11], 2].all() and not bad[:, :2].any()


def test_rows_past_a_block_are_gathered_in_blocks_of_one_size(monkeypatch):
    """Rows are read in gathers of ``ROWS_BLOCK`` (one program whatever their count: a few
    rows padded to a block, many in blocks), fewer where a block would pass ``ROWS_BYTES``
    or the rows ``a`` has, in order, the same values as NumPy's indexing."""
    monkeypatch.setattr(laplace, "ROWS_BLOCK", 8)
    a = np.random.default_rng(2).normal(size=(50, 3))
    rows = np.array([1, 4, 5, 9, 13, 20, 21, 30, 33, 34, 40, 41, 42, 44, 47, 48, 49])
    sizes = []
    take = laplace._take
    monkeypatch.setattr(laplace, "_take", lambda a, r: sizes.append(r.size) or take(a, r))
    with jax.enable_x64(True):
        got = laplace._rows(jnp.asarray(a), rows)
    np.testing.assert_array_equal(got, a[rows])
    assert sizes == [8, 8, 8]
    with jax.enable_x64(True):
        few = laplace._rows(jnp.asarray(a), rows[:3])
    np.testing.assert_array_equal(few, a[rows[:3]])
    assert sizes == [8, 8, 8, 8]
    monkeypatch.setattr(laplace, "ROWS_BYTES", 5 * a[0].nbytes)  # five rows a block
    with jax.enable_x64(True):
        capped = laplace._rows(jnp.asarray(a), rows)
        one = laplace._rows(jnp.asarray(a[:2]), np.array([1]))
    np.testing.assert_array_equal(capped, a[rows])
    np.testing.assert_array_equal(one, a[[1]])
    assert sizes[4:] == [5, 5, 5, 5, 2]  # four blocks of five; no more rows than a has


def test_a_least_squares_fit_stepped_entrywise_reaches_the_librarys_answer(monkeypatch):
    """The step with every solve written out (as on a chip) reaches the same minimum, with the
    same covariance, as the library's solves on a CPU: each platform its own programs."""
    _platform(monkeypatch, "tpu")
    t = np.linspace(0.0, 4.0, 30)
    y = 2.0 * np.exp(-t / 1.3) + 0.2 + 0.01 * np.sin(7 * t)

    def residuals(p):
        return (p["a"] * jnp.exp(-t / p["tau"]) + p["c"] - y) / 0.01

    space = {"a": ms.Uniform(0.0, 5.0), "tau": ms.LogUniform(0.1, 10.0), "c": ms.Uniform(-1, 1)}
    kw = dict(n_starts=4, batch_size=4, seed=0, log_every=0, absolute_sigma=True)
    with jax.enable_x64(True):
        chip = ms.MultiStartLeastSquares(**kw).fit(residuals, space)
        cov_chip = chip.covariance
    _platform(monkeypatch, "cpu")
    with jax.enable_x64(True):
        cpu = ms.MultiStartLeastSquares(**kw).fit(residuals, space)
        cov_cpu = cpu.covariance
    for name in space:
        np.testing.assert_allclose(chip.best_params[name], cpu.best_params[name], rtol=1e-9)
    np.testing.assert_allclose(cov_chip, cov_cpu, rtol=1e-7)
    assert cpu.stats["n_compiles"] == 1  # not the chip's program


def test_a_chips_jacobian_columns_under_a_mesh_of_devices_are_the_jvps(on_a_chip):
    """On a chip a Jacobian's columns are products of one linearisation; under ``shard_map``
    (a search over a mesh of devices) each tangent must be typed as the point is, varying over
    the mesh (a constant basis vector is refused). One device's mesh is enough to type it so:
    the columns are the ``vmap``-of-``jvp`` Jacobian's."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from multistart.solvers.base import linearize

    def residuals(v):
        return jnp.stack([jnp.sin(v[0]) * v[1], v[1] ** 2, v[0] + v[1], jnp.exp(-v[0])])

    def columns(u):
        return linearize(residuals, u)[1]

    mesh = Mesh(np.array(jax.devices()[:1]), ("starts",))
    over_mesh = jax.shard_map(
        jax.vmap(columns), mesh=mesh, in_specs=P("starts"), out_specs=P("starts")
    )
    u = jnp.array([[0.3, 1.2], [1.0, -0.5], [2.0, 0.1]])
    expected = jax.vmap(jax.jacfwd(residuals))(u)
    np.testing.assert_allclose(jax.jit(over_mesh)(u), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(columns)(u), expected, rtol=1e-6)
