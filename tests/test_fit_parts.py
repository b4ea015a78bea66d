"""ms.fit_parts through a concurrent.futures executor: merged as one run, failures kept apart.

The real engines (Ray, Dask, Slurm) run the same calls in tests/test_engines.py (slow tier).
"""

from __future__ import annotations

import functools
import signal
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from conftest import MULTIMODAL_SPACE, NoCompile, multimodal, signal_at_step
from test_parts import assert_same_run, search

import multistart as ms
from multistart.host.parts import _check_submit


@pytest.fixture(scope="module")
def whole():
    return search().fit(multimodal, MULTIMODAL_SPACE)


class Submits:
    """An executor's submit that records each part it is given and fails the parts in
    ``fail`` (their futures raise, as a lost task's do)."""

    def __init__(self, pool, fail=()):
        self.pool, self.fail, self.parts = pool, set(fail), []

    def __call__(self, fn, *args):
        part = args[3]
        self.parts.append(part)
        if part[0] in self.fail:
            future: Future = Future()
            future.set_exception(RuntimeError(f"node lost while part {part[0]} ran"))
            return future
        return self.pool.submit(fn, *args)


def test_parts_through_an_executor_merge_to_the_whole_run(whole):
    with ThreadPoolExecutor(2) as pool:
        submit = Submits(pool)
        merged = ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 3, submit=submit)
    assert submit.parts == [(0, 3), (1, 3), (2, 3)]
    assert merged.stats["n_parts"] == 3
    assert_same_run(merged, whole)


def test_a_failed_part_is_named_the_others_kept_and_only_it_is_run_again(whole):
    with ThreadPoolExecutor(2) as pool:
        first = Submits(pool, fail={1})
        with pytest.raises(ms.PartsFailed, match=r"part \[1\] of 3 failed.*node lost") as info:
            ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 3, submit=first)
        error = info.value
        assert error.missing == [1] and sorted(error.done) == [0, 2] and error.k == 3
        assert isinstance(error.failed[1], RuntimeError)
        again = Submits(pool)
        merged = ms.fit_parts(
            search(), multimodal, MULTIMODAL_SPACE, 3, submit=again, done=error.done
        )
    assert again.parts == [(1, 3)]  # only the missing part ran again
    assert_same_run(merged, whole)


def test_every_part_failing_keeps_nothing_and_names_them_all():
    with ThreadPoolExecutor(1) as pool, NoCompile():
        with pytest.raises(ms.PartsFailed, match=r"parts \[0, 1\] of 2 failed") as info:
            ms.fit_parts(
                search(), multimodal, MULTIMODAL_SPACE, 2, submit=Submits(pool, fail={0, 1})
            )
    assert info.value.done == {}


class InProcess:
    """An engine that runs each part here, at once, and hands back a finished future holding
    its Result or what it raised (a worker process's future carries a part's
    SearchInterrupted back the same way); the parts in ``sigterm`` get a real SIGTERM in
    their third step."""

    def __init__(self, monkeypatch, sigterm=()):
        self.monkeypatch, self.sigterm, self.parts = monkeypatch, set(sigterm), []

    def __call__(self, fn, *args):
        part = args[3]
        self.parts.append(part)
        future: Future = Future()
        with self.monkeypatch.context() as mp:
            if part[0] in self.sigterm:
                signal_at_step(mp, 3, signal.SIGTERM)
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - SearchInterrupted is no Exception
                future.set_exception(e)
        return future


def test_a_part_stopped_by_sigterm_is_that_parts_failure_and_the_others_are_kept(
    whole, monkeypatch
):
    first = InProcess(monkeypatch, sigterm={1})
    with pytest.raises(
        ms.PartsFailed,
        match=r"part \[1\] of 3 failed \(part 1: SearchInterrupted: search stopped by SIGTERM",
    ) as info:
        ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 3, submit=first)
    error = info.value
    assert first.parts == [(0, 3), (1, 3), (2, 3)]  # every part ran: none was abandoned
    assert error.missing == [1] and sorted(error.done) == [0, 2]
    stopped = error.failed[1]
    assert isinstance(stopped, ms.SearchInterrupted) and stopped.reason == "SIGTERM"
    assert stopped.result.n_starts == 2  # the part's slots 3 and 4, so far
    again = InProcess(monkeypatch)
    merged = ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 3, submit=again, done=error.done)
    assert again.parts == [(1, 3)]
    assert_same_run(merged, whole)


