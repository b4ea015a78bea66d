"""Per-start Gauss-Newton-type rules: one residual Jacobian a step, damping as per-start state.

A least-squares rule sees the residuals ``r`` and their Jacobian ``J`` at the point the engine
evaluated (the figure of merit is ``‖r‖²``). As in the L-BFGS line search, a step's trial point
is the next point the engine evaluates; if the actual decrease there is too small against the
linear model's, the start proposes a shorter step from the ``JᵀJ`` it kept, so a rejected trial
costs one evaluation and no start waits for another.

The rules (Nocedal & Wright, *Numerical Optimization*, 2nd ed., ch. 10; Madsen, Nielsen &
Tingleff, *Methods for non-linear least squares problems*, 2004):

- ``"lm"``: Levenberg-Marquardt. The step solves ``(JᵀJ + λ D) d = -Jᵀr`` with ``D`` the
  running maximum of ``diag(JᵀJ)`` (Marquardt's scaling, as MINPACK's ``lmder``), ``λ``
  starting at ``0.1`` (dimensionless: ``D`` carries the scale of ``JᵀJ``, so residuals
  ``c r`` take the steps ``r`` takes) and updated by the gain ratio ``ρ`` (actual over predicted
  decrease) as Nielsen's rule: ``λ *= max(1/3, 1 - (2ρ - 1)³)`` on an accepted step,
  ``λ *= ν, ν *= 2`` on a rejected one.
- ``"dogleg"``: Powell's dogleg in a trust region of radius ``Δ``: the Gauss-Newton step when it
  fits, else the steepest-descent (Cauchy) step cut at ``Δ``, else the point where the path
  between them meets the boundary; ``Δ`` shrinks by 4 when ``ρ < 1/4`` and doubles when
  ``ρ > 3/4`` and the step reached the boundary.
- ``"gauss-newton"``: the Gauss-Newton step ``JᵀJ d = -Jᵀr`` with a backtracking length: a
  rejected trial halves the length, an accepted one doubles it, up to the full step.

A trial is accepted when ``ρ > 1e-4`` (MINPACK's threshold). The stopping tests (scipy
``least_squares``' ``ftol``, ``xtol``, ``gtol``, relative, default ``eps^(3/4)``) are described
in ``docs/least-squares.md``. After a rejected trial, a next step too short to move the point
(``xtol``) is convergence too; one whose predicted decrease is below the rounding of ``‖r‖²``
ends the start ``stalled``. The normal equations are solved by Cholesky in the working
precision, so run ill-conditioned fits in float64.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..common import checks
from . import bounds, small
from .base import LeastSquaresRule, SolverStep, _set

__all__ = [
    "LeastSquaresSolver",
    "LeastSquaresState",
    "LeastSquaresFields",
    "METHODS",
    "default_tolerance",
]

METHODS = ("lm", "dogleg", "gauss-newton")
CONVERGED, STALLED = 1, 2  # LeastSquaresFields.done
ACCEPT = 1e-4  # a trial is accepted when the actual decrease is this much of the predicted
# The first damping λ: dimensionless, as it multiplies the scaling D. Madsen, Nielsen and
# Tingleff advise 1e-3 and larger for a start far from the solution, as a multi-start's drawn
# starts are: 0.1 kept more far peaks from one p0 (profiling/README.md, "Many small fits").
LM_TAU = 0.1
DOGLEG_FACTOR = 100.0  # the first trust radius, relative to max(‖x‖, 1) (MINPACK's factor)


def default_tolerance(tol: float | None, dtype) -> float:
    """``tol``, or for ``None`` the default ``eps^(3/4)`` of ``dtype`` (a Python float)."""
    return float(np.finfo(dtype).eps) ** 0.75 if tol is None else tol


class LeastSquaresState(NamedTuple):
    """One start's state, in three arrays (:class:`LeastSquaresFields` names their parts).

    Few leaves on purpose, as :class:`~multistart.solvers.lbfgs.LBFGSState`: every leaf of a
    start's state is its own gather, scatter and selects in the compiled chunk step.
    """

    rows: jax.Array  # (4 + n, n): x, g, diag, d, then the n rows of JᵀJ
    reals: jax.Array  # (4,): cost, param, nu, pred
    ints: jax.Array  # (3,) int32: started, done, unprojected


class LeastSquaresFields(NamedTuple):
    """The parts of :class:`LeastSquaresState` (vectors over the raveled unconstrained
    parameters)."""

    x: jax.Array  # the last accepted point
    cost: jax.Array  # ‖r‖² at x (inf before the first finite evaluation)
    g: jax.Array  # Jᵀr at x (half the gradient of the cost)
    a: jax.Array  # (n, n) JᵀJ at x
    diag: jax.Array  # the running maximum of diag(JᵀJ): the step's scaling
    param: jax.Array  # lm: the damping λ; dogleg: the trust radius Δ; gauss-newton: the length
    nu: jax.Array  # lm: the damping's growth on a rejected trial
    d: jax.Array  # the pending step: the trial is x + d
    pred: jax.Array  # the decrease of ‖r‖² that the linear model predicts at x + d
    started: jax.Array  # has x been evaluated (a finite first evaluation)?
    done: jax.Array  # 0 while running; CONVERGED (a test passed) or STALLED (no decrease left)
    unprojected: jax.Array  # a projected trial failed: no trial is projected again

    def pack(self) -> LeastSquaresState:
        rows = jnp.concatenate([jnp.stack([self.x, self.g, self.diag, self.d]), self.a])
        reals = jnp.stack([self.cost, self.param, self.nu, self.pred])
        ints = jnp.stack(
            [jnp.asarray(v, jnp.int32) for v in (self.started, self.done, self.unprojected)]
        )
        return LeastSquaresState(rows, reals, ints)

    @classmethod
    def unpack(cls, state: LeastSquaresState) -> LeastSquaresFields:
        rows, reals, ints = state
        return cls(
            x=rows[0],
            cost=reals[0],
            g=rows[1],
            a=rows[4:],
            diag=rows[2],
            param=reals[1],
            nu=reals[2],
            d=rows[3],
            pred=reals[3],
            started=ints[0] != 0,
            done=ints[1],
            unprojected=ints[2] != 0,
        )


@dataclass(frozen=True)
class LeastSquaresSolver(LeastSquaresRule):
    """A per-start Gauss-Newton-type rule over residuals (see the module's docstring).

    Args:
      method: ``"lm"`` (Levenberg-Marquardt), ``"dogleg"`` or ``"gauss-newton"``; the rule's
        name.
      ftol, xtol, gtol: scipy ``least_squares``' stopping tolerances (relative); ``None``
        (default) is ``eps^(3/4)`` of the search's float type; ``0`` turns one off.
      jacobian: ``"auto"`` (forward mode when there are at least as many residuals as
        parameters, else reverse mode), ``"forward"`` or ``"reverse"`` (for a model with a
        ``jax.custom_vjp`` and no forward-mode rule).
    """

    handles_nonfinite = True  # a non-finite trial is a rejected trial
    tests_convergence = True
    projects_to_bounds = True

    method: str = field(default="lm", metadata={"name": True})
    _: KW_ONLY
    ftol: float | None = None
    xtol: float | None = None
    gtol: float | None = None
    jacobian: str = "auto"

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(
                f"method must be one of {', '.join(map(repr, METHODS))}; got {self.method!r}"
            )
        super().__post_init__()
        _set(self, name=self.method)
        tols = {key: getattr(self, key) for key in ("ftol", "xtol", "gtol")}
        _set(
            self,
            **{k: v if v is None else float(checks.non_negative(v, k)) for k, v in tols.items()},
        )

    def init(self, u) -> LeastSquaresState:
        x, _ = ravel_pytree(u)
        n, dtype = x.shape[0], x.dtype
        zero = jnp.asarray(0.0, dtype)
        return LeastSquaresFields(
            x=x,
            cost=jnp.asarray(jnp.inf, dtype),
            g=jnp.zeros_like(x),
            a=jnp.zeros((n, n), dtype),
            diag=jnp.zeros_like(x),
            param=zero,
            nu=jnp.asarray(2.0, dtype),
            d=jnp.zeros_like(x),
            pred=zero,
            started=jnp.bool_(False),
            done=jnp.int32(0),
            unprojected=jnp.bool_(False),
        ).pack()

    def converged(self, state: LeastSquaresState) -> jax.Array:
        return LeastSquaresFields.unpack(state).done == CONVERGED

    def stalled(self, state: LeastSquaresState) -> jax.Array:
        return LeastSquaresFields.unpack(state).done == STALLED

    def step(self, residuals, jacobian, u, state, *, value, scale, value_fn, bounded=None):
        del value_fn  # one evaluation a step: the engine's
        u_flat, unravel = ravel_pytree(u)
        st, dtype = LeastSquaresFields.unpack(state), u_flat.dtype
        cost = jnp.asarray(value, dtype)
        a, g = small.normal_equations(jacobian, residuals)
        finite = _finite(cost, a)
        first = ~st.started
        actual = st.cost - cost
        rho = actual / jnp.where(st.pred > 0, st.pred, 1.0)
        accept = jnp.where(first, finite, finite & (st.pred > 0) & (rho > ACCEPT))
        # a projected trial that failed is tried again unprojected: the same step, not a
        # rejection that grows the damping (bounds.projected)
        projected, leaves = bounds.on_bounds(
            u_flat, g, bounded, started=st.started, base=st.x, d=st.d
        )
        retry = projected & ~accept

        # -- at an accepted point: new curvature, the stopping tests
        # the running maximum in the prior's own coordinate (bounds.prior_scale)
        diag = jnp.maximum(st.diag, jnp.diagonal(a) / bounds.prior_scale(u_flat, bounded) ** 2)
        stop_acc = self._stops_at(st, u_flat, cost, g, a, rho, bounded)

        keep = (st.x, st.cost, st.g, st.a, st.diag)
        new = (u_flat, cost, g, a, diag)
        x, cost_x, g_x, a_x, diag_x = jax.tree_util.tree_map(
            lambda p, q: jnp.where(accept, p, q), new, keep
        )
        param, nu = self._update(st, rho, accept, first, a_x)
        param, nu = jnp.where(retry, st.param, param), jnp.where(retry, st.nu, nu)
        free = bounds.inside(x, g_x, bounded)
        scaling = diag_x * bounds.prior_scale(x, bounded) ** 2
        d, pred = self._propose(g_x, a_x, scaling, param, scale, free)
        ends = self._ends_after_rejection(x, cost_x, g_x, a_x, d, pred, free)
        done = jnp.where(accept, jnp.where(stop_acc, CONVERGED, 0), jnp.where(retry, 0, ends))
        idle = first & ~finite  # never finite: the engine ends the start
        out = LeastSquaresFields(
            x=x,
            cost=cost_x,
            g=g_x,
            a=a_x,
            diag=diag_x,
            param=param.astype(dtype),
            nu=nu.astype(dtype),
            d=d,
            pred=pred,
            started=st.started | accept,
            done=jnp.where(idle, 0, done).astype(jnp.int32),
            # only a bound whose minimum lies inside ends the projecting (as L-BFGS's): a
            # projected trial that failed on the other coordinates' step leaves the next its own
            unprojected=st.unprojected | (retry & leaves),
        )
        out = jax.tree_util.tree_map(lambda p, q: jnp.where(idle, p, q), st, out)
        # the first trial from a newly accepted point may go to the bounds (bounds.to_bounds)
        fresh = accept & ~out.unprojected
        trial = bounds.to_bounds(out.x, out.d, fresh, bounded)
        u_next = jnp.where(idle | (out.done != 0), out.x, trial)
        return SolverStep(unravel(u_next.astype(dtype)), out.pack(), 0)

    def _stops_at(self, st: LeastSquaresFields, u_flat, cost, g, a, rho, bounded):
        """scipy's ``ftol``, ``xtol`` and ``gtol`` tests at a point just evaluated (they count
        where it is accepted); the gradient test over the coordinates no bound holds."""
        first, dtype = ~st.started, u_flat.dtype
        ftol, xtol, gtol = (default_tolerance(t, dtype) for t in (self.ftol, self.xtol, self.gtol))
        small_step = jnp.linalg.norm(u_flat - st.x) <= xtol * (xtol + jnp.linalg.norm(u_flat))
        small_drop = (st.cost - cost <= ftol * st.cost) & (rho > 0.25)
        free = bounds.inside(u_flat, g, bounded)
        return (_cosine(g, a, cost, free) <= gtol) | (~first & (small_drop | small_step))

    def _ends_after_rejection(self, x, cost, g, a, d, pred, free):
        """How a start ends after a rejected trial (0: it goes on): a next step ``d`` too small
        to move the point is MINPACK's xtol test (its trust region shrank below xtol:
        converged). One too small to lower ‖r‖² in the working precision leaves no decrease
        to find: converged where the kept point is a stationary point to half the working
        precision (the cosine test at sqrt(eps)), stalled otherwise."""
        eps = jnp.finfo(x.dtype).eps
        xtol = default_tolerance(self.xtol, x.dtype)
        tiny_step = jnp.linalg.norm(d) <= xtol * (xtol + jnp.linalg.norm(x))
        no_drop = pred <= eps * cost
        flat = _cosine(g, a, cost, free) <= jnp.sqrt(eps)
        return jnp.where(tiny_step | (no_drop & flat), CONVERGED, jnp.where(no_drop, STALLED, 0))

    # -- the three rules -------------------------------------------------------------------

    def _update(self, st: LeastSquaresFields, rho, accept, first, a):
        """``(param, nu)`` after a trial with gain ratio ``rho``."""
        if self.method == "lm":
            grown = st.param * jnp.maximum(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
            lam = jnp.where(first, LM_TAU, jnp.where(accept, grown, st.param * st.nu))
            nu = jnp.where(accept, 2.0, 2.0 * st.nu)
            # never exactly zero, or a rejected trial could not grow it
            return jnp.maximum(lam, jnp.finfo(a.dtype).tiny), nu
        if self.method == "dogleg":
            step = jnp.linalg.norm(st.d)
            on_edge = step >= 0.99 * st.param
            grown = jnp.where((rho > 0.75) & on_edge, 2.0 * st.param, st.param)
            radius = jnp.where(~accept | (rho < 0.25), 0.25 * step, grown)
            x_norm = jnp.maximum(jnp.linalg.norm(st.x), 1.0)
            return jnp.where(first, DOGLEG_FACTOR * x_norm, radius), st.nu
        # gauss-newton: half the length after a rejected trial; twice it (up to the full
        # step) after an accepted one, so a start far from its minimum does not backtrack
        # from the full step every time
        length = jnp.where(accept, jnp.minimum(2.0 * st.param, 1.0), 0.5 * st.param)
        return jnp.where(first, 1.0, length), st.nu

    def _propose(self, g, a, diag, param, scale, free):
        """``(d, pred)``: the next step from the kept point and its predicted decrease; a
        coordinate that is not ``free`` (a bound holds it, :func:`bounds.inside`) stays put,
        as an active bound in a projected method, its coupling to the others dropped."""
        n = g.shape[0]
        g = jnp.where(free, g, 0.0)
        a = jnp.where(free[:, None] & free[None, :], a, 0.0)
        # relative to the largest curvature, so the step does not depend on the residuals' scale
        biggest = jnp.max(diag)
        floor = jnp.finfo(g.dtype).eps * jnp.where(biggest > 0, biggest, 1.0)
        scaling = jnp.maximum(diag, floor)
        if self.method == "lm":
            d = _solve(a + param * jnp.diag(scaling), -g)
        else:
            # the Gauss-Newton step; a rank-deficient JᵀJ gets the least regularisation that
            # makes it positive definite in the working precision
            gn = _solve(a + jnp.diag(floor * jnp.ones(n, g.dtype)), -g)
            d = param * gn if self.method == "gauss-newton" else _dogleg(g, a, gn, param)
        d = scale * d
        pred = -(2.0 * jnp.vdot(d, g) + jnp.vdot(d, small.matvec(a, d)))
        return d, pred


def _finite(cost, a):
    """Are ``‖r‖²`` and the Jacobian finite? J is read off ``JᵀJ``'s diagonal, each column's
    sum of squares (nan or inf where the column holds one), not off J itself: XLA fused that
    test by computing every element of J a second time (profiling/HISTORY.md, "The Jacobian's
    finiteness"). A finite J whose squares overflow counts as not finite: its ``JᵀJ`` could
    not give a step."""
    return jnp.isfinite(cost) & jnp.all(jnp.isfinite(jnp.diagonal(a)))


def _cosine(g, a, cost, free):
    """MINPACK's scale-free gradient test: the largest cosine between ``r`` and a column of
    ``J``, from ``g = Jᵀr``, ``a = JᵀJ`` and ``cost = ‖r‖²``, over the ``free`` coordinates
    (not on a bound that holds them, :func:`multistart.solvers.bounds.inside`)."""
    col = jnp.sqrt(jnp.diagonal(a)) * jnp.sqrt(cost)
    cos = jnp.where(col > 0, jnp.abs(g) / jnp.where(col > 0, col, 1.0), 0.0)
    return jnp.max(jnp.where(free, cos, 0.0))


def _solve(m, b):
    """``m⁻¹ b`` for a symmetric positive definite ``m`` (nan when it is not)."""
    if small.entrywise(m.shape[0]):
        return small.cho_solve(m, b)
    factor = jax.scipy.linalg.cho_factor(m, lower=True)
    return jax.scipy.linalg.cho_solve(factor, b)


def _dogleg(g, a, gn, radius):
    """Powell's dogleg step in a trust region of ``radius``."""
    gg = jnp.vdot(g, g)
    gag = jnp.vdot(g, small.matvec(a, g))
    cauchy = -(gg / jnp.where(gag > 0, gag, 1.0)) * g
    gn_norm, cauchy_norm = jnp.linalg.norm(gn), jnp.linalg.norm(cauchy)
    # the path cauchy + t (gn - cauchy), t in [0, 1], meets the boundary where ‖·‖ = radius
    diff = gn - cauchy
    qa, qb = jnp.vdot(diff, diff), 2.0 * jnp.vdot(cauchy, diff)
    qc = cauchy_norm**2 - radius**2
    t = (-qb + jnp.sqrt(jnp.maximum(qb * qb - 4.0 * qa * qc, 0.0))) / jnp.where(qa > 0, 2 * qa, 1.0)
    between = cauchy + jnp.clip(t, 0.0, 1.0) * diff
    cut = radius / jnp.where(cauchy_norm > 0, cauchy_norm, 1.0) * cauchy
    return jnp.where(gn_norm <= radius, gn, jnp.where(cauchy_norm >= radius, cut, between))
