"""The merge of a search's parts (``fit(..., part=(i, k))``): the Result one run would have given.

Starts never interact, so each start's record in a part is the one the whole run gives that
slot (:mod:`multistart.host.parts`), and the merge is a concatenation in slot order: histories
joined, the best fit chosen again, the statistics added up where each part paid them. The
bookkeeping here is NumPy on saved values: nothing compiles.
"""

from __future__ import annotations

import copy
import json
import numbers
import os
from typing import Any

import jax
import numpy as np

from ..common.tolerance import lowest_finite
from ..device.chunking import part_slots

__all__ = ["merge", "best_fit", "best_rows", "difference", "config_difference"]

# Per-part statistics the merge adds up (each part paid them) or takes the largest of (the
# parts ran side by side); the others are kept where every part agrees.
_SUMMED = (
    "n_evals",
    "n_chunk_calls",
    "n_compiles",
    "n_tune_compiles",
    "n_compiles_total",
    "n_cache_hits",
    "n_filter_compiles",
)
_LARGEST = (
    "wall_s",
    "compile_s",
    "loop_s",
    "select_s",
    "first_step_s",
    "filter_s",
    "filter_compile_s",
    "n_steps_run",
)
_PER_PART = ("part", "slots", "wall_s", "n_evals", "stop_reason", "batch_size", "n_compiles")
_PART_ONLY = ("part", "slots", "plan", "identity", "whole_config")


def merge(cls, parts) -> Any:
    """The Result one run would have given, from its parts (see :meth:`Result.merge`)."""
    parts = _load(cls, parts)
    k = _check_together(parts)
    parts = sorted(parts, key=lambda r: r.stats["part"][0])
    n = sum(p.n_starts for p in parts)
    for p in parts:
        i = p.stats["part"][0]
        expected = part_slots(i, k, n)
        if tuple(p.stats["slots"]) != expected or p.n_starts != expected[1] - expected[0]:
            raise ValueError(
                f"part {i} of {k} holds slots {p.stats['slots']} ({p.n_starts} starts); "
                f"a part {i} of {n} starts holds {list(expected)}"
            )
    first = parts[0]

    def cat(name):
        return np.concatenate([np.asarray(getattr(p, name)) for p in parts])

    def cat_tree(name):
        trees = [getattr(p, name) for p in parts]
        return jax.tree_util.tree_map(lambda *a: np.concatenate([np.asarray(x) for x in a]), *trees)

    history, history_steps = _histories(parts)
    rungs = [p.rung for p in parts]
    foms, params = cat("foms").astype(np.float64, copy=False), cat_tree("params")
    # the best part's problem and covariance are the merged best's
    holder = next((p for p in parts if _holds(p, best_fit(foms, params)[0])), None)
    result = cls.of(
        foms=foms,
        params=params,
        start_params=cat_tree("start_params"),
        status=cat("status"),
        n_steps=cat("n_steps"),
        best_step=cat("best_step"),
        history=history,
        history_steps=history_steps,
        n_evals=cat("n_evals"),
        at_bound=cat("at_bound"),
        resurrections=cat("resurrections"),
        rung=None if any(r is None for r in rungs) else np.concatenate(rungs),
        stats=_stats(parts, k),
        paths=first.paths,
        config=dict(first.config),
        uncertainty=None if holder is None else copy.copy(holder._uncertainty),
    )
    return result.with_stats(n_distinct_minima=result.n_distinct_minima())  # the whole run's


def _load(cls, parts) -> list:
    if isinstance(parts, (str, os.PathLike, cls)):
        raise TypeError("Result.merge takes a list of parts (Results or saved paths)")
    out = [cls.load(p) if isinstance(p, (str, os.PathLike)) else p for p in parts]
    if not out:
        raise ValueError("Result.merge needs at least one part; got none")
    for j, p in enumerate(out):
        if not isinstance(p, cls):
            raise TypeError(f"parts[{j}] is a {type(p).__name__}, not a multistart.Result")
        if "part" not in p.stats:
            raise ValueError(
                f"parts[{j}] is not a part of a search (no stats['part']): merge the Results "
                "of fit(..., part=(i, k))"
            )
    return out


def _check_together(parts) -> int:
    """``k``, once every part is of one search and each of ``0..k-1`` is there once."""
    counts = sorted({int(p.stats["part"][1]) for p in parts})
    if len(counts) > 1:
        raise ValueError(f"the parts split the search in different numbers of parts: {counts}")
    k = counts[0]
    first = parts[0]
    for j, p in enumerate(parts[1:], start=1):
        what = difference(first, p)
        if what is not None:
            raise ValueError(
                f"parts[{j}] (part {p.stats['part'][0]}) is of another search than parts[0] "
                f"(part {first.stats['part'][0]}): {what}"
            )
    seen = [int(p.stats["part"][0]) for p in parts]
    twice = sorted({i for i in seen if seen.count(i) > 1})
    if twice:
        raise ValueError(f"part{'s' if len(twice) > 1 else ''} {twice} of {k} given twice")
    missing = sorted(set(range(k)) - set(seen))
    if missing:
        raise ValueError(
            f"part{'s' if len(missing) > 1 else ''} {missing} of {k} missing; run "
            f"{'them' if len(missing) > 1 else 'it'} (fit(..., part=(i, {k}))) and merge again"
        )
    return k


