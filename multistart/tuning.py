"""Choosing the batch width: explicit, ``"auto"`` or ``"tune"``.

Both words first bound the width by memory (:func:`multistart.memory.auto_width`). On an
accelerator ``"auto"`` takes that bound. On a CPU, where the best width depends on the model
(XLA's batched code can cost several times the unbatched body per start, while a cheap
objective needs wide chunks to amortise the dispatch), ``"auto"`` times a sparse ladder of
widths within the bound (the bound, 1, narrower by factors of 8, then one width between the
best and its better neighbour; only the bound and 1 when width 1 is far faster, see
:data:`AUTO_UNBATCHED_WINS`); ``"tune"`` times a denser one (1 and every power of two). Either
way a width is timed on a bounded number of chunk calls (never every start): a step's time is
predicted as the chunk calls it needs times the median seconds per call, which a passing spike
of load does not move. The timed calls step a copy of the initial population and are thrown
away, so the search gives the same result as a search at the width chosen. Choices persist in
the cache folder (:func:`multistart.cache.cache_dir`, under ``tuning/``), one JSON file per key,
shared by ``"auto"`` and ``"tune"``, so the next run of the same model on the same kind of
device skips the timing.

The key is a SHA-256 over:

- the StableHLO text of the *per-start* step (objective, optimiser, guards, convergence rule,
  the data's shapes and dtypes; not the data's values, which are an argument) lowered for one
  start. The chunk step's text would also hold ``n_starts`` and the history length, and a
  longer run of the same model should not retune;
- the backend (``"loop"``/``"scan"``), the platform and device kind (``"cpu"``, ``"NVIDIA
  H100 80GB HBM3"``...), the float dtype, ``n_starts`` rounded up to a power of two, and the
  JAX version.

Lowering is deterministic, so the same model in a second process gets the same key.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from . import log
from .cache import cache_dir
from .identity import step_program_hash
from .memory import (
    auto_candidates,
    auto_mode_from_env,
    auto_width,
    balanced_width,
    candidate_widths,
    cap_width,
    is_out_of_memory,
    max_batch_from_env,
    memory_budget,
    step_memory,
    tree_bytes,
)

__all__ = ["BATCH_SIZE_HELP", "WidthChoice", "check_batch_size", "resolve_width", "tune_key"]

BATCH_SIZE_HELP = "batch_size must be a positive int, None, 'auto' or 'tune'"
BATCH_SIZE_WORDS = ("auto", "tune")
# Timing per candidate width and pass: TUNE_CALLS chunk calls at a time (fewer when a step has
# fewer), repeated at least MIN and at most MAX times, stopping once TARGET seconds have passed.
# A width therefore costs at most (1 + TUNE_MAX_REPS) * TUNE_CALLS chunk calls beyond its
# compile, whatever the number of starts.
TUNE_TARGET_S = 0.1
TUNE_CALLS = 16
TUNE_MIN_REPS = 3
TUNE_MAX_REPS = 12
# Throughput against width rises and then falls. Widths are tried narrow to wide, and timing
# stops once two successive widths each fall below this share of the best so far.
TUNE_STOP_RATIO = 0.75
# "auto" times the widest width, then width 1. When width 1 steps at least this many times as
# fast, the batched program costs more per start than the unbatched one by more than the chunk
# calls it saves (an expensive model, whose single evaluation already keeps the cores busy), and
# the narrower widths are not timed: each is a compile (seconds for such a model), and on the
# models measured the best width was then 1 (``profiling/auto_width.py``).
AUTO_UNBATCHED_WINS = 1.5
_RECORD_FORMAT = 1


def check_batch_size(batch_size):
    """Validate ``batch_size``: ``None``, a positive int, ``"auto"`` or ``"tune"``.

    Raises:
      ValueError: anything else, naming ``batch_size`` and the options.
    """
    if batch_size is None:
        return None
    if isinstance(batch_size, str):
        if batch_size in BATCH_SIZE_WORDS:
            return batch_size
        raise ValueError(f"{BATCH_SIZE_HELP}; got {batch_size!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise ValueError(f"{BATCH_SIZE_HELP}; got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"{BATCH_SIZE_HELP}; got {batch_size!r}")
    return int(batch_size)


@dataclass
class WidthChoice:
    """The width a search runs at and how it was chosen (``result.stats["width_choice"]``)."""

    width: int
    info: dict[str, Any]
    tuning: dict[str, Any] | None = None
    n_tune_compiles: int = 0
    select_s: float = 0.0


def resolve_width(
    spec,
    sweep,
    pop,
    *,
    n_starts: int,
    device,
    start_step=None,
    backend: str = "loop",
    program_hash: str | None = None,
) -> WidthChoice:
    """Choose the batch width for ``spec`` (``sweep.at(choice.width)`` then steps at it).

    Programs compiled on the way (memory probes, tuning candidates) are released, except the
    chosen one, which the search then uses without compiling it again.

    Args:
      spec: ``None``, an int, ``"auto"`` or ``"tune"`` (already validated).
      sweep: a :class:`multistart.backends.Backend`.
      pop: the initial population (never stepped here: tuning steps a copy).
      n_starts: the number of starts (on each device, on several).
      device: the device the search runs on (the first, on several: widths are per device).
      start_step: the per-start step, for the tuning record's key (``"tune"``, and
        ``"auto"`` on a CPU).
      backend: ``"loop"`` or ``"scan"``, for the tuning key.
      program_hash: the per-start step's hash when the caller has it (the search identity's
        ``program``), so the key does not lower the step a second time.

    Returns:
      A :class:`WidthChoice`. Its ``info`` (``result.stats["width_choice"]``) says how:
      ``selected_by`` (``"explicit"``, ``"auto"`` (memory bound only), ``"auto (measured)"``,
      ``"auto (cache)"``, ``"tune (measured)"``, ``"tune (cache)"``), the memory bound's figures
      and,
      when it was computed, ``memory_width``; its ``tuning`` holds the timing table and the
      record's key and path.
    """
    t0 = time.perf_counter()
    max_batch = max_batch_from_env()
    info: dict[str, Any] = {"spec": spec, "max_batch": max_batch}
    tuning = None
    if spec is None or isinstance(spec, int):
        asked = n_starts if spec is None else spec
        width = cap_width(asked, n_starts, max_batch)
        if max_batch is not None and width < min(asked, n_starts):
            log.logger.info("batch_size %d capped to %d by MULTISTART_MAX_BATCH", asked, width)
        info["selected_by"] = "explicit"
    else:
        # On a mesh each device holds 1 / n_devices of the population (and n_starts is per
        # device): the memory bound is one device's.
        n_dev = sweep.n_devices
        start_bytes = tree_bytes(pop.starts) // sweep.n_total
        checkpoint_bytes = tree_bytes(pop) // n_dev
        info["checkpoint_bytes"] = checkpoint_bytes
        measure = spec == "tune" or _auto_measures(device)
        width = None
        if measure:
            width, tuning = _cached_width(
                spec, sweep, pop, n_starts, device, start_step, backend, program_hash
            )
        if width is None:
            bound = auto_width(
                sweep.compiled_for,
                n_starts=n_starts,
                device=device,
                start_bytes=start_bytes,
                checkpoint_bytes=checkpoint_bytes,
                upper=_upper(spec, measure, n_starts, max_batch, device),
            )
            info.update(bound.as_dict())
            info["memory_width"] = width = bound.width
            _log_bound(spec, bound)
            if measure:
                width, table = _measure(sweep, pop, bound.width, spec)
                tuning = {
                    **tuning,
                    "source": "measured",
                    "method": spec,
                    "width": width,
                    "table": table,
                }
                _save(tuning)
        info["selected_by"] = spec if tuning is None else f"{spec} ({tuning['source']})"
    n_tune = len([w for w in sweep.compiled_widths() if w != width])
    sweep.release(keep=width)
    sweep.compiled_for(width)  # compiled here, so select_s includes it
    return WidthChoice(width, info, tuning, n_tune, time.perf_counter() - t0)


def _auto_measures(device) -> bool:
    """Does ``"auto"`` time widths here? On a CPU, unless ``MULTISTART_AUTO_WIDTH=memory``.

    On an accelerator the widest width that fits is kept: a GPU's throughput rises with the
    width until memory binds, and timing would cost a compile per width for little.
    """
    return device.platform == "cpu" and auto_mode_from_env() == "measure"


def _upper(spec, measure: bool, n_starts: int, max_batch, device) -> int | None:
    """The widest width the memory bound may consider (None: :func:`auto_width`'s count cap).

    A measuring ``"auto"`` drops the count cap (a cheap objective with many starts wants wide
    chunks), except when there is no free-memory figure: then nothing else bounds the width.
    """
    if spec == "tune":
        return cap_width(n_starts, n_starts, max_batch)
    if not measure or memory_budget(device).nbytes is None:
        return None
    return balanced_width(n_starts, cap_width(n_starts, n_starts, max_batch))


def _say(spec, *args) -> None:
    """What the width choice is doing: INFO for an explicit ``"tune"``, DEBUG for ``"auto"``
    (a default fit logs only what runs and what came out)."""
    (log.logger.info if spec == "tune" else log.logger.debug)(*args)


def _log_bound(spec, bound) -> None:
    budget = bound.budget
    if budget.nbytes is None:
        return
    log.logger.debug(
        "batch_size %s: memory allows width %d (budget %.3g GiB: %s; estimate: %s; "
        "fixed %s, per start %s)",
        spec,
        bound.width,
        budget.nbytes / 2**30,
        budget.source,
        bound.estimate,
        _fmt_bytes(bound.fixed_bytes),
        _fmt_bytes(bound.per_start_bytes),
    )


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _measure(sweep, pop, upper: int, spec: str) -> tuple[int, list[dict[str, Any]]]:
    """Time candidate widths up to ``upper``; returns the best width and the table.

    ``"tune"`` tries 1 and the powers of two, narrow to wide, stopping once two in a row fall
    well below the best. ``"auto"`` tries fewer (:func:`multistart.memory.auto_candidates`:
    ``upper``, 1, then narrower by factors of 8 until one is slower than the last), then the
    width halfway (on a log scale) between the best and its faster neighbour; it stops after
    ``upper`` and 1 when width 1 steps :data:`AUTO_UNBATCHED_WINS` times as fast. Widths are
    balanced over the rows (same chunk count, least padding). The leading widths are timed
    again, widest first, and each keeps the median of all its repeats, so a slow spell during
    the first pass does not decide.
    """
    n_rows = sweep.rows.size
    per_call: dict[int, list[float]] = {}
    calls: dict[int, int] = {}
    failed: list[int] = []

    def step_s(w):
        return sweep.calls_per_step(w) * statistics.median(per_call[w])

    def time_width(w, label):
        _say(spec, "batch_size %s: timing width %d (%s) ...", spec, w, label)
        seconds, n = sweep.time_chunks(
            pop,
            w,
            calls=TUNE_CALLS,
            target_s=TUNE_TARGET_S,
            min_reps=TUNE_MIN_REPS,
            max_reps=TUNE_MAX_REPS,
        )
        per_call.setdefault(w, []).extend(seconds)
        calls[w] = calls.get(w, 0) + n

    def try_width(w, label) -> bool:
        try:
            time_width(w, label)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            per_call.pop(w, None)
            failed.append(w)
            return False
        return True

    if spec == "tune":
        ladder = sorted({balanced_width(n_rows, w) for w in candidate_widths(upper)})
        best, n_slow = None, 0
        for i, w in enumerate(ladder):
            if not try_width(w, f"{i + 1}/{len(ladder)}"):
                break
            if best is None or step_s(w) < step_s(best):
                best, n_slow = w, 0
            else:
                n_slow = n_slow + 1 if step_s(best) < TUNE_STOP_RATIO * step_s(w) else 0
            if n_slow >= 2:
                break
    else:
        ladder = list(dict.fromkeys(balanced_width(n_rows, w) for w in auto_candidates(upper)))
        previous, unbatched_wins = None, False
        for i, w in enumerate(ladder):
            # wide to narrow after width 1; narrower widths may fit where a wider one did not
            if not try_width(w, f"{i + 1}/{len(ladder)}"):
                continue
            if i == 1:
                widest = ladder[0]
                ratio = step_s(widest) / step_s(w) if widest in per_call else 0.0
                unbatched_wins = ratio >= AUTO_UNBATCHED_WINS
                if unbatched_wins:
                    _say(
                        spec,
                        "batch_size %s: width 1 steps %.3g times as fast as width %d; the "
                        "narrower widths are not timed",
                        spec,
                        ratio,
                        widest,
                    )
                    break
                continue
            if previous is not None and step_s(w) > step_s(previous):
                break
            previous = w
        if per_call and not unbatched_wins:
            between = _between(min(per_call, key=step_s), per_call, step_s, n_rows)
            if between is not None:
                try_width(between, "between the best two")
    if not per_call:
        raise RuntimeError(
            f"batch_size {spec}: no width up to {upper} ran without running out of memory"
        )
    n_again = 3 if spec == "tune" else 2
    for w in sorted(sorted(per_call, key=step_s)[:n_again], reverse=True):
        time_width(w, "again")
    best = min(per_call, key=step_s)
    table: list[dict[str, Any]] = [
        {
            "width": w,
            "calls": calls[w],
            "chunk_s": statistics.median(per_call[w]),
            "step_s": step_s(w),
            "steps_per_s": 1.0 / step_s(w),
            "starts_steps_per_s": n_rows / step_s(w),
            "compile_s": sweep.compile_seconds(w),
        }
        for w in sorted(per_call)
    ]
    table += [{"width": w, "error": "out of memory"} for w in failed]
    _log_table(spec, table, best)
    return best, table


def _between(best, per_call, step_s, n_rows) -> int | None:
    """The width halfway (geometric mean) between ``best`` and the faster of its timed
    neighbours in width, when that width is not timed yet."""
    timed = sorted(per_call)
    i = timed.index(best)
    near = timed[max(0, i - 1) : i] + timed[i + 1 : i + 2]
    if not near:
        return None
    other = min(near, key=step_s)
    w = balanced_width(n_rows, max(1, round(math.sqrt(best * other))))
    return None if w in per_call else w


def _log_table(spec, table, best) -> None:
    lines = [f"batch_size {spec}: width  calls  steps/s  starts*steps/s  compile s"]
    for row in table:
        if "error" in row:
            lines.append(f"  {row['width']:>5}  {row['error']}")
            continue
        mark = "  <- chosen" if row["width"] == best else ""
        lines.append(
            f"  {row['width']:>5}  {row['calls']:>5}  {row['steps_per_s']:>7.3g}"
            f"  {row['starts_steps_per_s']:>14.4g}"
            f"  {row['compile_s']:>9.2f}{mark}"
        )
    _say(spec, "\n".join(lines))


# -- persistence ----------------------------------------------------------------------------


def tune_key(
    start_step,
    pop,
    data,
    *,
    device,
    backend: str,
    n_starts: int,
    sweep=None,
    program_hash: str | None = None,
):
    """``(key, parts)``: the tuning record's key and what it was hashed from (see module doc)."""
    if program_hash is None:
        one = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), pop.starts
        )
        program_hash = step_program_hash(start_step, one, data)
    parts = {
        "format": _RECORD_FORMAT,
        # the same hash of the lowered per-start step as the search's identity (checkpoints)
        "program_sha256": program_hash,
        "backend": backend,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "dtype": str(pop.starts.fom.dtype),
        "n_starts_bucket": 1 << max(0, n_starts - 1).bit_length(),
        "jax": jax.__version__,
    }
    n_dev = 1 if sweep is None else sweep.n_devices
    if n_dev > 1:  # devices sharing a host's cores time differently from one
        parts["n_devices"] = n_dev
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return key, parts


