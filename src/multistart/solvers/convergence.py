"""The window guard, written once for NumPy and for JAX.

The rule runs inside the jitted step (with ``xp=jax.numpy``) so a start is frozen the moment it
stalls, whatever the host does; it is tested here on literal NumPy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common import checks

__all__ = ["Convergence", "window_converged"]


@dataclass(frozen=True)
class Convergence:
    """The window guard: a start ends when its best figure of merit stopped improving.

    A start ends at step ``k`` (counting from 0) when ``k >= window``, ``k + 1 >= min_steps``
    and ``best[k - window] - best[k] <= atol + rtol * |best[k]|``: over the last ``window``
    steps the best-so-far improved by no more than the tolerance. It ends as ``stalled``, not
    ``converged``: the test says the start stopped making progress, not that it reached a
    minimum (a rule's own optimality test says that).

    It is the default for rules without a test of their own (the optax rules). With the
    default ``atol=0`` the guard is relative, so it ends a fit of ``c * f`` where it ends a
    fit of ``f``, whatever the scale ``c``; an ``atol`` makes it depend on that scale.

    Args:
      window: steps over which the improvement is measured (>= 1).
      rtol: relative tolerance on the improvement (>= 0).
      atol: absolute tolerance on the improvement (>= 0; default 0).
      min_steps: no start ends by this rule before taking this many steps (>= 0).
    """

    window: int = 50
    rtol: float = 1e-6
    atol: float = 0.0
    min_steps: int = 0

    def __post_init__(self):
        for name, lo in (("window", 1), ("min_steps", 0)):
            checks.integer(getattr(self, name), f"Convergence.{name}", lo)
        for name in ("rtol", "atol"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"Convergence.{name} must be a float >= 0; got {v!r}")


def window_converged(old_best, new_best, step, *, window, rtol, atol, min_steps, xp=np):
    """Elementwise convergence test.

    Args:
      old_best: best-so-far figure of merit ``window`` steps ago (``inf`` if none was finite).
      new_best: best-so-far figure of merit now.
      step: index of the step just taken (0 for the first).
      xp: the array namespace (``numpy`` or ``jax.numpy``).

    >>> window_converged(np.array([10.0, 10.0]), np.array([9.0, 10.0]), 5,
    ...                  window=5, rtol=0.0, atol=1e-3, min_steps=0).tolist()
    [False, True]
    """
    # Written without ``old_best - new_best`` (inf - inf before the first finite value) and
    # without ``rtol * inf``, so NumPy raises no floating-point warnings.
    finite = xp.isfinite(new_best)
    scale = xp.abs(xp.where(finite, new_best, 0.0))
    small = old_best <= new_best + (atol + rtol * scale)
    return (step >= window) & (step + 1 >= min_steps) & finite & small
