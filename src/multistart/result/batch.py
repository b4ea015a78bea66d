"""A batch of fits (``curve_fit(batched=True)``): every fit reported as a fit.

:class:`BatchFits` holds, for each fit of the stack, what a single ``curve_fit`` gives: its
parameters and their errors, its ``pcov``, its χ², reduced χ² and degrees of freedom, how its
best start ended, a flag per parameter on a bound, and which parameters were fixed or tied.
``fits.report(i)`` is fit ``i``'s report (lmfit's ``fit_report``), ``fits.report()`` the
batch's, ``fits.to_dataframe()`` one row per fit, ``fits.map(name, shape)`` a column laid out on
the fits' grid; ``fits.save(path)`` and :func:`load_fits` keep them
(:mod:`multistart.result.fits_file`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import status
from ..common.status import Status
from . import fits_file
from .core import Result
from .fits_file import ARRAY, RESULT, STATUS, VALUE, kept
from .plot import PLOTS_HINT

__all__ = ["BatchFits", "bound_summary", "load_fits"]

MIN_CORRELATION = 0.1  # as Result.report: smaller correlations are not listed
FITS_NAMED = 10  # fits named in the summary of those on a bound


@dataclass(frozen=True, eq=False)
class BatchFits:
    """Each fit of a batched :func:`multistart.curve_fit` (``full_output=True``).

    Attributes:
      names: the parameters, in ``f``'s argument order (``popt``'s columns).
      popt: ``(n_fits, n)`` each fit's parameters (``nan`` for a fit with no finite start).
      pcov: ``(n_fits, n, n)`` each fit's ``pcov``; the rows and columns of a fixed
        parameter are 0, a tied one's propagated from the parameters it is tied to.
      errors: ``(n_fits, n)`` ``sqrt(diag(pcov))``: 0 for a fixed parameter, a tied one's
        through its tie, ``inf`` where the covariance could not be estimated.
      best_fom: ``(n_fits,)`` the figure of merit (``‖r‖²``, the χ² with ``sigma``) at each
        fit's best start (``inf`` when none was finite).
      dof: ``(n_fits,)`` degrees of freedom, points that count (``n_points``) minus free
        parameters (0 for a fit not run).
      redchi: ``(n_fits,)`` the reduced χ², ``best_fom / dof`` (``nan`` without a degree of
        freedom).
      status: ``(n_fits,)`` the :class:`multistart.Status` of each fit's best start
        (``message`` says what each means).
      at_bound: ``(n_fits, n)`` whether each parameter of each fit lies on a bound
        (within 1e-4 of a finite box's width, or of ``max(|bound|, 1)`` for a one-sided one:
        :func:`multistart.model.priors.near_bound`).
      n_evals: ``(n_fits,)`` evaluations made by all of each fit's starts.
      best_row: ``(n_fits,)`` the row of ``result`` holding each fit's best start (fit ``i``'s
        starts are rows ``i * n_starts`` to ``(i + 1) * n_starts - 1``).
      n_starts: starts per fit.
      free: ``(n,)`` which parameters were fitted (``False``: fixed or tied).
      held: what held each parameter that is not free, in words (``"fixed"``, ``"= a1"``).
      result: the :class:`multistart.Result` of the whole search, one row per start.
      n_points: ``(n_fits,)`` each fit's data points that count: those not left out (nan with
        ``nan_policy="omit"``, masked, or of infinite ``sigma``). A fit with fewer than its
        free parameters was not run: status ``no_data``, its values and errors ``nan``.

    ``fits.save(path)`` keeps every field in one file, :func:`multistart.load_fits` reads it.
    """

    # Each field says how its file keeps it (multistart.result.fits_file): a field added here
    # with kept(...) is saved and loaded with nothing else to change.
    names: tuple[str, ...] = kept(VALUE)
    popt: np.ndarray = kept(ARRAY, per_fit=True)
    pcov: np.ndarray = kept(ARRAY, per_fit=True)
    best_fom: np.ndarray = kept(ARRAY, per_fit=True)
    dof: np.ndarray = kept(ARRAY, per_fit=True)
    status: np.ndarray = kept(STATUS, per_fit=True)
    at_bound: np.ndarray = kept(ARRAY, per_fit=True)
    n_evals: np.ndarray = kept(ARRAY, per_fit=True)
    best_row: np.ndarray = kept(ARRAY, per_fit=True)
    n_starts: int = kept(VALUE)
    free: np.ndarray = kept(ARRAY)
    held: dict = kept(VALUE)
    result: Result = kept(RESULT)
    n_points: np.ndarray = kept(ARRAY, per_fit=True, default=None)

    def __post_init__(self):
        object.__setattr__(self, "names", tuple(self.names))  # a file's JSON gives a list
        if self.n_points is None:  # written before points could be left out: every one counts
            n = np.asarray(self.dof) + int(np.sum(self.free))
            object.__setattr__(self, "n_points", n)

    @property
    def n_fits(self) -> int:
        return int(len(self.popt))

    def save(self, path) -> None:
        """Write every field (each fit's, and the whole search's :class:`multistart.Result`)
        to one ``.npz`` file at exactly ``path``; :func:`multistart.load_fits` reads it back,
        its errors, reports and table the same.

        Arrays are NumPy arrays in the archive, the rest JSON; nothing is pickled. The file is
        written whole or not at all (a temporary file, renamed). The search's Result is saved
        without a covariance: a batch's has none, ``pcov`` is each fit's.
        """
        fits_file.save(self, path)

    @classmethod
    def load(cls, path) -> BatchFits:
        """Read the fits :meth:`save` wrote (:func:`multistart.load_fits`)."""
        return fits_file.load(cls, path)

    @property
    def errors(self) -> np.ndarray:
        return np.sqrt(np.abs(np.diagonal(self.pcov, axis1=1, axis2=2)))

    @property
    def redchi(self) -> np.ndarray:
        dof = np.asarray(self.dof, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(dof > 0, np.asarray(self.best_fom) / np.where(dof > 0, dof, 1), np.nan)

    @property
    def message(self) -> list[str]:
        """Each fit's status in words (:attr:`multistart.Status.message`)."""
        return list(status.messages(status.codes_of(self.status)))

    def on_bound(self) -> np.ndarray:
        """The fits with a parameter on a bound (their indices)."""
        return np.flatnonzero(np.asarray(self.at_bound).any(axis=1))

    def report(self, i: int | None = None, *, min_correlation: float = MIN_CORRELATION) -> str:
        """Fit ``i``'s report, as lmfit's ``fit_report`` (its χ², reduced χ², degrees of
        freedom and status; each parameter's value, error and bound flag; its correlations
        above ``min_correlation``), or with ``i=None`` the batch's: the fits by status, those
        on a bound, the reduced χ²'s distribution."""
        if i is None:
            return _batch_report(self)
        if (
            isinstance(i, bool)
            or not isinstance(i, int | np.integer)
            or not -self.n_fits <= i < self.n_fits
        ):
            raise IndexError(f"fit index must be an int in [0, {self.n_fits}); got {i!r}")
        return _fit_report(self, int(i) % self.n_fits, min_correlation)

    def to_dataframe(self):
        """One row per fit, as a ``pandas.DataFrame``: ``fit``, ``status``, ``chi2``,
        ``redchi``, ``dof``, ``n_points``, ``n_evals``, ``best_row``, ``at_bound`` (any
        parameter), then each
        parameter by name, its error as ``error:<name>`` and its flag as ``at_bound:<name>``.

        Raises:
          ImportError: pandas (the ``plots`` extra) is not installed.
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                f"BatchFits.to_dataframe() needs pandas; install it with {PLOTS_HINT}"
            ) from e
        return pd.DataFrame(self._columns())

    def map(self, name: str, shape) -> np.ndarray:
        """Column ``name`` of :meth:`to_dataframe` (a parameter, ``"error:<name>"``,
        ``"at_bound:<name>"``, ``"chi2"``, ``"redchi"``, ``"status"``, ...) laid out on the grid
        the fits came from: fit ``i`` at ``np.unravel_index(i, shape)``, NumPy's (C) order,
        the order ``cube.reshape(n_y * n_x, n_channels)`` lays a cube's spaxels out in.

        ``fits.map("v", (48, 48))`` is the velocity map of a 48 x 48 cube; a fit with no finite
        start holds ``nan``. Needs no pandas.

        Args:
          name: the column, as :meth:`to_dataframe` names it (a parameter's own name first).
          shape: the grid, an int or a tuple of ints whose product is ``n_fits`` (one of them
            may be ``-1``, as in :func:`numpy.reshape`).

        Returns:
          A new array of ``shape``.

        Raises:
          ValueError: ``name`` is no column (the message lists them), or ``shape`` does not
            hold ``n_fits`` fits.
        """
        columns = self._columns()
        if not isinstance(name, str) or name not in columns:
            params = ", ".join(repr(n) for n in self.names)
            others = ", ".join(repr(c) for c in columns if c not in self.names and ":" not in c)
            raise ValueError(
                f"name must be a parameter ({params}), 'error:<name>', 'at_bound:<name>' or "
                f"one of {others}; got {name!r}"
            )
        return np.asarray(columns[name]).reshape(_grid(shape, self.n_fits)).copy()

    def _columns(self) -> dict[str, np.ndarray]:
        """:meth:`to_dataframe`'s columns, by name."""
        at_bound = np.asarray(self.at_bound, dtype=bool)
        columns: dict[str, Any] = {
            "fit": np.arange(self.n_fits),
            "status": np.array([str(s) for s in self.status], dtype=object),
            "chi2": np.asarray(self.best_fom, dtype=np.float64),
            "redchi": self.redchi,
            "dof": np.asarray(self.dof),
            "n_points": np.asarray(self.n_points),
            "n_evals": np.asarray(self.n_evals),
            "best_row": np.asarray(self.best_row),
            "at_bound": at_bound.any(axis=1),
        }
        errors = self.errors
        for j, name in enumerate(self.names):
            columns[name] = self.popt[:, j]
        for j, name in enumerate(self.names):
            columns[f"error:{name}"] = errors[:, j]
        for j, name in enumerate(self.names):
            columns[f"at_bound:{name}"] = at_bound[:, j]
        return columns

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in status.counts(self.status).items())
        return (
            f"BatchFits(n_fits={self.n_fits}, n_starts={self.n_starts}, "
            f"params={list(self.names)}, status: {counts}, on a bound: {len(self.on_bound())})"
        )


