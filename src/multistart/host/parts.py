"""A search's parts: a fit split into the i-th of k parts of one start plan (``part=(i, k)``)
or over a job's processes, and the parts run through any engine's ``submit`` and merged
(:func:`fit_parts`).

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

Every scheduler people scale out with has a ``submit(fn, *args)`` that returns a future with
``.result()``: :class:`concurrent.futures.Executor`, Dask's ``Client.submit``, submitit's
executors; Ray's is one line (``lambda fn, *a: ray.remote(fn).remote(*a).future()``). The
part's function, :func:`run_part`, lives here, in the installed package, so a worker process
imports it by name; the search, the objective and the space travel pickled, as the engine
sends arguments. A failed part loses only itself (one that raised, was lost, or was stopped by
a signal, :class:`multistart.SearchInterrupted`): :class:`PartsFailed` carries the others'
Results, and a second call with ``done=`` runs only what is missing.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import numbers
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from typing import Any

import jax

from ..common import log
from ..common.digest import starts_hash
from ..device.chunking import part_slots
from ..device.distributed import allgather_bytes
from ..model.problem import Problem
from ..result import Result
from ..result.merge import config_difference, difference
from ..starts.strategies import StartPlan
from .checkpoint import SearchInterrupted

__all__ = ["Part", "check_part", "check_stack", "coupling", "select_part", "over_processes"]
__all__ += ["merge_over_processes", "first_process_logs"]
__all__ += ["fit_parts", "run_part", "PartsFailed"]


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
    first of the configuration's couplings (:meth:`multistart.SearchConfig.couplings`) that a
    part may not keep."""
    for c in options.couplings():
        if not c.part_may_keep:
            return f"{c.option}: {c.why}"
    return None


def check_stack(problem, options, part, n_devices: int = 1) -> None:
    """A stack of datasets (``problem.rows_per_datum``) runs only where every row is its own
    start of its own dataset, on one device: not in parts, and with none of the options that
    couple slots (:meth:`multistart.SearchConfig.couplings`: the broad-start filter among them)
    but a shared budget. ``options`` is the search's ``SearchConfig``."""
    if problem.rows_per_datum is None:
        return
    if n_devices > 1:
        raise ValueError(
            f"a stack of datasets (curve_fit(..., batched=True)) runs on one device; got "
            f"{n_devices} devices: pass devices=1 (or split the stack and fit each part on "
            "its own device)"
        )
    given = ["part"] if part is not None else []
    given += [c.option for c in options.couplings() if not c.stack_may_keep]
    if given:
        raise ValueError(
            f"a stack of datasets (curve_fit(..., batched=True)) fits every dataset apart from "
            f"the others; {', '.join(given)} would rank or replace starts across the whole "
            "search, so across datasets: drop it, or fit those datasets one by one (a batch "
            "draws its starts without a filter and runs every start to its end)"
        )


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


class PartsFailed(RuntimeError):
    """Some parts of :func:`fit_parts` failed; the others' Results are kept.

    Attributes:
      k: the number of parts.
      done: ``{i: Result}``, every part that finished (the ones passed in ``done=`` included).
      failed: ``{i: exception}``, what each failed part raised (through its future); a part
        stopped by Ctrl-C or SIGTERM raised :class:`multistart.SearchInterrupted`, whose
        ``.result`` holds that part's starts so far.
      missing: the failed parts' indices, sorted.

    Run the missing parts again with ``ms.fit_parts(..., done=error.done)``, which submits only
    those and merges, or each alone with ``fit(..., part=(i, k))`` and
    :meth:`multistart.Result.merge`.
    """

    def __init__(self, k: int, done: dict[int, Result], failed: dict[int, BaseException]):
        self.k, self.done, self.failed = k, done, failed
        self.missing = sorted(failed)
        why = "; ".join(f"part {i}: {type(e).__name__}: {_gist(e)}" for i, e in failed.items())
        super().__init__(
            f"part{'s' if len(failed) > 1 else ''} {self.missing} of {k} failed ({why}); the "
            f"{len(done)} other parts' Results are kept in .done: run the failed ones again "
            "with fit_parts(..., done=error.done), which submits only those and merges"
        )


