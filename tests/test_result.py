import dataclasses
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import PARABOLA_SPACE, parabola

import multistart as ms

# Every field a Result saves (the underscored ones hold the attached problem, never saved).
RECORD_FIELDS = [f.name for f in dataclasses.fields(ms.Result) if not f.name.startswith("_")]


def handmade_result() -> ms.Result:
    """Every field set, with nested params, a 2-d parameter, every Status and NaN/inf values."""
    n = len(ms.Status)  # one start of every status
    rng = np.random.default_rng(0)

    def params():
        return {
            "a": rng.normal(size=n).astype(np.float32),
            "band": {"flux": rng.normal(size=(n, 2)), "psf": rng.normal(size=(n, 2, 3))},
            "layers": {
                0: {"x": np.resize([np.nan, np.inf, -np.inf, 1.0, 2.0], n)},
                1: {"x": np.arange(n, dtype=np.int32)},
            },
        }

    p = params()
    best = jax.tree_util.tree_map(lambda a: a[1], p)
    return ms.Result(
        best_params=best,
        best_fom=-3.5,
        best_index=1,
        foms=np.resize([np.nan, -3.5, np.inf, 2.0, -np.inf], n),
        params=p,
        start_params=params(),
        status=np.array(list(ms.Status), dtype=object),
        n_steps=np.resize(np.array([1, 20, 3, 40, 5], dtype=np.int64), n),
        best_step=np.resize(np.array([-1, 19, 0, 12, 4], dtype=np.int64), n),
        history=np.array(
            [
                np.resize([np.nan, 1.0, np.inf, 4.0, 0.5], n),
                np.resize([np.nan, -3.5, np.inf, 2.0, -np.inf], n),
            ]
        ),
        history_steps=np.array([10, 20]),
        stats={"n_compiles": 1, "compile_s": 0.25, "first_step_s": None, "odd": float("nan")},
        paths=["a", "band.flux", "band.psf", "layers.0.x", "layers.1.x"],
        config={"search": "MultiStartAdam", "convergence": {"window": 50}, "band": [0.1, 0.9]},
    )


def assert_same(a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (a, b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)) and not isinstance(a, np.str_):
        assert np.asarray(b).dtype == np.asarray(a).dtype and np.shape(a) == np.shape(b)
        if a.dtype == object:
            assert list(a) == list(b)
        else:
            np.testing.assert_array_equal(a, b)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b)
    else:
        assert type(a) is type(b) and a == b, (a, b)


def test_save_load_round_trips_every_field(tmp_path):
    result = handmade_result()
    path = tmp_path / "fit.npz"
    result.save(path)
    loaded = ms.Result.load(path)
    for name in RECORD_FIELDS:
        assert_same(getattr(result, name), getattr(loaded, name))
    assert all(isinstance(s, ms.Status) for s in loaded.status)
    assert list(loaded.status) == list(ms.Status)
    assert list(loaded.params["layers"]) == [0, 1]  # int keys stay ints
    assert loaded.params["layers"][1]["x"].dtype == np.int32
    assert loaded.params["a"].dtype == np.float32


@pytest.fixture(scope="module")
def real_search():
    """One real search for the round-trip and the colliding-name tests: the parabola (a 2-d
    Uniform and a Normal), its Normal named ``fom`` as a record column is."""

    def fom_parabola(p):
        return parabola({"x": p["x"], "y": p["fom"]})

    space = {"x": PARABOLA_SPACE["x"], "fom": PARABOLA_SPACE["y"]}
    return ms.MultiStartAdam(n_starts=5, batch_size=2, n_steps=40, seed=0).fit(fom_parabola, space)


def test_save_load_round_trips_a_real_search(tmp_path, real_search):
    result = real_search
    result.save(tmp_path / "r.npz")
    loaded = ms.Result.load(tmp_path / "r.npz")
    for name in RECORD_FIELDS:
        assert_same(getattr(result, name), getattr(loaded, name))
    assert repr(loaded) == repr(result)


def test_a_search_s_result_is_frozen_and_with_stats_copies_it(real_search):
    result = real_search
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.foms = result.foms * 2  # type: ignore[misc]
    more = result.with_stats(note="added")
    assert more.stats["note"] == "added" and "note" not in result.stats
    assert more._uncertainty is result._uncertainty  # the same problem attached
    assert result.stats["n_distinct_minima"] >= 1  # assemble's last statistic, made in