def load_fits(path) -> BatchFits:
    """Read a batch's fits that :meth:`BatchFits.save` wrote: every per-fit field, so its
    errors, reports and :meth:`~BatchFits.to_dataframe` are the saved fits', and the whole
    search's :class:`multistart.Result` (``fits.result``). No pickle is ever loaded.

    Every member of the file is read and checked (its CRC-32) before anything is built.

    Example:
      >>> import multistart as ms
      >>> fits.save("cube-fits.npz")  # doctest: +SKIP
      >>> fits = ms.load_fits("cube-fits.npz")  # in another session  # doctest: +SKIP
      >>> v = fits.map("v", (48, 48))  # a 48 x 48 cube's velocity map  # doctest: +SKIP

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError: the file is not a saved BatchFits: cut short, altered (a changed byte), a
        member missing or of the wrong length, a saved :class:`multistart.Result` (read it
        with ``ms.Result.load``), another kind of file or an unknown format version; the
        message names the file.
    """
    return BatchFits.load(path)


def _grid(shape, n_fits: int) -> tuple[int, ...]:
    """``shape`` as a tuple that holds ``n_fits`` fits, checked."""
    dims = (shape,) if isinstance(shape, numbers.Integral) else shape
    ints = isinstance(dims, (tuple, list)) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims
    )
    if not ints or not dims or any(d == 0 or d < -1 for d in dims) or list(dims).count(-1) > 1:
        raise ValueError(
            "shape must be a positive int or a tuple of them (one may be -1), the grid the "
            f"fits were laid out on; got {shape!r}"
        )
    dims = tuple(int(d) for d in dims)
    known = math.prod(d for d in dims if d != -1)
    if (-1 in dims and n_fits % known) or (-1 not in dims and known != n_fits):
        raise ValueError(
            f"shape {shape!r} holds {known}{' x k' if -1 in dims else ''} fits; this batch "
            f"has {n_fits}"
        )
    return dims


