"""The fused per-start step and the chunk step built from it.

One start's step is value_and_grad -> the solver's step (any optax rule, or the batched
L-BFGS), with a non-finite guard, the start's best-so-far and convergence kept inside the
compiled program. The chunk step gathers ``batch_size`` starts from the population state,
runs ``vmap`` of the start step over them and scatters them back, so the population stays on
the device and one compiled program serves every chunk.

Around the solver, the same for every rule:

- **The non-finite guard.** A non-finite value, gradient or next point is a failure. Unless
  ``solver.handles_nonfinite``, the start is rolled back to its last finite point, its solver
  state restarted there and its step scale halved for good; ``max_nonfinite`` failures
  without an improvement in between end it as ``nonfinite``.
- **The best-so-far** over every evaluated point, and the step it was found at.
- **Ending**: ``converged`` when the solver's own optimality test passes; ``stalled`` when the
  window guard (:class:`multistart.Convergence`, relative in the figure of merit) sees the
  best-so-far stop improving.
- **A per-start step cap** (``max_start_steps``, TikTak's ``local_steps``): a start that
  took that many steps ends as ``max_steps`` on the device, so its slot can be reused.

Everything here is a pure function of its arguments (the model's data included), so the same
model gives the same program in another process and over a device mesh.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..common import xla
from ..common.status import Status
from ..solvers import LeastSquaresRule, Minimiser, Solver, small
from ..solvers.convergence import Convergence, window_converged

__all__ = [
    "StartState",
    "PopState",
    "make_start_step",
    "make_chunk_step",
    "clock",
    "init_population",
    "init_rows",
    "host_population",
    "device_population",
    "made_on_device_bytes",
    "DEVICE_POPULATION_BYTES",
]

_RUNNING, _CONVERGED, _NONFINITE = Status.RUNNING.code, Status.CONVERGED.code, Status.NONFINITE.code
_MAX_STEPS, _STALLED = Status.MAX_STEPS.code, Status.STALLED.code
_HELD = -1  # no status's code: a row a call does not step, for the call's length
_TAKE = -2  # no status's code: a row a call starts anew, until it is started


class StartState(NamedTuple):
    """State of one start (in the population, every leaf has a leading axis of rows: the
    fit's starts, or a part's, padded for a mesh of devices)."""

    u: Any  # unconstrained parameters
    opt_state: Any  # this start's own solver state
    fom: jax.Array  # figure of merit at the last evaluated point
    best_fom: jax.Array  # best finite figure of merit so far (inf if none)
    best_u: Any  # unconstrained parameters at best_fom
    best_step: jax.Array  # step at which best_fom was evaluated (-1 if none)
    good_u: Any  # the last point whose evaluation was finite: where a failed step rolls back to
    scale: jax.Array  # the solver's step multiplier; halved at each rolled-back step
    n_bad: jax.Array  # non-finite evaluations since the best figure of merit last improved
    n_steps: jax.Array  # engine steps taken (one value_and_grad each)
    n_evals: jax.Array  # evaluations of the objective (steps plus a rule's own, e.g. a line search)
    status: jax.Array  # Status code
    ring: jax.Array  # (window,) best_fom at the last `window` steps, for convergence


class PopState(NamedTuple):
    """The whole search's device state: every start plus the best-so-far history."""

    starts: StartState
    history: jax.Array  # (n_steps, rows) best-so-far per step; nan where not stepped


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


