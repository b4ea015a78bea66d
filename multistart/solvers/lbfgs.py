"""A batched L-BFGS: per-start memory and a line search carried from step to step.

``optax.lbfgs`` runs its line search as a ``lax.while_loop`` inside one update. Under ``vmap``
every start then waits for the slowest start's search and both branches of every ``cond`` run,
so a step costs several evaluations for every start. Here the line search is a small state
machine in each start's state instead: the engine evaluates the objective **once per step** at
the point the state machine asks for (the first point, or a trial ``x + alpha d``), and the
machine either accepts the trial (a new quasi-Newton direction) or backtracks (a shorter trial
next step). No start ever waits for another, and a start that converged leaves the sweep.

The rule, per start (Nocedal & Wright, *Numerical Optimization*, 2nd ed., algorithms 7.4 and
7.5, with the safeguards of scipy's L-BFGS-B where they apply to unconstrained coordinates):

- **Direction**: the two-loop recursion over the start's own ``memory`` most recent pairs
  ``(s, y)`` with the initial scale ``gamma = sᵀy / yᵀy`` of the newest pair. Memory is never
  shared across starts: the curvature of one basin says nothing about another's.
- **Line search**: Armijo sufficient decrease ``f(x + a d) <= f(x) + c1 a gᵀd``. A failed trial
  backtracks to the minimiser of the cubic through the values and slopes at ``0`` and ``a``
  (every trial is evaluated with its gradient, so both slopes are known), falling back to the
  quadratic through ``f(x)``, ``gᵀd`` and ``f(x + a d)``, clamped to ``[0.1 a, 0.5 a]``. A
  non-finite trial is a failed test and shrinks the step tenfold.
- **First step** ``a = min(1, 1/‖g‖)`` (a unit-length step, as L-BFGS-B's first iteration), and
  after the memory has a pair, ``a = 1``; no trial moves a coordinate by more than
  ``max_step``.
- **Memory update** only when ``sᵀy > eps ‖s‖ ‖y‖`` (curvature positive beyond rounding, which
  keeps float32 runs safe); otherwise the pair is skipped.
- **Recovery**: after ``max_linesearch`` failed trials the memory is cleared and steepest
  descent is tried; if that fails as often, the start has stalled and stops (converged: no
  representable decrease is left). A direction that is not a descent direction clears the
  memory too. The engine's non-finite guard stays behind all of this.
- **Stopping** (as scipy's L-BFGS-B, with its defaults): ``max |g| <= gtol`` at an accepted
  point, or a relative decrease ``(f_k - f_k+1) / max(|f_k|, |f_k+1|, 1) <= ftol`` at an
  accepted step. The gradient is the gradient in the search's unconstrained coordinates (a
  logit per bounded parameter, the standardised value for a normal prior), not in the physical
  ones.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .. import checks
from .base import Solver, SolverStep

__all__ = ["LBFGS", "LBFGSState"]


def _select(pred, on_true, on_false):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class LBFGSState(NamedTuple):
    """One start's L-BFGS state (vectors are the flattened unconstrained parameters)."""

    x: jax.Array  # the last accepted point
    f: jax.Array  # the figure of merit at x (inf before the first finite evaluation)
    g: jax.Array  # the gradient at x
    d: jax.Array  # the search direction from x
    alpha: jax.Array  # the step length of the pending trial x + alpha d
    s: jax.Array  # (memory, n) steps, a ring; empty rows are zero
    y: jax.Array  # (memory, n) gradient changes
    rho: jax.Array  # (memory,) 1 / sᵀy, zero for an empty row
    head: jax.Array  # the ring row the next pair is written to
    gamma: jax.Array  # the initial inverse-Hessian scale
    n_back: jax.Array  # failed trials in the current line search
    started: jax.Array  # has x been evaluated (a finite first evaluation)?
    done: jax.Array  # a stopping test passed


