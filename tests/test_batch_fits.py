"""A batch's fits kept and laid out: BatchFits.save, ms.load_fits and BatchFits.map."""

from __future__ import annotations

import dataclasses
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from conftest import assert_same_result
from test_result import _damaged_copies

import multistart as ms
from multistart.result.fits_file import ARRAY, RESULT, STATUS, VALUE, kept

X = np.linspace(0.0, 5.0, 30)
GRID = (2, 3)  # six fits, laid out as a 2 x 3 cube's spaxels (C order)
TRUTHS = np.array(
    [[3.0, 1.5], [1.0, 0.7], [2.0, 3.0], [0.5, 1.0], [1.5, 2.0], [2.5, 0.8]]
)  # a, tau per fit
BOUNDS = ([0.0, 0.1, -1.0, 0.0], [10.0, 2.5, 1.0, 1.0])  # tau <= 2.5 binds fit 2 (3.0)


def decay(x, a, tau, c, slope):
    return a * jnp.exp(-x / tau) + c + slope * x


@pytest.fixture(scope="module")
def fits() -> ms.BatchFits:
    """Six fits with a fixed parameter, a tied one and one fit on a bound: every field of
    BatchFits holds something that tells the fits apart."""
    rng = np.random.default_rng(3)
    clean = np.stack([a * np.exp(-X / tau) + 0.1 * a for a, tau in TRUTHS])
    ys = clean + rng.normal(0.0, 0.05, clean.shape)
    with warnings.catch_warnings():  # fit 2 on its bound: a warning, by design
        warnings.simplefilter("ignore", scipy.optimize.OptimizeWarning)
        *_, info, _, _ = ms.curve_fit(
            decay,
            X,
            ys,
            p0=[1.0, 1.0, 0.0, 0.0],
            sigma=np.full(X.size, 0.05),
            bounds=BOUNDS,
            fixed={"slope": 0.0},
            tied={"c": lambda p: 0.1 * p["a"]},
            n_starts=3,
            seed=0,
            batched=True,
            full_output=True,
            log_every=0,
        )
    return info["fits"]


@pytest.fixture(scope="module")
def cube_fits() -> ms.BatchFits:
    """Six fits with points left out: fit 1 two nan channels, fit 3 an infinite sigma, fit 4
    every point masked (no data), fit 5 a channel masked."""
    rng = np.random.default_rng(4)
    clean = np.stack([a * np.exp(-X / tau) + 0.1 * a for a, tau in TRUTHS])
    ys = clean + rng.normal(0.0, 0.05, clean.shape)
    ys[1, [3, 17]] = np.nan
    sigma = np.full(ys.shape, 0.05)
    sigma[3, 8] = np.inf
    mask = np.zeros(ys.shape, dtype=bool)
    mask[4], mask[5, 2] = True, True
    *_, info, _, _ = ms.curve_fit(
        decay,
        X,
        ys,
        p0=[1.0, 1.0, 0.0, 0.0],
        sigma=sigma,
        mask=mask,
        nan_policy="omit",
        bounds=([0.0, 0.1, -1.0, 0.0], [10.0, 5.0, 1.0, 1.0]),
        fixed={"slope": 0.0},
        n_starts=3,
        seed=0,
        batched=True,
        full_output=True,
        log_every=0,
    )
    return info["fits"]


def assert_same_fits(a: ms.BatchFits, b: ms.BatchFits) -> None:
    """Every field of the two, bit for bit (each field BatchFits has: a field added later is
    compared too), and what is read off them."""
    for f in dataclasses.fields(ms.BatchFits):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "result":
            assert_same_result(x, y)
            assert (x.stats, x.config, x.paths) == (y.stats, y.config, y.paths)
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert type(x) is type(y) and x == y, f.name
    np.testing.assert_array_equal(a.errors, b.errors)
    np.testing.assert_array_equal(a.redchi, b.redchi)
    assert a.message == b.message and repr(a) == repr(b)
    assert [a.report(i) for i in range(a.n_fits)] == [b.report(i) for i in range(b.n_fits)]
    assert a.report() == b.report()


