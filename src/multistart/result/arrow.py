"""The curvature of a factor graph from the arrow structure of its Hessian.

A factor's own parameters enter the figure of merit only through its own log-likelihood and
priors, so the Hessian of a graph is an *arrow*: a dense block over the shared parameters
``S``, a block ``B_f`` a factor over its own parameters, the cross blocks ``C_f`` between
them, and zeros between two factors' own parameters. That structure gives the whole Hessian
from ``n_shared + k`` Hessian-vector products (``k`` the largest number of own coordinates of a
factor): one a shared coordinate (a column of ``S`` and every ``C_f``), and one a *colour*
``j``, the tangent that moves coordinate ``j`` of every factor at once (column ``j`` of every
``B_f``: two factors' own parameters never meet, so their columns do not mix). The inverse
follows by the Schur complement over the factor blocks::

    M = S - sum_f C_fᵀ B_f⁻¹ C_f              (n_shared x n_shared)
    (H⁻¹)_ss = M⁻¹
    (H⁻¹)_fs = -B_f⁻¹ C_f M⁻¹
    (H⁻¹)_ff = B_f⁻¹ + B_f⁻¹ C_f M⁻¹ C_fᵀ B_f⁻¹

in memory linear in the number of factors: nothing ``n x n`` is made unless asked for. Where a
dense Hessian is needed it is built from Hessian-vector products too, a chunk of columns a
compiled call (:meth:`ArrowCurvature.dense`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..common import xla

__all__ = ["ArrowBlocks", "ArrowCurvature", "ArrowInverse", "invert", "safe_inverses"]

#: Hessian-vector products a compiled call: the memory of a call is this many times one
#: product's (the tangents and the rows they give back are ``COLUMNS x n``).
COLUMNS = 32


@dataclass(frozen=True)
class ArrowBlocks:
    """A graph's Hessian at one point, as its arrow.

    Attributes:
      shared: ``(n_s,)`` flat indices of the shared coordinates.
      index: per block of factors, ``(n_f, k)`` flat indices of each factor's own coordinates.
      factors: per block, the factor names of its rows.
      S: ``(n_s, n_s)`` the shared block.
      C: per block, ``(n_f, k, n_s)`` each factor's cross block.
      B: per block, ``(n_f, k, k)`` each factor's own block.
      value: the figure of merit at the point.
    """

    shared: np.ndarray
    index: tuple[np.ndarray, ...]
    factors: tuple[tuple[str, ...], ...]
    S: np.ndarray
    C: tuple[np.ndarray, ...]
    B: tuple[np.ndarray, ...]
    value: float

    @property
    def n(self) -> int:
        return self.shared.size + sum(i.size for i in self.index)

    def dense(self) -> np.ndarray:
        """The ``(n, n)`` Hessian in the flat order (``n²`` memory: asked for, never implied)."""
        h = np.zeros((self.n, self.n))
        h[np.ix_(self.shared, self.shared)] = self.S
        for idx, c, b in zip(self.index, self.C, self.B, strict=True):
            for f in range(idx.shape[0]):
                h[np.ix_(idx[f], idx[f])] = b[f]
                h[np.ix_(idx[f], self.shared)] = c[f]
                h[np.ix_(self.shared, idx[f])] = c[f].T
        return h


class ArrowCurvature:
    """A graph problem's curvature, compiled once for every point: the Hessian's arrow from
    ``n_shared + k`` Hessian-vector products, or its dense form a chunk of columns a call.

    Args:
      problem: a :class:`multistart.model.problem.Problem` whose space has an
        :meth:`~multistart.model.plates.GraphSpace.arrow` with at least one factor's own
        parameters.
      gauss_newton: for a least-squares problem (its ``residuals``): the arrow of the
        Gauss-Newton matrix ``2 JᵀJ`` of ``‖r‖²`` instead, from products ``2 Jᵀ(J t)`` (a
        residual depends on the shared parameters and one factor's own, so ``JᵀJ`` is an arrow
        too); ``value`` is then ``‖r‖²`` and :meth:`residuals` gives ``r``.
    """

    def __init__(self, problem, gauss_newton: bool = False):
        if gauss_newton and getattr(problem, "residuals", None) is None:
            raise TypeError("gauss_newton=True needs a least-squares problem (its residuals)")
        space, fom = problem.space, problem.fom  # not the problem: kept, it would keep its data
        self.arrow = space.arrow()
        self.n = space.n_dims
        self.gauss_newton = gauss_newton

        def fom_flat(vec, data):
            return fom(space.unravel(vec), data)

        def hessian_rows(vec, data, tangents):
            grad = jax.grad(fom_flat)
            _, hvp = jax.linearize(lambda v: grad(v, data), vec)
            return jax.vmap(hvp)(tangents), fom_flat(vec, data)

        residuals = getattr(problem, "residuals", None)  # a least-squares problem's

        def flat(vec, data):
            assert residuals is not None  # made only for a least-squares problem
            return ravel_pytree(residuals(space.unravel(vec), data))[0]

        def gauss_newton_rows(vec, data, tangents):
            r, jvp = jax.linearize(lambda v: flat(v, data), vec)
            vjp = jax.linear_transpose(jvp, vec)
            return jax.vmap(lambda t: 2.0 * vjp(jvp(t))[0])(tangents), jnp.vdot(r, r)

        self._residuals = xla.jit(flat)
        self._rows = xla.jit(gauss_newton_rows if gauss_newton else hessian_rows)

    def residuals(self, vec, data) -> np.ndarray:
        """The flat residuals at ``vec`` (``gauss_newton`` only)."""
        return np.asarray(self._residuals(vec, data), dtype=np.float64)

    def tangents(self) -> np.ndarray:
        """``(n_s + k, n)``: a unit tangent a shared coordinate, then one a colour."""
        arrow = self.arrow
        t = np.zeros((arrow.shared.size + arrow.n_own, self.n))
        t[np.arange(arrow.shared.size), arrow.shared] = 1.0
        for j in range(arrow.n_own):
            for idx in arrow.blocks:
                if j < idx.shape[1]:
                    t[arrow.shared.size + j, idx[:, j]] = 1.0
        return t

    def _products(self, vec, data, tangents: np.ndarray) -> tuple[np.ndarray, float]:
        """``H t`` of each row of ``tangents``, :data:`COLUMNS` rows a call (one shape)."""
        dtype = jnp.result_type(vec)
        width = min(COLUMNS, len(tangents))
        out, value = [], np.nan
        for lo in range(0, len(tangents), width):
            chunk = tangents[lo : lo + width]
            pad = width - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad, self.n))])
            got, value = self._rows(vec, data, jnp.asarray(chunk, dtype))
            out.append(np.asarray(got, dtype=np.float64)[: width - pad])
        return np.concatenate(out), float(value)

    def blocks(self, vec, data) -> ArrowBlocks:
        """The arrow of the Hessian at ``vec`` (the flat physical point)."""
        arrow = self.arrow
        rows, value = self._products(vec, data, self.tangents())
        n_s = arrow.shared.size
        shared_rows, colours = rows[:n_s], rows[n_s:]
        S = shared_rows[:, arrow.shared].T
        S = 0.5 * (S + S.T)
        C, B = [], []
        for idx in arrow.blocks:
            k = idx.shape[1]
            C.append(np.moveaxis(shared_rows[:, idx], 0, -1))  # (n_f, k, n_s)
            b = np.moveaxis(colours[:k][:, idx], 0, -1)  # [f, r, j] = H[own_f[r], own_f[j]]
            B.append(0.5 * (b + np.swapaxes(b, 1, 2)))
        return ArrowBlocks(arrow.shared, arrow.blocks, arrow.factors, S, tuple(C), tuple(B), value)

    def dense(self, vec, data) -> tuple[np.ndarray, float]:
        """The dense ``(n, n)`` Hessian at ``vec``, :data:`COLUMNS` columns a compiled call
        (the memory of a call is that many Hessian-vector products'), and the value there."""
        hess = np.empty((self.n, self.n))
        value = np.nan
        for lo in range(0, self.n, COLUMNS):
            cols = np.arange(lo, min(lo + COLUMNS, self.n))
            t = np.zeros((cols.size, self.n))
            t[np.arange(cols.size), cols] = 1.0
            got, value = self._products(vec, data, t)
            hess[:, cols] = got.T
        return hess, value


def safe_inverses(h: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(inverse, bad)`` of each matrix of a stack ``(m, k, k)``, judged as
    :func:`multistart.result.laplace._safe_inverse` judges one: scaled to unit diagonal, the
    inverse on the positive-definite part; ``bad`` ``(m, k)``: a coordinate with a zero,
    negative or non-finite curvature, or with a part above ``sqrt(eps)`` in a direction whose
    eigenvalue is at most ``k * eps`` of the largest. A bad coordinate's rows and columns of the
    inverse are ``nan``."""
    _, k, _ = h.shape
    diag = np.diagonal(h, axis1=1, axis2=2)
    bad = ~(np.isfinite(diag) & (diag > 0))
    # a non-finite cross term between two coordinates that are otherwise fine makes both bad
    pair = bad[:, :, None] | bad[:, None, :]
    bad |= ~np.all(np.isfinite(h) | pair, axis=2)
    pair = bad[:, :, None] | bad[:, None, :]
    d = 1.0 / np.sqrt(np.where(bad, 1.0, diag))
    scaled = np.where(pair, 0.0, h) * d[:, :, None] * d[:, None, :]
    eye = np.arange(k)
    scaled[:, eye, eye] = np.where(bad, 1.0, scaled[:, eye, eye])  # a bad one: kept apart
    lam, vec = np.linalg.eigh(scaled)
    n_good = np.maximum((~bad).sum(axis=1), 1)
    top = np.maximum(lam.max(axis=1, initial=0.0), 0.0)  # >= 1 (unit diagonal): bad ones add 1s
    ok = (lam > (top * n_good * eps)[:, None]) & (lam > 0)
    bad |= np.any((np.abs(vec) > np.sqrt(eps)) & ~ok[:, None, :], axis=2)
    weight = np.where(ok, 1.0 / np.where(ok, lam, 1.0), 0.0)
    inverse = (vec * weight[:, None, :]) @ np.swapaxes(vec, 1, 2) * d[:, :, None] * d[:, None, :]
    return np.where(bad[:, :, None] | bad[:, None, :], np.nan, inverse), bad


@dataclass(frozen=True)
class ArrowInverse:
    """``H⁻¹`` of an arrow, in blocks (shaped as :class:`ArrowBlocks`'s), with ``M`` the Schur
    complement.

    Attributes:
      ss: ``(n_s, n_s)`` ``M⁻¹``.
      v: per block, ``(n_f, k, n_s)`` ``B_f⁻¹ C_f``.
      own: per block, ``(n_f, k, k)`` each factor's own block ``B_f⁻¹ + B_f⁻¹ C_f M⁻¹ C_fᵀ
        B_f⁻¹``.
      bad: ``(n,)`` in the flat order: coordinates in a direction of zero, negative or
        non-finite curvature; their rows and columns are ``nan``.
      blocks: the arrow it inverts.
      eps: the rounding the inverses were judged by (:func:`invert`'s).
    """

    ss: np.ndarray
    v: tuple[np.ndarray, ...]
    own: tuple[np.ndarray, ...]
    bad: np.ndarray
    blocks: ArrowBlocks
    eps: float

    def _m(self) -> np.ndarray:
        return np.where(np.isnan(self.ss), 0.0, self.ss)

    def diagonal(self) -> np.ndarray:
        """The diagonal of ``H⁻¹`` in the flat order, without making it whole."""
        blocks = self.blocks
        out = np.empty(blocks.n)
        out[blocks.shared] = np.diagonal(self.ss)
        for idx, own in zip(blocks.index, self.own, strict=True):
            out[idx] = np.diagonal(own, axis1=1, axis2=2)
        return out

    def rows(self, which: np.ndarray) -> np.ndarray:
        """Rows ``which`` (flat indices) of ``H⁻¹``, ``(len(which), n)``: :meth:`dense`'s rows,
        in memory ``len(which) x n``."""
        blocks, s = self.blocks, self.blocks.shared
        which = np.asarray(which)
        out = np.zeros((which.size, blocks.n))
        where = np.full(blocks.n, -1)  # a shared coordinate's place in s, else -1
        where[s] = np.arange(s.size)
        sh = where[which] >= 0
        out[np.ix_(np.flatnonzero(sh), s)] = self.ss[where[which[sh]]]
        if blocks.index:
            own = np.concatenate([i.reshape(-1) for i in blocks.index])
            v = np.concatenate([v.reshape(v.shape[0] * v.shape[1], s.size) for v in self.v])
            vm = v @ self._m()
            place = np.full(blocks.n, -1)  # an own coordinate's place in ``own``
            place[own] = np.arange(own.size)
            out[np.ix_(np.flatnonzero(sh), own)] = -vm[:, where[which[sh]]].T
            ow = np.flatnonzero(~sh)
            p = place[which[ow]]
            out[np.ix_(ow, s)] = -vm[p]
            out[np.ix_(ow, own)] = vm[p] @ v.T
            start = 0
            for idx, block in zip(blocks.index, self.own, strict=True):
                n_f, k = idx.shape
                mine = (p >= start) & (p < start + n_f * k)
                f, r = np.divmod(p[mine] - start, k)
                out[ow[mine][:, None], idx[f]] = block[f, r]
                start += n_f * k
        out[self.bad[which], :] = np.nan
        out[:, self.bad] = np.nan
        return out

    def dense(self) -> np.ndarray:
        """``H⁻¹`` whole, ``(n, n)`` in the flat order (``n²`` memory: asked for, never
        implied); two factors' block is ``B_f⁻¹ C_f M⁻¹ C_gᵀ B_g⁻¹``."""
        blocks, s = self.blocks, self.blocks.shared
        out = np.zeros((blocks.n, blocks.n))
        out[np.ix_(s, s)] = self.ss
        if blocks.index:
            own = np.concatenate([i.reshape(-1) for i in blocks.index])
            v = np.concatenate([v.reshape(v.shape[0] * v.shape[1], s.size) for v in self.v])
            vm = v @ self._m()
            out[np.ix_(own, s)] = -vm
            out[np.ix_(s, own)] = -vm.T
            out[np.ix_(own, own)] = vm @ v.T
            for idx, block in zip(blocks.index, self.own, strict=True):
                for f in range(idx.shape[0]):
                    out[np.ix_(idx[f], idx[f])] = block[f]
        out[self.bad, :] = np.nan
        out[:, self.bad] = np.nan
        return out


def invert(blocks: ArrowBlocks, eps: float) -> ArrowInverse:
    """``H⁻¹`` of an arrow by the Schur complement over its factor blocks (see the module).

    A factor block that is not positive definite makes that factor's coordinates in its bad
    directions ``nan`` and leaves them out of the Schur complement (the shared errors are then
    those with them held); a Schur complement that is not positive definite makes the shared
    coordinates in its bad directions ``nan``, and leaves them out of the factors' blocks.
    ``bad.any()`` of the result tells whether either happened.
    """
    s = blocks.shared
    M = blocks.S.copy()
    inverses, bads, vs = [], [], []
    for c, b in zip(blocks.C, blocks.B, strict=True):
        inv, bad = safe_inverses(b, eps)
        v = np.where(np.isnan(inv), 0.0, inv) @ c  # (n_f, k, n_s): B_f⁻¹ C_f
        M -= np.einsum("fki,fkj->ij", c, v)
        inverses.append(inv)
        bads.append(bad)
        vs.append(v)
    M = 0.5 * (M + M.T)
    if s.size:
        minv, bad_s = (a[0] for a in safe_inverses(M[None], eps))
    else:
        minv, bad_s = np.zeros((0, 0)), np.zeros(0, dtype=bool)
    m = np.where(np.isnan(minv), 0.0, minv)
    own = tuple(inv + v @ m @ np.swapaxes(v, 1, 2) for inv, v in zip(inverses, vs, strict=True))
    bad = np.zeros(blocks.n, dtype=bool)
    bad[s] = bad_s
    for idx, b in zip(blocks.index, bads, strict=True):
        bad[idx] = b
    return ArrowInverse(minv, tuple(vs), own, bad, blocks, eps)