def _record_path(key: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / "tuning" / f"{key}.json"


def _cached_width(spec, sweep, pop, n_starts, device, start_step, backend, program_hash):
    """The persisted width for this model and device, if any and if it still fits."""
    key, parts = tune_key(
        start_step,
        pop,
        sweep.data,
        device=device,
        backend=backend,
        n_starts=n_starts,
        sweep=sweep,
        program_hash=program_hash,
    )
    path = _record_path(key)
    tuning = {"key": key, "key_parts": parts, "path": None if path is None else str(path)}
    if path is None or not path.is_file():
        return None, tuning
    try:
        record = json.loads(path.read_text())
        width = int(record["width"])
        if width < 1:
            raise ValueError(width)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.logger.warning("ignoring the unreadable tuning record %s (%s)", path, exc)
        return None, tuning
    width = cap_width(width, n_starts, max_batch_from_env())
    budget = memory_budget(device)
    if budget.nbytes is not None:
        est = step_memory(sweep.compiled_for(width), width, tree_bytes(pop.starts) // sweep.n_total)
        if est.extra + tree_bytes(pop) > budget.nbytes:
            log.logger.info(
                "batch_size %s: the recorded width %d no longer fits the memory budget; "
                "timing again",
                spec,
                width,
            )
            return None, tuning
    _say(spec, "batch_size %s: width %d, recorded in %s", spec, width, path)
    tuning.update(
        source="cache", method=record.get("method"), width=width, table=record.get("table", [])
    )
    return width, tuning


def _save(tuning: dict[str, Any]) -> None:
    path = tuning.get("path")
    if path is None:
        return
    path = Path(path)
    record = {
        "width": tuning["width"],
        "method": tuning["method"],
        "table": tuning["table"],
        "key_parts": tuning["key_parts"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # write then rename: a concurrent run reads either the old record or the new one
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        log.logger.warning("could not save the tuned width to %s (%s)", path, exc)
