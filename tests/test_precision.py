"""A precision the user chooses (``dtype``), and float64 answers where a chip lacks float64:
float32 steps refined in float64 at the end (issue 70). The chip is simulated on the CPU by
the platform the programs are traced for (``xla.platform``)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.common import xla

T = np.linspace(0.0, 4.0, 30)
Y = 2.0 * np.exp(-T / 1.3) + 0.2 + 0.01 * np.sin(7 * T)
SPACE = {"a": ms.Uniform(0.0, 5.0), "tau": ms.LogUniform(0.1, 10.0), "c": ms.Uniform(-1, 1)}
QUIET = dict(log_every=0, progress=False)


def residuals(p):
    return (p["a"] * jnp.exp(-T / p["tau"]) + p["c"] - Y) / 0.01


def decay(x, a, tau, c):
    return a * jnp.exp(-x / tau) + c


def _search(**kw):
    return ms.MultiStartLeastSquares(**{"n_starts": 4, "batch_size": 4, "seed": 0, **QUIET, **kw})


@pytest.mark.parametrize("dtype", ["float32", "float64", np.float32, jnp.float64])
def test_a_search_steps_in_the_dtype_it_is_given_whatever_the_process_default(dtype):
    want = np.dtype(dtype).name
    for x64 in (False, True):
        with jax.enable_x64(x64):
            result = _search(dtype=dtype).fit(residuals, SPACE)
        assert result.fit_dtype == np.dtype(want), (dtype, x64)
        assert result.config["dtype"] == want


def test_a_float64_fit_after_float32_fits_of_the_same_globals_while_their_results_live():
    """The residuals capture module-level NumPy arrays (T, Y): JAX's float32 copy of them, made
    by float32 fits (in either process default), is not served to a float64 fit's trace while
    those fits' Results (which keep their traces) live: the float64 fit is float64's."""
    kept = []
    for x64 in (False, True):
        with jax.enable_x64(x64):
            kept.append(_search(dtype="float32").fit(residuals, SPACE))
    with jax.enable_x64(False):
        wide = _search(dtype="float64").fit(residuals, SPACE)
    assert wide.fit_dtype == np.float64 and all(r.fit_dtype == np.float32 for r in kept)
    with jax.enable_x64(True):
        alone = _search().fit(residuals, SPACE)
    np.testing.assert_array_equal(wide.foms, alone.foms)


def test_float64_given_is_the_float64_fit_bit_for_bit():
    with jax.enable_x64(True):
        default = _search().fit(residuals, SPACE)
    with jax.enable_x64(False):
        given = _search(dtype="float64").fit(residuals, SPACE)
    np.testing.assert_array_equal(given.foms, default.foms)
    for name in SPACE:
        np.testing.assert_array_equal(given.params[name], default.params[name])


@pytest.mark.parametrize("bad", ["float16", "double64", 32, True, "complex64"])
def test_a_bad_dtype_is_refused_naming_it_before_anything_compiles(bad):
    with pytest.raises(ValueError, match="dtype must be None, 'float32' or 'float64'"):
        ms.MultiStartLBFGS(dtype=bad)
    with pytest.raises(ValueError, match="dtype must be"):
        ms.curve_fit(decay, T, Y, p0=[1.0, 1.0, 0.0], dtype=bad)


def test_curve_fit_answers_in_float64_unless_asked_for_float32():
    kw = dict(p0=[1.0, 1.0, 0.0], n_starts=2, **QUIET)
    popt, pcov, info, _, _ = ms.curve_fit(decay, T, Y, full_output=True, **kw)
    assert info["result"].fit_dtype == np.float64
    popt32, pcov32, info32, _, _ = ms.curve_fit(
        decay, T, Y, dtype="float32", full_output=True, **kw
    )
    assert info32["result"].fit_dtype == np.float32
    np.testing.assert_allclose(popt32, popt, rtol=1e-4)
    np.testing.assert_allclose(np.sqrt(np.diag(pcov32)), np.sqrt(np.diag(pcov)), rtol=1e-3)


@pytest.fixture
def a_chip_without_float64(monkeypatch):
    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    assert not xla.native_float64()


def test_on_a_chip_without_float64_a_fit_steps_in_float32_and_answers_in_float64(
    a_chip_without_float64, monkeypatch
):
    """The search runs in float32 (its Result says so); popt and pcov come from float64
    Gauss-Newton steps from its answer, and equal the float64 fit's to 1e-6."""
    kw = dict(p0=[1.0, 1.0, 0.0], n_starts=2, full_output=True, **QUIET)
    popt, pcov, info, _, _ = ms.curve_fit(decay, T, Y, **kw)
    assert info["result"].fit_dtype == np.float32
    f32 = np.array([float(info["result"].best_params[k]) for k in ("a", "tau", "c")])
    monkeypatch.setattr(xla, "platform", lambda: "cpu")
    ref, ref_cov = ms.curve_fit(decay, T, Y, **kw)[:2]
    np.testing.assert_allclose(popt, ref, rtol=1e-7)
    np.testing.assert_allclose(pcov, ref_cov, rtol=1e-6)
    assert np.max(np.abs(f32 / ref - 1)) > 1e-9  # the float32 answer itself is not that close


