"""A search's tail swept narrower (issue 38, item 4): once few starts are running, they are
stepped at a narrower width, so a handful of long starts does not keep a wide chunk stepping;
by the step count alone, so a seed's results are deterministic and resume bit for bit."""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np
import pytest
from conftest import assert_same_result

import multistart as ms
from multistart.device import programs
from multistart.host import engine
from multistart.host.decide import TAIL_EVERY, TAIL_MIN_WIDTH

SPACE = {"x": ms.Uniform(-100.0, 100.0)}
# 240 starts next to the minimum end within a hundred steps; 16 far ones walk there at Adam's
# pace (0.5 a step): the tail, for several hundred steps
STARTS = {"x": np.concatenate([np.full(240, 1.0), np.linspace(80.0, 95.0, 16)])}


def bowl(p):
    return (p["x"] - 0.5) ** 2


def _fit(batch_size=256, resume=False, **kw):
    search = ms.MultiStartAdam(
        learning_rate=0.5,
        n_starts=256,
        batch_size=batch_size,
        n_steps=kw.pop("n_steps", 600),
        n_candidates=0,
        log_every=0,
        **kw,
    )
    with jax.enable_x64(True):
        return search.fit(bowl, SPACE, starts=STARTS, resume=resume)


@pytest.fixture(scope="module")
def tailed():
    return _fit()


def test_the_tail_is_swept_at_a_narrower_width_by_the_step_count(tailed):
    narrowed = tailed.stats["narrowed"]
    assert len(narrowed) == 1, narrowed
    (record,) = narrowed
    assert record["from"] == 256 and record["to"] == TAIL_MIN_WIDTH
    assert record["step"] % TAIL_EVERY == 0
    # the tail lasted one decision before it narrowed: at the step before, 16 were running
    ends = np.asarray(tailed.n_steps)
    assert np.sum(ends > record["step"] - TAIL_EVERY) <= TAIL_MIN_WIDTH
    assert np.sum(ends > record["step"] - 2 * TAIL_EVERY) > TAIL_MIN_WIDTH
    assert tailed.stats["batch_size"] == 256  # the search's own width, the tail's apart
    assert tailed.stats["n_compiles"] == 2  # the search's program and the tail's
    # far starts walk on after it, many steps at the narrow width
    assert ends.max() > record["step"] + 100


def test_the_narrow_tail_gives_the_results_a_fit_without_it_gives(tailed):
    narrow = _fit(batch_size=64)  # below 8 x 16: never narrows
    assert "narrowed" not in narrow.stats
    assert_same_result(tailed, narrow, exact=False, rtol=1e-12)
    again = _fit()
    assert again.stats["narrowed"] == tailed.stats["narrowed"]
    assert_same_result(tailed, again)  # deterministic


def test_a_search_resumed_after_its_tail_narrowed_ends_as_the_one_run(tailed, tmp_path):
    folder = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=50)
    first = _fit(n_steps=300, **folder)
    assert first.stats["narrowed"] == tailed.stats["narrowed"]
    resumed = _fit(**folder, resume=True)
    assert resumed.stats["resumed_from"] == 300
    # narrowed again at the step it resumed from, to the width the checkpoint recorded
    assert resumed.stats["narrowed"] == [{"step": 300, "from": 256, "to": TAIL_MIN_WIDTH}]
    assert_same_result(tailed, resumed)


def test_the_scan_backend_narrows_its_tail_alike(tailed):
    scanned = _fit(backend="scan")
    assert scanned.stats["narrowed"] == tailed.stats["narrowed"]
    assert_same_result(tailed, scanned, exact=False, rtol=1e-12)


@pytest.mark.parametrize("start_s, narrows", [(1e-3, True), (1e-9, False)])
def test_an_auto_width_narrows_only_where_its_prices_say_the_compile_is_repaid(
    tailed, monkeypatch, start_s, narrows
):
    """``"auto"``'s width choice prices the fit (seconds a start, a compile): with a start's
    step that dear, the ~500 steps left after the tail decision repay the narrow program; at a
    nanosecond they cannot, and the straggler steps on at the width swept (one program), its
    result as the narrowed run's to rounding. The price is injected, so nothing here is timed."""
    real = engine.resolve_width

    def priced(spec, *args, **kw):
        choice = real(256, *args, **kw)  # the width the tailed fit ran at, then its prices
        prices = {"n_steps": 600, "fit_s": 1.0, "compile_s": 1.0, "start_s": start_s}
        return dataclasses.replace(choice, tuning={"prices": prices})

    monkeypatch.setattr(engine, "resolve_width", priced)
    monkeypatch.setattr(programs, "_kept", collections.OrderedDict())  # no earlier choice
    fit = _fit(batch_size="auto")
    assert fit.stats["batch_size"] == 256
    if narrows:
        assert fit.stats["narrowed"] == tailed.stats["narrowed"]
        assert_same_result(tailed, fit)
    else:
        assert "narrowed" not in fit.stats and fit.stats["n_compiles"] == 1
        assert_same_result(tailed, fit, exact=False, rtol=1e-12)


def test_a_chip_narrows_no_unpriced_tail(tailed, monkeypatch):
    """On a chip an explicit width's tail (no price: nothing measured the compile it would
    cost, seconds to a minute there) is swept on at the width: one program, the same
    results. The CPU's narrowing is the fixture's."""
    from multistart.common import xla

    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    chip = _fit()
    assert "narrowed" not in chip.stats and chip.stats["n_compiles"] == 1
    assert_same_result(tailed, chip, exact=False, rtol=1e-12)