def make_start_step(
    fom_u: Callable[[Any, Any], jax.Array],
    solver: Solver,
    convergence: Convergence | None,
    max_nonfinite: int,
    max_start_steps: int | None = None,
    residual_u: Callable[[Any, Any], Any] | None = None,
    bounded: Any = None,
) -> Callable[[StartState, Any], StartState]:
    """Build ``start_step(state, data) -> state`` for one start: the solver behind the guard.

    ``fom_u(u, data)`` is the figure of merit at unconstrained ``u``. Each step evaluates it
    and its gradient once at the start's current point and asks ``solver`` for the next point.
    A :class:`~multistart.solvers.LeastSquaresRule` instead gets the residuals
    ``residual_u(u, data)`` and their Jacobian there (``solver.linearize``: one evaluation,
    counted in ``n_evals`` at what it costs), the figure of merit being their sum of squares.
    Around the solver, the same for every rule: the guard, the best-so-far, convergence and
    the per-start step cap (the module doc). ``bounded`` (a bool per raveled coordinate of
    ``u``: a bounded prior's logistic one) goes to a rule that ``projects_to_bounds``.

    A start that is not running is returned unchanged, so results do not depend on when the
    host drops it.
    """

    if isinstance(solver, LeastSquaresRule) and residual_u is None:
        raise TypeError(
            f"the rule {solver.name!r} is a least-squares rule: it needs residuals, not a scalar "
            "objective; fit with multistart.MultiStartLeastSquares(method=...)"
        )

    def start_step(s: StartState, data) -> StartState:
        def f(u):
            return fom_u(u, data)

        fom, finite, cost, (u_next, opt_next, extra_evals) = _evaluate_and_step(
            solver, s, f, residual_u, data, bounded
        )
        moved = _tree_all_finite(u_next)
        g = _guard(s, fom, finite, moved, solver.handles_nonfinite, max_nonfinite)
        ok, improved, best_fom = g.ok, g.improved, g.best_fom
        status, ring = _ending(s, g, solver, opt_next, convergence, max_start_steps)

        new = StartState(
            u=_tree_select(ok, u_next, s.good_u),
            opt_state=_tree_select(ok, opt_next, solver.restart(s.good_u, s.opt_state)),
            fom=fom.astype(s.fom.dtype),
            best_fom=best_fom.astype(s.best_fom.dtype),
            best_u=_tree_select(improved, s.u, s.best_u),
            best_step=jnp.where(improved, s.n_steps, s.best_step),
            good_u=_tree_select(finite & moved, s.u, s.good_u),
            scale=jnp.where(ok, s.scale, s.scale / 2),
            n_bad=g.n_bad,
            n_steps=s.n_steps + 1,
            n_evals=s.n_evals + cost + jnp.asarray(extra_evals, s.n_evals.dtype),
            status=status.astype(s.status.dtype),
            ring=ring,
        )
        return _tree_select(s.status == _RUNNING, new, s)

    return start_step


class _Guarded(NamedTuple):
    """The guard's reading of one step (see :func:`make_start_step`)."""

    ok: jax.Array  # keep the solver's next point
    improved: jax.Array  # the point just evaluated is the best so far
    best_fom: jax.Array
    n_bad: jax.Array  # failures since the last improvement
    dead: jax.Array  # too many failures: the start ends as nonfinite


def _guard(s: StartState, fom, finite, moved, handles_nonfinite: bool, max_nonfinite: int):
    """The non-finite guard and the best-so-far for one step. One check covers the new point
    too (``moved``): a rule such as Lion can turn an inf gradient into a finite step and carry
    the inf in its state."""
    ok = moved & (finite | handles_nonfinite)
    failed = ~(finite & moved)  # counts towards max_nonfinite
    improved = jnp.isfinite(fom) & (fom < s.best_fom)
    best_fom = jnp.where(improved, fom, s.best_fom)
    # Failures count until the start improves again, so a start bouncing off a nan wall
    # without getting better ends after max_nonfinite tries at ever smaller steps.
    n_bad = jnp.where(improved, 0, s.n_bad + failed.astype(s.n_bad.dtype))
    dead = failed & ((n_bad >= max_nonfinite) | ~jnp.isfinite(best_fom))
    return _Guarded(ok, improved, best_fom, n_bad, dead)


