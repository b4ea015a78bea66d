"""``curve_fit``: scipy's signature, one fit or a batch of them, scipy's full output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..common import log, status
from ..common.status import Status
from ..result.batch import BatchFits
from .arguments import _METHODS, _Args, _check_choices, _check_scipy_options, _default_starts
from .batch import _fit_batch
from .single import _fit


def curve_fit(
    f: Callable,
    xdata,
    ydata,
    p0=None,
    sigma=None,
    absolute_sigma: bool = False,
    check_finite: bool | None = None,
    bounds=(-np.inf, np.inf),
    method: str | None = None,
    jac=None,
    *,
    full_output: bool = False,
    nan_policy: str | None = None,
    mask=None,
    n_starts: int | None = None,
    batched: bool = False,
    resume: bool = False,
    fixed: dict | None = None,
    tied: dict | None = None,
    **options,
):
    """Fit ``f(xdata, *params)`` to ``ydata`` by least squares from many starts.

    scipy's arguments mean what they mean there (docs/curve-fit.md's table says each); ``f``
    is traced by JAX, in float64. ``p0`` is the first start, the others drawn in the box (or
    around ``p0`` at the spread the data allow, :func:`_spreads`); no step leaves the bounds.

    Args:
      f: ``f(x, *params)`` in ``jax.numpy``; it and ``xdata`` ... ``jac``, ``nan_policy`` are
        scipy's (``method`` ``"lm"``, ``"dogleg"`` or ``"gauss-newton"``; ``jac`` None: JAX
        differentiates ``f``; ``sigma`` a scalar, ``ydata``'s shape or ``(m, m)``; nan with
        ``nan_policy="omit"``, and an infinite ``sigma``, leave their points out).
      full_output: scipy's ``infodict, mesg, ier`` too, the Result in ``infodict``.
      mask: ``True`` where a point is left out (``numpy.ma``'s meaning; a masked ``ydata``
        does the same): a single fit drops it, a batch leaves it out of its own fit.
      n_starts: local searches (default 32); with ``batched``, per fit (default 8).
      batched: ``ydata`` (and ``sigma``, ``xdata``, ``p0`` if they do) carry a leading axis of
        independent fits, fitted in one search, each as alone with ``start_strategy="band"``.
      resume: continue the search checkpointed in ``checkpoint_dir``.
      fixed: ``{name: value}`` held (lmfit's ``vary=False``; equal bounds fix one too).
      tied: ``{name: other}`` or ``{name: g}``, ``g(params)`` by name (lmfit's ``expr``).
      **options: the search's (:class:`multistart.MultiStartLeastSquares`): ``n_steps``...

    Returns:
      ``(popt, pcov)``, or with ``full_output`` scipy's ``(popt, pcov, infodict, mesg, ier)``
      (``infodict["result"]``, or batched ``infodict["fits"]``, a :class:`BatchFits`); ``pcov``
      ``inf``, with an ``OptimizeWarning``, where it cannot be estimated; a best fit on a
      bound is an ``OptimizeWarning`` too. Bad arguments raise ValueError / TypeError before
      any compile; Ctrl-C raises :class:`multistart.SearchInterrupted` (batched: ``.fits``).
    """
    _check_choices(method, jac, absolute_sigma, full_output, batched, resume)
    _check_scipy_options(options)
    args = _Args(f, xdata, ydata, p0, sigma, absolute_sigma, check_finite, bounds, nan_policy, mask)
    fit, hold = _fit_batch if batched else _fit, {"fixed": fixed, "tied": tied}
    with log.quiet():  # as scipy: nothing printed unless something needs the user
        k = _default_starts(n_starts, batched)  # starts a fit
        *answer, bound = fit(args, resume, hold, k, method=_METHODS[method], **options)
    return _returned(answer, bound, full_output)


def _returned(answer, bound, full_output: bool) -> tuple:
    """``(popt, pcov)``, or with ``full_output`` scipy's five values."""
    popt, pcov, record, fvec = answer
    if not full_output:
        return popt, pcov
    return (popt, pcov, *_full_output(record, fvec, _bound_words(*bound)))


def _full_output(record, fvec, on_bound: np.ndarray) -> tuple[dict, Any, Any]:
    """scipy's ``(infodict, mesg, ier)``: ``ier`` 1 where the best start settled (converged,
    or stalled: see ``mesg``), 5 where it took ``n_steps`` (MINPACK's ``maxfev``), 0
    otherwise; ``mesg`` the status's message, and ``on_bound``'s words where the fit has a
    parameter on a bound (``ier`` stays 1: a constrained optimum, scipy's ``least_squares``
    reports success there too, its ``active_mask`` saying which); with the Result
    (``"result"``) or a batch's :class:`BatchFits` (``"fits"``)."""
    if isinstance(record, BatchFits):
        codes = status.codes_of(record.status)
        fvec = np.asarray(fvec, dtype=np.float64)  # read from the device only when asked for
        info = {"nfev": np.asarray(record.n_evals), "fvec": fvec, "fits": record}
        return info, list(status.messages(codes) + on_bound), _IER[codes]
    best = record.best_index
    ended = Status(record.status[best]) if best >= 0 else Status.NONFINITE
    info = {"nfev": int(np.sum(record.n_evals)), "fvec": fvec, "result": record}
    return info, ended.message + on_bound[0], int(_IER[ended.code])


def _bound_words(names, at_bound: np.ndarray) -> np.ndarray:
    """``(k,)`` what ``mesg`` adds for each fit with a parameter on a bound (``at_bound``
    ``(k, n)``), ``""`` for the others: one string per pattern of parameters, not per fit."""
    out = np.full(len(at_bound), "", dtype=object)
    hit = at_bound.any(axis=1)
    if hit.any():
        patterns, which = np.unique(at_bound[hit], axis=0, return_inverse=True)
        words = [
            f" On a bound: {', '.join(k for k, b in zip(names, p, strict=True) if b)} (the "
            "optimum may lie outside the bounds: widen them, or the parameter is not "
            "determined there)."
            for p in patterns
        ]
        out[hit] = np.array(words + [None], dtype=object)[:-1][which.reshape(-1)]
    return out


#: scipy's ``ier`` of each status (by code): 1 settled, 5 out of steps (``maxfev``), 0 else
_IER = np.array([1 if s.settled else 5 if s is Status.MAX_STEPS else 0 for s in Status])
