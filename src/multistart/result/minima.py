"""Grouping ended starts into distinct local minima (NumPy only).

Two starts reached the same minimum when, as MATLAB's MultiStart defines it, both their
figures of merit and their parameters agree within tolerances::

    |f_i - f_j| <= ftol * max(1, |f_j|)   and   |x_i - x_j| <= xtol * max(1, |x_j|) elementwise

Starts are taken from best to worst; each joins the first existing minimum it matches (compared
with that minimum's best start) or founds a new one. The grouping is therefore deterministic.

The default tolerances (:func:`default_tolerances`) are as fine as a search resolves a minimum,
and no finer: tighter ones split one minimum into as many "minima" as there were starts.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

__all__ = ["cluster_minima", "default_tolerances"]

# The figure of merit is a sum of many rounded terms: a few ulps is the best it resolves.
_ROUNDING_ULPS = 10
# How finely a search's tests locate a minimum's figure of merit (relative), at most: the
# window guard's default rtol, and about the rules' own decrease tests after their last steps.
LOCATED = 1e-6
# Past this many candidate minima in a start's window they are compared in one NumPy call.
_VECTOR_FROM = 8


def default_tolerances(dtype, convergence: dict | None) -> tuple[float, float]:
    """``(xtol, ftol)`` that match how finely a search located its minima.

    A search's tests end a start once its figure of merit improves by less than a relative
    ``r`` (the window guard's ``rtol + atol``, or a rule's own tests, which locate a minimum's
    figure of merit to about :data:`LOCATED`), and it is never known better than a few ulps
    of its float type: ``r`` is the largest of the three. Near a minimum
    ``f - f* = (x - x*)^T H (x - x*) / 2``, so parameters are located only to about
    ``sqrt(r)`` (relative): that is ``xtol``. ``ftol`` is the same ``sqrt(r)``: a start ended
    on a slow, flat approach can still be far more than ``r`` above its minimum, while
    distinct minima at the same figure of merit are told apart by ``xtol``.

    Args:
      dtype: the float type the search ran in.
      convergence: the search's window guard as recorded in ``result.config["convergence"]``
        (a dict with ``rtol`` and ``atol``), or ``None``.

    >>> [round(t, 5) for t in default_tolerances(np.float64, {"rtol": 1e-5, "atol": 0.0})]
    [0.00316, 0.00316]
    >>> f"{default_tolerances(np.float64, None)[0]:.1e}"
    '1.0e-03'
    """
    resolution = max(_ROUNDING_ULPS * float(np.finfo(dtype).eps), LOCATED)
    if convergence:
        rule = float(convergence.get("rtol", 0.0)) + float(convergence.get("atol", 0.0))
        resolution = max(resolution, rule)
    tol = float(np.sqrt(resolution))
    return tol, tol


def cluster_minima(x: np.ndarray, f: np.ndarray, *, xtol: float, ftol: float) -> np.ndarray:
    """Label each row of ``x`` (``(n, d)``) with the index of its minimum.

    Args:
      x: one row of parameters per start.
      f: ``(n,)`` figures of merit; non-finite rows get label ``-1``.
      xtol, ftol: tolerances (``>= 0``), relative above magnitude 1 and absolute below.

    Returns:
      ``(n,)`` integer labels; minimum 0 is the best, 1 the next best, and so on.

    >>> cluster_minima(np.array([[0.0], [1e-9], [5.0]]), np.array([1.0, 1.0, 2.0]),
    ...                xtol=1e-6, ftol=1e-6).tolist()
    [0, 0, 1]
    """
    x = np.asarray(x, dtype=np.float64).reshape(len(f), -1)
    f = np.asarray(f, dtype=np.float64)
    for name, tol in (("xtol", xtol), ("ftol", ftol)):
        if not (isinstance(tol, (int, float)) and not isinstance(tol, bool) and tol >= 0):
            raise ValueError(f"{name} must be a number >= 0; got {tol!r}")
    labels = np.full(f.shape, -1, dtype=np.int64)
    finite = np.isfinite(f) & np.all(np.isfinite(x), axis=1)
    order = np.flatnonzero(finite)[np.argsort(f[finite], kind="stable")]
    f_list = f.tolist()  # Python floats: the per-start work below is scalar
    heads = _Heads(order.size, x.shape[1], xtol=xtol, ftol=ftol)
    for i in order.tolist():
        fi = f_list[i]
        label = heads.match(fi, x[i])
        labels[i] = label if label >= 0 else heads.found(fi, x[i])
    return labels


class _Heads:
    """The minima's best starts, in the order they were founded (so by figure of merit, as the
    starts come best first): their f (sorted, for bisection), x and x's scale."""

    def __init__(self, n: int, d: int, *, xtol: float, ftol: float):
        self.xtol, self.ftol = xtol, ftol
        self.f: list[float] = []
        self.f_array = np.empty(n)  # the same, for the vectorised comparison
        self.x = np.empty((n, d))
        self.scale = np.empty_like(self.x)
        # A head can match only if f_i - f_h <= ftol * max(1, |f_h|) <= ftol * (1 + |f_i| +
        # f_i - f_h), so (ftol < 1) only heads with f_h >= f_i - ftol * (1 + |f_i|) / (1 - ftol)
        # can: a window found by bisection, checked exactly. Linear in the starts when minima
        # are spread out.
        self.reach = ftol / (1.0 - ftol) if ftol < 1.0 else math.inf

    def match(self, fi: float, xi: np.ndarray) -> int:
        """The first head within the tolerances of ``(fi, xi)``, or -1."""
        k, lo = len(self.f), 0
        if self.reach != math.inf:
            floor = fi - self.reach * (1.0 + abs(fi)) * (1.0 + 1e-12) - 1e-300
            lo = bisect.bisect_left(self.f, floor)
        if k - lo > _VECTOR_FROM:  # many candidates: test them at once
            window = self.f_array[lo:k]
            same_f = np.abs(fi - window) <= self.ftol * np.maximum(1.0, np.abs(window))
            near = np.abs(xi - self.x[lo:k]) <= self.xtol * self.scale[lo:k]
            hit = np.flatnonzero(same_f & np.all(near, axis=1))
            return lo + int(hit[0]) if hit.size else -1
        for h in range(lo, k):
            fh = self.f[h]
            if abs(fi - fh) <= self.ftol * max(1.0, abs(fh)) and bool(
                np.all(np.abs(xi - self.x[h]) <= self.xtol * self.scale[h])
            ):
                return h
        return -1

    def found(self, fi: float, xi: np.ndarray) -> int:
        """Make ``(fi, xi)`` the head of a new minimum; its label."""
        k = len(self.f)
        self.f.append(fi)
        self.f_array[k] = fi
        self.x[k] = xi
        self.scale[k] = np.maximum(1.0, np.abs(xi))
        return k
