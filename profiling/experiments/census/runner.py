"""The census loop: every cell x transform x width, cold then warm, each in a fresh process.

For one measurement the runner makes a fresh persistent-cache folder, runs the probe there
(cold: the cache is empty, the compile writes it), then runs it again in another fresh process
with the same folder (warm), and deletes the folder. Repeats rotate the order of the
measurements, so slow drift on a shared machine spreads over all of them. Rows are written to
the JSON file after every process, so an interrupted census keeps what it measured.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from profiling import harness

from . import cells
from .probe import PHASE, RESULT, TRANSFORMS

__all__ = ["Plan", "QUICK", "FULL", "measurements", "run_census", "make_row"]


@dataclass(frozen=True)
class Plan:
    """What a census measures, and under which caps.

    Attributes:
      cells: names from :data:`profiling.experiments.census.cells.CELLS`.
      transforms: names from :data:`profiling.experiments.census.probe.TRANSFORMS`.
      widths: vmap widths (``vmap_vag``, ``pyloop_vag``) and ``lax.map`` batch sizes
        (``laxmap_vag``); ``vag`` is one start, width 1.
      n_starts: starts swept by ``laxmap_vag`` and ``pyloop_vag``.
      size: a key of :data:`profiling.experiments.census.cells.SIZES` (grids and default
        components).
      components: MGE components per band; each value is its own set of measurements.
      repeats: cold/warm pairs per measurement.
      phase_cap_s: no phase of a child (setup, trace, lower, compile, steady) may take longer.
      rss_cap_mb: a child (with its descendants) is killed above this resident memory.
      steady_budget_s: seconds of repeated calls behind each steady evaluation time.
    """

    cells: tuple[str, ...]
    transforms: tuple[str, ...]
    widths: tuple[int, ...]
    n_starts: int
    size: str
    components: tuple[int, ...]
    repeats: int
    phase_cap_s: float
    rss_cap_mb: float
    steady_budget_s: float

    def __post_init__(self):
        _check_names(self.cells, cells.CELLS, "cells")
        _check_names(self.transforms, TRANSFORMS, "transforms")
        if self.size not in cells.SIZES:
            raise ValueError(f"size must be one of {', '.join(cells.SIZES)}; got {self.size!r}")
        for name in ("widths", "components"):
            values = getattr(self, name)
            if not values or any(not _is_count(v) for v in values):
                raise ValueError(f"{name} must be positive ints; got {values!r}")
        if not _is_count(self.n_starts) or self.n_starts < max(self.widths):
            raise ValueError(
                f"n_starts must be an int >= the largest width ({max(self.widths)}); "
                f"got {self.n_starts!r}"
            )
        if not _is_count(self.repeats):
            raise ValueError(f"repeats must be a positive int; got {self.repeats!r}")
        for name in ("phase_cap_s", "rss_cap_mb", "steady_budget_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be a positive number; got {value!r}")


#: The sizes the command offers (caps and memory are filled in at run time).
FULL = dict(
    widths=(4, 16),
    n_starts=32,
    size="full",
    components=(cells.SIZES["full"].components,),
    phase_cap_s=300.0,
    steady_budget_s=1.0,
)
QUICK = dict(
    widths=(4,),
    n_starts=8,
    size="quick",
    components=(cells.SIZES["quick"].components,),
    phase_cap_s=60.0,
    steady_budget_s=0.3,
)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_names(names: Sequence[str], known, what: str) -> None:
    if not names:
        raise ValueError(f"{what} is empty; choose from {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; choose from {', '.join(known)}")


def measurements(plan: Plan) -> list[tuple[str, int, str, int]]:
    """``(cell, components, transform, width)`` for every measurement of ``plan``; ``vag``
    is measured at width 1 only."""
    out = []
    for components in plan.components:
        for cell in plan.cells:
            for transform in plan.transforms:
                for width in (1,) if transform == "vag" else plan.widths:
                    out.append((cell, components, transform, width))
    return out


def default_rss_cap_mb(fraction: float = 0.5) -> float:
    """A safe memory cap: ``fraction`` of the memory available now, in MiB."""
    import psutil

    return fraction * psutil.virtual_memory().available / 2**20


def child_env() -> dict[str, str]:
    """The child's environment: the checkout (src/multistart, profiling) first on the path, no
    inherited cache folder."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(root) / "src"), root, *filter(None, [env.get("PYTHONPATH")])]
    )
    env["MULTISTART_LOG_LEVEL"] = "WARNING"
    return env


def probe_command(spec: dict) -> list[str]:
    return [sys.executable, "-m", "profiling.experiments.census.probe", json.dumps(spec)]


