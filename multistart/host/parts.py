"""A search's parts run through any engine's ``submit`` and merged: :func:`fit_parts`.

Every scheduler people scale out with has a ``submit(fn, *args)`` that returns a future with
``.result()``: :class:`concurrent.futures.Executor`, Dask's ``Client.submit``, submitit's
executors; Ray's is one line (``lambda fn, *a: ray.remote(fn).remote(*a).future()``). The
part's function, :func:`run_part`, lives here, in the installed package, so a worker process
imports it by name; the search, the objective and the space travel pickled, as the engine
sends arguments. A failed part loses only itself: :class:`PartsFailed` carries the others'
Results, and a second call with ``done=`` runs only what is missing.
"""

from __future__ import annotations

import inspect
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..result import Result
from .split import check_part

__all__ = ["fit_parts", "run_part", "PartsFailed"]


class PartsFailed(RuntimeError):
    """Some parts of :func:`fit_parts` failed; the others' Results are kept.

    Attributes:
      k: the number of parts.
      done: ``{i: Result}``, every part that finished (the ones passed in ``done=`` included).
      failed: ``{i: exception}``, what each failed part raised (through its future).
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
      TypeError / ValueError: a bad ``k``, ``submit``, ``done`` or fit argument, or a search
        that cannot run in parts; before anything is submitted.
      PartsFailed: some parts failed; it names them and holds the others' Results.
      ValueError: from the merge, when ``done`` holds parts of another search (it says what
        differs).
    """
    _check_k(search, k)
    if not callable(submit):
        raise TypeError(f"submit must be callable as submit(fn, *args); got {submit!r}")
    _check_fit_kwargs(search, objective, space, k, fit_kwargs)
    have = _done(done, k)
    futures = {}
    for i in range(k):
        if i not in have:
            futures[i] = submit(run_part, search, objective, space, (i, k), dict(fit_kwargs))
            _check_future(futures[i])
    failed: dict[int, BaseException] = {}
    for i, future in futures.items():
        try:
            have[i] = future.result()
        except Exception as e:  # an engine's own errors (a lost worker) included
            failed[i] = e
    if failed:
        raise PartsFailed(k, dict(sorted(have.items())), failed)
    return Result.merge([have[i] for i in range(k)])


def _check_k(search, k) -> None:
    if not isinstance(k, numbers.Integral) or isinstance(k, bool):
        raise TypeError(f"k (the number of parts) must be an int; got {k!r}")
    options = getattr(search, "options", None)
    if options is None or not callable(getattr(search, "fit", None)):
        raise TypeError(
            f"search must be a multistart search (with fit and options); got {search!r}"
        )
    check_part((0, int(k)), options)  # k's range and a search whose slots are coupled


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