def test_a_refined_batch_keeps_every_fit_and_moves_one_on_a_bound_onto_it(
    a_chip_without_float64, monkeypatch
):
    """A batch refined: every determined fit equals its float64 answer to 1e-6; a fit whose
    optimum lies below a bound (a decay of negative amplitude, bounded at 0) ends on the
    bound itself, not float32's nearest point to it, with its offset refined there (its decay
    time, which an amplitude of 0 leaves undetermined, where float32 left it)."""
    ys = np.stack([decay(T, a, 1.3, 0.2) + 0.01 * np.sin(7 * T + a) for a in (1.0, 2.0, -0.5)])
    kw = dict(p0=[1.0, 1.0, 0.0], bounds=([0, 0.1, -1], [5, 10, 1]), batched=True, **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the third fit's bound and its covariance
        popt, pcov, info, _, _ = ms.curve_fit(decay, T, ys, n_starts=2, full_output=True, **kw)
        assert info["fits"].result.fit_dtype == np.float32
        monkeypatch.setattr(xla, "platform", lambda: "cpu")
        ref = ms.curve_fit(decay, T, ys, n_starts=2, **kw)[0]
    np.testing.assert_allclose(popt[:2], ref[:2], rtol=1e-6)
    assert popt[2, 0] == 0.0 and info["fits"].at_bound[2, 0]
    np.testing.assert_allclose(popt[2, 2], ref[2, 2], rtol=1e-6)
    assert not np.isfinite(pcov[2]).all()  # tau undetermined there: curve_fit's inf


def test_a_float32_and_a_float64_fit_of_one_model_do_not_share_programs():
    """Each float type compiles its own step, and a switch of float type re-reads the NumPy
    arrays the model captures in the new type (docs/accelerators.md: while a Result of the
    other type lives, JAX serves its copy of them: the first is dropped here)."""
    first = _search(dtype="float32").fit(residuals, SPACE)
    assert first.fit_dtype == np.float32
    del first
    second = _search(dtype="float64").fit(residuals, SPACE)
    assert second.stats["n_compiles"] == 1 and second.fit_dtype == np.float64
    third = _search(dtype="float64", seed=1).fit(residuals, SPACE)
    assert third.stats["n_compiles"] == 0  # no switch: JAX's caches and the programs kept


def test_a_chip_refines_a_few_fits_on_its_host_and_a_large_batch_on_itself(
    a_chip_without_float64, monkeypatch
):
    """A chip's emulated float64 compiles a refinement in tens of seconds, its host's CPU in
    one: a single fit and a small batch refine there, a batch past REFINE_ON_HOST_FITS on
    the chip; a platform with float64 refines where it fits."""
    cpu = jax.devices("cpu")[0]
    assert xla.refine_device() == cpu
    assert xla.refine_device(xla.REFINE_ON_HOST_FITS) == cpu
    assert xla.refine_device(xla.REFINE_ON_HOST_FITS + 1) is None
    monkeypatch.setattr(xla, "platform", lambda: "gpu")
    assert xla.refine_device() is None


def test_a_refined_fit_runs_its_refinement_on_the_refine_device(
    a_chip_without_float64, monkeypatch
):
    """The refinement program runs under the device refine_device names (the host's CPU for a
    single fit on a chip): every default device the covariance sees while refining is it."""
    seen = []
    real = jax.default_device

    def spy(device):
        seen.append(device)
        return real(device)

    monkeypatch.setattr(jax, "default_device", spy)
    ms.curve_fit(decay, T, Y, p0=[1.0, 1.0, 0.0], n_starts=2, **QUIET)
    assert seen == [jax.devices("cpu")[0]]
    seen.clear()
    monkeypatch.setattr(xla, "REFINE_ON_HOST_FITS", 0)
    ms.curve_fit(decay, T, Y, p0=[1.0, 1.0, 0.0], n_starts=2, **QUIET)
    assert seen == [None]


def test_on_a_chip_a_refined_batch_with_a_tie_and_missing_points_answers_in_float64(
    monkeypatch,
):
    """A chip's small batch, refined in float64 on its host's CPU, with a parameter tied by a
    function (its errors propagated through the tie's Jacobian) and points left out (their
    residuals nan in ``fvec``): no float64 request outside the refinement (each warned and
    truncated before), and the answers, errors and residuals the CPU's float64 batch gives,
    to 1e-6. Gauss-Newton converges only linearly where the residuals are not small: this
    fit's float32 answer, 3.5e-5 away, was 2.9e-6 away after the chip's 4 steps; the host's
    refinement steps until no fit moves."""

    def platform():  # a TPU, whose host's CPU refines (jax.default_device set to it)
        device = jax.config.jax_default_device
        on_host = device is not None and getattr(device, "platform", device) == "cpu"
        return "cpu" if on_host else "tpu"

    monkeypatch.setattr(xla, "platform", platform)
    assert not xla.native_float64() and xla.refine_device(2) == jax.devices("cpu")[0]
    ys = np.stack([decay(T, a, 1.3, 0.2) + 0.01 * np.sin(7 * T + a) for a in (1.0, 2.0)])
    mask = np.zeros_like(ys, dtype=bool)
    mask[1, :4] = True
    kw = dict(p0=[1.0, 1.0, 0.0], batched=True, n_starts=2, mask=mask, full_output=True, **QUIET)
    kw["tied"] = {"c": lambda p: 0.15 * p["a"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a float64 request outside x64 warns
        popt, pcov, info, _, _ = ms.curve_fit(decay, T, ys, **kw)
    assert info["fits"].result.fit_dtype == np.float32
    assert np.isnan(info["fvec"][1, :4]).all() and np.isfinite(info["fvec"][1, 4:]).all()
    monkeypatch.setattr(xla, "platform", lambda: "cpu")
    ref, ref_cov, ref_info, _, _ = ms.curve_fit(decay, T, ys, **kw)
    np.testing.assert_allclose(popt, ref, rtol=1e-6)
    np.testing.assert_allclose(pcov, ref_cov, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(info["fvec"], ref_info["fvec"], rtol=0, atol=1e-7)
    assert pcov[0, 2, 0] != 0.0  # the tied c's error carried from a's, through the tie


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_on_a_chip_a_batch_covariance_compiles_beside_its_search_and_answers_the_same(
    a_chip_without_float64, monkeypatch, dtype
):
    """On a chip a batch's covariance program (the refinement's, or float32's own) is lowered
    and compiled on a worker thread while the search runs, once, and not again when the
    search ends; popt and pcov are bit for bit the batch's that compiles it after its search."""
    import threading

    from multistart.curve_fit import batch as batch_module

    def fresh():  # a model of its own: its programs are compiled in this test
        def model(x, a, tau, c):
            return a * jnp.exp(-x / tau) + c

        return model

    ys = np.stack([decay(T, a, 1.3, 0.2) + 0.01 * np.sin(7 * T + a) for a in (1.0, 2.0, 3.0)])
    kw = dict(p0=[1.0, 1.0, 0.0], bounds=([0, 0.1, -1], [5, 10, 1]), batched=True, **QUIET)
    where = []

    def listen(event, duration, **info):
        if event.endswith("backend_compile_duration") and "curvature" in info.get("fun_name", ""):
            where.append(threading.current_thread().name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        with monkeypatch.context() as m:
            m.setattr(batch_module._Batch, "compile_ahead", lambda self: None)
            after = ms.curve_fit(fresh(), T, ys, dtype=dtype, **kw)
        assert where == ["MainThread"]
        where.clear()
        ahead = ms.curve_fit(fresh(), T, ys, dtype=dtype, **kw)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert len(where) == 1 and where[0].startswith("multistart-covariance")
    for a, b in zip(ahead, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_on_a_chip_f_is_traced_once_for_its_steps_and_once_for_its_refinement(
    a_chip_without_float64,
):
    """A float32 search's trace of ``f`` cannot serve its float64 refinement: ``f`` is traced
    once more there, at float64, and that trace replayed by every step of the refinement and
    its Jacobian (it ran at each of them: 10 times a fit); a refit compiles nothing and traces
    ``f`` once, for its shape check."""
    calls = []

    def decaying(x, a, tau, c):  # a model of its own: its programs are made in this test
        calls.append(jnp.result_type(a).name)
        return a * jnp.exp(-x / tau) + c

    kw = dict(p0=[1.0, 1.0, 0.0], n_starts=2, **QUIET)
    popt, _ = ms.curve_fit(decaying, T, Y, **kw)
    assert calls == ["float32", "float64"]
    calls.clear()
    ys = np.stack([Y, Y + 0.01])
    ms.curve_fit(decaying, T, ys, batched=True, **kw)
    assert calls == ["float32", "float64"]
    calls.clear()
    again, _ = ms.curve_fit(decaying, T, Y, **kw)
    assert calls == ["float32"]
    np.testing.assert_array_equal(again, popt)


def test_on_a_chip_a_covariance_compile_that_fails_on_its_worker_is_compiled_after_the_search(
    a_chip_without_float64, monkeypatch
):
    """A compile ahead that fails on its worker thread (here: the arguments' types cannot be
    read) is not the batch's failure: the program compiles when the search has ended, on the
    caller's thread, and the answers are those of a batch whose compile ahead succeeded."""
    import threading

    from multistart.curve_fit import covariance

    def fresh():  # a model of its own: its programs are compiled in this test
        def model(x, a, tau, c):
            return a * jnp.exp(-x / tau) + c

        return model

    ys = np.stack([decay(T, a, 1.3, 0.2) + 0.01 * np.sin(7 * T + a) for a in (1.0, 2.0)])
    kw = dict(p0=[1.0, 1.0, 0.0], bounds=([0, 0.1, -1], [5, 10, 1]), batched=True, **QUIET)
    ahead = ms.curve_fit(fresh(), T, ys, **kw)
    where = []

    def listen(event, duration, **info):
        if event.endswith("backend_compile_duration") and "curvature" in info.get("fun_name", ""):
            where.append(threading.current_thread().name)

    def broken(data):
        raise RuntimeError("no types here")

    monkeypatch.setattr(covariance, "_specs", broken)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        after = ms.curve_fit(fresh(), T, ys, **kw)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert where == ["MainThread"]
    for a, b in zip(after, ahead, strict=True):
        np.testing.assert_array_equal(a, b)


def test_on_a_chip_a_refinement_takes_float32_jacobians_and_ends_at_the_float64_answer(
    a_chip_without_float64,
):
    """On a chip without float64 a refinement step's normal equations are solved in float32
    (the residuals, their sums of squares and the last step in float64): from a float32 answer
    3e-6 away it ends within 2e-8 of the float64 minimum (scipy's, converged), as the
    all-float64 refinement does. (Residuals this large make Gauss-Newton converge only
    linearly: neither reaches float64's last digits in the chip's 4 steps.)"""
    from scipy.optimize import least_squares

    from multistart.result import laplace

    seen = []

    def res(v, data):
        seen.append(jnp.result_type(v).name)
        return (v[0] * jnp.exp(-data[0] / v[1]) + v[2] - data[1]) / 0.01

    data = np.stack([T, Y])
    with jax.enable_x64(True):
        exact = least_squares(lambda v: np.asarray(res(v, data)), [2.0, 1.3, 0.2], xtol=1e-15,
                              ftol=1e-15, gtol=1e-15).x  # fmt: skip
        start = (exact * (1 + 3e-6)).astype(np.float32).astype(np.float64)
        box = (np.array([0.0, 0.1, -1.0]), np.array([5.0, 10.0, 1.0]))
        plain = jax.jit(lambda v: laplace._refined(lambda u: res(u, data), v, box))
        seen.clear()
        data32 = data.astype(np.float32)
        mixed = jax.jit(lambda v: laplace._refined(
            lambda u: res(u, data), v, box, lambda u: res(u, data32)))  # fmt: skip
        out = np.asarray(mixed(start))
        assert "float32" in seen and "float64" in seen  # its Jacobians in float32, not all
        both = np.asarray(plain(start))
    np.testing.assert_allclose(out, exact, rtol=2e-8)  # (measured: 3.8e-9)
    np.testing.assert_allclose(both, exact, rtol=2e-8)  # (5e-10)
    assert np.max(np.abs(start / exact - 1)) > 1e-6  # the start itself was not that close


def test_a_mixed_refinement_step_solves_in_float32_and_returns_a_float64_point():
    """A chip's mixed step (:func:`laplace._better` given float32 normal equations) solves them
    in float32, where the chip emulates every float64 operation of the written-out solves: its
    point is float64, the float64 solve's within float32's rounding of the step, and a
    coordinate the step would take out of the box is held at its bound as the float64 step
    holds it."""
    from multistart.result import laplace
    from multistart.solvers import small

    a_mat = np.array([[1.0, 0.3], [0.2, 1.5], [0.4, -0.7], [1.1, 0.1]])
    b = np.array([1.0, 2.0, -0.5, 0.3])

    def res(v):
        return a_mat @ v - b

    unbounded = np.linalg.lstsq(a_mat, b, rcond=None)[0]
    top = unbounded[1] - 0.01  # the second coordinate's bound, just short of its optimum
    held0 = np.linalg.lstsq(a_mat[:, :1], b - a_mat[:, 1] * top, rcond=None)[0][0]
    with jax.enable_x64(True):
        x = jnp.asarray([held0 + 2e-5, top - 3e-5])  # near the answer, off the bound
        box = (jnp.asarray([-10.0, -10.0]), jnp.asarray([10.0, top]))
        reach = laplace._reach(box)
        r = res(x)
        jac = jnp.asarray(a_mat)
        normal64 = small.normal_equations(jac, r)
        normal32 = small.normal_equations(jac.astype(jnp.float32), r.astype(jnp.float32))
        assert normal32[0].dtype == jnp.float32
        step64, _ = jax.jit(lambda n: laplace._better(res, box, reach, x, r, n, False))(normal64)
        step32, _ = jax.jit(lambda n: laplace._better(res, box, reach, x, r, n, False))(normal32)

        def float64_operations(normal) -> int:
            program = jax.make_jaxpr(lambda n: laplace._better(res, box, reach, x, r, n, False))
            eqns = program(normal).jaxpr.eqns
            return sum(any(v.aval.dtype == jnp.float64 for v in e.outvars) for e in eqns)

        # the solves in float32: a quarter of the float64 step's float64 operations (106 and
        # 25 here; 101 when the float32 normal equations were solved in float64)
        assert float64_operations(normal32) < float64_operations(normal64) / 2
    assert step32.dtype == jnp.float64
    # the step would leave the box: the second coordinate is held at its bound, the first
    # goes to its optimum with it there
    np.testing.assert_allclose(step64, [held0, top], rtol=1e-12)
    np.testing.assert_allclose(step32, [held0, top], rtol=1e-6)


def _decays(k: int, seed: int = 0):
    """``(points, data, box)``: ``k`` decay fits' data ``(k, 2, 30)``, noisy enough that
    Gauss-Newton converges only linearly, and starts 3e-4 off their optima (scipy's), each
    fit's own: a refinement's fits stop after different numbers of steps (4 to 9 here)."""
    from scipy.optimize import least_squares

    rng = np.random.default_rng(seed)
    a = rng.uniform(1.0, 3.0, k)
    ys = a[:, None] * np.exp(-T / 1.3) + 0.2 + 0.3 * rng.standard_normal((k, T.size))
    data = np.stack([np.broadcast_to(T, ys.shape), ys], axis=1)
    with jax.enable_x64(True):
        optima = [least_squares(lambda v, d=d: np.asarray(_decay_residuals(v, d)), [ai, 1.3, 0.2],
                                xtol=1e-15, ftol=1e-15, gtol=1e-15).x
                  for ai, d in zip(a, data, strict=True)]  # fmt: skip
    points = np.array(optima) * (1 + 3e-4 * rng.standard_normal((k, 3)))
    return points, data, (np.array([0.0, 0.1, -1.0]), np.array([5.0, 10.0, 1.0]))


def _decay_residuals(v, data):
    return (v[0] * jnp.exp(-data[0] / v[1]) + v[2] - data[1]) / 0.3


def test_a_cpu_refinement_in_blocks_ends_where_one_program_of_the_batch_ends_fit_by_fit(
    monkeypatch,
):
    """A stack of fits refined on a CPU in blocks (:func:`laplace.refine_in_blocks`: each fit
    up to REFINE_STEPS steps, those still moving up to twice as many, ...) ends, fit by fit,
    bit for bit where one program of the whole batch ends (every fit until no step moves it),
    with fits that stop in the first round and fits that step past it, in blocks whose last
    is padded; the block programs compile once for any number of fits."""
    from multistart.result import laplace

    monkeypatch.setattr(laplace, "REFINE_BLOCK", 8)
    compiles = []

    def listen(event, duration, **info):
        if event.endswith("backend_compile_duration"):
            compiles.append(info.get("fun_name", ""))

    with jax.enable_x64(True):
        first = laplace.residual_refinement(_decay_residuals, first=True)
        more = laplace.residual_refinement(_decay_residuals, first=False)
        whole = laplace.residual_curvature(_decay_residuals, stacked=True)
        points, data, box = _decays(21)
        steps = np.zeros(len(points), dtype=np.int32)
        limit = np.int32(laplace.REFINE_STEPS)
        moving = np.asarray(first(points[:8], data[:8], box, steps[:8], limit)[2])
        assert moving.any() and not moving.all()  # some stop in the first round, some go on
        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            blocks = laplace.refine_in_blocks(first, more, points, data, box)
            again = laplace.refine_in_blocks(first, more, *_decays(13, seed=1)[:2], box)
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)
        one = np.asarray(whole(points, data, box).at)
        ref = np.asarray(whole(*_decays(13, seed=1)[:2], box).at)
    np.testing.assert_array_equal(blocks, one)
    np.testing.assert_array_equal(again, ref)
    assert not np.array_equal(blocks, points)  # (they moved)
    # one compile in both calls, of 21 and 13 fits: the second round's program (the first
    # round's was compiled above, for 8 fits), whatever the number of fits and blocks
    assert [c for c in compiles if "refinement" in c] == ["jit(multistart_refinement)"]


def _host_refines(device=None) -> str:
    """A TPU's platform, the host's CPU where a refinement runs (``jax.default_device`` set
    to it)."""
    device = jax.config.jax_default_device
    on_host = device is not None and getattr(device, "platform", device) == "cpu"
    return "cpu" if on_host else "tpu"


def test_on_a_chip_a_batch_refined_in_blocks_on_its_host_answers_as_one_program_compiled_ahead(
    monkeypatch,
):
    """A chip's batch of more fits than REFINE_BLOCK, refined on its host's CPU: its popt,
    pcov and residuals are bit for bit those of one program of the whole batch, ``f`` is
    traced as often (once a float type), and the block programs and the curvature where they
    end are compiled on the covariance's worker thread while the search runs, none after
    it."""
    import threading

    from multistart.result import laplace

    traced = []

    def fresh():  # a model of its own: its programs are compiled in this test
        def model(x, a, tau, c):
            traced.append(jnp.result_type(a).name)
            return a * jnp.exp(-x / tau) + c

        return model

    monkeypatch.setattr(xla, "platform", _host_refines)
    rng = np.random.default_rng(0)
    ys = np.stack([decay(T, a, 1.3, 0.2) + 0.3 * rng.standard_normal(T.size)
                   for a in (1.0, 2.0, 3.0, 1.5, 2.5)])  # fmt: skip
    kw = dict(p0=[1.0, 1.0, 0.0], bounds=([0, 0.1, -1], [5, 10, 1]), batched=True)
    kw.update(full_output=True, **QUIET)
    one = ms.curve_fit(fresh(), T, ys, **kw)
    where = []

    def listen(event, duration, **info):
        name = info.get("fun_name", "")
        ours = "curvature" in name or "refinement" in name
        if event.endswith("backend_compile_duration") and ours:
            where.append((name, threading.current_thread().name))

    monkeypatch.setattr(laplace, "REFINE_BLOCK", 2)
    traced.clear()
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        blocks = ms.curve_fit(fresh(), T, ys, **kw)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    # f traced once for the search and once for the refinement, replayed by the block
    # programs and the curvature as by the one program
    assert traced == ["float32", "float64"]
    assert one[2]["fits"].result.fit_dtype == np.float32
    for a, b in ((one[0], blocks[0]), (one[1], blocks[1]), (one[2]["fvec"], blocks[2]["fvec"])):
        np.testing.assert_array_equal(a, b)
    assert sorted(name for name, _ in where) == [
        "jit(multistart_curvature)",
        "jit(multistart_refinement)",
        "jit(multistart_refinement)",
    ]
    assert all(thread.startswith("multistart-covariance") for _, thread in where)
