"""Small dense linear algebra written entry by entry, for many small problems at once.

A batch of small fits holds one ``n × n`` matrix a start (``JᵀJ``, a damped system, a
covariance) for thousands of starts. Under ``vmap`` a library solve of each (``cho_solve``,
``jnp.linalg.svd``, ``eigh``) becomes a batched kernel built for large matrices: on a TPU the
batched Cholesky of 200,000 4 × 4 systems took 91 ms a step, ``eigh`` 564 ms, and a batched
SVD did not compile (profiling/experiments/tpu_kernels.py). Written here entry by entry,
every entry of every matrix is one scalar of the per-start code, so under ``vmap`` it is one
vector over the starts: the whole solve is a few fused elementwise kernels (0.29 ms for the
same step), and it runs in float64 where a chip has no float64 factorisations. Above
:data:`MAX_N` parameters the traced program would grow as ``n³``, and on a CPU XLA compiles
it slowly: the library's own routines are used there (:func:`entrywise`).

Every function takes and returns arrays (one start's: ``(n,)``, ``(n, n)``, ``(m, n)``), so a
caller is written as for one start and batched by ``vmap``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..common import xla

__all__ = [
    "MAX_N",
    "entrywise",
    "gram",
    "normal_equations",
    "transpose_times",
    "matvec",
    "cho_solve",
    "gram_inverse",
]

#: The most parameters solved entry by entry (a Cholesky is ``n³/6`` traced operations).
MAX_N = 8


def entrywise(n: int) -> bool:
    """Whether ``n`` parameters are solved entry by entry: at most :data:`MAX_N`, on a chip
    (the platform of the default device when the program is traced). On a CPU the library's
    routines run as fast, and XLA compiles the entrywise form several times slower (a cold
    4-parameter ``curve_fit`` took 2.7x its time), so a CPU keeps them."""
    return n <= MAX_N and xla.on_chip()


def gram(jac: jax.Array) -> jax.Array:
    """``JᵀJ`` of an ``(m, n)`` Jacobian: for a small ``n`` one dot product of two columns an
    entry (each pair once: the matrix is symmetric)."""
    n = jac.shape[1]
    if not entrywise(n):
        return jac.T @ jac
    cols = [jac[:, i] for i in range(n)]
    a: list[list] = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            a[i][j] = a[j][i] = jnp.vdot(cols[i], cols[j])
    return jnp.stack([jnp.stack(row) for row in a])


def normal_equations(jac: jax.Array, r: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(JᵀJ, Jᵀr)`` of an ``(m, n)`` Jacobian and residuals ``(m,)`` (:func:`gram`,
    :func:`transpose_times`)."""
    return gram(jac), transpose_times(jac, r)


def transpose_times(jac: jax.Array, r: jax.Array) -> jax.Array:
    """``Jᵀr``: for a small ``n`` one dot product a column."""
    n = jac.shape[1]
    if not entrywise(n):
        return jac.T @ r
    return jnp.stack([jnp.vdot(jac[:, i], r) for i in range(n)])


def matvec(a: jax.Array, x: jax.Array) -> jax.Array:
    """``a @ x`` for an ``(n, n)`` ``a``: for a small ``n`` elementwise products summed, not a
    (batched) matrix product."""
    if not entrywise(a.shape[0]):
        return a @ x
    return jnp.sum(a * x[None, :], axis=1)


def _cholesky(a) -> list[list]:
    """The lower Cholesky factor of a symmetric ``a`` (rows of scalars); ``nan`` entries where
    ``a`` is not positive definite (a square root of a negative pivot)."""
    n = len(a)
    low: list[list] = [[None] * n for _ in range(n)]
    for j in range(n):
        low[j][j] = jnp.sqrt(a[j][j] - sum((low[j][k] ** 2 for k in range(j)), start=0.0))
        for i in range(j + 1, n):
            s = a[i][j] - sum((low[i][k] * low[j][k] for k in range(j)), start=0.0)
            low[i][j] = s / low[j][j]
    return low


def _substitute(low, b) -> list:
    """``(L Lᵀ)⁻¹ b`` by forward then back substitution."""
    n = len(b)
    z: list = [None] * n
    for i in range(n):
        z[i] = (b[i] - sum((low[i][k] * z[k] for k in range(i)), start=0.0)) / low[i][i]
    x: list = [None] * n
    for i in reversed(range(n)):
        x[i] = (z[i] - sum((low[k][i] * x[k] for k in range(i + 1, n)), start=0.0)) / low[i][i]
    return x


def cho_solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a⁻¹ b`` for a symmetric positive definite ``(n, n)`` ``a`` (``nan`` where it is not),
    by a Cholesky factor written out: ``jax.scipy.linalg.cho_solve``'s answer, to rounding."""
    n = a.shape[0]
    low = _cholesky([[a[i, j] for j in range(n)] for i in range(n)])
    return jnp.stack(_substitute(low, [b[i] for i in range(n)]))


def _inverse_entries(low) -> list[list]:
    """``(L Lᵀ)⁻¹`` from a Cholesky factor (rows of scalars), column by column."""
    n = len(low)
    zero, one = jnp.zeros_like(low[0][0]), jnp.ones_like(low[0][0])
    cols = [_substitute(low, [one if i == j else zero for i in range(n)]) for j in range(n)]
    return [[cols[j][i] for j in range(n)] for i in range(n)]


def gram_inverse(jac: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``((JᵀJ)⁻¹, bad, sure)`` of one ``(m, n)`` Jacobian, by a Cholesky factor of ``JᵀJ``
    with ``J``'s columns scaled to unit norm (so units do not pass for ill-conditioning).

    ``bad`` ``(n,)``: a parameter whose column is not finite or zero. ``sure``: no parameter is
    bad and ``JᵀJ`` is conditioned well enough that forming it cost fewer than half the
    working digits: ``n cond(J)² eps < sqrt(eps)``, ``cond(J)²`` bounded above by
    ``trace(JᵀJ) trace((JᵀJ)⁻¹)`` (below ``1e4`` in float64, ``45`` in float32 for 4
    parameters). Where it is not sure, the caller takes the SVD of ``J`` instead
    (:func:`multistart.result.laplace.settle_inverses`), whose precision is ``J``'s: the few
    ill-conditioned fits cost a host SVD each, the rest a few fused kernels.
    """
    m, n = jac.shape
    eps = jnp.finfo(jac.dtype).eps
    finite = jnp.all(jnp.isfinite(jac), axis=0)
    jac = jnp.where(finite[None, :], jac, 0.0)
    norms = jnp.sqrt(jnp.sum(jac * jac, axis=0))
    bad = ~(finite & (norms > 0))
    d = 1.0 / jnp.where(bad, 1.0, norms)
    a = gram(jac * d[None, :])
    if entrywise(n):
        low = _cholesky([[a[i, j] for j in range(n)] for i in range(n)])
        inverse = jnp.stack([jnp.stack(row) for row in _inverse_entries(low)])
    else:
        factor = jax.scipy.linalg.cho_factor(a, lower=True)
        inverse = jax.scipy.linalg.cho_solve(factor, jnp.eye(n, dtype=a.dtype))
    cond2 = jnp.trace(a) * jnp.trace(inverse)
    sure = ~jnp.any(bad) & jnp.all(jnp.isfinite(inverse)) & (cond2 > 0)
    sure = sure & (n * cond2 * eps < jnp.sqrt(eps))
    inverse = inverse * d[:, None] * d[None, :]
    return jnp.where(bad[:, None] | bad[None, :], jnp.nan, inverse), bad, sure
