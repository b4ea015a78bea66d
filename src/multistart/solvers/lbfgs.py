"""A batched L-BFGS: per-start memory and a line search carried from step to step.

``optax.lbfgs`` runs its line search as a ``lax.while_loop`` inside one update. Under ``vmap``
every start then waits for the slowest start's search and both branches of every ``cond`` run,
so a step costs several evaluations for every start. Here the line search is a small state
machine in each start's state instead: the engine evaluates the objective **once per step** at
the point the state machine asks for (the first point, or a trial ``x + alpha d``), and the
machine either accepts the trial (a new quasi-Newton direction) or backtracks (a shorter trial
next step). No start ever waits for another, and a start that converged leaves the sweep.

The rule, per start (Nocedal & Wright, *Numerical Optimization*, algorithms 7.4 and 7.5, with
scipy L-BFGS-B's safeguards), and its relative stopping tests, are written out once in
``docs/rules.md`` ("The batched L-BFGS, in detail" and "Convergence"). Memory is never shared
across starts; everything is in the search's unconstrained coordinates.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from ..common import checks
from . import bounds
from .base import Minimiser, SolverStep, _set

__all__ = ["LBFGS", "LBFGSFields", "LBFGSState"]


def _select(pred, on_true, on_false):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class LBFGSState(NamedTuple):
    """One start's L-BFGS state, in three arrays (:class:`LBFGSFields` names their parts).

    Few leaves on purpose: every leaf of a start's state is its own gather, scatter and
    selects in the compiled chunk step, whose compile time grows with them
    (``profiling/experiments/lbfgs_compile.py``).
    """

    rows: jax.Array  # (3 + 2 * memory, n): x, g, d, the memory's s rows, its y rows
    reals: jax.Array  # (memory + 3,): the memory's rho, then f, alpha, gamma
    ints: jax.Array  # (5,) int32: n_back, started, done (0, CONVERGED or STALLED), n_pairs,
    # unprojected


class LBFGSFields(NamedTuple):
    """The parts of :class:`LBFGSState` (vectors are the flattened unconstrained parameters).

    The memory is kept oldest first: a new pair shifts the others up one row and takes the
    last; empty rows (before ``memory`` pairs were stored, or after a reset) are zero and come
    first.
    """

    x: jax.Array  # the last accepted point
    f: jax.Array  # the figure of merit at x (inf before the first finite evaluation)
    g: jax.Array  # the gradient at x
    d: jax.Array  # the search direction from x
    alpha: jax.Array  # the step length of the pending trial x + alpha d
    s: jax.Array  # (memory, n) steps, oldest first; empty rows are zero
    y: jax.Array  # (memory, n) gradient changes
    rho: jax.Array  # (memory,) 1 / sᵀy, zero for an empty row
    gamma: jax.Array  # the initial inverse-Hessian scale
    n_pairs: jax.Array  # pairs in the memory
    n_back: jax.Array  # failed trials in the current line search
    started: jax.Array  # has x been evaluated (a finite first evaluation)?
    done: jax.Array  # 0 while running; CONVERGED (a test passed) or STALLED (no progress)
    unprojected: jax.Array  # a projected trial failed: no trial is projected again (bounds)

    def pack(self) -> LBFGSState:
        rows = jnp.concatenate([jnp.stack([self.x, self.g, self.d]), self.s, self.y])
        reals = jnp.concatenate([self.rho, jnp.stack([self.f, self.alpha, self.gamma])])
        flags = (self.n_back, self.started, self.done, self.n_pairs, self.unprojected)
        return LBFGSState(rows, reals, jnp.stack([jnp.asarray(a, jnp.int32) for a in flags]))

    @classmethod
    def unpack(cls, state: LBFGSState) -> LBFGSFields:
        rows, reals, ints = state
        m = reals.shape[0] - 3
        return cls(
            x=rows[0],
            f=reals[m],
            g=rows[1],
            d=rows[2],
            alpha=reals[m + 1],
            s=rows[3 : 3 + m],
            y=rows[3 + m :],
            rho=reals[:m],
            gamma=reals[m + 2],
            n_pairs=ints[3],
            n_back=ints[0],
            started=ints[1] != 0,
            done=ints[2],
            unprojected=ints[4] != 0,
        )


CONVERGED, STALLED = 1, 2  # LBFGSFields.done

#: ``diagonal``'s scales stay within this factor of ``gamma`` either way (on the cohort of
#: ``profiling/cohort.py`` 1e4 took fewer steps than 1e2 or 1e8: docs/rules.md).
_DIAGONAL_RANGE = 1e4


class _Memory(NamedTuple):
    s: jax.Array
    y: jax.Array
    rho: jax.Array
    gamma: jax.Array
    n_pairs: jax.Array

    def cleared_unless(self, keep) -> _Memory:
        """This memory where ``keep``, else an empty one."""
        return _Memory(
            jnp.where(keep, self.s, 0.0),
            jnp.where(keep, self.y, 0.0),
            jnp.where(keep, self.rho, 0.0),
            jnp.where(keep, self.gamma, 1.0).astype(self.gamma.dtype),
            jnp.where(keep, self.n_pairs, 0).astype(jnp.int32),
        )


@dataclass(frozen=True)
class LBFGS(Minimiser):
    """Limited-memory BFGS with a per-start backtracking line search, one evaluation a step.

    Args:
      memory: the number of ``(s, y)`` pairs each start keeps (scipy's ``maxcor``).
      rtol: converged when the decrease the quasi-Newton model predicts for the next step is
        at most ``rtol * |f|``. ``None`` (default): ``100 * eps`` of the search's float type
        (``2.2e-14`` in float64, ``1.2e-5`` in float32).
      xtol: converged when the first trial of a line search was accepted and moved the point
        by at most ``xtol * (xtol + ‖x‖)``. ``None`` (default): ``sqrt(eps)`` (MINPACK's);
        ``0`` turns the test off.
      ftol: stalled when an accepted step lowers the figure of merit by at most ``ftol``
        relative to ``max(|f_k|, |f_k+1|)`` (scipy's, without its floor of 1). ``0`` (default):
        off.
      c1: the Armijo constant.
      max_linesearch: failed trials before the memory is cleared (and, a second time in a
        row, before the start stops).
      max_step: no trial moves an unconstrained coordinate by more than this.
      curvature_eps: a pair enters the memory only when ``sᵀy > curvature_eps ‖s‖ ‖y‖``.
      diagonal: the recursion's initial inverse Hessian a scale a coordinate (each
        coordinate's secant over the memory) instead of one scalar: far fewer steps where the
        Hessian is nearly diagonal but its diagonal spans orders of magnitude (a cohort's
        factor graph: shared parameters and thousands of factors' own), more where the
        coordinates are strongly coupled (docs/rules.md). ``False`` (default): off.
    """

    name = "lbfgs"
    handles_nonfinite = True
    tests_convergence = True
    projects_to_bounds = True

    memory: int = 10
    _: KW_ONLY
    rtol: float | None = None
    xtol: float | None = None
    ftol: float = 0.0
    c1: float = 1e-4
    max_linesearch: int = 20
    max_step: float = 10.0
    curvature_eps: float = 1e-8
    diagonal: bool = False

    def __post_init__(self):
        _set(
            self,
            memory=checks.integer(self.memory, "memory", 1),
            rtol=None if self.rtol is None else float(checks.non_negative(self.rtol, "rtol")),
            xtol=None if self.xtol is None else float(checks.non_negative(self.xtol, "xtol")),
            ftol=float(checks.non_negative(self.ftol, "ftol")),
            c1=float(checks.in_unit_interval(checks.positive(self.c1, "c1"), "c1")),
            max_linesearch=checks.integer(self.max_linesearch, "max_linesearch", 1),
            max_step=float(checks.positive(self.max_step, "max_step")),
            curvature_eps=float(checks.non_negative(self.curvature_eps, "curvature_eps")),
            diagonal=checks.boolean(self.diagonal, "diagonal"),
        )

    def hyperparameters(self) -> dict:
        # ``diagonal`` is recorded only when on: a fit without it keeps the configuration (and
        # the checkpoint identity) it had before the option existed.
        hyper = super().hyperparameters()
        if not self.diagonal:
            del hyper["diagonal"]
        return hyper

    # -- state -------------------------------------------------------------------------------

    def init(self, u) -> LBFGSState:
        x, _ = ravel_pytree(u)
        n, dtype = x.shape[0], x.dtype
        zeros = jnp.zeros((self.memory, n), dtype)
        return LBFGSFields(
            x=x,
            f=jnp.asarray(jnp.inf, dtype),
            g=jnp.zeros_like(x),
            d=jnp.zeros_like(x),
            alpha=jnp.asarray(0.0, dtype),
            s=zeros,
            y=zeros,
            rho=jnp.zeros((self.memory,), dtype),
            gamma=jnp.asarray(1.0, dtype),
            n_pairs=jnp.int32(0),
            n_back=jnp.int32(0),
            started=jnp.bool_(False),
            done=jnp.int32(0),
            unprojected=jnp.bool_(False),
        ).pack()

    def converged(self, state: LBFGSState) -> jax.Array:
        return LBFGSFields.unpack(state).done == CONVERGED

    def stalled(self, state: LBFGSState) -> jax.Array:
        return LBFGSFields.unpack(state).done == STALLED

    # -- the step ----------------------------------------------------------------------------

    def step(
        self, value, grad, u, state: LBFGSState, *, scale, value_fn, bounded=None
    ) -> SolverStep:
        del value_fn  # one evaluation a step: the engine's
        (u_flat, unravel), g_flat = ravel_pytree(u), ravel_pytree(grad)[0]
        st = LBFGSFields.unpack(state)
        value = jnp.asarray(value, dtype := u_flat.dtype)
        s_new, y_new = u_flat - st.x, g_flat - st.g
        dots = _Dots.of(s_new, y_new, g_flat, st)
        finite = jnp.isfinite(value) & jnp.isfinite(dots.g_max)  # nan or inf if g is
        first = ~st.started
        armijo, projected, leaves = self._armijo(st, value, u_flat, g_flat, dots, finite, bounded)
        accept = jnp.where(first, finite, armijo)

        # -- an accepted point: a new pair, a new direction, the stopping tests.
        curv_ok = dots.sy > self.curvature_eps * jnp.sqrt(dots.ss) * jnp.sqrt(dots.yy)
        store = accept & ~first & curv_ok & jnp.isfinite(dots.sy)
        mem = self._remember(st, s_new, y_new, dots, store)  # st's memory when not accepted
        d_acc, norm_acc, max_acc, descent, dg_acc = _direction(
            self._two_loop(g_flat, mem, self._h0(mem)), g_flat, dots
        )
        code_acc = self._tests(st, value, u_flat, dots, mem, descent, dg_acc, first)

        # -- a failed trial: backtrack (a projected one: retried unprojected); clear
        # the memory after too many; stop after twice that.
        alpha_back = jnp.where(projected, st.alpha, _backtrack(st, value, dots, finite))
        n_back = st.n_back + 1
        exhausted = n_back >= self.max_linesearch
        reset = exhausted & (st.n_pairs > 0)  # steepest descent from x with an empty memory
        stalled = exhausted & (st.n_pairs == 0)

        # -- put the two cases together.
        fresh = accept | reset  # a new line search begins from x
        d = jnp.where(accept, d_acc, jnp.where(reset, -st.g, st.d))
        norm_d = jnp.where(accept, norm_acc, jnp.where(reset, dots.norm_g_old, dots.norm_d_old))
        max_d = jnp.where(accept, max_acc, jnp.where(reset, dots.g_max_old, dots.d_max_old))
        # The memory is cleared by a direction that is not a descent direction and by a reset:
        # one select per element, whichever case.
        mem = mem.cleared_unless(jnp.where(accept, descent, ~reset))
        alpha0 = self._first_alpha(accept & (mem.n_pairs > 0), norm_d, max_d, dtype)
        new = LBFGSFields(
            jnp.where(accept, u_flat, st.x),
            jnp.where(accept, value, st.f),
            jnp.where(accept, g_flat, st.g),
            d,
            jnp.where(fresh, alpha0 * scale, alpha_back).astype(dtype),
            *mem,
            n_back=jnp.where(fresh, 0, n_back).astype(jnp.int32),
            started=st.started | accept,
            done=jnp.where(accept, code_acc, jnp.where(stalled, STALLED, 0)),
            # only a bound whose minimum lies inside ends the projecting: a projected trial
            # that failed on the other coordinates' step leaves the next line search its own
            unprojected=st.unprojected | (projected & leaves),
        )
        # A start whose first evaluation was non-finite stays where it is (the engine ends it;
        # it accepted nothing, so new.x is st.x).
        idle = first & ~finite
        u_next = jnp.where(idle | (new.done != 0), new.x, _to_bounds(new, fresh, bounded))
        return SolverStep(unravel(u_next.astype(dtype)), _select(idle, state, new.pack()), 0)

    # -- pieces ------------------------------------------------------------------------------

    def _first_alpha(self, unit_step, norm_d, max_d, dtype):
        """A new line search's first trial: a step of 1 where the memory scales the direction
        (``unit_step``), else a step of unit length; never more than ``max_step`` along any
        coordinate."""
        tiny = jnp.finfo(dtype).tiny
        unit = 1.0 / jnp.maximum(norm_d, tiny)  # a step of unit length
        alpha0 = jnp.where(unit_step, 1.0, unit)
        return jnp.minimum(alpha0, self.max_step / jnp.maximum(max_d, tiny))

    def _armijo(self, st: LBFGSFields, value, x, g, dots: _Dots, finite, bounded):
        """``(armijo, projected, leaves)``: does the point just evaluated pass the
        sufficient-decrease test (a trial on a bound whose minimum lies inside does not), was it
        a projected trial, and is a coordinate on a bound there with its minimum inside
        (:mod:`multistart.solvers.bounds`)?"""
        armijo = finite & (value <= st.f + self.c1 * st.alpha * dots.slope0)
        if bounded is None:
            return armijo, jnp.bool_(False), jnp.bool_(False)
        # a trial that leaves a coordinate on a bound whose minimum lies inside fails
        projected, leaves = bounds.on_bounds(
            x, g, jnp.asarray(bounded), started=st.started, base=st.x, d=st.d, alpha=st.alpha
        )
        return armijo & ~leaves, projected, leaves

    def _tests(self, st: LBFGSFields, value, x, dots: _Dots, mem: _Memory, descent, dg, first):
        """The stopping tests at an accepted point: ``CONVERGED``, ``STALLED`` or 0."""
        eps = float(jnp.finfo(x.dtype).eps)
        rtol = 100 * eps if self.rtol is None else self.rtol
        xtol = eps**0.5 if self.xtol is None else self.xtol
        size = jnp.abs(value)
        # the quasi-Newton model's predicted decrease, or an exact stationary point
        decrement = (mem.n_pairs > 0) & descent & (-dg <= 2.0 * rtol * size)
        stationary = dots.g_max == 0
        # a first trial (no backtracking) that hardly moved: the model's minimum is here (a
        # step shortened by the line search says nothing of the kind)
        moved = jnp.sqrt(dots.ss)
        small_step = (st.n_back == 0) & (moved <= xtol * (xtol + jnp.linalg.norm(x)))
        drop = (st.f - value) / jnp.maximum(jnp.abs(st.f), size)  # relative: no floor of 1
        converged = decrement | stationary | (~first & small_step)
        stalled = ~first & (drop <= self.ftol)
        return jnp.where(converged, CONVERGED, jnp.where(stalled, STALLED, 0))

    def _remember(self, st: LBFGSFields, s_new, y_new, dots: _Dots, store) -> _Memory:
        """The memory with ``(s_new, y_new)`` appended (the oldest pair dropped) when ``store``."""
        s = jnp.where(store, jnp.concatenate([st.s[1:], s_new[None]]), st.s)
        y = jnp.where(store, jnp.concatenate([st.y[1:], y_new[None]]), st.y)
        rho_new = 1.0 / jnp.where(store, dots.sy, 1.0)
        rho = jnp.where(store, jnp.concatenate([st.rho[1:], rho_new[None]]), st.rho)
        gamma = jnp.where(store, dots.sy / jnp.where(store, dots.yy, 1.0), st.gamma)
        n_pairs = jnp.minimum(st.n_pairs + store.astype(jnp.int32), self.memory)
        return _Memory(s, y, rho, gamma, n_pairs)

    def _h0(self, mem: _Memory):
        """The initial inverse Hessian of the two-loop recursion: the scalar ``gamma``, or with
        ``diagonal`` a scale a coordinate, ``sum_i s_i y_i / sum_i y_i²`` over the memory's
        pairs (each coordinate's own secant), kept within ``_DIAGONAL_RANGE`` of ``gamma`` and
        ``gamma`` itself where a coordinate's pairs show no positive curvature."""
        if not self.diagonal:
            return mem.gamma
        sy, yy = jnp.sum(jnp.stack([mem.s * mem.y, mem.y * mem.y]), axis=1)
        ok = (sy > 0) & (yy > 0)
        d = jnp.where(ok, sy / jnp.where(ok, yy, 1.0), mem.gamma)
        return jnp.clip(d, mem.gamma / _DIAGONAL_RANGE, mem.gamma * _DIAGONAL_RANGE)

    @staticmethod
    def _two_loop(g, mem: _Memory, h0):
        """``H g`` for the inverse-Hessian approximation of the memory (empty rows add nothing).

        Both loops are ``lax.scan`` s over the memory rather than unrolled Python loops, so
        the compiled step stays small.
        The memory is kept oldest first, so the scans read it as it is, with no gather.
        """

        def first(q, row):  # newest to oldest
            s_i, y_i, rho_i = row
            a = rho_i * jnp.vdot(s_i, q)
            return q - a * y_i, a

        q, alphas = jax.lax.scan(first, g, (mem.s, mem.y, mem.rho), reverse=True)

        def second(r, row):  # oldest to newest
            s_i, y_i, rho_i, a = row
            b = rho_i * jnp.vdot(y_i, r)
            return r + (a - b) * s_i, None

        r, _ = jax.lax.scan(second, h0 * q, (mem.s, mem.y, mem.rho, alphas))
        return r


class _Dots(NamedTuple):
    """The inner products and largest magnitudes a step reads, from two reductions over the
    parameters: sums of eight products, stacked, and the largest |value| of three vectors.

    Each reduction over the parameters is a kernel of its own in the compiled chunk step (and
    the small values between them more kernels); reducing stacked rows together keeps that
    count, and the compile time, low. A vector holding nan or inf has a nan or inf largest
    magnitude, which is the finite check.
    """

    slope0: jax.Array  # gᵀd at the last accepted point: negative for a descent direction
    sy: jax.Array  # sᵀy of the new pair
    ss: jax.Array  # sᵀs
    yy: jax.Array  # yᵀy
    slope_a: jax.Array  # gᵀd at the point just evaluated
    norm_g: jax.Array  # ‖g‖ at the point just evaluated
    norm_g_old: jax.Array  # ‖g‖ at the last accepted point
    norm_d_old: jax.Array  # ‖d‖ of the pending direction
    g_max: jax.Array  # max |g| at the point just evaluated
    g_max_old: jax.Array  # max |g| at the last accepted point
    d_max_old: jax.Array  # max |d| of the pending direction

    @classmethod
    def of(cls, s_new, y_new, g, st: LBFGSFields) -> _Dots:
        left = jnp.stack([st.g, s_new, s_new, y_new, g, g, st.g, st.d])
        right = jnp.stack([st.d, y_new, s_new, y_new, st.d, g, st.g, st.d])
        sums = jnp.sum(left * right, axis=1)
        big = jnp.max(jnp.abs(jnp.stack([g, st.g, st.d])), axis=1)
        return cls(*sums[:5], *jnp.sqrt(sums[5:]), *big)


def _direction(hg, g, dots: _Dots):
    """``(d, ‖d‖, max |d|, descent, dᵀg)``: the quasi-Newton direction ``-hg`` when it is a
    finite descent direction, else steepest descent ``-g`` (two reductions); ``dᵀg`` is the
    quasi-Newton direction's."""
    d = -hg
    dg, dd = jnp.sum(jnp.stack([d * g, d * d]), axis=1)
    d_max = jnp.max(jnp.abs(d))
    descent = (dg < 0) & jnp.isfinite(d_max)
    return (
        jnp.where(descent, d, -g),
        jnp.where(descent, jnp.sqrt(dd), dots.norm_g),
        jnp.where(descent, d_max, dots.g_max),
        descent,
        dg,
    )


def _to_bounds(new: LBFGSFields, fresh, bounded):
    """The next trial point, projected where a fresh line search's first trial takes a
    coordinate near a bound (:func:`multistart.solvers.bounds.to_bounds`)."""
    return bounds.to_bounds(
        new.x, new.d, fresh, bounded, alpha=new.alpha, unprojected=new.unprojected
    )


def _backtrack(st: LBFGSFields, value, dots: _Dots, finite):
    """The next, shorter trial step after a failed one (safeguarded interpolation)."""
    a, f0, slope0, slope_a = st.alpha, st.f, dots.slope0, dots.slope_a
    d1 = slope0 + slope_a - 3.0 * (value - f0) / a
    disc = d1 * d1 - slope0 * slope_a
    d2 = jnp.sqrt(jnp.maximum(disc, 0.0))
    cubic = a - a * (slope_a + d2 - d1) / (slope_a - slope0 + 2.0 * d2)
    quad = -slope0 * a * a / (2.0 * (value - f0 - slope0 * a))
    pick = jnp.where((disc >= 0) & jnp.isfinite(cubic) & (cubic > 0), cubic, quad)
    pick = jnp.where(jnp.isfinite(pick) & (pick > 0), pick, 0.5 * a)
    shorter = jnp.clip(pick, 0.1 * a, 0.5 * a)
    return jnp.where(finite, shorter, 0.1 * a).astype(a.dtype)
