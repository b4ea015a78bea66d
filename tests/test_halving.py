"""The halving schedule inside the engine: who is pruned, what continues, resume, records."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NoCompile, assert_same_result, signal_at_step

import multistart as ms

# Four bowls of known depths on [0, 4]: the deepest (0) is at 3.1. Adam with a small step in
# the logit coordinates needs a few hundred steps to settle, so every rung is reached.
CENTRES = jnp.array([1.0, 1.7, 2.4, 3.1])
DEPTHS = jnp.array([3.0, 2.0, 1.0, 0.0])


def bowls(p):
    x = p["x"]
    return jnp.min(8.0 * (x - CENTRES) ** 2 + DEPTHS) + 0.0 * jnp.sum(p["y"])


SPACE = {"x": ms.Uniform(0.0, 4.0), "y": ms.Uniform(-1.0, 1.0)}
HALVING = ms.Halving(r0=8, eta=2, grace=1.0)
BASE = dict(
    n_starts=12,
    batch_size=4,
    n_steps=120,
    seed=3,
    n_candidates=0,
    learning_rate=0.03,
    convergence=ms.Convergence(window=20, rtol=1e-7, atol=1e-9),
)


@pytest.fixture(scope="module")
def fits():
    @functools.cache
    def fit(schedule="all", **kw):
        options = {**BASE, **kw}
        return ms.MultiStartAdam(**options, schedule=schedule).fit(bowls, SPACE)

    return fit


def test_halving_keeps_the_deepest_bowl_for_fewer_evaluations(fits):
    full, halved = fits("all"), fits(HALVING)
    assert np.isclose(full.best_fom, 0.0, atol=1e-3)
    assert halved.best_fom == full.best_fom
    assert halved.stats["n_evals"] < 0.7 * full.stats["n_evals"]
    assert halved.stats["n_pruned"] == int(np.sum(halved.status == "pruned")) > 0
    assert halved.config["schedule"] == HALVING.record()
    assert halved.config["schedule"]["r0"] == 8


def test_a_continued_start_follows_the_trajectory_it_would_have_had(fits):
    """Continuing is not restarting: every start's record up to where it stopped is the
    uninterrupted run's."""
    full, halved = fits("all"), fits(HALVING)
    for i in range(full.n_starts):
        k = int(halved.n_steps[i])
        rows = int(np.searchsorted(halved.history_steps, k, side="right"))
        np.testing.assert_array_equal(halved.history[:rows, i], full.history[:rows, i])
        if halved.status[i] != "pruned":
            assert halved.foms[i] == full.foms[i] and halved.n_steps[i] == full.n_steps[i]
        else:
            assert halved.n_steps[i] < full.n_steps[i]
            assert halved.foms[i] == full.history[rows - 1, i]


def test_pruned_starts_keep_their_records(fits):
    halved = fits(HALVING)
    pruned = halved.status == "pruned"
    assert np.all(np.isfinite(halved.foms[pruned]))
    assert np.all(halved.n_evals[pruned] >= HALVING.r0)
    rungs = halved.stats["rungs"]
    assert rungs["evals"][:2] == [8, 16] and sum(rungs["pruned"]) == int(pruned.sum())
    assert halved.stats["evals_to_best"] <= halved.stats["n_evals"]


def test_halving_does_not_depend_on_the_batch_size(fits):
    assert_same_result(fits(HALVING), fits(HALVING, batch_size=5))


def test_rank_alone_prunes_more(fits):
    """``grace`` keeps a start whose figure of merit still falls fast; without it the first
    rung prunes by rank alone, so more starts go there and fewer evaluations are made."""
    lenient, strict = fits(HALVING), fits(ms.Halving(r0=8, eta=2, grace=0.0))
    assert strict.stats["rungs"]["pruned"][0] > lenient.stats["rungs"]["pruned"][0]
    assert strict.stats["n_pruned"] >= lenient.stats["n_pruned"]
    assert strict.stats["n_evals"] < lenient.stats["n_evals"]


def test_the_scan_backend_prunes_as_the_loop_does(fits):
    assert_same_result(fits(HALVING), fits(HALVING, backend="scan"))


def _spy_on_the_queue(monkeypatch) -> list[tuple[int, np.ndarray, dict]]:
    """``(step, rows, starts)`` for every ``queue.take`` a refill makes, in order."""
    from multistart.starts import refill

    taken, original = [], refill.Refiller.refill

    def spied(self, pop, lineage, rows, short, step, ended):
        take = self.queue.take

        def recording(m, best=None):
            starts = take(m, best)
            taken.append((step, np.array(rows), starts))
            return starts

        self.queue.take = recording
        try:
            return original(self, pop, lineage, rows, short, step, ended)
        finally:
            del self.queue.take

    monkeypatch.setattr(refill.Refiller, "refill", spied)
    return taken


