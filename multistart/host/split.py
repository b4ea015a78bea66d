"""A fit split: the i-th of k parts of one start plan (``part=(i, k)``), or over a job's processes.

Every part computes the whole search's start plan from the seed (user starts, strategy draws,
the broad-start filter's ranking and diverse choice), then runs only a contiguous block of its
slots, split as :func:`numpy.array_split` splits ``n_starts`` rows
(:func:`multistart.device.chunking.part_slots`). Starts never interact, so each start's record in a
part is the one the whole run gives that slot, and the merge of the parts is a concatenation in
slot order (:meth:`multistart.Result.merge`).

Parts are for schedulers that run and retry tasks independently (Slurm job arrays, Ray,
Dask): a failed part is run again alone. What couples the slots of one search has no parts
(:func:`coupling`). In a job of several JAX processes a fit without ``part=`` runs one part in
each process and merges them, or runs on one mesh over every process's devices
(:func:`over_processes`).
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import tempfile
from contextlib import contextmanager

import jax

from ..common import log
from ..common.digest import starts_hash
from ..device.chunking import part_slots
from ..device.distributed import allgather_bytes
from ..model.problem import Problem
from ..result import Result
from ..starts.strategies import StartPlan

__all__ = ["Part", "check_part", "coupling", "select_part", "over_processes"]
__all__ += ["merge_over_processes", "first_process_logs"]


@dataclasses.dataclass(frozen=True)
class Part:
    """The ``index``-th of ``count`` parts: slots ``lo`` to ``hi`` (exclusive)."""

    index: int
    count: int
    lo: int
    hi: int

    def words(self, n_total: int) -> str:
        return f" (slots {self.lo}..{self.hi - 1} of {n_total}: part {self.index} of {self.count})"


def check_part(part, options) -> Part | None:
    """Validate ``fit``'s ``part=`` for a search of ``options``; ``None`` is the whole run.

    Raises:
      ValueError: ``part`` is not a pair ``(i, k)`` of ints with ``0 <= i < k <= n_starts``,
        or the search couples its slots (:func:`coupling`).
    """
    if part is None:
        return None
    ints = (
        isinstance(part, (tuple, list))
        and len(part) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in part)
    )
    if not ints:
        raise ValueError(f"part must be None or a pair (i, k) of ints; got {part!r}")
    i, k = (int(v) for v in part)
    n = options.n_starts
    if not (1 <= k <= n and 0 <= i < k):
        raise ValueError(
            f"part=(i, k) needs 1 <= k <= n_starts ({n}) and 0 <= i < k "
            f"(parts are numbered from 0); got part={part!r}"
        )
    why = coupling(options)
    if why is not None:
        raise ValueError(
            f"part={part!r} cannot be used with {why}, so a part could not give the whole "
            "run's records; run the search whole, or drop it"
        )
    return Part(i, k, *part_slots(i, k, n))


def coupling(options) -> str | None:
    """What couples a search's slots (so it cannot run in parts), in words, or ``None``: the
    first of the configuration's couplings (:meth:`multistart.SearchConfig.couplings`)."""
    for c in options.couplings():
        return f"{c.option}: {c.why}"
    return None


def select_part(start_plan: StartPlan, part: Part | None) -> StartPlan:
    """The whole plan's starts for ``part`` only; its statistics name the part and the plan.

    ``stats["plan"]`` is the hash of the whole plan's starts, so the merge can tell parts of
    one plan from parts of another (other user starts, say) with the same configuration.
    """
    if part is None:
        return start_plan
    rows = slice(part.lo, part.hi)
    stats = dict(
        start_plan.stats,
        part=[part.index, part.count],
        slots=[part.lo, part.hi],
        plan=starts_hash(start_plan.x0),
    )
    return dataclasses.replace(
        start_plan,
        x0=jax.tree_util.tree_map(lambda a: a[rows], start_plan.x0),
        started=start_plan.started[rows],
        reserve=None,
        explore=None,
        stats=stats,
    )


# -- several processes --------------------------------------------------------------------------


def over_processes(options) -> tuple[str | None, str | None]:
    """How a fit without ``part=`` runs in a job of several processes, and why: ``(None,
    None)`` in a job of one.

    ``"split"``: part ``(process_index, process_count)`` in each process, on its own devices,
    the parts merged at the end (no traffic between processes until then). ``"mesh"``: one
    search on a mesh over every process's devices, when a part could not give the whole run's
    records (:func:`coupling`), when the search checkpoints (one checkpoint of the whole
    search, with orbax's multi-host saves), or when there are fewer starts than processes.
    """
    k = jax.process_count()
    if k == 1:
        return None, None
    why = coupling(options)
    if why is None and options.checkpoint_dir is not None:
        why = "it checkpoints"
    if why is None and options.n_starts < k:
        why = f"n_starts ({options.n_starts}) is below the number of processes ({k})"
    return ("split", None) if why is None else ("mesh", why)


def merge_over_processes(result: Result, problem: Problem) -> Result:
    """Every process's part, exchanged through JAX's runtime and merged, in every process."""
    k = jax.process_count()
    with tempfile.TemporaryDirectory(prefix="multistart-parts-") as folder:
        mine = os.path.join(folder, "mine.npz")
        result.save(mine, errors=False)  # the merge computes the covariance when asked
        with open(mine, "rb") as f:
            blobs = allgather_bytes(f.read())
        paths = []
        for i, blob in enumerate(blobs):
            paths.append(os.path.join(folder, f"part-{i}-of-{k}.npz"))
            with open(paths[-1], "wb") as f:
                f.write(blob)
        merged = Result.merge(paths)
    return merged.with_stats(n_processes=k).attach_problem(problem)


@contextmanager
def first_process_logs():
    """Only process 0 of a job logs below WARNING (and draws the progress bar)."""
    if jax.process_count() == 1 or jax.process_index() == 0:
        yield
        return
    quiet = _BelowWarning()
    log.logger.addFilter(quiet)
    try:
        yield
    finally:
        log.logger.removeFilter(quiet)


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING
