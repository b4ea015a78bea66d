"""ms.fit_parts through a concurrent.futures executor: merged as one run, failures kept apart.

The real engines (Ray, Dask, Slurm) run the same calls in tests/test_engines.py (slow tier).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from conftest import MULTIMODAL_SPACE, NoCompile, multimodal
from test_parts import assert_same_run, search

import multistart as ms


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


def test_done_of_another_search_is_refused_by_the_merge_naming_what_differs():
    with ThreadPoolExecutor(1) as pool:
        other = search(seed=6).fit(multimodal, MULTIMODAL_SPACE, part=(0, 2))
        with pytest.raises(ValueError, match="seed 6 -> 5|seed 5 -> 6"):
            ms.fit_parts(
                search(), multimodal, MULTIMODAL_SPACE, 2, submit=pool.submit, done=[other]
            )


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
