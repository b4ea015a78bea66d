"""The fused per-start step and the chunk step built from it.

One start's step is value_and_grad -> optax update -> apply, with a non-finite guard and the
start's best-so-far kept inside the compiled program. The chunk step gathers ``batch_size``
starts from the population state, runs ``vmap`` of the start step over them and scatters them
back, so the population stays on the device and one compiled program serves every chunk.

Everything here is a pure function of its arguments: the model's data is an argument, not a
captured value, so the same model gives the same program in another process (the persistent
compilation cache can hit) and the step can later run unchanged over a device mesh.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from .convergence import Convergence, window_converged
from .status import Status

__all__ = ["StartState", "PopState", "make_start_step", "make_chunk_step", "init_population"]

_RUNNING, _CONVERGED, _NONFINITE = Status.RUNNING.code, Status.CONVERGED.code, Status.NONFINITE.code


class StartState(NamedTuple):
    """State of one start (in the population, every leaf has a leading ``n_starts`` axis)."""

    u: Any  # unconstrained parameters
    opt_state: Any  # this start's own optax state
    fom: jax.Array  # figure of merit at the last evaluated point
    best_fom: jax.Array  # best finite figure of merit so far (inf if none)
    best_u: Any  # unconstrained parameters at best_fom
    best_step: jax.Array  # step at which best_fom was evaluated (-1 if none)
    good_u: Any  # the last point whose evaluation was finite: where a failed step rolls back to
    scale: jax.Array  # multiplier on the optax update; halved at each non-finite evaluation
    n_bad: jax.Array  # non-finite evaluations since the best figure of merit last improved
    n_steps: jax.Array  # evaluations taken (value_and_grad calls)
    status: jax.Array  # Status code
    ring: jax.Array  # (window,) best_fom at the last `window` steps, for convergence


class PopState(NamedTuple):
    """The whole search's device state: every start plus the best-so-far history."""

    starts: StartState
    history: jax.Array  # (n_steps, n_starts) best-so-far per step; nan where not stepped