def _each_new_start_is_the_queues_next(result, taken) -> None:
    """Every start begun in a freed slot is the point the queue handed out for that slot, in
    the queue's order; and every point handed out ran."""
    begun = [q for q in result.incarnations if q["incarnation"] > 0]
    assert len(begun) == sum(len(rows) for _, rows, _ in taken) > 0
    for step, rows, starts in taken:
        for k, slot in enumerate(rows):
            (q,) = [r for r in begun if r["slot"] == slot and r["started_at"] == step]
            for name in SPACE:
                got, want = np.asarray(q["start_params"][name]), np.asarray(starts[name])[k]
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=str((step, slot)))


def _pruned_and_replaced(result) -> list[dict]:
    """The pruned starts that gave their slot to the next start from the queue, each checked to
    be followed in its slot by a start begun at the sync that pruned it."""
    pruned = [r for r in result.incarnations if r["status"] == "pruned"]
    for r in pruned:
        (after,) = [
            q
            for q in result.incarnations
            if q["slot"] == r["slot"] and q["incarnation"] == r["incarnation"] + 1
        ]
        assert r["replaced_at"] is not None and after["started_at"] == r["replaced_at"], (r, after)
        assert r["n_evals"] >= HALVING.r0  # it was pruned at a rung
    # every start the schedule pruned is either a replaced one or a slot's last
    still = int(np.sum(result.status == "pruned"))
    assert result.stats["n_pruned"] == len(pruned) + still
    return pruned


def test_a_pruned_slot_takes_tiktak_s_next_start(monkeypatch):
    taken = _spy_on_the_queue(monkeypatch)
    options = {**BASE, "start_strategy": "tiktak", "n_candidates": 48}
    halved = ms.MultiStartAdam(**options, schedule=HALVING).fit(bowls, SPACE)
    assert _pruned_and_replaced(halved)
    _each_new_start_is_the_queues_next(halved, taken)
    # a slot stays pruned only once TikTak's queue ran out (every local search of n_local ran)
    if np.any(halved.status == "pruned"):
        assert halved.stats["n_local"] == halved.config["n_local"]
    assert halved.stats["n_local"] == halved.n_starts + halved.stats["n_resurrections"]
    assert np.isclose(halved.best_fom, 0.0, atol=1e-3)


def test_a_pruned_slot_takes_resurrection_s_next_start(monkeypatch):
    # with no filter, resurrection's reserve is fresh draws: it never runs out, so every slot
    # pruned before the last sync runs a further start
    taken = _spy_on_the_queue(monkeypatch)
    halved = ms.MultiStartAdam(**BASE, resurrect=2, schedule=HALVING).fit(bowls, SPACE)
    assert _pruned_and_replaced(halved) and not np.any(halved.status == "pruned")
    _each_new_start_is_the_queues_next(halved, taken)
    assert halved.stats["n_resurrections"] == len(halved.incarnations) - np.sum(
        halved.resurrections > 0
    )


def rosenbrock(p):
    x = p["x"]
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def test_a_continued_lbfgs_start_keeps_its_memory_and_line_search():
    """L-BFGS carries a memory and a line search across steps: a start that continues past a
    rung follows the uninterrupted run's trajectory exactly."""
    space = {"x": ms.Uniform(-2.0, 2.0, shape=(4,))}
    base = dict(n_starts=8, batch_size=4, n_steps=80, seed=1, n_candidates=0)
    full = ms.MultiStartLBFGS(**base).fit(rosenbrock, space)
    halved = ms.MultiStartLBFGS(**base, schedule=ms.Halving(r0=6, eta=2)).fit(rosenbrock, space)
    assert halved.stats["n_pruned"] > 0
    kept = halved.status != "pruned"
    # the kept starts continued past at least one rung (a sync where others were pruned)
    assert kept.sum() >= 2 and np.all(halved.rung[kept] >= 1)
    np.testing.assert_array_equal(halved.foms[kept], full.foms[kept])
    np.testing.assert_array_equal(halved.n_evals[kept], full.n_evals[kept])
    # and step by step: every recorded best so far of a kept start is the uninterrupted run's
    rows = halved.history_steps.size
    np.testing.assert_array_equal(halved.history_steps, full.history_steps[:rows])
    np.testing.assert_array_equal(halved.history[:, kept], full.history[:rows, kept])