def bound_summary(fits: BatchFits) -> str | None:
    """The one line a batch warns with when fits have a parameter on a bound (else ``None``):
    ``"12 of 500 fits have a parameter on a bound: fits 3, 17, ...; see fits.at_bound"``."""
    hit = fits.on_bound()
    if not hit.size:
        return None
    shown = ", ".join(str(i) for i in hit[:FITS_NAMED]) + (", ..." if hit.size > FITS_NAMED else "")
    names = [n for j, n in enumerate(fits.names) if np.asarray(fits.at_bound)[:, j].any()]
    verb = "has" if hit.size == 1 else "have"
    return (
        f"{hit.size} of {fits.n_fits} fit{'s' if fits.n_fits > 1 else ''} {verb} a parameter on "
        f"a bound ({', '.join(names)}): fit{'s' if hit.size > 1 else ''} {shown}; see "
        "fits.at_bound (the optimum may lie outside the bounds: widen them, or the parameter "
        "is not determined there)"
    )


def _fit_report(fits: BatchFits, i: int, min_correlation: float) -> str:
    ended = Status(fits.status[i])
    n_free = int(np.sum(fits.free))
    m = int(fits.n_points[i])
    lines = [
        f"[[Fit {i} of {fits.n_fits}]]",
        f"    status             {ended}",
        f"    message            {ended.message}",
        f"    data points        {m}",
        f"    variables          {n_free}"
        + (f" ({len(fits.names)} with those held)" if n_free < len(fits.names) else ""),
        f"    chi-square         {float(fits.best_fom[i]):.7g}",
        f"    reduced chi-square {float(fits.redchi[i]):.7g} ({int(fits.dof[i])} degrees of "
        "freedom)",
        f"    starts             {fits.n_starts} "
        + (
            "(none run: no data)"
            if ended is Status.NO_DATA
            else f"(best: row {int(fits.best_row[i])} of fits.result)"
        ),
        "[[Variables]]",
        *_variable_lines(fits, i),
    ]
    pairs = _correlations(fits, i, min_correlation)
    if pairs:
        lines += [f"[[Correlations]]   (|r| > {min_correlation:g})", *pairs]
    return "\n".join(lines)