def _tree_select(pred, on_true, on_false):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _tree_all_finite(tree) -> jax.Array:
    """Are all floating-point values in ``tree`` finite? One reduction over one vector.

    Concatenating first matters for compile time: a reduction per leaf is an XLA op per leaf,
    and these checks run on every state tree of every start.
    """
    leaves = [
        jnp.ravel(x)
        for x in jax.tree_util.tree_leaves(tree)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    if not leaves:
        return jnp.bool_(True)
    return jnp.all(jnp.isfinite(jnp.concatenate([x.astype(leaves[0].dtype) for x in leaves])))


def update_kwargs(optimizer: optax.GradientTransformation) -> frozenset[str]:
    """Which of ``value``, ``grad``, ``value_fn`` the optimizer's ``update`` accepts.

    optax rules that need the objective inside their update (``optax.lbfgs`` and its line
    search) take them as keyword arguments; a rule that declares no such parameter gets none.
    """
    try:
        params = inspect.signature(optimizer.update).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return frozenset({"value", "grad", "value_fn"})
    return frozenset(p.name for p in params) & {"value", "grad", "value_fn"}


def make_start_step(
    fom_u: Callable[[Any, Any], jax.Array],
    optimizer: optax.GradientTransformation,
    convergence: Convergence | None,
    max_nonfinite: int,
) -> Callable[[StartState, Any], StartState]:
    """Build ``start_step(state, data) -> state`` for one start.

    ``fom_u(u, data)`` is the figure of merit at unconstrained ``u``. A non-finite value or
    gradient (or a non-finite update) rolls the start back to its last finite point, restarts
    its optimiser state there (momentum would carry it straight back) and halves its step scale
    for good; ``max_nonfinite`` failures
    without an improvement in between, or a start that never had a finite value and gradient,
    end it as ``nonfinite``. A start that is not
    running is returned unchanged, so results do not depend on when the host drops it.
    """
    extra = update_kwargs(optimizer)

    def start_step(s: StartState, data) -> StartState:
        def f(u):
            return fom_u(u, data)

        fom, grad = jax.value_and_grad(f)(s.u)
        finite = jnp.isfinite(fom)

        kwargs = {"value": fom, "grad": grad, "value_fn": f}
        kwargs = {k: v for k, v in kwargs.items() if k in extra}
        updates, opt_new = optimizer.update(grad, s.opt_state, s.u, **kwargs)
        updates = jax.tree_util.tree_map(lambda g: (s.scale * g).astype(g.dtype), updates)
        u_new = optax.apply_updates(s.u, updates)
        # One check covers the value, the gradient (a rule such as Lion can turn an inf
        # gradient into a finite step, and then carry the inf in its state) and the new point.
        ok = _tree_all_finite((fom, grad, u_new))

        improved = finite & (fom < s.best_fom)
        best_fom = jnp.where(improved, fom, s.best_fom)
        # Failures count until the start improves again, so a start bouncing off a nan wall
        # without getting better ends after max_nonfinite tries at ever smaller steps.
        n_bad = jnp.where(improved, 0, s.n_bad + (~ok).astype(s.n_bad.dtype))
        dead = (~ok) & ((n_bad >= max_nonfinite) | ~jnp.isfinite(best_fom))

        status = jnp.where(dead, _NONFINITE, s.status)
        ring = s.ring
        if convergence is not None:
            slot = s.n_steps % ring.shape[0]
            conv = window_converged(
                ring[slot],
                best_fom,
                s.n_steps,
                window=convergence.window,
                rtol=convergence.rtol,
                atol=convergence.atol,
                min_steps=convergence.min_steps,
                xp=jnp,
            )
            ring = ring.at[slot].set(best_fom)
            status = jnp.where(~dead & conv, _CONVERGED, status)

        new = StartState(
            u=_tree_select(ok, u_new, s.good_u),
            opt_state=_tree_select(ok, opt_new, optimizer.init(s.good_u)),
            fom=fom.astype(s.fom.dtype),
            best_fom=best_fom.astype(s.best_fom.dtype),
            best_u=_tree_select(improved, s.u, s.best_u),
            best_step=jnp.where(improved, s.n_steps, s.best_step),
            good_u=_tree_select(ok, s.u, s.good_u),
            scale=jnp.where(ok, s.scale, s.scale / 2),
            n_bad=n_bad,
            n_steps=s.n_steps + 1,
            status=status.astype(s.status.dtype),
            ring=ring,
        )
        return _tree_select(s.status == _RUNNING, new, s)

    return start_step


def make_chunk_step(start_step: Callable[[StartState, Any], StartState]):
    """Build ``chunk_step(pop, gather, scatter, t, data) -> pop``.

    ``gather`` and ``scatter`` are ``batch_size`` row indices from
    :func:`multistart.chunking.chunk_indices`; the padding's scatter index is out of bounds and
    its writes are dropped. ``t`` is the global step, the row of ``history`` written.
    """
    vstep = jax.vmap(start_step, in_axes=(0, None))

    def multistart_chunk_step(pop: PopState, gather, scatter, t, data) -> PopState:
        chunk = jax.tree_util.tree_map(lambda a: a[gather], pop.starts)
        # Materialise the chunk's new state once: without the barrier XLA may fuse (and so
        # recompute, possibly rounding differently) the same value into both scatters below.
        out = jax.lax.optimization_barrier(vstep(chunk, data))
        starts = jax.tree_util.tree_map(
            lambda a, b: a.at[scatter].set(b, mode="drop"), pop.starts, out
        )
        history = pop.history.at[t, scatter].set(out.best_fom, mode="drop")
        return PopState(starts, history)

    return multistart_chunk_step


def init_population(optimizer, u0, n_steps: int, window: int, status=None) -> PopState:
    """The initial population state from stacked unconstrained starts ``u0`` (traceable).

    ``status`` optionally gives each start's initial status code (default: all running); a
    start that is not running never steps.
    """
    leaves = jax.tree_util.tree_leaves(u0)
    n = leaves[0].shape[0]
    dtype = leaves[0].dtype
    inf = jnp.full((n,), jnp.inf, dtype)
    starts = StartState(
        u=u0,
        opt_state=jax.vmap(optimizer.init)(u0),
        fom=jnp.full((n,), jnp.nan, dtype),
        best_fom=inf,
        best_u=u0,
        best_step=jnp.full((n,), -1, jnp.int32),
        good_u=u0,
        scale=jnp.ones((n,), dtype),
        n_bad=jnp.zeros((n,), jnp.int32),
        n_steps=jnp.zeros((n,), jnp.int32),
        status=(
            jnp.full((n,), _RUNNING, jnp.int8)
            if status is None
            else jnp.asarray(status).astype(jnp.int8)
        ),
        ring=jnp.full((n, window), jnp.inf, dtype),
    )
    return PopState(starts, jnp.full((n_steps, n), jnp.nan, dtype))