@pytest.mark.parametrize("stop_at", [17, 32])  # mid-rung, and on a sync that prunes
def test_resume_mid_rung_is_bit_identical(tmp_path, fits, stop_at):
    pytest.importorskip("orbax.checkpoint")
    full = fits(HALVING)
    # the uninterrupted run prunes a start at step 32 (its third rung), none at step 17
    pruned_here = (full.status == "pruned") & (full.n_steps == stop_at)
    assert pruned_here.any() == (stop_at == 32)
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=50)
    options = {**BASE, "schedule": HALVING, **ck}
    ms.MultiStartAdam(**{**options, "n_steps": stop_at}).fit(bowls, SPACE)
    resumed = ms.MultiStartAdam(**options).fit(bowls, SPACE, resume=True)
    assert resumed.stats["resumed_from"] == stop_at
    assert_same_result(full, resumed)
    assert resumed.stats["rungs"] == full.stats["rungs"]
    assert resumed.stats["evals_to_best"] == full.stats["evals_to_best"]


def test_bad_schedules_are_refused_before_any_compile():
    with NoCompile():
        with pytest.raises(ValueError, match="schedule must be 'all', 'halving'"):
            ms.MultiStartAdam(schedule="fast")
        with pytest.raises(ValueError, match="Halving.r0 must be an int >= 1"):
            ms.Halving(r0=0)
        with pytest.raises(ValueError, match="Halving.eta must be an int >= 2"):
            ms.Halving(eta=1.5)
        with pytest.raises(ValueError, match="Halving.grace"):
            ms.Halving(grace=-1.0)
        with pytest.raises(ValueError, match="schedule='halving'"):
            ms.MultiStartAdam(n_starts=4, schedule="halving").fit(bowls, SPACE, part=(0, 2))


def test_the_progress_line_shows_the_rungs(caplog, monkeypatch):
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    with caplog.at_level("INFO", logger="multistart"):
        ms.MultiStartAdam(**{**BASE, "log_every": 20}, schedule=HALVING).fit(bowls, SPACE)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 20/")]
    assert lines and "rungs 2:" in lines[0] and "pruned 8" in lines[0], lines


def test_rung_occupancy_in_words():
    from multistart.host.schedule import Rungs

    r = Rungs(np.array([0, 1, 1, 2]), np.zeros(4), np.zeros(4, bool), pruned=(3, 1))
    running = np.array([ms.Status.RUNNING.code] * 3 + [ms.Status.PRUNED.code])
    assert r.occupancy(running) == "rungs 0:1 1:2, pruned 4"


def test_each_start_s_rung_is_in_the_table_and_the_file(fits, tmp_path):
    halved, full = fits(HALVING), fits("all")
    assert full.rung is None and "rung" not in full.to_dataframe()
    table = halved.to_dataframe()
    np.testing.assert_array_equal(table["rung"], halved.rung)
    # a pruned start's rung is the one that pruned it: it made at least that many evaluations
    pruned = halved.status == "pruned"
    assert np.all(halved.n_evals[pruned] >= HALVING.r0 * HALVING.eta ** halved.rung[pruned])
    halved.save(tmp_path / "r.npz", errors=False)
    again = ms.Result.load(tmp_path / "r.npz")
    assert_same_result(halved, again)
    np.testing.assert_array_equal(again.rung, halved.rung)


def test_the_figure_shows_the_rungs(fits):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = fits(HALVING).plot()
    labels = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    assert labels[:2] == ["rung 0: 4 pruned", "rung 1: 4 pruned"], labels


# -- the race with L-BFGS's default starts (band_tiktak's refills), issue 73 -------------------


def _image(n_blobs: int, side: int, elliptical: bool):
    """``(chi2, space)`` of ``n_blobs`` Gaussians on a ``side`` x ``side`` image (noise 0.05):
    a small cousin of ``profiling/image_model.py``."""
    c = (np.arange(side) + 0.5) / side * 2.0 - 1.0
    yy, xx = np.meshgrid(c, c, indexing="ij")
    rng = np.random.default_rng(1)
    k = n_blobs
    truth = {
        "x": rng.uniform(-0.6, 0.6, k),
        "y": rng.uniform(-0.6, 0.6, k),
        "flux": rng.uniform(1.0, 5.0, k),
        "size": rng.uniform(0.08, 0.2, k),
    }
    space = {
        "x": ms.Uniform(-0.8, 0.8, shape=(k,)),
        "y": ms.Uniform(-0.8, 0.8, shape=(k,)),
        "flux": ms.LogUniform(0.2, 20.0, shape=(k,)),
        "size": ms.LogUniform(0.03, 0.4, shape=(k,)),
    }
    if elliptical:
        truth.update(q=rng.uniform(0.3, 0.9, k), theta=rng.uniform(0.1, 3.0, k))
        space.update(q=ms.Uniform(0.2, 1.0, shape=(k,)), theta=ms.Uniform(0.0, np.pi, shape=(k,)))

    def render(p):
        dx, dy = xx[..., None] - p["x"], yy[..., None] - p["y"]
        if elliptical:
            c, s = jnp.cos(p["theta"]), jnp.sin(p["theta"])
            dx, dy = c * dx + s * dy, (-s * dx + c * dy) / p["q"]
        return jnp.sum(p["flux"] * jnp.exp(-0.5 * (dx**2 + dy**2) / p["size"] ** 2), -1)

    img = np.asarray(render(truth)) + rng.normal(0.0, 0.05, xx.shape)

    def chi2(p):
        return jnp.sum(((render(p) - img) / 0.05) ** 2)

    return chi2, space


