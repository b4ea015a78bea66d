"""Missing data: the points a fit leaves out, read into one boolean array per fit.

A point is left out where the caller says so: ``mask`` (``True``: left out, as a
``numpy.ma`` mask and astropy's), a ``numpy.ma.MaskedArray`` ``ydata`` or ``sigma`` (its
mask), an infinite ``sigma`` (no weight: it carries nothing); and, with
``nan_policy="omit"``, where ``ydata`` or ``sigma`` is not finite. A single fit drops those
points, as scipy's ``nan_policy="omit"`` does; a batch keeps every fit's shape (one compiled
step for all) and gives them weight 0, their ``ydata`` a finite 0 (:func:`filled`), so they
move neither its steps nor its degrees of freedom.
"""

from __future__ import annotations

import numpy as np


def read(ydata, sigma, mask) -> tuple[np.ndarray, object, list[tuple[str, np.ndarray]]]:
    """``(y, sigma, masks)``: ``ydata`` as a float64 array (a masked array's data), ``sigma``
    (a masked array's data, 1 under its mask, so its values there are not checked), and the
    masks given: ``mask`` and the masked arrays', each named by its argument."""
    masks: list[tuple[str, np.ndarray]] = []
    if np.ma.isMaskedArray(ydata):
        masks.append(("ydata's mask (a numpy.ma.MaskedArray)", np.ma.getmaskarray(ydata)))
        ydata = np.ma.getdata(ydata)
    y = _float_array(ydata)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != bool:
            raise TypeError(
                "mask must be booleans, True where a point is left out (numpy.ma's and "
                f"astropy's meaning); got dtype {m.dtype}"
            )
        masks.append(("mask", m))
    if np.ma.isMaskedArray(sigma):
        under = np.ma.getmaskarray(sigma)
        masks.append(("sigma's mask (a numpy.ma.MaskedArray)", under))
        sigma = np.where(under, 1.0, np.ma.getdata(sigma).astype(np.float64))
    return y, sigma, masks


def _float_array(ydata) -> np.ndarray:
    """``ydata`` as float64; a ragged list (arrays of different lengths) refused by name."""
    try:
        return np.asarray(ydata, dtype=np.float64)
    except ValueError as e:
        if isinstance(ydata, (list, tuple)) and len({np.shape(a) for a in ydata}) > 1:
            lengths = sorted({np.shape(a) for a in ydata}, key=str)
            raise ValueError(
                f"ydata must be one array; got a list of arrays of different shapes "
                f"{', '.join(map(str, lengths[:4]))}{', ...' if len(lengths) > 4 else ''}: pad "
                "the shorter ones with nan and pass nan_policy='omit' (each fit then leaves "
                "its own missing points out), or fit them one by one"
            ) from None
        raise ValueError(f"ydata must be an array of numbers: {e}") from None


def given(masks, ys_shape: tuple, batched: bool) -> np.ndarray | None:
    """``(n_fits, m)``: the points ``masks`` leave out (:func:`read`), each of ``ydata``'s
    shape ``ys_shape`` (a single fit's with a leading axis of one) or, batched, one fit's
    (every fit's); ``None`` where none is."""
    one = ys_shape[1:]
    shape = ys_shape if batched else one
    out = np.zeros(ys_shape, dtype=bool)
    for name, m in masks:
        if m.shape == shape or (batched and m.shape == one):
            out |= m
            continue
        shared = f" or one fit's shape {one} (shared by every fit)" if batched else ""
        raise ValueError(f"{name} must have ydata's shape {shape}{shared}; got shape {m.shape}")
    return out.reshape(ys_shape[0], -1) if out.any() else None


def left_out(ys: np.ndarray, s, given_out, nan_policy) -> np.ndarray | None:
    """``(n_fits, m)``: every point left out: ``given_out`` (:func:`given`), an infinite
    standard deviation in ``s`` (``(n_fits, m)``; a covariance ``(n_fits, m, m)`` has none),
    and with ``nan_policy="omit"`` a non-finite ``ys`` or ``s``; ``None`` where none is."""
    n = len(ys)
    out = np.zeros((n, ys[0].size), dtype=bool) if given_out is None else given_out.copy()
    deviations = s is not None and s.ndim == 2
    if deviations:
        out |= s == np.inf
    if nan_policy == "omit":
        out |= ~np.isfinite(ys.reshape(n, -1))
        if deviations:
            out |= ~np.isfinite(s)
    return out if out.any() else None


def filled(ys: np.ndarray, s, gone: np.ndarray):
    """``(ys, s)`` with every point ``gone`` made harmless: ``ydata`` 0 and a standard
    deviation 1 there (their weight is made 0 apart), a covariance's rows and columns there
    those of the identity (its Cholesky factor then whitens the other points as their own
    covariance would, and the point, 0 before whitening, stays 0)."""
    ys = np.where(gone.reshape(ys.shape), 0.0, ys)
    if s is None:
        return ys, s
    if s.ndim == 2:
        return ys, np.where(gone, 1.0, s)
    keep = ~gone
    both = keep[:, :, None] & keep[:, None, :]
    return ys, np.where(both, s, 0.0) + gone[:, :, None] * np.eye(s.shape[1])


def points(gone: np.ndarray | None, n_fits: int, m: int) -> np.ndarray:
    """``(n_fits,)`` each fit's points that count: ``m`` less those ``gone``."""
    if gone is None:
        return np.full(n_fits, m, dtype=np.int64)
    return m - gone.sum(axis=1).astype(np.int64)