def test_save_and_load_keep_every_field(fits, tmp_path):
    assert fits.held == {"slope": "fixed", "c": "tied"} and fits.free.tolist() == [1, 1, 0, 0]
    assert fits.on_bound().tolist() == [2]  # the flags tell the fits apart
    fits.save(tmp_path / "cube-fits.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["cube-fits.npz"]  # no temporary left
    back = ms.load_fits(tmp_path / "cube-fits.npz")
    assert isinstance(back, ms.BatchFits) and back.names == fits.names
    assert all(isinstance(s, ms.Status) for s in back.status)
    assert_same_fits(back, fits)
    pd = pytest.importorskip("pandas")
    pd.testing.assert_frame_equal(back.to_dataframe(), fits.to_dataframe())
    assert ms.BatchFits.load(str(tmp_path / "cube-fits.npz")).report(2) == fits.report(2)


def test_fits_with_points_left_out_and_one_with_none_are_kept_whole(cube_fits, tmp_path):
    m = X.size
    np.testing.assert_array_equal(cube_fits.n_points, [m, m - 2, m, m - 1, 0, m - 1])
    np.testing.assert_array_equal(cube_fits.dof, [m - 3, m - 5, m - 3, m - 4, 0, m - 4])
    assert [str(s) for s in cube_fits.status] == ["converged"] * 4 + ["no_data", "converged"]
    cube_fits.save(tmp_path / "cube.npz")
    back = ms.load_fits(tmp_path / "cube.npz")
    assert_same_fits(back, cube_fits)
    assert "data points        28" in back.report(1)
    assert "status             no_data" in back.report(4) and "no_data 1" in back.report()
    pd = pytest.importorskip("pandas")
    pd.testing.assert_frame_equal(back.to_dataframe(), cube_fits.to_dataframe())
    assert back.map("n_points", (3, 2)).tolist() == [[m, m - 2], [m, m - 1], [0, m - 1]]


def test_a_file_from_before_points_could_be_left_out_counts_every_point(fits, tmp_path):
    path = _rewritten(tmp_path, fits, lambda m: m.pop("fits/n_points"))
    older = ms.load_fits(path)
    np.testing.assert_array_equal(older.n_points, np.full(6, X.size))
    np.testing.assert_array_equal(older.n_points, fits.n_points)
    assert older.report(0) == fits.report(0)


def test_every_field_says_how_its_file_keeps_it_and_the_per_fit_ones_are_per_fit(fits):
    kinds = {f.name: f.metadata["file"] for f in dataclasses.fields(ms.BatchFits)}
    assert set(kinds.values()) <= {ARRAY, STATUS, VALUE, RESULT}
    for f in dataclasses.fields(ms.BatchFits):
        if f.metadata["per_fit"]:
            assert len(getattr(fits, f.name)) == fits.n_fits, f.name


@dataclasses.dataclass(frozen=True, eq=False)
class WithPoints(ms.BatchFits):
    """A per-fit field added later (the seeing of each fit's spaxel, say)."""

    seeing: np.ndarray | None = kept(ARRAY, per_fit=True, default=None)


def test_a_field_added_with_kept_is_saved_and_older_files_load_with_its_default(fits, tmp_path):
    values = {f.name: getattr(fits, f.name) for f in dataclasses.fields(ms.BatchFits)}
    more = WithPoints(**values, seeing=np.arange(30, 36))
    more.save(tmp_path / "more.npz")
    back = WithPoints.load(tmp_path / "more.npz")
    np.testing.assert_array_equal(back.seeing, np.arange(30, 36))
    assert_same_fits(back, more)
    fits.save(tmp_path / "older.npz")  # a file from before the field
    assert WithPoints.load(tmp_path / "older.npz").seeing is None
    assert_same_fits(ms.load_fits(tmp_path / "more.npz"), fits)  # a newer file, read older


def test_a_field_without_its_kind_is_refused_on_saving(fits, tmp_path):
    @dataclasses.dataclass(frozen=True, eq=False)
    class Unsaid(ms.BatchFits):
        note: str = ""

    values = {f.name: getattr(fits, f.name) for f in dataclasses.fields(ms.BatchFits)}
    with pytest.raises(TypeError, match=r"BatchFits.note says not how it is kept"):
        Unsaid(**values).save(tmp_path / "unsaid.npz")
    assert not (tmp_path / "unsaid.npz").exists()


def test_a_damaged_file_is_one_value_error_naming_it(fits, tmp_path):
    fits.save(tmp_path / "good.npz")
    good = (tmp_path / "good.npz").read_bytes()
    copies = list(_damaged_copies(good, np.random.default_rng(1)))
    loaded_anyway = 0
    for what, data in copies:
        path = tmp_path / "damaged.npz"
        path.write_bytes(data)
        try:
            back = ms.load_fits(path)
        except ValueError as e:
            assert str(path) in str(e), (what, e)
            continue
        loaded_anyway += 1  # a flip the archive does not check: every field is intact
        assert_same_fits(back, fits)
    assert loaded_anyway < len(copies) / 2


def _rewritten(tmp_path, fits, change) -> str:
    """``fits``' file with its members changed by ``change(members)`` (valid checksums)."""
    fits.save(tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as z:
        members = {k: z[k] for k in z.files}
    change(members)
    path = str(tmp_path / "changed.npz")
    np.savez(path, **members)
    return path


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m.pop("fits/pcov"), "it lacks the fits' 'pcov'"),
        (lambda m: m.pop("fits/status"), "it lacks the fits' 'status'"),
        (lambda m: m.pop("result/__meta__"), "it lacks the fits' 'result'"),
        (lambda m: m.update({"fits/popt": m["fits/popt"][:-1]}), r"popt holds \(5,\) fits"),
        (lambda m: m.update({"fits/status": np.array(["lost"] * 6)}), "'lost' is not a valid"),
        (lambda m: m.pop("result/foms"), "not a readable multistart Result file"),
    ],
    ids=["pcov", "status", "result", "popt-length", "status-name", "result-member"],
)
def test_a_file_with_a_member_missing_or_wrong_is_refused_naming_it(fits, tmp_path, change, words):
    path = _rewritten(tmp_path, fits, change)
    with pytest.raises(ValueError, match=words) as info:
        ms.load_fits(path)
    assert repr(path) in str(info.value)


