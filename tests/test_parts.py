"""Runs that merge: fit(..., part=(i, k)), Result.merge, and ms.distributed.initialize."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import (
    MULTIMODAL_SPACE,
    NoCompile,
    assert_same_result,
    multimodal,
    run_two_processes,
    same_result,
)

import multistart as ms
from multistart.device.chunking import part_slots

REPO = Path(__file__).resolve().parents[1]

# 7 starts in 3 parts (3, 2, 2 slots), the broad-start filter on (its default), and a
# convergence window short enough that starts end at different steps, so parts' histories
# differ in length and the merge must pad them.
KW = dict(
    n_starts=7,
    batch_size=2,
    n_steps=120,
    seed=5,
    log_every=0,
    convergence=ms.Convergence(window=10, rtol=1e-4, atol=1e-6),
)


def search(**kw):
    return ms.MultiStartAdam(learning_rate=0.1, **{**KW, **kw})


@pytest.fixture(scope="module")
def runs():
    whole = search().fit(multimodal, MULTIMODAL_SPACE)
    parts = [search().fit(multimodal, MULTIMODAL_SPACE, part=(i, 3)) for i in range(3)]
    return whole, parts


def assert_same_run(merged: ms.Result, whole: ms.Result) -> None:
    assert same_result(merged, whole)
    np.testing.assert_array_equal(merged.n_evals, whole.n_evals)
    np.testing.assert_array_equal(merged.at_bound, whole.at_bound)
    np.testing.assert_array_equal(merged.history_steps, whole.history_steps)
    assert merged.best_index == whole.best_index
    assert merged.best_fom == whole.best_fom
    assert_same_result(merged, whole)
    assert merged.config == whole.config and merged.paths == whole.paths
    assert merged.stats["identity"] == whole.stats["identity"]
    assert merged.stats["n_evals"] == whole.stats["n_evals"]


def test_slots_split_as_numpy_array_split():
    for n in range(1, 12):
        for k in range(1, n + 1):
            split = np.array_split(np.arange(n), k)
            assert [part_slots(i, k, n) for i in range(k)] == [
                (int(s[0]), int(s[-1]) + 1) for s in split
            ]


def test_three_parts_merge_to_the_whole_run(runs):
    whole, parts = runs
    assert [p.stats["part"] for p in parts] == [[0, 3], [1, 3], [2, 3]]
    assert [p.stats["slots"] for p in parts] == [[0, 3], [3, 5], [5, 7]]
    assert [p.n_starts for p in parts] == [3, 2, 2]
    assert whole.stats["n_candidates"] > 7  # the filter ranked candidates for every part
    assert len({p.history.shape[0] for p in parts}) > 1  # the merge pads a shorter history
    merged = ms.Result.merge([parts[2], parts[0], parts[1]])  # any order
    assert_same_run(merged, whole)
    assert merged.stats["n_parts"] == 3 and "part" not in merged.stats
    assert merged.stats["wall_s"] == max(p.stats["wall_s"] for p in parts)
    assert merged.stats["stop_reason"] == whole.stats["stop_reason"]


def test_a_part_rerun_alone_merges_with_saved_parts(runs, tmp_path):
    whole, parts = runs
    paths = []
    for i, p in enumerate(parts):
        paths.append(tmp_path / f"part-{i}.npz")
        p.save(paths[-1])
    again = search().fit(multimodal, MULTIMODAL_SPACE, part=(1, 3))  # as if part 1 had failed
    merged = ms.Result.merge([str(paths[0]), again, paths[2]])
    assert_same_run(merged, whole)
    merged.save(tmp_path / "merged.npz")
    loaded = ms.Result.load(tmp_path / "merged.npz")
    assert same_result(loaded, whole) and loaded.stats["n_parts"] == 3


@pytest.mark.parametrize(
    "part", [(3, 3), (0, 0), (-1, 2), (0, 8), (1.0, 2), (True, 2), (0, 1, 2), "01", 1]
)
def test_a_bad_part_is_refused_before_any_compile(part):
    with NoCompile(), pytest.raises(ValueError, match="part"):
        search().fit(multimodal, MULTIMODAL_SPACE, part=part)


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"resurrect": 1}, "resurrect"),
        ({"start_strategy": "tiktak"}, "tiktak"),
        ({"target_fom": 0.0}, "target_fom"),
        ({"max_evals": 100}, "max_evals"),
    ],
)
def test_parts_of_a_search_that_couples_its_slots_are_refused(kw, word):
    with NoCompile(), pytest.raises(ValueError, match=word):
        search(**kw).fit(multimodal, MULTIMODAL_SPACE, part=(0, 2))


def _edited(result: ms.Result, **stats) -> ms.Result:
    edited = result.with_stats(**stats)  # a copy, its problem still attached
    return dataclasses.replace(edited, config=dict(result.config), uncertainty=edited._uncertainty)


def test_merging_parts_of_different_searches_is_refused(runs):
    _, parts = runs

    def shifted(p):
        return multimodal(p) + 0.5 * p["n"]

    other_model = search().fit(shifted, MULTIMODAL_SPACE, part=(1, 3))
    with pytest.raises(ValueError, match="another model"):
        ms.Result.merge([parts[0], other_model, parts[2]])
    other_seed = _edited(parts[1])
    other_seed.config["seed"] = 6
    with pytest.raises(ValueError, match="seed 5 -> 6"):
        ms.Result.merge([parts[0], other_seed, parts[2]])
    other_plan = _edited(parts[1], plan="0" * 64)  # the same search from other user starts
    with pytest.raises(ValueError, match="start plan"):
        ms.Result.merge([parts[0], other_plan, parts[2]])


def test_missing_duplicated_or_mixed_parts_are_refused(runs):
    whole, parts = runs
    with pytest.raises(ValueError, match=r"part \[1\] of 3 missing"):
        ms.Result.merge([parts[0], parts[2]])
    with pytest.raises(ValueError, match=r"part \[2\] of 3 given twice"):
        ms.Result.merge([parts[0], parts[1], parts[2], parts[2]])
    with pytest.raises(ValueError, match=r"different numbers of parts: \[2, 3\]"):
        ms.Result.merge([parts[0], _edited(parts[1], part=[1, 2]), parts[2]])
    with pytest.raises(ValueError, match="not a part"):
        ms.Result.merge([whole])
    with pytest.raises(ValueError, match="at least one part"):
        ms.Result.merge([])


def test_initialize_selects_gloo_and_passes_its_arguments_through(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
    before = jax.config.jax_cpu_collectives_implementation
    try:
        jax.config.update("jax_cpu_collectives_implementation", None)
        ms.distributed.initialize("127.0.0.1:1234", num_processes=2, process_id=1)
        assert jax.config.jax_cpu_collectives_implementation == "gloo"
        jax.config.update("jax_cpu_collectives_implementation", "mpi")  # a user's choice stays
        ms.distributed.initialize()
        assert jax.config.jax_cpu_collectives_implementation == "mpi"
    finally:
        jax.config.update("jax_cpu_collectives_implementation", before)
    assert calls == [(("127.0.0.1:1234",), {"num_processes": 2, "process_id": 1}), ((), {})]


_WORKER = r"""
import importlib.util
import sys
import multistart as ms

address, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ms.distributed.initialize(
    coordinator_address=address, num_processes=2, process_id=process_id,
    initialization_timeout=60,
)
import jax
assert jax.process_count() == 2, jax.process_count()
sys.path.insert(0, sys.argv[4])
from test_parts import search
from conftest import MULTIMODAL_SPACE, multimodal

part = (jax.process_index(), jax.process_count())
assert importlib.util.find_spec("orbax") is not None  # the refusal below is the search's own
try:  # a part's arrays are this process's own: orbax's multi-host saves cannot write them
    search(checkpoint_dir=sys.argv[3] + ".ckpt").fit(multimodal, MULTIMODAL_SPACE, part=part)
except ValueError as e:
    assert "checkpoint_dir with part= is not supported" in str(e), e
else:
    raise AssertionError("checkpoint_dir was accepted in a job of two processes")
search().fit(multimodal, MULTIMODAL_SPACE, part=part).save(out)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_processes_each_run_a_part_and_the_parts_merge(tmp_path, runs):
    pytest.importorskip("orbax.checkpoint")  # the workers check the refusal of checkpoint_dir
    outs = [tmp_path / f"part-{i}.npz" for i in range(2)]
    run_two_processes(_WORKER, lambda i: [outs[i], REPO / "tests"])
    merged = ms.Result.merge(outs)
    whole = runs[0]  # the whole search, fitted here once for every test of the file
    assert same_result(merged, whole)
    assert merged.stats["identity"] == whole.stats["identity"]


def test_a_part_resumes_its_own_checkpoint_and_refuses_another_parts(runs, tmp_path):
    pytest.importorskip("orbax.checkpoint")
    whole, parts = runs
    kw = dict(checkpoint_dir=tmp_path, checkpoint_every=40)
    search(**kw).fit(multimodal, MULTIMODAL_SPACE, part=(0, 3))
    resumed = search(**kw).fit(multimodal, MULTIMODAL_SPACE, part=(0, 3), resume=True)
    assert resumed.stats["resumed_from"] > 0 and same_result(resumed, parts[0])
    with pytest.raises(ms.CheckpointMismatch, match=r"part \[0, 3\] -> \[1, 3\]"):
        search(**kw).fit(multimodal, MULTIMODAL_SPACE, part=(1, 3), resume=True)
