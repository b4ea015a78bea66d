"""``resolve_width``: the width a search runs at, from ``batch_size`` and what is known.

An int is used as given (clamped); ``"auto"`` and ``"tune"`` read a record of an earlier
choice when it still fits, else bound the width by memory and, where it is worth it, time
widths (:mod:`multistart.width.timing`). Every width, measured or remembered, is checked
against the budget by one rule (:class:`Footprint`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import log
from ..device.oom import is_out_of_memory
from . import record as records
from .budget import auto_width, memory_budget, need, step_memory, tree_bytes
from .env import auto_mode_from_env, max_batch_from_env
from .timing import PRIOR_GAINS, Gate, Timings, expected_share, say, time_auto, time_tune
from .widths import balanced_width, cap_width

# A measuring "auto" starts from a width that leaves the sweep this many chunks to drop as
# starts end, at least SWEEP_MIN_WIDTH (sweep_width). 8 chunks left 500 spectra's 16,000 starts
# at 2,000 a chunk, half of every step padding once most had ended: 64 ran it 3.0x as fast,
# 2,000 small fits of 8 starts alike (profiling/HISTORY.md, "The sweep's chunks, finer").
SWEEP_CHUNKS = 64
SWEEP_MIN_WIDTH = 256

__all__ = ["Footprint", "WidthChoice", "resolve_width"]


@dataclass
class WidthChoice:
    """The width a search runs at and how it was chosen (``result.stats["width_choice"]``).

    ``info`` is described in :func:`resolve_width`'s Returns.
    """

    width: int
    info: dict[str, Any]
    tuning: dict[str, Any] | None = None
    n_tune_compiles: int = 0
    select_s: float = 0.0


def resolve_width(
    spec,
    backend,
    pop,
    *,
    starts_per_device: int,
    device,
    start_step=None,
    backend_name: str = "loop",
    program_hash: str | None = None,
    n_steps: int | None = None,
    run_share: float = 1.0,
) -> WidthChoice:
    """Choose the batch width for ``spec`` (``backend.at(choice.width)`` then steps at it).

    Programs compiled on the way (memory probes, timed widths) are released, except the
    chosen one, which the search then uses without compiling it again, and the narrower powers
    of two, which its tail may narrow to.

    Args:
      spec: ``None``, an int, ``"auto"`` or ``"tune"`` (already validated).
      backend: a :class:`multistart.device.backends.Backend`.
      pop: the initial population (never stepped here: timing steps a copy).
      starts_per_device: the starts each device holds (all of them, on one device).
      device: the device the search runs on (the first, on several: widths are per device).
      start_step: the per-start step, for the tuning record's key.
      backend_name: ``"loop"`` or ``"scan"``, for the tuning key.
      program_hash: the per-start step's hash when the caller has it, so the key does not
        lower the step a second time.
      n_steps, run_share: the steps the search will take at most, and the share of them it
        is priced at: with them ``"auto"`` times widths only where deciding pays
        (:class:`Gate`); without ``n_steps``, it times its ladder whatever the fit.

    Returns:
      A :class:`WidthChoice`. Its ``info`` (``result.stats["width_choice"]``) says how:
      ``selected_by`` (``"explicit"``, ``"auto"`` (no timing considered), ``"auto (priced)"``
      (the fit priced, timing not worth it: the bound), ``"auto (measured)"``,
      ``"auto (cache)"``, ``"tune (measured)"``, ``"tune (cache)"``), ``reason``,
      ``decide_s`` (what deciding cost beyond the chosen width's compile), the memory bound's
      figures, ``memory_width`` when computed, and for a priced ``"auto"``
      ``fit_estimate_s``; ``tuning`` holds the timing table and the record's key and path.
    """
    t0, max_batch = time.perf_counter(), max_batch_from_env()
    info: dict[str, Any] = {"spec": spec, "max_batch": max_batch}
    tuning = None
    if spec is None or isinstance(spec, int):
        width = _explicit(spec, starts_per_device, max_batch, info)
    else:
        keyed = dict(start_step=start_step, backend=backend_name, program_hash=program_hash)
        steps = (n_steps, run_share)  # what "auto" prices the fit at
        width, tuning = _by_word(spec, backend, pop, info, starts_per_device, device, steps, keyed)
        info["selected_by"] = spec if tuning is None else f"{spec} ({tuning['source']})"
    n_tune = len([w for w in backend.compiled_widths() if w != width])
    backend.release(keep=_kept(backend, width))
    width = _compiled_within_memory(backend, width, starts_per_device, info)  # in select_s
    select_s = time.perf_counter() - t0
    info["decide_s"] = max(0.0, select_s - backend.compile_seconds(width))
    why, took = info["reason"], info["decide_s"]
    say(spec, "batch_size %r: width %d (%s); deciding took %.3g s", spec, width, why, took)
    return WidthChoice(width, info, tuning, n_tune, select_s)


def _compiled_within_memory(backend, width: int, starts_per_device: int, info) -> int:
    """``width``, compiled; narrower (halved, balanced over the starts) while the compiler
    refuses it for the device's memory (a chip's compiler checks a program's buffers against
    its memory and raises ``RESOURCE_EXHAUSTED``), each back-off logged and recorded in
    ``info["compile_backoffs"]``: an explicit width too wide for the chip runs at the widest
    that compiles instead of failing."""
    while True:
        try:
            backend.compiled_for(width)
            return width
        except Exception as e:
            if width == 1 or not is_out_of_memory(e):
                raise
            narrower = balanced_width(starts_per_device, max(1, width // 2))
            log.logger.warning(
                "batch_size: a chunk step of width %d does not fit the device's memory (%s); "
                "running at width %d",
                width,
                str(e).splitlines()[0][:160],
                narrower,
            )
            info.setdefault("compile_backoffs", []).append({"from": width, "to": narrower})
            info["reason"] = f"{info.get('reason', '')}; narrowed to {narrower} to compile"
            width = narrower


def _kept(backend, width: int) -> tuple[int, ...]:
    """The programs kept after choosing ``width``: its own, and the narrower powers of two
    timed, which a search's tail may narrow to (:func:`multistart.host.decide.tail_width`)
    without compiling them again."""
    return (width, *(w for w in backend.compiled_widths() if w < width and w & (w - 1) == 0))


def _explicit(spec, starts_per_device: int, max_batch, info) -> int:
    """An int (or ``None``: every start), clamped to ``starts_per_device`` and
    ``MULTISTART_MAX_BATCH``."""
    asked = starts_per_device if spec is None else spec
    width = cap_width(asked, starts_per_device, max_batch)
    info["selected_by"] = "explicit"
    info["reason"] = f"asked for {asked}"
    if width < asked:
        capped = "MULTISTART_MAX_BATCH" if max_batch is not None and width == max_batch else None
        info["reason"] += f", capped to {width} by " + (capped or f"the {starts_per_device} starts")
        if capped:
            log.logger.info("batch_size %d capped to %d by MULTISTART_MAX_BATCH", asked, width)
    return width


def _by_word(spec, backend, pop, info, starts_per_device, device, steps, keyed):
    """``(width, tuning)`` for ``"auto"`` or ``"tune"``: a record, else the memory bound and,
    where it is worth it, timing. ``steps``: ``(n_steps, run_share)``."""
    n_steps, run_share = steps
    footprint = Footprint.of(backend, pop)
    info["checkpoint_bytes"] = footprint.checkpoint_bytes
    if not (spec == "tune" or _auto_measures(device)):
        bound = _bound(spec, backend, footprint, info, starts_per_device, device, measure=False)
        where = "an accelerator" if device.platform != "cpu" else "MULTISTART_AUTO_WIDTH=memory"
        info["reason"] = f"the memory bound ({bound.estimate}; no timing on {where})"
        return bound.width, None
    record = _record_of(backend, pop, starts_per_device, device, keyed)
    width, compile_s = _recorded(
        spec, record, backend, footprint, starts_per_device, device, n_steps
    )
    if width is not None:
        info["reason"] = f"recorded in {record['path']}"
        return width, record
    bound = _bound(spec, backend, footprint, info, starts_per_device, device, measure=True)
    timings = Timings(backend, pop, spec)
    if spec == "tune":
        info["reason"] = time_tune(timings, bound.width)
        tuning = {**record, "source": "measured", "method": spec}
    else:
        measured = records.device_gains(device)
        gate = None
        if n_steps is not None:
            gate = Gate(n_steps, compile_s=compile_s, measured=measured, run_share=run_share)
        info["reason"] = time_auto(timings, bound.width, gate)
        priced = gate is not None and len(timings.per_call) == 1
        tuning = {**record, "source": "priced" if priced else "measured"}
        tuning["method"] = "auto (priced)" if priced else spec
        if gate is not None:
            tuning["prices"] = gate.prices(timings)
            info.update(fit_estimate_s=tuning["prices"]["fit_s"], compile_estimate_s=gate.compile_s)
    tuning.update(width=timings.best(), table=timings.table())
    records.save(tuning)
    return tuning["width"], tuning


def _bound(spec, backend, footprint, info, starts_per_device, device, *, measure: bool):
    """The memory bound (:func:`multistart.width.auto_width`), its figures put in ``info``."""
    bound = auto_width(
        backend.compiled_for,
        starts_per_device=starts_per_device,
        device=device,
        start_bytes=footprint.start_bytes,
        checkpoint_bytes=footprint.checkpoint_bytes,
        upper=_upper(spec, measure, starts_per_device, max_batch_from_env(), device),
    )
    info.update(bound.as_dict())
    info["memory_width"] = bound.width
    _log_bound(spec, bound)
    return bound


def _auto_measures(device) -> bool:
    """Does ``"auto"`` consider timing widths here? On a CPU, unless
    ``MULTISTART_AUTO_WIDTH=memory`` (a GPU's throughput rises with the width until memory
    binds)."""
    return device.platform == "cpu" and auto_mode_from_env() == "measure"


def _upper(spec, measure: bool, starts_per_device: int, max_batch, device) -> int | None:
    """The widest width the memory bound may consider (None: :func:`auto_width`'s count cap).

    A measuring ``"auto"`` drops the count cap (a cheap objective with many starts wants wide
    chunks), except when there is no free-memory figure: then nothing else bounds the width.
    """
    if spec == "tune":
        return cap_width(starts_per_device, starts_per_device, max_batch)
    if not measure or memory_budget(device).nbytes is None:
        return None
    return balanced_width(
        starts_per_device, cap_width(sweep_width(starts_per_device), starts_per_device, max_batch)
    )


def sweep_width(starts_per_device: int) -> int:
    """The widest width a measuring ``"auto"`` considers for ``starts_per_device``: one that
    leaves the sweep :data:`SWEEP_CHUNKS` chunks, never narrower than :data:`SWEEP_MIN_WIDTH`:
    a chunk steps while any of its starts runs, which the timing of widths (every start
    running) cannot see.

    >>> sweep_width(100), sweep_width(2000), sweep_width(16000), sweep_width(100_000)
    (256, 256, 256, 1563)
    """
    return max(SWEEP_MIN_WIDTH, math.ceil(starts_per_device / SWEEP_CHUNKS))


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


# -- memory: the one check a width passes -----------------------------------------------------


@dataclass(frozen=True)
class Footprint:
    """What the population costs one device's budget: one start's state (for the size
    fallback) and the device's share of the copy the out-of-memory back-off keeps. Every width,
    measured or recorded, is checked by :meth:`fits`.
    """

    start_bytes: int
    checkpoint_bytes: int

    @classmethod
    def of(cls, backend, pop) -> Footprint:
        return cls(tree_bytes(pop.starts) // backend.n_total, tree_bytes(pop) // backend.n_devices)

    def fits(self, backend, width: int, budget) -> bool:
        """Does the chunk step at ``width`` (compiled now if it is not yet) fit ``budget``?"""
        if budget.nbytes is None:
            return True
        est = step_memory(backend.compiled_for(width), width, self.start_bytes)
        return need(est, self.checkpoint_bytes) <= budget.nbytes


def _record_of(backend, pop, starts_per_device, device, keyed) -> dict[str, Any]:
    """The record's key, what it was hashed from and its path (``None``: no cache folder)."""
    key, parts = records.tune_key(
        keyed["start_step"],
        pop,
        backend.data,
        device=device,
        backend=keyed["backend"],
        starts_per_device=starts_per_device,
        n_devices=backend.n_devices,
        program_hash=keyed["program_hash"],
    )
    path = records.record_path(key)
    return {"key": key, "key_parts": parts, "path": None if path is None else str(path)}


def _recorded(spec, record, backend, footprint: Footprint, starts_per_device, device, n_steps):
    """``(width, compile_s)``: the recorded width if it still serves (``record`` then says it
    came from the cache; else ``None``), and the compile seconds a priced record holds.

    A measured record serves whatever the fit. A priced one (the bound kept untimed) serves
    ``"auto"`` until a longer fit is expected to save more than a compile; ``"tune"`` always
    times.
    """
    path = record["path"]
    found = None if path is None or not Path(path).is_file() else records.read_width(Path(path))
    if found is None:
        return None, 0.0
    width, saved = found
    prices = saved.get("prices") or {}
    compile_s = float(prices.get("compile_s", 0.0))
    if saved.get("method") == "auto (priced)":
        if spec == "tune":
            return None, compile_s
        fit_s = float(prices.get("fit_s", 0.0)) * (n_steps or 0) / max(1, prices.get("n_steps", 1))
        gains = (*PRIOR_GAINS, *records.device_gains(device))
        # a record from before the seconds a start were kept: the median model's
        start_s = float(prices.get("start_s", sorted(s for s, _ in PRIOR_GAINS)[2]))
        if n_steps is not None and fit_s * expected_share(start_s, gains) > compile_s:
            say(
                spec,
                "batch_size %s: %d steps make timing worth it; the priced record is set aside",
                spec,
                n_steps,
            )
            return None, compile_s
    width = cap_width(width, starts_per_device, max_batch_from_env())
    if not footprint.fits(backend, width, memory_budget(device)):
        log.logger.info(
            "batch_size %s: the recorded width %d no longer fits the memory budget; timing again",
            spec,
            width,
        )
        return None, compile_s
    say(spec, "batch_size %s: width %d, recorded in %s", spec, width, path)
    record.update(
        source="cache", method=saved.get("method"), width=width, table=saved.get("table", [])
    )
    if saved.get("prices"):  # what the tail's narrowing is weighed on (decide.TailPrice)
        record["prices"] = saved["prices"]
    return width, compile_s