def _variable_lines(fits: BatchFits, i: int) -> list[str]:
    width = max(len(n) for n in fits.names)
    errors = fits.errors[i]
    rows = []
    for j, name in enumerate(fits.names):
        value = float(fits.popt[i, j])
        flag = "  (on a bound)" if fits.at_bound[i, j] else ""
        held = "" if fits.free[j] else f" ({fits.held[name]})"
        if held and fits.held[name] == "fixed":
            rows.append(f"    {name + ':':{width + 1}s} {value: .7g}{held}{flag}")
            continue
        error = float(errors[j])  # a tied one's: propagated through its tie, as lmfit's
        if not np.isfinite(error):
            rows.append(f"    {name + ':':{width + 1}s} {value: .7g} +/- (not estimated){flag}")
            continue
        rel = f" ({100 * abs(error / value):.2f}%)" if value != 0 else ""
        rows.append(f"    {name + ':':{width + 1}s} {value: .7g} +/- {error:.5g}{rel}{held}{flag}")
    return rows


def _correlations(fits: BatchFits, i: int, threshold: float) -> list[str]:
    cov = np.asarray(fits.pcov[i])
    if not np.all(np.isfinite(cov)):
        return []
    d = np.sqrt(np.diag(cov))
    pairs = []
    for a in range(len(fits.names)):
        for b in range(a + 1, len(fits.names)):
            if fits.free[a] and fits.free[b] and d[a] > 0 and d[b] > 0:  # as lmfit's
                r = cov[a, b] / (d[a] * d[b])
                if abs(r) > threshold:
                    pairs.append((abs(r), f"    C({fits.names[a]}, {fits.names[b]}) = {r:+.4f}"))
    return [line for _, line in sorted(pairs, reverse=True)]


def _batch_report(fits: BatchFits) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in status.counts(fits.status).items())
    hit = fits.on_bound()
    shown = ", ".join(str(i) for i in hit[:FITS_NAMED]) + (", ..." if hit.size > FITS_NAMED else "")
    bound = "none" if not hit.size else f"{hit.size} (fits {shown}; fits.at_bound)"
    redchi = fits.redchi[np.isfinite(fits.redchi)]
    if redchi.size:
        q = np.percentile(redchi, [0, 5, 50, 95, 100])
        spread = (
            f"median {q[2]:.4g}; 5-95 % {q[1]:.4g} to {q[3]:.4g}; min {q[0]:.4g}, max {q[4]:.4g}"
        )
    else:
        spread = "none finite"
    ran = status.codes_of(fits.status) != Status.NO_DATA.code  # a fit not run has no errors
    unestimated = int(np.sum(~np.all(np.isfinite(fits.errors), axis=1) & ran))
    held = ", ".join(f"{k} {v}" for k, v in fits.held.items())
    lines = [
        f"[[Batch]] {fits.n_fits} fits, {fits.n_starts} starts each, one search",
        f"    parameters         {', '.join(fits.names)}" + (f" (held: {held})" if held else ""),
        f"    fits by status     {counts}",
        f"    on a bound         {bound}",
        f"    reduced chi-square {spread}",
        f"    no covariance      {unestimated} fit{'s' if unestimated != 1 else ''}",
        "    one fit's report:  fits.report(i); a table: fits.to_dataframe()",
    ]
    return "\n".join(lines)