def test_a_result_file_and_a_fits_file_name_each_others_reader(fits, tmp_path):
    fits.result.save(tmp_path / "search.npz", errors=False)
    fits.save(tmp_path / "fits.npz")
    with pytest.raises(ValueError, match=r"is a saved Result, not a BatchFits: .*ms.Result.load"):
        ms.load_fits(tmp_path / "search.npz")
    with pytest.raises(ValueError, match=r"is a saved BatchFits, not a Result: .*ms.load_fits"):
        ms.Result.load(tmp_path / "fits.npz")
    np.savez(tmp_path / "other.npz", x=np.ones(3))
    with pytest.raises(ValueError, match="is not a saved multistart BatchFits"):
        ms.load_fits(tmp_path / "other.npz")
    with pytest.raises(FileNotFoundError):
        ms.load_fits(tmp_path / "missing.npz")


def test_map_lays_a_column_out_on_the_grid(fits):
    tau = fits.map("tau", GRID)
    assert tau.shape == GRID
    for i in range(fits.n_fits):  # fit i at np.unravel_index(i, GRID)
        assert tau[np.unravel_index(i, GRID)] == fits.popt[i, 1]
    np.testing.assert_array_equal(fits.map("error:a", (3, -1)), fits.errors[:, 0].reshape(3, 2))
    np.testing.assert_array_equal(fits.map("at_bound:tau", GRID), fits.at_bound[:, 1].reshape(GRID))
    np.testing.assert_array_equal(fits.map("redchi", 6), fits.redchi)
    assert fits.map("status", GRID).tolist() == np.array(fits.status, str).reshape(GRID).tolist()
    tau[0, 0] = -1.0  # a copy: the fits are not changed through it
    assert fits.popt[0, 1] != -1.0


@pytest.mark.parametrize(
    "name, shape, words",
    [
        ("v", GRID, r"name must be a parameter \('a', 'tau', 'c', 'slope'\), 'error:<name>'"),
        ("error:v", GRID, r"got 'error:v'"),
        (1, GRID, "got 1"),
        ("tau", (4, 2), r"shape \(4, 2\) holds 8 fits; this batch has 6"),
        ("tau", (4, -1), r"shape \(4, -1\) holds 4 x k fits; this batch has 6"),
        ("tau", 0, "shape must be a positive int or a tuple of them"),
        ("tau", (2, -1, -1), "one may be -1"),
        ("tau", (2.0, 3.0), "shape must be a positive int"),
        ("tau", True, "shape must be a positive int"),
    ],
)
def test_map_refuses_a_wrong_name_or_shape(fits, name, shape, words):
    with pytest.raises(ValueError, match=words):
        fits.map(name, shape)