def run_part(search, objective, space, part: tuple[int, int], fit_kwargs: dict) -> Result:
    """One part, in whatever process the engine runs it: ``search.fit(..., part=part)``."""
    return search.fit(objective, space, part=part, **fit_kwargs)


def fit_parts(
    search,
    objective,
    space,
    k: int,
    *,
    submit: Callable[..., Any],
    done: Mapping[int, Result] | Iterable[Result] | None = None,
    **fit_kwargs,
) -> Result:
    """Run the ``k`` parts ``part=(i, k)`` of one search through ``submit`` and merge them.

    Each part runs ``search.fit(objective, space, part=(i, k), **fit_kwargs)`` in the process
    the engine gives it, and :meth:`multistart.Result.merge` joins the parts: the Result one
    ``search.fit(objective, space)`` gives, bit for bit at a fixed ``batch_size``.

    Args:
      search: a multistart search (``MultiStartAdam(...)``, ``MultiStartLeastSquares(...)``).
      objective, space: as ``search.fit`` takes them (``space=None`` for a factor graph),
        pickled to the workers: the objective is a module-level function the workers can
        import (or one ``cloudpickle`` pickles by value), not a lambda of a script that the
        workers cannot see.
      k: the number of parts, ``1 <= k <= n_starts``.
      submit: ``submit(fn, *args)`` returning a future with ``.result()``: an executor's or
        Dask client's ``submit``, a submitit executor's; for Ray
        ``lambda fn, *a: ray.remote(max_retries=3)(fn).remote(*a).future()``. Retries are
        the engine's (``functools.partial(client.submit, retries=2)`` for Dask).
      done: parts already run (a ``{i: Result}`` such as :attr:`PartsFailed.done`, or a list
        of Results or their saved paths' loads): only the other parts are submitted.
      **fit_kwargs: passed to every part's ``fit`` (``starts=``, ``resume=``).

    Returns:
      The merged :class:`multistart.Result` (``stats["n_parts"] == k``).

    Raises:
      TypeError / ValueError: a bad ``k``, ``submit`` (one that cannot take ``(fn, *args)``),
        ``done`` or fit argument, a search that cannot run in parts, or ``done`` holding parts
        of different searches or of another configuration than ``search``'s (it says what
        differs); before anything is submitted.
      PartsFailed: some parts failed (raised, were lost, or were stopped by a signal:
        :class:`multistart.SearchInterrupted`); it names them and holds the others' Results.
      ValueError: from the merge, when ``done`` holds parts of another model or start plan
        than the one given (other data, other ``starts=``): those need the model traced and
        the starts planned, which the parts do.
    """
    _check_k(search, k)
    _check_submit(submit)
    _check_fit_kwargs(search, objective, space, k, fit_kwargs)
    have = _done(done, k)
    _check_done_of(search, have, k)
    futures = {}
    for i in range(k):
        if i not in have:
            futures[i] = submit(run_part, search, objective, space, (i, k), dict(fit_kwargs))
            _check_future(futures[i])
    failed = _wait(futures, have)
    if failed:
        raise PartsFailed(k, dict(sorted(have.items())), failed)
    return Result.merge([have[i] for i in range(k)])


def _wait(futures: dict, have: dict[int, Result]) -> dict[int, BaseException]:
    """Each part's Result into ``have``, in order; what each failed part raised, returned."""
    failed: dict[int, BaseException] = {}
    for i, future in futures.items():
        try:
            have[i] = future.result()
        # an engine's own errors (a lost worker) included, and a part stopped by a signal
        # (SearchInterrupted is a KeyboardInterrupt: the caller's own Ctrl-C still stops this)
        except (Exception, SearchInterrupted) as e:
            failed[i] = e
    return failed