def difference(a, b) -> str | None:
    """What makes two parts parts of different searches, in words (``None``: the same)."""
    ia, ib = a.stats.get("identity", {}), b.stats.get("identity", {})
    if ia.get("model") != ib.get("model"):
        return "another model (its figure of merit, data, space or dtype differ)"
    if list(a.paths) != list(b.paths):
        return f"other parameters ({list(a.paths)} -> {list(b.paths)})"
    what = config_difference(a.config, b.config)
    if what is not None:
        return what
    if ia.get("rule") != ib.get("rule"):
        return "another rule or hyperparameters (the compiled step differs)"
    if a.stats.get("plan") != b.stats.get("plan"):
        return "another start plan (other user starts?)"
    return None


def config_difference(a: dict, b: dict) -> str | None:
    """Two searches' configurations (a Result's ``config``) compared, in words: ``"another
    configuration (seed 7 -> 8)"``, or ``None`` where they are the same. A saved Result's
    configuration is JSON (its tuples lists), so both are compared as JSON text (where a
    ``nan`` equals a ``nan``)."""
    a, b = _as_json(a), _as_json(b)
    keys = sorted(set(a) | set(b))
    changed = [key for key in keys if _text(a.get(key)) != _text(b.get(key))]
    if not changed:
        return None
    words = [f"{key} {a.get(key)!r} -> {b.get(key)!r}" for key in changed]
    return "another configuration (" + "; ".join(words) + ")"


def _as_json(config: dict) -> dict:
    return json.loads(_text(config))


def _text(value) -> str:
    return json.dumps(value, sort_keys=True, default=_plain)


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _holds(part, index: int) -> bool:
    lo, hi = part.stats["slots"]
    return lo <= index < hi


def _histories(parts) -> tuple[np.ndarray, np.ndarray]:
    """Histories side by side; a part that ended sooner carries its last row forward, as the
    whole run's history does for starts that ended."""
    longest = max(parts, key=lambda p: (len(p.history_steps), _last(p.history_steps)))
    rows = len(longest.history_steps)
    blocks = []
    for p in parts:
        h = np.asarray(p.history, dtype=np.float64)
        if h.shape[0] == 0:
            h = np.full((rows, p.n_starts), np.nan)
        elif h.shape[0] < rows:
            h = np.concatenate([h, np.repeat(h[-1:], rows - h.shape[0], axis=0)])
        blocks.append(h)
    return np.concatenate(blocks, axis=1), np.asarray(longest.history_steps).copy()


def _last(steps) -> int:
    return int(steps[-1]) if len(steps) else 0


def best_rows(foms) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, found)`` of ``foms`` ``(n_groups, k)``, each group's starts side by side: each
    group's best start, its lowest finite figure of merit (the first on ties; the group's first
    where none is finite), as a flat index, and whether one was finite. The one pick of a best
    start: a run's and a merge's (:func:`best_fit`, one group) and each fit's of a batch.

    >>> nan = np.nan
    >>> best_rows(np.array([[2.0, 1.0, 1.0], [nan, nan, nan], [nan, 0.5, -np.inf]]))
    (array([1, 3, 7]), array([ True, False,  True]))
    """
    foms = np.asarray(foms)
    finite = np.isfinite(foms)
    best = lowest_finite(foms, axis=1)
    return np.arange(len(foms)) * foms.shape[1] + best, finite.any(axis=1)


def best_fit(foms: np.ndarray, params):
    """``(best_index, best_fom, best_params)``: the lowest finite figure of merit (the first on
    ties), or ``(-1, inf, nan params)`` when none is finite (:func:`best_rows`, of one group).
    A run and a merge choose alike."""
    rows, found = best_rows(np.reshape(foms, (1, -1))) if np.size(foms) else ([0], [False])
    if found[0]:
        i = int(rows[0])
        return i, float(foms[i]), jax.tree_util.tree_map(lambda a: np.asarray(a)[i], params)
    blank = jax.tree_util.tree_map(
        lambda a: np.full(np.shape(a)[1:], np.nan, np.asarray(a).dtype), params
    )
    return -1, float("inf"), blank


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except ValueError:  # arrays compare elementwise
        return bool(np.array_equal(a, b))


def _stats(parts, k: int) -> dict:
    """The parts' statistics as one run's: counts added, times the longest, the rest kept
    where every part agrees; each part's own figures under ``"parts"``."""
    all_stats = [p.stats for p in parts]
    out: dict[str, Any] = {}
    for key in all_stats[0]:
        if key in _PART_ONLY:
            continue
        values = [s.get(key) for s in all_stats]
        if key in _SUMMED and all(isinstance(v, numbers.Number) for v in values):
            out[key] = sum(values)
        elif key in _LARGEST and all(isinstance(v, numbers.Number) for v in values):
            out[key] = max(values)
        elif all(_same(v, values[0]) for v in values):
            out[key] = values[0]
    reasons = {s.get("stop_reason") for s in all_stats} - {"all ended"}
    out["stop_reason"] = ", ".join(sorted(map(str, reasons))) if reasons else "all ended"
    out["n_parts"] = k
    ident = all_stats[0].get("identity", {})
    whole = all_stats[0].get("whole_config")
    if ident and whole is not None:
        # The whole run's identity: its configuration hash covers the whole plan's starts (each
        # part's assembly hashed it, under "whole_config").
        out["identity"] = {"model": ident["model"], "rule": ident["rule"], "config": whole}
    out["parts"] = [{key: s.get(key) for key in _PER_PART} for s in all_stats]
    return out