def test_save_writes_exactly_the_path_given(tmp_path):
    handmade_result().save(tmp_path / "fit.result")
    assert [p.name for p in tmp_path.iterdir()] == ["fit.result"]
    assert ms.Result.load(tmp_path / "fit.result").best_index == 1


def test_load_rejects_other_files(tmp_path):
    np.savez(tmp_path / "other.npz", x=np.ones(3))
    with pytest.raises(ValueError, match="is not a saved multistart Result"):
        ms.Result.load(tmp_path / "other.npz")


def _damaged_copies(good: bytes, rng):
    """A saved Result cut short, with one bit flipped, or replaced: every way a disk, a copy or
    a user can spoil a file."""
    for cut in sorted({0, 1, 10, 100, len(good) // 2, len(good) - 22, len(good) - 1}):
        yield f"cut at {cut}", good[:cut]
    for at in rng.choice(len(good), size=120, replace=False):
        flipped = bytearray(good)
        flipped[at] ^= 1 << int(rng.integers(8))
        yield f"bit flipped at {at}", bytes(flipped)
    yield "random bytes", rng.bytes(len(good))
    yield "text", b"best_fom = 3.5\n"


def _npy_with_pickle() -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def test_a_damaged_file_is_one_clear_error_naming_it(tmp_path):
    # Issue 24, item 2: BadZipFile, zlib.error or "allow_pickle=False" (misleading) came out.
    result = handmade_result()
    result.save(tmp_path / "good.npz")
    good = (tmp_path / "good.npz").read_bytes()
    rng = np.random.default_rng(0)
    loaded_anyway = 0
    copies = [*_damaged_copies(good, rng), ("a pickled .npy", _npy_with_pickle())]
    for what, data in copies:
        path = tmp_path / "damaged.npz"
        path.write_bytes(data)
        try:
            back = ms.Result.load(path)
        except ValueError as e:
            assert str(path) in str(e), (what, e)
            assert "pickle" not in str(e).split("(")[0], (what, e)  # no advice to unpickle
            continue
        # A flipped bit the archive does not check (a timestamp, a spare header field):
        # then every record must be intact.
        loaded_anyway += 1
        for name in RECORD_FIELDS:
            assert_same(getattr(result, name), getattr(back, name))
    assert loaded_anyway < len(copies) / 2  # the CRC-32 of every member caught most flips


def test_save_is_whole_or_nothing(tmp_path, monkeypatch):
    result = handmade_result()
    path = tmp_path / "fit.npz"
    result.save(path)
    before = path.read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # e.g. Ctrl-C while the archive is written

    monkeypatch.setattr(np, "savez_compressed", killed)
    with pytest.raises(KeyboardInterrupt):
        result.save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["fit.npz"]


def test_save_refuses_values_json_cannot_hold(tmp_path):
    result = handmade_result()
    result.stats["callback"] = print
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        result.save(tmp_path / "r.npz")


def test_to_dataframe_columns_and_values():
    result = handmade_result()
    df = result.to_dataframe()
    params = ["a", "band.flux[0]", "band.flux[1]"]
    params += [f"band.psf[{i},{j}]" for i in range(2) for j in range(3)]
    params += ["layers.0.x", "layers.1.x"]
    expected = ["index", "fom", "status", "n_steps", "n_evals", "at_bound", "best_step"]
    expected += ["minimum", *params]
    expected += [f"start:{c}" for c in params]
    assert list(df.columns) == expected
    assert len(df) == result.n_starts
    assert df["status"].tolist() == [s.value for s in ms.Status]
    np.testing.assert_array_equal(df["fom"], result.foms)
    np.testing.assert_array_equal(df["band.flux[1]"], result.params["band"]["flux"][:, 1])
    np.testing.assert_array_equal(df["band.psf[1,2]"], result.params["band"]["psf"][:, 1, 2])
    np.testing.assert_array_equal(df["start:a"], result.start_params["a"])
    np.testing.assert_array_equal(df["best_step"], result.best_step)


def test_to_dataframe_of_a_search_and_a_colliding_name(real_search):
    assert "fom" in real_search.paths  # a parameter named as the record column
    with pytest.raises(ValueError, match="parameter column 'fom' collides"):
        real_search.to_dataframe()


def test_to_dataframe_without_pandas_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(ImportError, match=r"multistart\[plots\]"):
        handmade_result().to_dataframe()


def test_save_load_round_trips_resurrected_incarnations(tmp_path, x64):
    def nan_right(p):
        return jnp.where(p["x"][0] > 1.0, jnp.nan, jnp.sum((p["x"] - 0.5) ** 2))

    search = ms.MultiStartAdam(
        n_starts=6, n_steps=60, seed=0, n_candidates=0, resurrect=1, log_every=0
    )
    result = search.fit(nan_right, {"x": ms.Uniform(-4.0, 4.0, shape=(2,))})
    assert result.incarnations and result.resurrections.sum() > 0
    result.save(tmp_path / "r.npz")
    loaded = ms.Result.load(tmp_path / "r.npz")
    for name in RECORD_FIELDS:
        assert_same(getattr(result, name), getattr(loaded, name))


# -- printing --------------------------------------------------------------------------------


def float32_result() -> ms.Result:
    foms = np.array([395.6813, 395.6814, 402.5], dtype=np.float32).astype(np.float64)
    params = {"amp": np.array([24.917944, 24.91795, 3.0], dtype=np.float32)}
    return ms.Result(
        best_params={"amp": params["amp"][0]},
        best_fom=foms[0],
        best_index=0,
        foms=foms,
        params=params,
        start_params=params,
        status=np.array([ms.Status.CONVERGED, ms.Status.CONVERGED, ms.Status.MAX_STEPS]),
        n_steps=np.array([10, 12, 20]),
        best_step=np.array([9, 11, 19]),
        history=np.array([[500.0, 450.0, 900.0], foms]),
        history_steps=np.array([5, 20]),
        paths=["amp"],
        config={"convergence": {"window": 5, "rtol": 1e-6, "atol": 1e-8, "min_steps": 0}},
    )


def test_a_float32_fit_prints_with_float32_precision():
    result = float32_result()
    assert result.fit_dtype == np.float32
    assert repr(result.best_fom) == str(result.best_fom) == "395.6813"
    assert f"{result.best_fom:.2f}" == "395.68" and result.best_fom == float(np.float32(395.6813))
    assert "best_fom=395.6813," in repr(result)
    assert result.to_dataframe()["fom"].dtype == np.float32
    (best,) = result.distinct_minima()  # the third start did not converge: not a minimum
    assert len(result.distinct_minima(include_unconverged=True)) == 2
    assert repr(best) == "Minimum(fom=395.6813, n_starts=2, params={'amp': 24.917944})"
    assert repr(handmade_result().best_fom) == "-3.5"  # float64 prints as a float


def test_status_compares_and_prints_as_words():
    result = float32_result()
    assert (result.status == "converged").tolist() == [True, True, False]
    assert result.status[2] is ms.Status.MAX_STEPS  # still the enum members
    assert repr(result.status) == "array(['converged', 'converged', 'max_steps'], dtype=object)"
    assert f"{ms.Status.NONFINITE}" == "nonfinite"


def test_a_result_made_from_codes_or_words_holds_members_and_refuses_a_code_out_of_range():
    """Statuses given as codes (what a search hands the Result) or as words give the same
    members and codes; a code no status has is refused, naming the range."""
    result = float32_result()
    codes = result.status_codes
    assert codes.tolist() == [ms.Status.CONVERGED.code] * 2 + [ms.Status.MAX_STEPS.code]
    assert not codes.flags.writeable and not result.status.flags.writeable
    for given in (codes.astype(np.int64), np.array(["converged", "converged", "max_steps"])):
        again = result.replaced(status=given)
        assert again.status.tolist() == result.status.tolist()
        np.testing.assert_array_equal(again.status_codes, codes)
        assert again.status[2] is ms.Status.MAX_STEPS
    for bad in (np.array([0, 0, 99]), np.array([0, -1, 0])):
        with pytest.raises(ValueError, match=r"status codes must lie in 0\.\.\d+"):
            result.replaced(status=bad)


def test_an_unpickled_result_keeps_its_statuses_read_only():
    """A Result that crossed a process (a part from Ray, Dask or a pool) is as it was made:
    its statuses and their codes read-only, the same values."""
    import pickle

    result = float32_result()
    again = pickle.loads(pickle.dumps(result))
    assert again.status.tolist() == result.status.tolist()
    np.testing.assert_array_equal(again.status_codes, result.status_codes)
    assert not again.status.flags.writeable and not again.status_codes.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        again.status[0] = ms.Status.MAX_STEPS


def test_pickle_keeps_the_result_but_not_its_problem():
    import pickle

    result = float32_result().attach_problem(lambda p: p["amp"] ** 2, {"amp": ms.Uniform(0, 50)})
    back = pickle.loads(pickle.dumps(result))
    assert repr(back.best_fom) == "395.6813" and back._uncertainty.problem is None
    np.testing.assert_array_equal(back.foms, result.foms)


def test_plot_draws_every_start_and_the_minima():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = float32_result()
    fig = result.plot()
    left, right = fig.axes
    assert len(left.lines) == result.n_starts + 1  # every start, and the best again on top
    assert left.get_xscale() == "log" and left.get_yscale() == "log"
    (points,) = right.collections
    np.testing.assert_allclose(
        points.get_offsets()[:, 1], [m.fom for m in result.distinct_minima()], rtol=1e-6
    )
    plt.close(fig)
    fig = handmade_result().plot()  # nan, inf and -inf figures of merit draw too
    plt.close(fig)


def test_plot_labels_one_minimum_with_one_tick():
    # Issue 24, item 13: with one minimum the ticks fell back to 0.6, 0.8, ... and overprinted.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = float32_result()
    result.foms[:] = result.foms[0]
    same = jax.tree_util.tree_map(lambda a: np.broadcast_to(a[:1], a.shape), result.params)
    result = dataclasses.replace(result, params=same)
    assert len(result.distinct_minima()) == 1
    fig = result.plot()
    right = fig.axes[1]
    lo, hi = right.get_xlim()
    assert [t for t in right.get_xticks() if lo <= t <= hi] == [1.0]
    plt.close(fig)


def test_plot_without_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"multistart\[plots\]"):
        float32_result().plot()


def test_a_search_where_no_start_improved_says_so():
    # Issue 24, item 5: a rule that ascends reported "converged" and as many minima as starts.
    result = float32_result()
    assert ms.result.warn_if_no_start_improved(result) is None
    result.best_step[:] = 0  # every start's first value was its best
    with pytest.warns(RuntimeWarning, match="no start improved on its first value"):
        assert "3 starts, up to 20 steps" in ms.result.warn_if_no_start_improved(result)
    every = np.full(len(result.foms), ms.Status.NONFINITE.code)
    said = result.replaced(status=every)  # what happened to them is said already
    assert ms.result.warn_if_no_start_improved(said) is None
    with pytest.raises(ValueError, match="read-only"):  # the statuses are the search's record
        result.status[:] = ms.Status.NONFINITE
    result.n_steps[:] = 1  # a start that stepped once cannot have improved: nothing to say
    assert ms.result.warn_if_no_start_improved(result) is None


def test_the_report_names_every_parameter_its_error_the_convention_and_a_bound(x64):
    from test_laplace import PEAK_SPACE, _peak_residuals

    space = dict(PEAK_SPACE, amp=ms.Uniform(0.0, 2.0))  # the amplitude, 3, is outside
    search = ms.MultiStartLeastSquares(n_starts=4, seed=0, log_every=0)
    result = search.fit(_peak_residuals(1.0), space)
    text = result.report()
    errors = result.errors
    for name in ("amp", "centre", "width"):
        line = next(row for row in text.splitlines() if row.strip().startswith(name + " "))
        assert f"{errors[name]:.5g}" in line
    assert "on a bound" in next(r for r in text.splitlines() if r.strip().startswith("amp"))
    assert "absolute_sigma=False" in text and "reduced χ²" in text
    assert f"{result.laplace.reduced_chi2:.6g} ({result.laplace.dof} degrees of freedom)" in text
    assert "lm (MultiStartLeastSquares), float64" in text
    # the correlations above the threshold, from the covariance itself, largest first
    cov, names = result.laplace.covariance, result.laplace.names
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    shown = sorted((p for p in pairs if abs(corr[p]) > 0.1), key=lambda p: -abs(corr[p]))
    assert shown  # amp and width correlate
    printed = [r.strip() for r in text.splitlines() if r.strip().startswith("C(")]
    assert printed == [f"C({names[i]}, {names[j]}) = {corr[i, j]:+.3f}" for i, j in shown]
    assert "C(" not in result.report(min_correlation=1.0)
    # a Result without its problem and without a saved covariance says so instead
    bare = ms.Result.of(
        foms=result.foms,
        params=result.params,
        start_params=result.start_params,
        status=result.status,
        n_steps=result.n_steps,
        best_step=result.best_step,
        history=result.history,
        history_steps=result.history_steps,
        paths=result.paths,
        config=result.config,
        stats=result.stats,
    )
    assert "(no errors: this Result has no problem" in bare.report()