def _check_k(search, k) -> None:
    if not isinstance(k, numbers.Integral) or isinstance(k, bool):
        raise TypeError(f"k (the number of parts) must be an int; got {k!r}")
    options = getattr(search, "options", None)
    if options is None or not callable(getattr(search, "fit", None)):
        raise TypeError(
            f"search must be a multistart search (with fit and options); got {search!r}"
        )
    check_part((0, int(k)), options)  # k's range and a search whose slots are coupled


#: what fit_parts calls ``submit`` with: the part's function, then its arguments
_SUBMITTED = "submit(run_part, search, objective, space, (i, k), fit_kwargs)"


def _check_submit(submit) -> None:
    """``submit`` must take ``(fn, *args)``: five arguments after the part's function."""
    if not callable(submit):
        raise TypeError(f"submit must be callable as submit(fn, *args); got {submit!r}")
    try:
        signature = inspect.signature(submit)
    except (TypeError, ValueError):  # a builtin without one: its call will tell
        return
    try:
        signature.bind(run_part, None, None, None, (0, 1), {})
    except TypeError as e:
        raise TypeError(
            f"submit must be callable as submit(fn, *args) and return a future (an executor's "
            f"or Dask client's submit, submitit's executor.submit); {_name(submit)}{signature} "
            f"cannot take fit_parts' {_SUBMITTED}: {e}"
        ) from None


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _check_done_of(search, have: dict[int, Result], k: int) -> None:
    """Parts in ``done`` of another search are refused before any part is submitted: each
    against the others (model, parameters, configuration, rule and start plan, as the merge
    compares them) and against ``search``'s configuration. A part of another model or start
    plan than the one given is found only by the merge: its hashes need the model traced and
    the starts planned."""
    if not have:
        return
    (first_i, first), *others = sorted(have.items())
    for i, part in others:
        what = difference(first, part)
        if what is not None:
            raise ValueError(
                f"done holds parts of different searches: part {i} of {k} is of another "
                f"search than part {first_i}: {what}"
            )
    config = getattr(search, "config", None)
    what = config_difference(first.config, config()) if callable(config) else None
    if what is not None:
        raise ValueError(
            f"done holds parts of another search than the one given ({what}, from the parts' "
            "to the search's): pass the search that ran them, or leave done out"
        )


def _check_fit_kwargs(search, objective, space, k, fit_kwargs) -> None:
    if "part" in fit_kwargs:
        raise TypeError("fit_parts sets each part's part=(i, k) itself: drop part=")
    try:
        inspect.signature(search.fit).bind(objective, space, part=(0, k), **fit_kwargs)
    except TypeError as e:
        raise TypeError(
            f"fit_parts passes **fit_kwargs to search.fit, which refuses them: {e}"
        ) from e


def _done(done, k: int) -> dict[int, Result]:
    if done is None:
        return {}
    items = list(done.values()) if isinstance(done, Mapping) else list(done)
    have: dict[int, Result] = {}
    for j, r in enumerate(items):
        if not isinstance(r, Result) or "part" not in r.stats:
            raise TypeError(f"done[{j}] is not the Result of a part (fit(..., part=(i, k)))")
        i, count = (int(v) for v in r.stats["part"])
        if count != k:
            raise ValueError(f"done[{j}] is part {i} of {count}, not of k={k}")
        if i in have:
            raise ValueError(f"done holds part {i} of {k} twice")
        have[i] = r
    return have


def _check_future(future) -> None:
    if not callable(getattr(future, "result", None)):
        raise TypeError(
            f"submit(fn, *args) returned a {type(future).__name__}, not a future with .result(); "
            "for Ray pass submit=lambda fn, *a: ray.remote(fn).remote(*a).future()"
        )


_RAISED = re.compile(r"^\s*[A-Za-z_][\w.]*(?:Error|Exception|Interrupted|Exit)\b.*?: \S")


def _gist(e: BaseException) -> str:
    """An error in one line: where an engine wraps the part's error in a traceback (Ray,
    submitit), the traceback's last ``Name: message`` line; otherwise the first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    return raised[-1] if raised else lines[0] if lines else "(no message)"