def test_done_of_another_configuration_is_refused_before_anything_is_submitted():
    other = search(seed=6).fit(multimodal, MULTIMODAL_SPACE, part=(0, 2))
    with (
        NoCompile(),
        pytest.raises(
            ValueError,
            match=r"done holds parts of another search than the one given \(another "
            r"configuration \(seed 6 -> 5\), from the parts' to the search's\)",
        ),
    ):
        ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 2, submit=_never, done=[other])
    mine = search().fit(multimodal, MULTIMODAL_SPACE, part=(1, 2))
    with (
        NoCompile(),
        pytest.raises(
            ValueError,
            match=r"done holds parts of different searches: part 1 of 2 is of another search "
            r"than part 0: another configuration \(seed 6 -> 5\)",
        ),
    ):
        ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 2, submit=_never, done=[mine, other])


def test_a_saved_part_of_the_same_search_is_taken_as_done(whole, tmp_path):
    """A loaded part's configuration is JSON (tuples as lists): the check before submitting
    compares it as the merge does, so the search's own saved part is not refused."""
    search().fit(multimodal, MULTIMODAL_SPACE, part=(2, 3)).save(tmp_path / "part-2.npz")
    loaded = ms.Result.load(tmp_path / "part-2.npz")
    with ThreadPoolExecutor(2) as pool:
        submit = Submits(pool)
        merged = ms.fit_parts(
            search(), multimodal, MULTIMODAL_SPACE, 3, submit=submit, done=[loaded]
        )
    assert submit.parts == [(0, 3), (1, 3)]
    assert_same_run(merged, whole)


def _never(fn, *args):
    raise AssertionError("submitted although the arguments were bad")


@pytest.mark.parametrize(
    "change, error, words",
    [
        (dict(k=0), ValueError, r"1 <= k <= n_starts \(7\)"),
        (dict(k=8), ValueError, r"1 <= k <= n_starts \(7\)"),
        (dict(k=True), TypeError, "k .the number of parts. must be an int"),
        (dict(k=1.5), TypeError, "k .the number of parts. must be an int"),
        (dict(search=search(resurrect=1)), ValueError, "resurrect"),
        (dict(search="adam"), TypeError, "search must be a multistart search"),
        (dict(submit=None), TypeError, "submit must be callable"),
        (
            dict(submit=lambda fn, args: None),  # multiprocessing's apply_async(fn, args)
            TypeError,
            r"submit must be callable as submit\(fn, \*args\) and return a future .*"
            r"<lambda>\(fn, args\) cannot take fit_parts' submit\(run_part, search, "
            r"objective, space, \(i, k\), fit_kwargs\): too many positional arguments",
        ),
        (
            dict(submit=lambda fn, *args, key: None),
            TypeError,
            r"<lambda>\(fn, \*args, key\) cannot take .*missing a required argument: 'key'",
        ),
        (dict(part=(0, 3)), TypeError, "drop part="),
        (dict(startz=None), TypeError, "refuses them.*startz"),
        (dict(done=["part-0.npz"]), TypeError, r"done\[0\] is not the Result of a part"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_submitted(change, error, words):
    kw = dict(search=search(), objective=multimodal, space=MULTIMODAL_SPACE, k=3, submit=_never)
    kw.update(change)
    with NoCompile(), pytest.raises(error, match=words):
        ms.fit_parts(**kw)


def test_done_with_a_part_twice_or_of_another_k_is_refused(whole):
    part = search().fit(multimodal, MULTIMODAL_SPACE, part=(0, 3))
    with NoCompile():
        with pytest.raises(ValueError, match=r"done holds part 0 of 3 twice"):
            ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 3, submit=_never, done=[part] * 2)
        with pytest.raises(ValueError, match=r"done\[0\] is part 0 of 3, not of k=2"):
            ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 2, submit=_never, done=[part])
        with pytest.raises(TypeError, match="not a future with .result"):
            ms.fit_parts(search(), multimodal, MULTIMODAL_SPACE, 3, submit=lambda fn, *a: 42)


def test_the_engines_submits_take_a_part():
    """The signatures fit_parts is documented with pass the check; a callable without a
    signature Python can read is left to its call."""
    with ThreadPoolExecutor(1) as pool:
        for submit in [
            pool.submit,  # (fn, /, *args, **kwargs)
            functools.partial(pool.submit),
            lambda fn, *a: pool.submit(fn, *a),  # Ray's one line
            max,  # no signature to read
        ]:
            _check_submit(submit)