def _versions() -> dict:
    out: dict[str, str | None] = {}
    for name in ("jax", "jaxlib"):
        try:
            out[f"{name}_version"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[f"{name}_version"] = None
    return out


def make_row(base: dict, outcome, cache: str) -> dict:
    """One JSON row from the measurement's fixed fields and how its child ended (the harness's
    ``Child``).

    A warm row without a confirmed persistent-cache hit is not a warm figure: its status
    becomes ``no_cache_hit``. A cold row that hit the cache was not cold: ``cache_not_cold``.
    """
    row = {**base, "cache": cache, "status": outcome.status, "note": outcome.note}
    row["phase"] = outcome.progress[-1][0] if outcome.progress else None
    row["wall_s"] = outcome.wall_s
    row["peak_rss_mb"] = outcome.peak_rss_mb
    result = _result(outcome.lines)
    if outcome.status == "ok" and result is None:
        row["status"], row["note"] = "error", "the probe printed no result line"
    if result is not None:
        row.update(result)
    if outcome.status != "ok" and outcome.stderr:
        row["stderr_tail"] = outcome.stderr
    if row["status"] == "ok" and cache == "warm" and not row.get("cache_hits"):
        row["status"] = "no_cache_hit"
        row["note"] = "the warm compile did not hit the persistent cache"
    if row["status"] == "ok" and cache == "cold" and row.get("cache_hits"):
        row["status"] = "cache_not_cold"
        row["note"] = "the cold compile hit the persistent cache"
    return row


def _result(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        if line.startswith(RESULT + " "):
            return json.loads(line[len(RESULT) + 1 :])
    return None


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_census(
    plan: Plan,
    out: str | Path,
    *,
    command: str = "",
    echo: Callable[[str], None] = print,
) -> list[dict]:
    """Run every measurement of ``plan`` cold then warm, ``plan.repeats`` times.

    Rows go to ``out`` (a JSON list, rewritten after every process) and are returned.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = measurements(plan)
    described = {
        (c, k): cells.describe(c, plan.size, k) for c in plan.cells for k in plan.components
    }
    common = {
        **_versions(),
        "cpu_count": os.cpu_count(),
        "size": plan.size,
        "phase_cap_s": plan.phase_cap_s,
        "rss_cap_mb": plan.rss_cap_mb,
        "command": command,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    rows: list[dict] = []
    total = 2 * len(todo) * plan.repeats
    for rep in range(plan.repeats):
        shift = rep % len(todo)  # rotate the order, so drift spreads over every measurement
        for cell, components, transform, width in todo[shift:] + todo[:shift]:
            n_starts = {"vag": 1, "vmap_vag": width}.get(transform, plan.n_starts)
            spec = {
                "cell": cell,
                "size": plan.size,
                "components": components,
                "transform": transform,
                "width": width,
                "n_starts": n_starts,
                "steady_budget_s": plan.steady_budget_s,
            }
            base = {
                "cell": cell,
                "transform": transform,
                "width": width,
                "n_starts": n_starts,
                "repeat": rep,
                **described[cell, components],
                **common,
            }
            for row in _cold_then_warm(plan, spec, base):
                rows.append(row)
                out.write_text(json.dumps(rows, indent=1))
                echo(f"[{len(rows)}/{total}] {_progress(row)}")
    return rows


def _cold_then_warm(plan: Plan, spec: dict, base: dict):
    """The cold row, then the warm row, of one measurement sharing one fresh cache folder."""
    cache_dir = Path(tempfile.mkdtemp(prefix="multistart-census-cache-"))
    try:
        spec = {**spec, "cache_dir": str(cache_dir)}
        cold = _run_child(plan, spec, base, "cold")
        cold["cache_bytes"] = _folder_bytes(cache_dir)
        yield cold
        yield (
            _run_child(plan, spec, base, "warm") if cold["status"] == "ok" else _skipped(base, cold)
        )
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _run_child(plan: Plan, spec: dict, base: dict, cache: str) -> dict:
    base = {
        **base,
        "loadavg_1m": os.getloadavg()[0],
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    outcome = harness.run_child(
        probe_command(spec),
        env=child_env(),
        timeout_s=plan.phase_cap_s,
        memory_mb=plan.rss_cap_mb,
        progress=PHASE + " ",
    )
    return make_row(base, outcome, cache)


def _skipped(base: dict, cold: dict) -> dict:
    return {
        **base,
        "cache": "warm",
        "status": "skipped",
        "note": f"the cold run did not finish ({cold['status']}): no cache entry to warm from",
    }


def _progress(row: dict) -> str:
    head = f"{row['cell']} K={row['components']} {row['transform']} w={row['width']} {row['cache']}"
    if row["status"] == "ok":
        return (
            f"{head}: trace+lower {row['trace_s'] + row['lower_s']:.2f} s, compile "
            f"{row['compile_s']:.2f} s, steady {row['steady_per_start_s'] * 1e3:.3f} ms/start, "
            f"peak {row['peak_rss_mb']:.0f} MB"
        )
    return f"{head}: {row['status']}: {row['note']}"