# Four elliptical blobs (24 parameters): L-BFGS's local searches run hundreds of evaluations,
# most to n_steps (the 48-parameter image fit's regime). Five round ones (20 parameters): most
# end on their own within 60-170, so band_tiktak's refills run (the global suite's regime).
LONG, SHORT = _image(4, 16, elliptical=True), _image(5, 20, elliptical=False)
DEFAULTS = dict(n_starts=8, batch_size=4, n_steps=400, seed=0, log_every=0)


@pytest.fixture(scope="module")
def default_fits():
    @functools.cache
    def fit(problem: str, schedule: str = "all", **kw):
        chi2, space = {"long": LONG, "short": SHORT}[problem]
        with jax.enable_x64(True):
            search = ms.MultiStartLBFGS(**DEFAULTS, **kw, schedule=schedule)
            return search.fit(chi2, space)

    return fit


def test_a_race_with_the_default_starts_spends_fewer_evaluations_and_keeps_the_best(
    default_fits,
):
    """Long local searches: the race keeps the evaluations it saves (its pruned slots take no
    start, as no search that ended on its own was short), where refilling them spent the
    whole budget and more (3,700 evaluations against 3,200 before issue 73); the start that
    ends best is kept, so the best is ``"all"``'s, bit for bit."""
    full, raced = default_fits("long"), default_fits("long", "halving")
    assert raced.stats["start_strategy"] == full.stats["start_strategy"] == "band_tiktak"
    assert raced.best_fom == full.best_fom
    assert raced.stats["n_evals"] < 0.5 * full.stats["n_evals"]
    assert raced.stats["n_pruned"] > 0 and np.sum(raced.status == "pruned") > 0
    assert raced.stats["n_local"] == raced.n_starts  # no pruned slot took a start


def test_pruned_slots_take_starts_once_searches_that_ended_on_their_own_were_short(
    default_fits,
):
    raced = default_fits("short", "halving")
    incs = raced.incarnations
    own = [q for q in incs if q["status"] != "pruned" and q["replaced_at"] is not None]
    pruned = [q for q in incs if q["status"] == "pruned" and q["replaced_at"] is not None]
    assert own and pruned and raced.stats["short_searches"]
    first_own_end = min(q["replaced_at"] for q in own)
    assert np.mean([q["n_evals"] for q in own]) <= 300  # band_tiktak's gate
    # the queue learns a search's length when its slot is refilled: pruned slots wait for it
    assert min(q["replaced_at"] for q in pruned) > first_own_end
    # (pruned at step started_at + n_evals: one evaluation a step)
    assert any(q["replaced_at"] > q["started_at"] + q["n_evals"] for q in pruned)
    assert raced.stats["n_local"] > raced.n_starts
    # the same minimum as "all" (found by another search: equal to rounding)
    assert raced.best_fom == pytest.approx(default_fits("short").best_fom, rel=1e-12)


@pytest.mark.parametrize("problem, stop_at", [("short", 60), ("short", 150), ("long", 35)])
def test_a_race_with_refills_resumes_bit_identically(
    tmp_path, monkeypatch, default_fits, problem, stop_at
):
    """Interrupted while pruned slots wait for the queue (60), among the refills of pruned and
    ended slots (150), and on the long fit after its rungs (35): the resumed Result is the
    uninterrupted one's."""
    pytest.importorskip("orbax.checkpoint")
    full = default_fits(problem, "halving")
    chi2, space = {"long": LONG, "short": SHORT}[problem]
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=25)
    with jax.enable_x64(True):
        with monkeypatch.context() as mp, pytest.raises(ms.SearchInterrupted):
            signal_at_step(mp, stop_at)
            ms.MultiStartLBFGS(**DEFAULTS, **ck, schedule="halving").fit(chi2, space)
        resumed = ms.MultiStartLBFGS(**DEFAULTS, **ck, schedule="halving").fit(
            chi2, space, resume=True
        )
    assert resumed.stats["resumed_from"] == stop_at
    assert_same_result(full, resumed)
    assert resumed.stats["rungs"] == full.stats["rungs"]
    assert resumed.stats["n_local"] == full.stats["n_local"]
