"""The record of a measured width: its key, where it lives, reading and writing it.

One JSON file per key under ``<cache folder>/tuning/`` (:func:`multistart.device.cache.cache_dir`),
written by a rename so a concurrent run reads the old record or the new one, never half.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import jax

from ..common import log
from ..common.digest import step_program_hash
from ..device.cache import cache_dir

__all__ = ["device_gains", "read_width", "record_path", "save", "tune_key"]

_RECORD_FORMAT = 1


def tune_key(
    start_step,
    pop,
    data,
    *,
    device,
    backend: str,
    starts_per_device: int,
    n_devices: int = 1,
    program_hash: str | None = None,
):
    """``(key, parts)``: the tuning record's key and what it was hashed from (see
    :mod:`multistart.width`)."""
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
        # (the key's name predates the per-device count it holds: renaming it would orphan every
        # record on disk)
        "n_starts_bucket": 1 << max(0, starts_per_device - 1).bit_length(),
        "jax": jax.__version__,
    }
    if n_devices > 1:  # devices sharing a host's cores time differently from one
        parts["n_devices"] = n_devices
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return key, parts


def record_path(key: str) -> Path | None:
    """Where the record of ``key`` lives; ``None`` when caching is off (no cache folder)."""
    folder = cache_dir()
    return None if folder is None else folder / "tuning" / f"{key}.json"


def read_width(path: Path) -> tuple[int, dict[str, Any]] | None:
    """``(width, record)`` from the file at ``path``; ``None`` (with a warning) when it cannot
    be read, holds no positive width, or prices it with anything but finite numbers."""
    try:
        saved = json.loads(path.read_text())
        width = int(saved["width"])
        if width < 1:
            raise ValueError(width)
        prices = saved.get("prices") or {}  # what a priced choice and the tail are weighed on
        if not all(math.isfinite(float(v)) for v in prices.values()):
            raise ValueError(f"prices {prices}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.logger.warning("ignoring the unreadable tuning record %s (%s)", path, exc)
        return None
    return width, saved


# The newest records read for what this device measured (a folder of many models stays cheap)
_GAINS_FROM = 200


def device_gains(device) -> tuple[tuple[float, float], ...]:
    """What widths gained on this kind of device, from its measured records (any model):
    ``(seconds a start cost in one chunk call at the widest width timed, that width's step /
    the best width's step)`` per record that timed two widths or more. Nothing without a
    cache folder; an unreadable record is skipped."""
    folder = cache_dir()
    if folder is None or not (folder / "tuning").is_dir():
        return ()
    files = sorted((folder / "tuning").glob("*.json"), key=_mtime, reverse=True)
    gains = []
    for path in files[:_GAINS_FROM]:
        try:
            saved = json.loads(path.read_text())
            parts = saved["key_parts"]
            if (parts["platform"], parts["device_kind"]) != (device.platform, device.device_kind):
                continue
            rows = [r for r in saved.get("table", []) if "step_s" in r]
            if saved.get("method") not in ("auto", "tune") or len(rows) < 2:
                continue
            widest = max(rows, key=lambda r: r["width"])
            best = min(r["step_s"] for r in rows)
            gains.append((widest["chunk_s"] / widest["width"], widest["step_s"] / best))
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
    return tuple(gains)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def save(tuning: dict[str, Any]) -> None:
    """Write the measured choice ``tuning`` (its ``width``, ``method``, ``table`` and
    ``key_parts``) to its ``path``; a failure is a warning, never an error."""
    path = tuning.get("path")
    if path is None:
        return
    path = Path(path)
    record = {
        "width": tuning["width"],
        "method": tuning["method"],
        "table": tuning["table"],
        "key_parts": tuning["key_parts"],
        **({"prices": tuning["prices"]} if "prices" in tuning else {}),
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