def _ending(s: StartState, g: _Guarded, solver, opt_next, convergence, max_start_steps):
    """``(status, ring)`` after one step: nonfinite, converged (the solver's own test,
    ``solver.converged(opt_next)``), stalled (the solver gave up, ``solver.stalled``, or the
    window guard on the best-so-far), out of steps, or still running."""
    dead, best_fom = g.dead, g.best_fom
    status = jnp.where(dead, _NONFINITE, s.status)
    conv = solver.converged(opt_next) & g.ok
    stall = solver.stalled(opt_next) & g.ok
    ring = s.ring
    if convergence is not None:
        slot = s.n_steps % ring.shape[0]
        stall = stall | window_converged(
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
    status = jnp.where(~dead & stall, _STALLED, status)
    status = jnp.where(~dead & conv, _CONVERGED, status)
    if max_start_steps is not None:
        out_of_steps = (status == _RUNNING) & (s.n_steps + 1 >= max_start_steps)
        status = jnp.where(out_of_steps, _MAX_STEPS, status)
    return status, ring


def _evaluate_and_step(solver: Solver, s: StartState, f, residual_u, data, bounded=None):
    """``(fom, finite, cost, SolverStep)``: the step's one evaluation (``cost`` evaluations, a
    Python int) and the rule's step from it. A least-squares rule's ``‖r‖²`` and ``2 Jᵀr`` feed
    the guard and the best-so-far as a value and gradient would."""
    extra = {"bounded": bounded} if solver.projects_to_bounds and bounded is not None else {}
    if isinstance(solver, LeastSquaresRule):
        r, jac, cost = solver.linearize(lambda v: residual_u(v, data), s.u)
        _, unravel = ravel_pytree(s.u)
        fom, grad = jnp.vdot(r, r), unravel(2.0 * small.transpose_times(jac, r))
        finite = _tree_all_finite((fom, grad))
        out = solver.step(r, jac, s.u, s.opt_state, value=fom, scale=s.scale, value_fn=f, **extra)
        return fom, finite, cost, out
    fom, grad = jax.value_and_grad(f)(s.u)
    finite = _tree_all_finite((fom, grad))
    out = cast(Minimiser, solver).step(
        fom, grad, s.u, s.opt_state, scale=s.scale, value_fn=f, **extra
    )
    return fom, finite, 1, out


def make_chunk_step(
    start_step: Callable[[StartState, Any], StartState],
    init_rows: Callable[[Any], StartState],
    rows_per_datum: int | None = None,
    history_stride: int = 1,
):
    """Build ``chunk_step(pop, gather, scatter, new, clock, data) -> pop``: up to ``n`` steps
    of one chunk's starts in one call.

    ``gather`` and ``scatter`` are ``batch_size`` row indices from
    :func:`multistart.device.chunking.chunk_indices`; the padding's scatter index is out of
    bounds and its writes are dropped. ``new = (take, u)``: rows where ``take`` is non-zero
    start anew from ``u`` (a refill, in a call of 0 steps); a running row that took no step is
    set to ``init_rows(u)``. ``clock`` is ``[t, n]`` (int32): the steps taken before the
    call (the global step count), how many to take now, and whether to stop after the first
    step at which one of its running starts ends (1; the host then acts on it, as a refill
    does). The chunk is gathered once, stepped in a ``lax.while_loop`` that stops early once
    none of its starts is running (an ended start is frozen: the steps it skips would not
    change it), and scattered once; step ``t + j`` writes row ``(t + j) // history_stride``
    of ``history``. The loop's body is the one step whatever ``n``, so a start's arithmetic
    does not depend on how many steps a call takes (the suite checks it bit for bit). A chunk
    as wide as the population (a fit in one chunk) is not gathered: its named rows are stepped
    where they lie and the rest held, bit for bit as a gathered chunk would step them. On a
    chip (:func:`windowed`) so is a chunk whose rows lie within its width of each other, in
    that window of the population (the program chooses, per call, the window or the gather).

    ``rows_per_datum``: ``data`` is a stack of datasets (every leaf with a leading axis of
    them), and rows ``i * rows_per_datum`` to ``(i + 1) * rows_per_datum - 1`` fit dataset
    ``i`` (``curve_fit(..., batched=True)``: each fit's starts). ``None``: every row fits the
    one ``data``.
    """
    per_row = rows_per_datum is not None
    vstep = jax.vmap(start_step, in_axes=(0, 0 if per_row else None))

    def multistart_chunk_step(pop: PopState, gather, scatter, new, clock, data) -> PopState:
        chunk, where = _take(pop.starts, gather, scatter, new, init_rows)
        if rows_per_datum is not None:
            data = _chunk_data(data, where, gather, rows_per_datum)
        t, n, until_end = clock[0], clock[1], clock[2] != 0
        n_running = jnp.sum(chunk.status == _RUNNING)

        def running(carry):
            j, chunk, _ = carry
            left = jnp.sum(chunk.status == _RUNNING)
            return (j < n) & (left > 0) & ~(until_end & (left < n_running))

        def one_step(carry):
            j, chunk, history = carry
            # Materialise the chunk's new state once: without the barrier XLA may fuse (and
            # so recompute, possibly rounding differently) the same value into two uses.
            out = jax.lax.optimization_barrier(vstep(chunk, data))
            row = (t + j) // history_stride
            return j + 1, out, _history_row(history, row, where, out.best_fom)

        first = (jnp.zeros((), jnp.int32), chunk, pop.history)
        _, chunk, history = jax.lax.while_loop(running, one_step, first)
        return PopState(_put_back(pop.starts, chunk, where, scatter), history)

    return multistart_chunk_step


def windowed() -> bool:
    """Whether a chunk whose rows lie within its width of each other is stepped in that window
    of the population (sliced and written back whole), not gathered and scattered: on a chip
    (the platform of the default device when the program is traced). A TPU's gather and
    scatter of rows of the population's ``[rows, k]`` leaves relaid out and rewrote every row
    of the population at every call (about 13 ms a call of 200,000 small fits, a third of the
    chip's time); a window's slice touches only its own rows. On a CPU a gather costs no more,
    and the choice between the two forms in the program would add to its compile."""
    return xla.on_chip()


def _branch(fits, window: Callable[[], Any], gathered: Callable[[], Any]):
    """``window()`` or ``gathered()``: the one the trace knows (``fits`` a bool), else both in
    the program and the one ``fits`` says when it runs."""
    if fits is True:
        return window()
    if fits is False:
        return gathered()
    return jax.lax.cond(fits, lambda _: window(), lambda _: gathered(), None)


class _Where(NamedTuple):
    """Where a chunk call's rows are: ``fits`` (a bool the trace knows, or a traced one) in the
    window of the population from ``lo``, else gathered; ``columns`` each row's column of
    ``history`` (one past the end: none); ``held`` a window's statuses set aside."""

    fits: Any
    lo: Any
    columns: jax.Array
    held: jax.Array


def _take(starts: StartState, gather, scatter, new, init_rows) -> tuple[StartState, _Where]:
    """The chunk's starts (new ones written, fresh ones started) and where they lie: in a
    window of the population where it is the population, or on a chip (:func:`windowed`)
    where its rows fit one; else gathered."""
    n_rows, width = starts.status.shape[0], gather.shape[0]
    if width == n_rows:  # the chunk is the population: a window of all of it
        fits, lo = True, 0
    elif windowed():
        fits, lo = _window(scatter, n_rows, width)
    else:
        fits, lo = False, 0
    chunk, columns, held = _branch(
        fits,
        lambda: _in_window(starts, lo, width, scatter, new),
        lambda: _gathered(starts, gather, scatter, new, mark=fits is not False),
    )
    chunk = _started(chunk, new if fits is False else _taken_new(chunk), init_rows)
    return chunk, _Where(fits, lo, columns, held)


def _chunk_data(data, where: _Where, gather, rows_per_datum: int):
    """Each of the chunk's rows' dataset, of a stack of datasets one per ``rows_per_datum``
    rows: sliced for a window, gathered otherwise."""
    return _branch(
        where.fits,
        lambda: _window_data(data, where.lo, gather.shape[0], rows_per_datum),
        lambda: jax.tree_util.tree_map(lambda d: d[gather // rows_per_datum], data),
    )


def _history_row(history, row, where: _Where, best_fom):
    """``history`` with row ``row`` of the chunk's columns set to ``best_fom`` (a row or column
    out of range dropped)."""
    return _branch(
        where.fits,
        lambda: _history_window(history, row, where.lo, where.columns, best_fom),
        lambda: history.at[row, where.columns].set(best_fom, mode="drop"),
    )


def _put_back(starts: StartState, chunk: StartState, where: _Where, scatter) -> StartState:
    """The population's starts after the chunk's call: its window written back, or the
    gathered chunk scattered back."""
    return _branch(
        where.fits,
        lambda: _put_window(starts, chunk, where.lo, where.columns, where.held),
        lambda: jax.tree_util.tree_map(
            lambda a, b: a.at[scatter].set(b, mode="drop"), starts, chunk
        ),
    )


def _window(scatter, n_rows: int, width: int):
    """``(fits, lo)``: whether the chunk's rows (``scatter``'s, its padding ``n_rows``) lie in
    the ``width`` rows from ``lo``, the first of them (or ``n_rows - width``, where fewer rows
    are left after it)."""
    named = scatter < n_rows
    lo = jnp.minimum(jnp.min(scatter), n_rows - width)
    hi = jnp.max(jnp.where(named, scatter, -1))
    return hi < lo + width, lo


def _marked(chunk: StartState, take, u_new) -> StartState:
    """``chunk`` with the rows ``take`` names given ``u_new``'s start and marked
    :data:`_TAKE` (the ``new`` argument carried in the chunk, out of a branch of the program:
    :func:`_taken_new` reads it)."""
    return chunk._replace(
        u=_rows_select(take, u_new, chunk.u),
        status=jnp.where(take, jnp.int8(_TAKE), chunk.status),
    )


def _taken_new(chunk: StartState):
    """The ``new`` argument :func:`_marked` left in ``chunk``."""
    return (chunk.status == _TAKE).astype(jnp.int8), chunk.u


def _gathered(starts: StartState, gather, scatter, new, mark: bool):
    """``(chunk, columns, held)`` of a gathered chunk (``held``: its statuses, unused);
    ``mark``: ``new`` carried in it (:func:`_marked`)."""
    chunk = jax.tree_util.tree_map(lambda a: a[gather], starts)
    if mark:
        take, u_new = new
        chunk = _marked(chunk, take != 0, u_new)
    return chunk, scatter, chunk.status


def _in_window(starts: StartState, lo, width: int, scatter, new):
    """``(chunk, columns, held)`` for the chunk stepped in the ``width`` rows of the
    population from ``lo`` (all of them, a chunk as wide as the population: no row is gathered
    or scattered, which is also about an eighth of the program's compile). The rows
    ``scatter`` names are stepped where they lie; every other row of the window is held, its
    status set aside (``held``) and replaced by one that does not run, so the step leaves it as
    it is. ``new``'s rows, in ``scatter``'s order, are written to their rows, the rows it takes
    marked (:func:`_marked`). ``columns`` is each row's column of
    ``history``: its own if named, else one past the end (dropped)."""
    n_rows = starts.status.shape[0]
    window = starts
    if width < n_rows:
        window = jax.tree_util.tree_map(
            lambda a: jax.lax.dynamic_slice_in_dim(a, lo, width, 0), starts
        )
    at = scatter - lo  # the padding's (n_rows) is past the window's end: dropped
    named = jnp.zeros(width, bool).at[at].set(True, mode="drop")
    columns = jnp.where(named, lo + jnp.arange(width, dtype=scatter.dtype), n_rows)
    take, u_new = new
    take = jnp.zeros(width, bool).at[at].set(take != 0, mode="drop")
    u_new = jax.tree_util.tree_map(lambda a, b: a.at[at].set(b, mode="drop"), window.u, u_new)
    held = window.status
    chunk = window._replace(status=jnp.where(named, held, jnp.int8(_HELD)))
    return _marked(chunk, take, u_new), columns, held


def _window_data(data, lo, width: int, rows_per_datum: int):
    """Each row's dataset for the ``width`` rows from ``lo`` (a stack of datasets, one per
    ``rows_per_datum`` rows): the datasets they span, sliced, then each row's among them."""

    def rows_of(d):
        n_data = d.shape[0]
        span = min(n_data, (width - 1) // rows_per_datum + 2)
        first = jnp.minimum(lo // rows_per_datum, n_data - span)
        local = (lo + jnp.arange(width)) // rows_per_datum - first
        return jax.lax.dynamic_slice_in_dim(d, first, span, 0)[local]

    return jax.tree_util.tree_map(rows_of, data)


def _history_window(history, row, lo, columns, best_fom):
    """``history`` with row ``row`` of the window's columns from ``lo`` set to ``best_fom``
    where named (``columns`` not past the end), a row out of range dropped: the window's own
    segment of the row read and written, not a scatter (a scatter of the population's width a
    step is a tenth of a small fit's step on a TPU)."""
    n_rows, width, last = history.shape[1], best_fom.shape[0], history.shape[0] - 1
    at = jnp.minimum(row, last)
    keep = (columns < n_rows) & (row <= last)
    if width == n_rows:
        line = jax.lax.dynamic_index_in_dim(history, at, 0, False)
        return jax.lax.dynamic_update_index_in_dim(history, jnp.where(keep, best_fom, line), at, 0)
    line = jax.lax.dynamic_slice(history, (at, lo), (1, width))[0]
    return jax.lax.dynamic_update_slice(history, jnp.where(keep, best_fom, line)[None], (at, lo))


def _put_window(starts: StartState, chunk: StartState, lo, columns, held) -> StartState:
    """The population's starts after a window's call: its held rows given their own status
    back, the window written where it was sliced from."""
    n_rows, width = starts.status.shape[0], chunk.status.shape[0]
    chunk = chunk._replace(status=jnp.where(columns < n_rows, chunk.status, held))
    if width == n_rows:
        return chunk
    return jax.tree_util.tree_map(
        lambda a, b: jax.lax.dynamic_update_slice_in_dim(a, b, lo, 0), starts, chunk
    )


def _rows_select(pred, on_true, on_false):
    """Per row (leading axis) ``on_true`` where ``pred``, else ``on_false``."""

    def pick(a, b):
        return jnp.where(pred.reshape(pred.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree_util.tree_map(pick, on_true, on_false)


def _started(chunk: StartState, new, init_rows) -> StartState:
    """``chunk`` with the new starts of ``new = (take, u)`` written, and every running row that
    has taken no step in its start's initial state (bit for bit the state a start is made
    with: the solver's ``init`` of its ``u``, which reads nothing else)."""
    take, u_new = new
    take = take != 0
    chunk = chunk._replace(
        u=_rows_select(take, u_new, chunk.u),
        status=jnp.where(take, jnp.int8(_RUNNING), chunk.status),
        n_steps=jnp.where(take, 0, chunk.n_steps),
    )
    fresh = (chunk.status == _RUNNING) & (chunk.n_steps == 0)

    def start(c: StartState) -> StartState:
        return cast(StartState, _rows_select(fresh, init_rows(c.u), c))

    # most calls start nothing: they skip the initial states and the selects
    return jax.lax.cond(jnp.any(fresh), start, lambda c: c, chunk)


def clock(step: int, n: int = 1, until_end: bool = False) -> np.ndarray:
    """The chunk step's ``clock`` argument: ``n`` steps after ``step`` taken, or fewer, to the
    first step at which a running start ends, if ``until_end``."""
    return np.array([step, n, until_end], np.int32)


def init_rows(solver: Solver, window: int, u) -> StartState:
    """Stacked starts' initial states (traceable): the chunk step's ``init_rows``."""
    return init_population(solver, u, 1, window).starts


def host_population(opt_state, u0, n_steps: int, window: int, status) -> PopState:
    """The initial population made on the host (NumPy; no program, no trace): each row's start
    ``u0`` and ``status``, its solver state zeros of one start's ``opt_state`` shapes (a tree
    of ``jax.ShapeDtypeStruct``, :meth:`multistart.device.layout.Layout.one_start_state`'s)
    until its first chunk call sets it (:func:`make_chunk_step`; a row that is not running
    never steps, and its solver state is never read)."""
    u0 = jax.tree_util.tree_map(np.asarray, u0)
    leaves = jax.tree_util.tree_leaves(u0)
    n, dtype = leaves[0].shape[0], leaves[0].dtype
    fields: dict[str, Any] = dict(  # NumPy leaves
        u=u0,
        opt_state=jax.tree_util.tree_map(lambda a: np.zeros((n, *a.shape), a.dtype), opt_state),
        fom=np.full(n, np.nan, dtype),
        best_fom=np.full(n, np.inf, dtype),
        best_u=jax.tree_util.tree_map(np.copy, u0),  # each leaf its own buffer (donated)
        best_step=np.full(n, -1, np.int32),
        good_u=jax.tree_util.tree_map(np.copy, u0),
        scale=np.ones(n, dtype),
        n_bad=np.zeros(n, np.int32),
        n_steps=np.zeros(n, np.int32),
        n_evals=np.zeros(n, np.int32),
        status=np.asarray(status).astype(np.int8),
        ring=np.full((n, window), np.inf, dtype),
    )
    history: Any = np.full((n_steps, n), np.nan, dtype)
    return PopState(StartState(**fields), history)


#: A chip's initial population is made there (:func:`device_population`) where what that makes
#: takes at least this many bytes: below it the host's zeros cross the link in under a
#: millisecond (48 MB took 14 ms on a TPU v5e, ``profiling/experiments/transfers.py``), and a
#: first fit would compile the population's program for nothing (the README's fits' are a few
#: kB; 20,000 small fits' 3.8 MB, 200,000's 38 MB are made there).
DEVICE_POPULATION_BYTES = 1 << 21


def made_on_device_bytes(opt_state, n: int, n_steps: int, window: int, dtype) -> int:
    """The bytes :func:`device_population` makes on the device for ``n`` starts: everything
    but the starts and their statuses."""
    itemsize = np.dtype(dtype).itemsize
    state = sum(
        int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
        for a in jax.tree_util.tree_leaves(opt_state)
    )
    per_start = state + (3 + window + n_steps) * itemsize + 4 * 4  # fom.., ring, history; ints
    return n * per_start


def device_population(opt_state, u0, n_steps: int, window: int, status) -> PopState:
    """:func:`host_population`'s population on the default device: the starts and statuses
    sent, every other field made there by one program (its shapes' own, compiled once). The
    solver state's zeros and the rest are most of the population (38 of 48 MB for 200,000 fits
    of 4 parameters by least squares), which the host would otherwise send to a chip at every
    call (issue 70)."""
    u0 = jax.tree_util.tree_map(np.asarray, u0)
    leaves = jax.tree_util.tree_leaves(u0)
    n, dtype = leaves[0].shape[0], np.dtype(leaves[0].dtype)
    states, treedef = jax.tree_util.tree_flatten(opt_state)
    shapes = tuple((tuple(a.shape), np.dtype(a.dtype).str) for a in states)
    made = _made_on_device(n, dtype.str, shapes, n_steps, window)
    # each of u, best_u and good_u its own buffer (the population is donated)
    u, best_u, good_u, status = jax.device_put(
        (u0, *(jax.tree_util.tree_map(np.copy, u0) for _ in range(2)), np.asarray(status, np.int8))
    )
    fields = {k: v for k, v in made.items() if k not in ("opt_state", "history")}
    opt = jax.tree_util.tree_unflatten(treedef, made["opt_state"])
    starts = StartState(u=u, opt_state=opt, best_u=best_u, good_u=good_u, status=status, **fields)
    return PopState(starts, made["history"])


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _made_on_device(n: int, dtype: str, shapes: tuple, n_steps: int, window: int) -> dict:
    """:func:`host_population`'s fields that are a function of the shapes alone."""
    return dict(
        opt_state=[jnp.zeros((n, *shape), np.dtype(kind)) for shape, kind in shapes],
        fom=jnp.full(n, jnp.nan, dtype),
        best_fom=jnp.full(n, jnp.inf, dtype),
        best_step=jnp.full(n, -1, jnp.int32),
        scale=jnp.ones(n, dtype),
        n_bad=jnp.zeros(n, jnp.int32),
        n_steps=jnp.zeros(n, jnp.int32),
        n_evals=jnp.zeros(n, jnp.int32),
        ring=jnp.full((n, window), jnp.inf, dtype),
        history=jnp.full((n_steps, n), jnp.nan, dtype),
    )


def init_population(solver: Solver, u0, n_steps: int, window: int, status=None) -> PopState:
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
        opt_state=jax.vmap(solver.init)(u0),
        fom=jnp.full((n,), jnp.nan, dtype),
        best_fom=inf,
        best_u=u0,
        best_step=jnp.full((n,), -1, jnp.int32),
        good_u=u0,
        scale=jnp.ones((n,), dtype),
        n_bad=jnp.zeros((n,), jnp.int32),
        n_steps=jnp.zeros((n,), jnp.int32),
        n_evals=jnp.zeros((n,), jnp.int32),
        status=(
            jnp.full((n,), _RUNNING, jnp.int8)
            if status is None
            else jnp.asarray(status).astype(jnp.int8)
        ),
        ring=jnp.full((n, window), jnp.inf, dtype),
    )
    return PopState(starts, jnp.full((n_steps, n), jnp.nan, dtype))