class LBFGS(Solver):
    """Limited-memory BFGS with a per-start backtracking line search, one evaluation a step.

    Args:
      memory: the number of ``(s, y)`` pairs each start keeps (scipy's ``maxcor``).
      gtol: stop when the largest gradient component at an accepted point is at most this.
      ftol: stop when an accepted step lowers the figure of merit by at most this, relative
        to ``max(|f_k|, |f_k+1|, 1)`` (scipy's ``ftol``). ``0`` turns the test off.
      c1: the Armijo constant.
      max_linesearch: failed trials before the memory is cleared (and, a second time in a
        row, before the start stops).
      max_step: no trial moves an unconstrained coordinate by more than this.
      curvature_eps: a pair enters the memory only when ``sᵀy > curvature_eps ‖s‖ ‖y‖``.
    """

    name = "lbfgs"
    handles_nonfinite = True

    def __init__(
        self,
        memory: int = 10,
        *,
        gtol: float = 1e-5,
        ftol: float = 2.220446049250313e-09,
        c1: float = 1e-4,
        max_linesearch: int = 20,
        max_step: float = 10.0,
        curvature_eps: float = 1e-8,
    ):
        self.memory = checks.integer(memory, "memory", 1)
        self.gtol = float(checks.non_negative(gtol, "gtol"))
        self.ftol = float(checks.non_negative(ftol, "ftol"))
        self.c1 = float(checks.positive(c1, "c1"))
        checks.in_unit_interval(self.c1, "c1")
        self.max_linesearch = checks.integer(max_linesearch, "max_linesearch", 1)
        self.max_step = float(checks.positive(max_step, "max_step"))
        self.curvature_eps = float(checks.non_negative(curvature_eps, "curvature_eps"))

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "memory": self.memory,
            "gtol": self.gtol,
            "ftol": self.ftol,
            "c1": self.c1,
            "max_linesearch": self.max_linesearch,
            "max_step": self.max_step,
            "curvature_eps": self.curvature_eps,
        }

    # -- state -------------------------------------------------------------------------------

    def init(self, u) -> LBFGSState:
        x, _ = ravel_pytree(u)
        n, dtype = x.shape[0], x.dtype
        zeros = jnp.zeros((self.memory, n), dtype)
        return LBFGSState(
            x=x,
            f=jnp.asarray(jnp.inf, dtype),
            g=jnp.zeros_like(x),
            d=jnp.zeros_like(x),
            alpha=jnp.asarray(0.0, dtype),
            s=zeros,
            y=zeros,
            rho=jnp.zeros((self.memory,), dtype),
            head=jnp.int32(0),
            gamma=jnp.asarray(1.0, dtype),
            n_back=jnp.int32(0),
            started=jnp.bool_(False),
            done=jnp.bool_(False),
        )

    def converged(self, state: LBFGSState) -> jax.Array:
        return state.done

    # -- the step ----------------------------------------------------------------------------

    def step(self, value, grad, u, state: LBFGSState, *, scale, value_fn) -> SolverStep:
        del value_fn  # one evaluation a step: the engine's
        u_flat, unravel = ravel_pytree(u)
        g_flat, _ = ravel_pytree(grad)
        st = state
        dtype = u_flat.dtype
        value = jnp.asarray(value, dtype)
        finite = jnp.isfinite(value) & jnp.all(jnp.isfinite(g_flat))
        first = ~st.started

        slope0 = jnp.vdot(st.g, st.d)  # gᵀd at x: negative for a descent direction
        armijo = finite & (value <= st.f + self.c1 * st.alpha * slope0)
        accept = jnp.where(first, finite, armijo)

        # -- an accepted point: a new pair, a new direction, the stopping tests.
        s_new, y_new = u_flat - st.x, g_flat - st.g
        sy = jnp.vdot(s_new, y_new)
        curv_ok = sy > self.curvature_eps * jnp.linalg.norm(s_new) * jnp.linalg.norm(y_new)
        store = accept & ~first & curv_ok & jnp.isfinite(sy)
        mem = self._remember(st, s_new, y_new, sy, store)
        d_acc = -self._two_loop(g_flat, *mem)
        descent = (jnp.vdot(d_acc, g_flat) < 0) & jnp.all(jnp.isfinite(d_acc))
        mem = self._clear_unless(mem, descent)
        d_acc = jnp.where(descent, d_acc, -g_flat)
        has_pair = jnp.any(mem[2] != 0)
        drop = (st.f - value) / jnp.maximum(jnp.maximum(jnp.abs(st.f), jnp.abs(value)), 1.0)
        stop_acc = (jnp.max(jnp.abs(g_flat)) <= self.gtol) | (~first & (drop <= self.ftol))

        # -- a failed trial: backtrack; clear the memory after too many; stop after twice that.
        alpha_back = self._backtrack(st, value, g_flat, slope0, finite)
        n_back = st.n_back + 1
        exhausted = n_back >= self.max_linesearch
        had_pair = jnp.any(st.rho != 0)
        reset = exhausted & had_pair  # steepest descent from x with an empty memory
        stalled = exhausted & ~had_pair

        # -- put the two cases together.
        x = jnp.where(accept, u_flat, st.x)
        f = jnp.where(accept, value, st.f)
        g = jnp.where(accept, g_flat, st.g)
        fresh = accept | reset  # a new line search begins from x
        d = jnp.where(accept, d_acc, jnp.where(reset, -st.g, st.d))
        old = (st.s, st.y, st.rho, st.head, st.gamma)
        cleared = self._clear_unless(old, jnp.bool_(False))
        s_mem, y_mem, rho, head, gamma = _select(accept, mem, _select(reset, cleared, old))
        alpha0 = jnp.where(
            accept & has_pair, 1.0, jnp.minimum(1.0, 1.0 / jnp.maximum(jnp.linalg.norm(d), 1e-30))
        )
        alpha0 = jnp.minimum(alpha0, self.max_step / jnp.maximum(jnp.max(jnp.abs(d)), 1e-30))
        alpha = jnp.where(fresh, alpha0 * scale, alpha_back).astype(dtype)
        done = jnp.where(accept, stop_acc, stalled)
        # A start whose first evaluation was non-finite stays where it is (the engine ends it).
        idle = first & ~finite
        new = LBFGSState(
            x=x,
            f=f,
            g=g,
            d=d,
            alpha=alpha,
            s=s_mem,
            y=y_mem,
            rho=rho,
            head=head,
            gamma=gamma,
            n_back=jnp.where(fresh, 0, n_back).astype(jnp.int32),
            started=st.started | accept,
            done=done & ~idle,
        )
        new = _select(idle, st, new)
        u_next = jnp.where(idle | new.done, new.x, new.x + new.alpha * new.d)
        return SolverStep(unravel(u_next.astype(dtype)), new, 0)

    # -- pieces ------------------------------------------------------------------------------

    def _remember(self, st: LBFGSState, s_new, y_new, sy, store):
        """The memory with ``(s_new, y_new)`` written at ``head`` when ``store``."""
        row = jax.nn.one_hot(st.head, self.memory, dtype=jnp.bool_) & store
        s = jnp.where(row[:, None], s_new[None, :], st.s)
        y = jnp.where(row[:, None], y_new[None, :], st.y)
        rho = jnp.where(row, 1.0 / jnp.where(store, sy, 1.0), st.rho)
        head = jnp.where(store, (st.head + 1) % self.memory, st.head).astype(jnp.int32)
        yy = jnp.vdot(y_new, y_new)
        gamma = jnp.where(store, sy / jnp.where(store, yy, 1.0), st.gamma)
        return s, y, rho, head, gamma

    @staticmethod
    def _clear_unless(mem, keep):
        s, y, rho, head, gamma = mem
        return (
            jnp.where(keep, s, 0.0),
            jnp.where(keep, y, 0.0),
            jnp.where(keep, rho, 0.0),
            jnp.where(keep, head, 0).astype(jnp.int32),
            jnp.where(keep, gamma, 1.0).astype(gamma.dtype),
        )

    def _two_loop(self, g, s, y, rho, head, gamma):
        """``H g`` for the inverse-Hessian approximation of the memory (empty rows add nothing).

        Both loops are ``lax.scan`` s over the memory rather than unrolled Python loops: the
        compiled step stays small (unrolled, the L-BFGS step compiled 3x slower than Adam's).
        """
        m = self.memory
        order = (head - 1 - jnp.arange(m)) % m  # newest first
        s, y, rho = s[order], y[order], rho[order]

        def first(q, row):
            s_i, y_i, rho_i = row
            a = rho_i * jnp.vdot(s_i, q)
            return q - a * y_i, a

        q, alphas = jax.lax.scan(first, g, (s, y, rho))

        def second(r, row):
            s_i, y_i, rho_i, a = row
            b = rho_i * jnp.vdot(y_i, r)
            return r + (a - b) * s_i, None

        r, _ = jax.lax.scan(second, gamma * q, (s, y, rho, alphas), reverse=True)
        return r

    @staticmethod
    def _backtrack(st: LBFGSState, value, g_flat, slope0, finite):
        """The next, shorter trial step after a failed one (safeguarded interpolation)."""
        a, f0 = st.alpha, st.f
        slope_a = jnp.vdot(g_flat, st.d)
        d1 = slope0 + slope_a - 3.0 * (value - f0) / a
        disc = d1 * d1 - slope0 * slope_a
        d2 = jnp.sqrt(jnp.maximum(disc, 0.0))
        cubic = a - a * (slope_a + d2 - d1) / (slope_a - slope0 + 2.0 * d2)
        quad = -slope0 * a * a / (2.0 * (value - f0 - slope0 * a))
        pick = jnp.where((disc >= 0) & jnp.isfinite(cubic) & (cubic > 0), cubic, quad)
        pick = jnp.where(jnp.isfinite(pick) & (pick > 0), pick, 0.5 * a)
        shorter = jnp.clip(pick, 0.1 * a, 0.5 * a)
        return jnp.where(finite, shorter, 0.1 * a).astype(a.dtype)
