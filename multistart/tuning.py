"""Choosing the batch width: explicit, ``"auto"`` (memory-bounded) or ``"tune"`` (measured).

``"tune"`` times a few steps at each candidate width within the memory bound (1 and powers of
two up to ``n_starts``) and keeps the best throughput, in starts x steps per second. The timed
steps run on a copy of the initial population and are thrown away, so a tuned search gives the
same result as a search at the width it chose. Choices persist in the cache folder
(:func:`multistart.cache.cache_dir`, under ``tuning/``), one JSON file per key, so the next
run of the same model on the same kind of device skips the timing.

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
from .memory import (
    auto_width,
    candidate_widths,
    cap_width,
    is_out_of_memory,
    max_batch_from_env,
    memory_budget,
    step_memory,
)

__all__ = ["BATCH_SIZE_HELP", "WidthChoice", "check_batch_size", "resolve_width", "tune_key"]

BATCH_SIZE_HELP = "batch_size must be a positive int, None, 'auto' or 'tune'"
BATCH_SIZE_WORDS = ("auto", "tune")
# Timing per candidate width and pass: at least MIN and at most MAX steps, stopping once TARGET
# seconds have passed. A step is timed to its end, as the search's own host sync waits for it.
TUNE_TARGET_S = 0.25
TUNE_MIN_STEPS = 3
TUNE_MAX_STEPS = 50
# Throughput against width rises and then falls. Widths are tried narrow to wide, and tuning
# stops once two successive widths each fall below this share of the best so far.
TUNE_STOP_RATIO = 0.75
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
    """The width a search runs at and how it was chosen (``result.stats["width"]``)."""

    width: int
    info: dict[str, Any]
    tuning: dict[str, Any] | None = None
    n_tune_compiles: int = 0
    select_s: float = 0.0


def _tree_bytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree)))


def resolve_width(
    spec,
    sweep,
    pop,
    *,
    n_starts: int,
    device,
    start_step=None,
    backend: str = "loop",
) -> WidthChoice:
    """Choose the batch width for ``spec`` and leave ``sweep`` compiled at it.

    Programs compiled on the way (memory probes, tuning candidates) are released, except the
    chosen one, which the search then uses without compiling it again.

    Args:
      spec: ``None``, an int, ``"auto"`` or ``"tune"`` (already validated).
      sweep: a :class:`multistart.sweep.Sweep`.
      pop: the initial population (never stepped here: tuning steps a copy).
      n_starts: the number of starts.
      device: the device the search runs on.
      start_step: the per-start step, for the tuning key (``"tune"`` only).
      backend: ``"loop"`` or ``"scan"``, for the tuning key.
    """
    t0 = time.perf_counter()
    sweep.prepare(pop)
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
        start_bytes = _tree_bytes(pop.starts) // n_starts
        checkpoint_bytes = _tree_bytes(pop)
        info["checkpoint_bytes"] = checkpoint_bytes
        width, tuning = None, None
        if spec == "tune":
            width, tuning = _cached_width(sweep, pop, n_starts, device, start_step, backend)
        if width is None:
            upper = None if spec == "auto" else cap_width(n_starts, n_starts, max_batch)
            bound = auto_width(
                sweep.compiled_for,
                n_starts=n_starts,
                device=device,
                start_bytes=start_bytes,
                checkpoint_bytes=checkpoint_bytes,
                upper=upper,
            )
            info.update(bound.as_dict())
            width = bound.width
            _log_bound(spec, bound)
            if spec == "tune":
                width, table = _measure(sweep, pop, bound.width)
                tuning = {**(tuning or {}), "source": "measured", "width": width, "table": table}
                _save(tuning)
        info["selected_by"] = spec if tuning is None else f"tune ({tuning['source']})"
    n_tune = len([w for w in sweep.compiled_widths() if w != width])
    sweep.release(keep=width)
    sweep.set_width(width)
    return WidthChoice(width, info, tuning, n_tune, time.perf_counter() - t0)


def _log_bound(spec, bound) -> None:
    budget = bound.budget
    if budget.nbytes is None:
        return
    log.logger.info(
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


def _measure(sweep, pop, upper: int) -> tuple[int, list[dict[str, Any]]]:
    """Time each candidate width up to ``upper``; returns the best width and the table.

    A width's rate is its median step time, which a passing spike of load on a shared machine
    does not move. The three leading widths are then timed again, widest first, and each
    keeps the median of all its steps, so a slow spell during the first pass does not decide.
    """
    times: dict[int, list[float]] = {}
    failed: list[int] = []

    def rate(w):
        return 1.0 / statistics.median(times[w])

    def time_width(w):
        times.setdefault(w, []).extend(
            sweep.trial(
                pop, w, target_s=TUNE_TARGET_S, min_steps=TUNE_MIN_STEPS, max_steps=TUNE_MAX_STEPS
            )
        )

    best, n_slow = None, 0
    for w in candidate_widths(upper):
        try:
            time_width(w)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            times.pop(w, None)
            failed.append(w)
            break
        if best is None or rate(w) > rate(best):
            best, n_slow = w, 0
        else:
            n_slow = n_slow + 1 if rate(w) < TUNE_STOP_RATIO * rate(best) else 0
        if n_slow >= 2:
            break
    for w in sorted(sorted(times, key=rate)[-3:], reverse=True):
        time_width(w)
    best = max(times, key=rate)
    n_rows = sweep.rows.size
    table: list[dict[str, Any]] = [
        {
            "width": w,
            "steps": len(times[w]),
            "seconds": sum(times[w]),
            "steps_per_s": rate(w),
            "starts_steps_per_s": rate(w) * n_rows,
            "compile_s": sweep.compile_seconds(w),
        }
        for w in sorted(times)
    ]
    table += [{"width": w, "error": "out of memory"} for w in failed]
    _log_table(table, best)
    return best, table


def _log_table(table, best) -> None:
    lines = ["batch_size tune: width  steps/s  starts*steps/s  compile s"]
    for row in table:
        if "error" in row:
            lines.append(f"  {row['width']:>5}  {row['error']}")
            continue
        mark = "  <- chosen" if row["width"] == best else ""
        lines.append(
            f"  {row['width']:>5}  {row['steps_per_s']:>7.3g}  {row['starts_steps_per_s']:>14.4g}"
            f"  {row['compile_s']:>9.2f}{mark}"
        )
    log.logger.info("\n".join(lines))


# -- persistence ----------------------------------------------------------------------------


def tune_key(start_step, pop, data, *, device, backend: str, n_starts: int):
    """``(key, parts)``: the tuning record's key and what it was hashed from (see module doc)."""
    one = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), pop.starts)
    text = jax.jit(start_step).lower(one, data).as_text()
    parts = {
        "format": _RECORD_FORMAT,
        "program_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "backend": backend,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "dtype": str(pop.starts.fom.dtype),
        "n_starts_bucket": 1 << max(0, n_starts - 1).bit_length(),
        "jax": jax.__version__,
    }
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return key, parts


def _record_path(key: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / "tuning" / f"{key}.json"


def _cached_width(sweep, pop, n_starts, device, start_step, backend):
    """The persisted width for this model and device, if any and if it still fits."""
    key, parts = tune_key(
        start_step, pop, sweep.data, device=device, backend=backend, n_starts=n_starts
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
        est = step_memory(sweep.compiled_for(width), width, _tree_bytes(pop.starts) // n_starts)
        if est.extra + _tree_bytes(pop) > budget.nbytes:
            log.logger.info(
                "batch_size tune: the recorded width %d no longer fits the memory budget; "
                "tuning again",
                width,
            )
            return None, tuning
    log.logger.info("batch_size tune: width %d, recorded in %s", width, path)
    tuning.update(source="cache", width=width, table=record.get("table", []))
    return width, tuning


def _save(tuning: dict[str, Any]) -> None:
    path = tuning.get("path")
    if path is None:
        return
    path = Path(path)
    record = {
        "width": tuning["width"],
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
