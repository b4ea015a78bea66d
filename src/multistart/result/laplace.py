"""Parameter uncertainties from the curvature of the figure of merit (the Laplace approximation).

Near a minimum ``x*`` of a figure of merit ``F = -2 log L`` (a chi-squared, or this project's
graph figure of merit ``-2 (log L + log prior)``), ``L`` is approximately Gaussian with
covariance ``C = 2 H^-1``, ``H`` the Hessian of ``F`` at ``x*`` in physical coordinates. The
Hessian is computed by JAX (forward-over-reverse, exact to rounding), never by differences.
For a least-squares problem the covariance is ``scipy.optimize.curve_fit``'s instead
(:func:`residual_laplace`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..common import xla
from ..model.problem import Problem, as_problem, check_objective
from ..solvers import small
from ..solvers.base import linearize
from .arrow import ArrowBlocks, ArrowCurvature, ArrowInverse, invert

__all__ = [
    "KINDS",
    "ArrowLaplace",
    "Laplace",
    "laplace",
    "residual_laplace",
    "Curvature",
    "residual_curvature",
    "settle_inverses",
    "REFINE_BLOCK",
    "REFINE_MAX_STEPS",
    "REFINE_STEPS",
    "refine_in_blocks",
    "residual_refinement",
    "gram_inverse",
    "residual_scale",
    "laplace_problem",
    "flat_names",
    "leaf_paths",
    "errors_by_name",
    "hessian_function",
    "unflatten_like",
]

#: Covariance = ``SCALE * H^-1`` for a figure of merit of the form ``-2 log L`` (chi-squared).
CHI2_SCALE = 2.0

#: What ``Laplace.hessian`` is: the Hessian of the figure of merit (the Laplace approximation),
#: or for a sum of squared residuals its Gauss-Newton ``2 JᵀJ`` (curve_fit's ``(JᵀJ)⁻¹``).
KINDS = ("hessian", "gauss-newton")


@dataclass(frozen=True)
class Laplace:
    """The Laplace approximation at one point.

    Attributes:
      params: the point (a params pytree, physical).
      covariance: ``(n, n)`` covariance of the raveled physical parameters in the order of
        ``names`` (the space's as written, arrays raveled in C order); ``nan`` rows and columns
        for parameters in a singular or negative-curvature direction.
      names: the flat parameter names: ``"sigma"``, or ``"flux[1]"`` for an array element.
      hessian: ``(n, n)`` Hessian of the figure of merit at ``params`` (for ``kind``
        ``"gauss-newton"`` its Gauss-Newton approximation ``2 JᵀJ``).
      scale: covariance = ``scale * hessian^-1`` (2 for a chi-squared figure of merit; for a
        least-squares problem ``2 s²``, ``s²`` 1 with ``absolute_sigma`` else the reduced χ²).
      errors: the 1-sigma errors ``sqrt(diag(covariance))`` as the params pytree.
      kind: one of :data:`KINDS`.
      absolute_sigma: ``True``: the covariance as the figure of merit gives it (a χ² with the
        data's own errors); ``False``: scaled by the reduced χ² (curve_fit's default).
      dof: the degrees of freedom ``m - n``, where the number of data ``m`` is known.
      reduced_chi2: the figure of merit over ``dof`` at ``params``, where ``dof`` is known.
      residuals: for a least-squares problem, its residuals at ``params`` as one vector
        (curve_fit's ``fvec``); ``None`` otherwise, and in a loaded Result.
    """

    params: Any
    covariance: np.ndarray
    names: tuple[str, ...]
    hessian: np.ndarray
    scale: float
    errors: Any
    kind: str = "hessian"
    absolute_sigma: bool = True
    dof: int | None = None
    reduced_chi2: float | None = None
    residuals: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def convention(self) -> str:
        """Which covariance this is, in words (what a report and the docs name)."""
        what = "2 H⁻¹ of the figure of merit" if self.kind == "hessian" else "(JᵀJ)⁻¹"
        if self.absolute_sigma:
            how = "as it is (absolute_sigma=True: the data's own errors)"
        else:
            chi2 = "nan" if self.reduced_chi2 is None else f"{self.reduced_chi2:.6g}"
            how = f"scaled by the reduced χ² {chi2} (absolute_sigma=False)"
        return f"{what}, {how}"

    @property
    def std(self) -> np.ndarray:
        """1-sigma errors as one vector in the order of ``names``."""
        return np.sqrt(np.diag(self.covariance))

    @property
    def correlation(self) -> np.ndarray:
        """``(n, n)`` correlation matrix (``nan`` where an error is ``nan``)."""
        s = self.std
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.covariance / np.outer(s, s)

    def __repr__(self) -> str:
        shapes = [np.shape(v) for v in jax.tree_util.tree_leaves(self.params)]
        names = flat_names(leaf_paths(self.params), shapes)
        value = dict(zip(names, flat_values(self.params), strict=True))
        rows = [
            f"  {n} = {_num(value[n])} +/- {_num(e)}"
            for n, e in zip(self.names, self.std, strict=True)
        ]
        head = "Laplace(" if self.kind == "hessian" else f"Laplace(kind={self.kind!r},"
        return head + "\n" + "\n".join(rows) + "\n)"


def laplace(objective, space=None, params=None, *, scale: float = CHI2_SCALE) -> Laplace:
    """The covariance of the parameters at ``params`` from the Hessian of the figure of merit.

    ``covariance = scale * H^-1``, ``H`` the Hessian of the figure of merit in physical
    coordinates at ``params``. The default ``scale=2`` is right for a figure of merit that is
    ``-2 log L`` up to a constant (a chi-squared with the data's standard deviations, or a
    :class:`multistart.FactorGraphModel`, whose prior's curvature is then included). Otherwise
    scale it: ``scale=1`` for ``-log L``; ``2 * S / (m - n)`` for an unweighted sum of squares
    ``S`` of ``m`` points and ``n`` parameters.

    Computed in the current default float type (one compile). Directions where the Hessian is
    singular or not positive definite give ``nan`` errors for their parameters, with a
    ``RuntimeWarning`` naming them; the others keep their errors.

    Args:
      objective: the figure of merit ``objective(params) -> scalar`` (then ``space`` is its
        space), or a :class:`multistart.FactorGraphModel` (then omit ``space``:
        ``laplace(graph, params)``), or a least-squares problem
        (``MultiStartLeastSquares(...).problem(residuals, space)``, then omit ``space``),
        whose covariance is curve_fit's (:func:`residual_laplace`; ``scale`` does not apply).
      space: a (nested) dict of priors: it fixes the parameters' order and shapes.
      params: the point, a params pytree (usually ``result.best_params``).
      scale: the covariance is ``scale * H^-1``.

    Returns:
      A :class:`Laplace` with ``covariance``, ``errors`` (the params pytree), ``correlation``
      and ``names``.

    Raises:
      TypeError / ValueError: bad arguments, or ``params`` not shaped as the space.

    Example:
      >>> import jax.numpy as jnp, multistart as ms
      >>> space = {"a": ms.Uniform(-5.0, 5.0), "b": ms.Uniform(-5.0, 5.0)}
      >>> chi2 = lambda p: ((p["a"] - 1) / 0.5) ** 2 + ((p["b"] + p["a"]) / 2.0) ** 2
      >>> fit = ms.laplace(chi2, space, {"a": 1.0, "b": -1.0})
      >>> [round(float(e), 4) for e in fit.std]
      [0.5, 2.0616]
    """
    if getattr(objective, "multistart_problem", None) is not None and params is None:
        space, params = None, space  # laplace(graph, params)
    if params is None:
        raise TypeError("laplace needs the point: laplace(objective, space, params)")
    problem = as_problem(objective, space)
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
    check_objective(problem, dtype, "multistart.laplace")
    if _is_residual(problem) and scale != CHI2_SCALE:
        raise ValueError(
            "scale does not apply to a least-squares problem: its covariance is scaled by its "
            "absolute_sigma (1, or the reduced chi-squared)"
        )
    return laplace_problem(problem, params, hessian_function(problem), scale=scale)


def _is_residual(problem) -> bool:
    return getattr(problem, "residuals", None) is not None


def hessian_function(problem: Problem):
    """``jit(hessian)`` of the figure of merit over one start's raveled physical vector.

    Made once per problem, so the errors of many minima cost one compile. For a least-squares
    problem: :func:`_residual_curvature`. For a factor graph whose factors have parameters of
    their own: an :class:`~multistart.result.arrow.ArrowCurvature` (the Hessian's arrow from a
    few Hessian-vector products; :func:`laplace_problem` inverts it by blocks).
    """
    if _is_residual(problem):
        if _jacobian_too_big(problem):
            return ArrowCurvature(problem, gauss_newton=True)
        return _residual_curvature(problem)
    if _has_arrow(problem):
        return ArrowCurvature(problem)
    space, fom = problem.space, problem.fom  # not the problem: kept, it would keep its data

    def fom_flat(vec, data):
        return fom(space.unravel(vec), data)

    def curvature(vec, data):
        return jax.hessian(fom_flat)(vec, data), fom_flat(vec, data)

    return xla.jit(curvature)


def laplace_problem(
    problem: Problem, params, hess_fn, *, scale: float = CHI2_SCALE, warn: bool = True
) -> Laplace:
    """:func:`laplace` for a :class:`Problem` with a prepared :func:`hessian_function`;
    ``warn=False``: no ``RuntimeWarning`` for singular directions or no degree of freedom (a
    caller that says it its own way, as ``curve_fit``'s ``OptimizeWarning``)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a number > 0; got {scale!r}")
    if _is_residual(problem):
        return residual_laplace(problem, params, hess_fn, warn=warn)
    if isinstance(hess_fn, ArrowCurvature):
        return _arrow_laplace(problem, params, hess_fn, float(scale), warn)
    space = problem.space
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
    vec = _ravel_point(space, params)
    names = tuple(flat_names(space.paths, [p.shape for p in space.priors]))
    hess, value = hess_fn(jnp.asarray(vec, dtype), problem.data)
    hess = np.asarray(hess, dtype=np.float64)
    m = getattr(problem, "n_data", None)
    s2 = _reduced_chi2(problem, float(value), m, vec.size, warn)
    sigma = dict(absolute_sigma=problem.absolute_sigma, dof=None if m is None else m - vec.size)
    sigma["reduced_chi2"] = None if m is None or m <= vec.size else float(value) / (m - vec.size)
    factor = float(scale) * (1.0 if problem.absolute_sigma else s2)
    hess = 0.5 * (hess + hess.T)  # symmetric to rounding; exactly so for the eigensolver
    inverse, bad = _safe_inverse(hess, np.finfo(dtype).eps)
    point = (problem, space, params, vec, names)
    return _laplace(point, hess, inverse, bad, factor, "hessian", warn, **sigma)


def _reduced_chi2(problem, value: float, m: int | None, n: int, warn: bool) -> float:
    """``value / (m - n)`` where ``absolute_sigma=False`` asks for it; ``inf`` with a
    ``RuntimeWarning`` where no degree of freedom is left (as curve_fit)."""
    if problem.absolute_sigma or m is None:
        return 1.0
    if m > n:
        return value / (m - n)
    if warn:
        warnings.warn(
            f"{problem.name!r}: {m} data for {n} parameters leave no degrees of freedom for the "
            "reduced chi-squared: the covariance is inf (pass absolute_sigma=True if the figure "
            "of merit is a chi-squared with the data's own errors)",
            RuntimeWarning,
            stacklevel=4,
        )
    return np.inf


def _laplace(point, hess, inverse, bad, scale: float, kind: str, warn: bool, **more) -> Laplace:
    """The :class:`Laplace` with covariance ``scale * inverse`` (``inverse`` = ``hess⁻¹``,
    ``nan`` in the directions of the ``bad`` parameters), in the space's written order."""
    problem, space, params, vec, names = point
    if bad.any() and warn:
        _warn_bad(problem, names, bad)
    cov = scale * inverse if np.isfinite(scale) else np.full_like(inverse, np.inf)
    point = _on_space(space, vec)
    errors = _on_space(space, np.sqrt(np.diag(cov)), fixed_as=0.0)  # a fixed one has none
    ends = np.cumsum([0] + [p.size for p in space.priors])
    order = np.concatenate([np.arange(ends[i], ends[i + 1]) for i in space.written_order])
    rows = np.ix_(order, order)  # from the engine's (sorted) order to the space's as written
    names = tuple(names[i] for i in order)
    return Laplace(point, cov[rows], names, hess[rows], scale, errors, kind, **more)


class Curvature(NamedTuple):
    """A least-squares problem's curvature at ``k`` points (every field a leading axis of
    them): what its covariance is made of, made by one program (:func:`residual_curvature`).

    For ``kind="hessian"``, ``jac`` is the full Hessian of ``‖r‖²`` and ``inverse``, ``bad``,
    ``sure`` are ``None`` (its inverse is taken on the host, :func:`_safe_inverse`).
    """

    jac: Any  # (k, m, n) J, or (k, n, n) the Hessian of ‖r‖²
    ssr: Any  # (k,) ‖r‖²
    r: Any  # (k, m) the residuals
    norms: Any  # (k, n) J's column norms
    inverse: Any  # (k, n, n) (JᵀJ)⁻¹ (:func:`multistart.solvers.small.gram_inverse`)
    bad: Any  # (k, n) parameters whose column is not finite or zero
    sure: Any  # (k,) well conditioned, no parameter bad (else: settle_inverses, from J)
    at: Any = None  # (k, n) the points, where refined (else those given)


#: Gauss-Newton steps a refinement takes on a chip (:func:`residual_curvature`, in its
#: emulated float64; on a chip without float64 every one but the last with float32 normal
#: equations): from a float32 answer (about 7 digits) a step doubles the digits where the
#: residuals are small, so three reach float64's and one more confirms it. Where they are
#: not small a step gains only a fraction: a tied fit's float32 answer 3.5e-5 away was still
#: 2.9e-6 away after 4 steps, 6e-9 after 20. ``None``: as on a CPU.
REFINE_STEPS: int | None = 4
#: On a CPU (a chip's host refining a single fit or a small batch, in native float64) steps go
#: on until no fit moves, at most this many.
REFINE_MAX_STEPS = 32
#: The farthest a refinement step moves a coordinate, relative to ``max(|x|, 1)``: float32's
#: answer is within about 1e-4 of float64's where the data determine it.
REFINE_REACH = 1e-3
#: A coordinate within this many float32 epsilons (of its box's width, or of ``max(|bound|,
#: 1)`` for a one-sided bound) of a bound is as near as a float32 search gets: a refinement
#: tries it on the bound.
ON_BOUND = 64


def residual_curvature(residuals, *, stacked: bool, kind: str = "gauss-newton"):
    """``jit((points, data, box=None) -> Curvature)`` of ``residuals(vec, data) -> (m,)`` at
    each of ``points`` ``(k, n)``: its Jacobian (:func:`multistart.solvers.base.linearize`,
    the step's own), ``‖r‖²``, ``r`` and ``(JᵀJ)⁻¹`` with the undetermined parameters, every
    fit's on the device in one program. ``stacked``: ``data`` has a leading axis of ``k``
    datasets, one a point (a batch of fits); else every point is of the one ``data``.

    With ``box = (lower, upper)`` (``(n,)`` each) the points are refined first: each takes
    :data:`REFINE_STEPS` Gauss-Newton steps in the program's float type, kept in the box and
    kept only where they lower ``‖r‖²`` (an answer stepped in float32 refined in float64, on a
    chip without float64 arithmetic), and the curvature is taken where they end (``at``).

    The one covariance path: a single fit's Result (:func:`residual_laplace`) and a batch of
    fits (``curve_fit(batched=True)``) both read their ``(JᵀJ)⁻¹`` from here.
    """

    def one(vec, data, box):
        if box is not None:
            low = None
            if not xla.native_float64():  # the steps' Jacobians in float32 (see _refined)
                data32 = jax.tree_util.tree_map(_as_float32, data)
                low = lambda v: residuals(v, data32)  # noqa: E731
            vec = _refined(lambda v: residuals(v, data), vec, box, low)
        r, jac, _ = linearize(lambda v: residuals(v, data), vec)
        ssr = jnp.vdot(r, r)
        norms = jnp.sqrt(jnp.sum(jac * jac, axis=0))
        if kind == "hessian":
            hess = jax.hessian(lambda v: jnp.sum(residuals(v, data) ** 2))(vec)
            return Curvature(hess, ssr, r, norms, None, None, None, vec)
        inverse, bad, sure = small.gram_inverse(jac)
        return Curvature(jac, ssr, r, norms, inverse, bad, sure, vec)

    def multistart_curvature(points, data, box=None):
        axes = (0, 0 if stacked else None, None)
        return jax.vmap(one, in_axes=axes)(points, data, box)

    return xla.jit(multistart_curvature)


def _refined(residuals, vec, box, low=None):
    """``vec`` after Gauss-Newton steps of ``residuals`` in the ``box`` (:data:`REFINE_STEPS`
    on a chip; on a CPU until no fit moves, at most :data:`REFINE_MAX_STEPS`), each taken
    only where it lowers ``‖r‖²`` and moves no coordinate by more than
    :data:`REFINE_REACH` of ``max(|x|, 1)``: a refinement polishes the answer it is given, and
    a longer step is a direction the data do not determine (a peak's centre once its
    amplitude is on 0), not a better answer. A coordinate the step would take out of the box
    is held on its bound and the step solved again for the others (a projected Gauss-Newton
    step): a float32 answer on a bound (as near as float32 gets) moves onto it, and the
    others to their optimum with it there.

    ``low``: the residuals in float32 (the data as float32), given on a chip without float64
    arithmetic: there every step but the last solves its normal equations in float32 (its
    Jacobian, ``JᵀJ`` and ``Jᵀr`` from the float64 residuals rounded), the residuals and sums
    of squares staying in (emulated) float64 and a trial's residuals carried as the next
    step's (mixed-precision iterative refinement: one float64 evaluation a step, where a
    float64 step's Jacobian and products cost several; a chip's emulated float64 runs
    elementwise work over every point far slower than float32). Those steps end where
    ``J₃₂ᵀ r₃₂ = 0``, near float64's ``Jᵀ r = 0`` by float32's rounding of both times the
    residuals; the last step, in float64, takes the answer there."""

    reach = _reach(box)  # (once: the steps' loop only reads it)
    exact = _exact_step(residuals, box, reach)

    if low is None:
        steps = REFINE_STEPS if xla.on_chip() else None
        return _stepped(exact, vec, vec, steps, lambda x: x)

    def mixed(_, carry, first: bool = False):
        x, r = carry
        _, jac, _ = linearize(low, x.astype(jnp.float32))
        # the normal equations solved in float32 too (the correction of iterative refinement
        # in the low precision): a chip emulates every float64 operation of the written-out
        # solves, most of the program's (python -m profiling.experiments.refine_program)
        normal = small.normal_equations(jac, r.astype(jnp.float32))
        return _better(residuals, box, reach, x, r, normal, first)

    # a chip without float64: float32 normal equations, the residuals carried, then one step in
    # float64. (The covariance then linearises where it ends: taking the last step's Jacobian,
    # a step earlier, instead put 20,000 fits' errors up to 3e-6 of themselves off the CPU's,
    # against 7.8e-7: their 99th percentile)
    steps = None if REFINE_STEPS is None else max(REFINE_STEPS - 1, 1)
    return exact(0, _stepped(mixed, vec, (vec, residuals(vec)), steps, lambda c: c[0]))


def _exact_step(residuals, box, reach):
    """A refinement step in the residuals' own float type (:func:`_better` of a Gauss-Newton
    step from ``x``): ``(i, x, first=False) -> x``."""

    def exact(_, x, first: bool = False):
        r, jac, _ = linearize(residuals, x)
        return _better(residuals, box, reach, x, r, small.normal_equations(jac, r), first)[0]

    return exact


def _stepped(step, vec, start, steps: int | None, x_of):
    """``step`` (``(i, carry, first) -> carry``) from ``start`` (``vec``'s carry), ``steps``
    times, or until no fit moves (at most :data:`REFINE_MAX_STEPS`) where ``None``; the point
    (``x_of(carry)``) where they end."""
    first = step(0, start, first=True)
    if steps is not None:
        return x_of(jax.lax.fori_loop(1, steps, step, first))
    moved = jnp.any(x_of(first) != vec)
    return x_of(_until_still(step, 1, first, moved, REFINE_MAX_STEPS, x_of)[1])


def _until_still(step, i, carry, moved, limit, x_of):
    """``(i, carry, moved)`` after ``step`` from ``carry`` (``i`` steps taken, ``moved`` by
    the last) until a step moves nothing or ``limit`` steps are taken: a fit refined on a
    CPU, whose lanes of a batch each stop on their own (JAX's batched ``while_loop`` holds a
    finished lane as it is), so it ends where a fit refined alone would."""

    def more(state):
        i, _, moved = state
        return (i < limit) & moved

    def next_step(state):
        i, x, _ = state
        new = step(i, x)
        return i + 1, new, jnp.any(x_of(new) != x_of(x))

    return jax.lax.while_loop(more, next_step, (i, carry, moved))


#: A batch of more fits than this refined on a CPU (a chip's host refining the chip's float32
#: answers; a CPU's own search answers in float64 and refines nothing) takes its refinement
#: steps in blocks of this many fits (:func:`refine_in_blocks`), each block's fits only as
#: long as one of them still moves: in one program of the whole batch every fit steps until
#: the last one stops (a batch's lanes step together), and a TPU's float32 answers of 20,000
#: peaks kept it stepping to :data:`REFINE_MAX_STEPS` (2.2 s on its host, against 0.35 s for
#: 4 steps).
REFINE_BLOCK = 1024


def residual_refinement(residuals, *, first: bool):
    """``jit((points, data, box, steps, limit) -> (points, steps, moving))``: each of a stack
    of fits (``points`` ``(k, n)``, ``data`` with a leading axis of ``k``) refined as
    :func:`residual_curvature` refines it on a CPU (its float type's exact Gauss-Newton steps
    in ``box``), from ``steps`` ``(k,)`` steps taken, until a step moves it no more or it has
    taken ``limit`` (a scalar); ``moving``: whether its last step moved it (it would take
    another). ``first``: the points are the search's answers, not yet stepped (the first
    step tries the bounds too, :func:`_better`); else each moved on its last step.
    :func:`refine_in_blocks` runs it."""

    def one(vec, data, box, i, limit):
        exact = _exact_step(lambda v: residuals(v, data), box, _reach(box))
        if first:
            start = exact(0, vec, first=True)
            i, moved = jnp.ones_like(i), jnp.any(start != vec)
        else:
            start, moved = vec, jnp.asarray(True)
        i, x, moved = _until_still(exact, i, start, moved, limit, lambda x: x)
        return x, i, moved

    def multistart_refinement(points, data, box, steps, limit):
        return jax.vmap(one, in_axes=(0, 0, None, 0, None))(points, data, box, steps, limit)

    return xla.jit(multistart_refinement)


def refine_in_blocks(first, more, points, data, box) -> np.ndarray:
    """``points`` ``(k, n)`` refined as :func:`residual_curvature` refines a stack of fits on
    a CPU, fit by fit the same steps to the same point, but in blocks of
    :data:`REFINE_BLOCK` fits (the last padded) that leave the batch's still fits behind:
    every fit takes up to :data:`REFINE_STEPS` steps, those still moving up to twice as many,
    and so on to :data:`REFINE_MAX_STEPS`. ``first``, ``more``: :func:`residual_refinement`
    with ``first`` true and false; ``data``: leaves with a leading axis of ``k``, read on the
    host once and sent a block's rows at a time. One program a block's shape, whatever
    ``k``."""
    x = np.array(points, dtype=np.float64)
    data = jax.tree_util.tree_map(np.asarray, data)  # (once: a device array read one time)
    steps = np.zeros(len(x), dtype=np.int32)
    active, limit, program = np.arange(len(x)), REFINE_STEPS or REFINE_MAX_STEPS, first
    while active.size:
        blocks = [active[i : i + REFINE_BLOCK] for i in range(0, active.size, REFINE_BLOCK)]
        outs = [_refine_block(program, x, steps, data, box, rows, limit) for rows in blocks]
        still = []
        for rows, (at, taken, moving) in zip(blocks, outs, strict=True):
            x[rows] = np.asarray(at)[: rows.size]
            steps[rows] = np.asarray(taken)[: rows.size]
            still.append(rows[np.asarray(moving)[: rows.size]])
        if limit >= REFINE_MAX_STEPS:
            break
        active, limit, program = np.concatenate(still), min(2 * limit, REFINE_MAX_STEPS), more
    return x


def _refine_block(program, x, steps, data, box, rows, limit):
    """``program`` (:func:`residual_refinement`) dispatched on the fits ``rows``, padded to
    :data:`REFINE_BLOCK` with the first's copies."""
    padded = np.concatenate([rows, np.full(REFINE_BLOCK - rows.size, rows[0])])
    block = jax.tree_util.tree_map(lambda a: a[padded], data)
    return program(x[padded], block, box, steps[padded], np.int32(limit))


def _reach(box):
    """How near a bound of ``box`` float32 gets: :data:`ON_BOUND` float32 epsilons of the
    box's width, or of ``max(|bound|, 1)`` for a one-sided bound (once a refinement)."""
    lower, upper = box
    span = jnp.where(jnp.isfinite(upper - lower), upper - lower, 1.0)
    bound = jnp.where(jnp.isfinite(lower), jnp.abs(lower), jnp.abs(upper))
    scale = jnp.where(jnp.isfinite(upper - lower), span, jnp.maximum(bound, 1.0))
    return ON_BOUND * float(np.finfo(np.float32).eps) * scale


def _better(residuals, box, reach, x, r, normal, first: bool):
    """A refinement step (:func:`_refined`) from ``x`` (residuals ``r``, the normal equations
    ``(JᵀJ, Jᵀr)``, solved in their own float type: ``x``'s, or float32 in a mixed step): the
    best of its trials and ``x`` itself, with its residuals; ``reach``: :func:`_reach` of
    ``box``."""
    lower, upper = box
    a, g = normal
    eye = jnp.eye(x.shape[0], dtype=a.dtype)
    a = a + jnp.finfo(a.dtype).eps * jnp.maximum(jnp.max(jnp.diagonal(a)), 1.0) * eye
    full = x + small.cho_solve(a, -g).astype(x.dtype)
    held = (full < lower) | (full > upper)
    delta = jnp.where(held, jnp.clip(full, lower, upper) - x, 0.0).astype(a.dtype)
    both = ~held[:, None] & ~held[None, :]
    reduced = jnp.where(both, a, 0.0) + jnp.where(held, 1.0, 0.0) * eye
    rhs = jnp.where(held, delta, -g - small.matvec(a, delta))
    # the projected step, and the answer moved onto the bounds float32 left it next to
    # (alone: with a peak's amplitude on 0 its centre's step is long and means nothing)
    onto = jnp.where((x - lower <= reach) & (g > 0), lower, x)
    onto = jnp.where((upper - x <= reach) & (g < 0), upper, onto)
    best, best_r, best_cost = x, r, jnp.vdot(r, r)
    trials = [jnp.clip(x + small.cho_solve(reduced, rhs).astype(x.dtype), lower, upper)]
    # onto the bounds float32 left it next to: the first step's fallback (after it, an
    # answer on a bound stays there, and one off it was not that near)
    trials += [onto] if first else []
    for trial in trials:
        rt = residuals(trial)
        cost = jnp.vdot(rt, rt)
        near = jnp.abs(trial - x) <= REFINE_REACH * jnp.maximum(jnp.abs(x), 1.0)
        ok = jnp.isfinite(cost) & (cost < best_cost) & jnp.all(near & jnp.isfinite(trial))
        best, best_r = jnp.where(ok, trial, best), jnp.where(ok, rt, best_r)
        best_cost = jnp.where(ok, cost, best_cost)
    return best, best_r


def _as_float32(a):
    """A floating leaf as float32 (the others as they are)."""
    a = jnp.asarray(a)
    return a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a


def settle_inverses(curvature: Curvature) -> tuple[np.ndarray, np.ndarray]:
    """``((JᵀJ)⁻¹, bad)`` of every point of ``curvature``, as NumPy arrays: the device's
    inverses where they are sure (:func:`multistart.solvers.small.gram_inverse`), and for the
    others, ill-conditioned or not determined, :func:`gram_inverse` of their ``J`` (the SVD of
    ``J``, whose precision is ``J``'s: scipy's), only those Jacobians read from the device."""
    inverse = np.array(curvature.inverse, dtype=np.float64)
    bad = np.array(curvature.bad, dtype=bool)
    unsure = np.flatnonzero(~np.asarray(curvature.sure))
    if unsure.size:
        jac = _rows(curvature.jac, unsure)
        inverse[unsure], bad[unsure] = gram_inverse(jac)
    return inverse, bad


#: The rows :func:`_rows` gathers a call (padded, or in calls of this many): one gather program
#: a Jacobian's shape, so a warm batch compiles none whatever its count of rows (on a TPU the
#: count varied from 16 to thousands between batches of 200,000 fits, and each new size class
#: cost a warm call a quarter of its time, issue 70).
ROWS_BLOCK = 1024
#: ...and no block past this many bytes (a fit of a million points has Jacobian rows of tens of
#: MB: its block is as many rows as fit here, at least one).
ROWS_BYTES = 1 << 26


def _rows(a, rows: np.ndarray) -> np.ndarray:
    """``a[rows]`` as float64 NumPy, for a device array read only at those rows: gathered on
    the device in blocks of one size for ``a``'s shape (the last padded; :data:`ROWS_BLOCK`
    rows, no more than ``a`` has or :data:`ROWS_BYTES` holds), one program whatever the
    count."""
    if isinstance(a, np.ndarray):
        return np.asarray(a[rows], dtype=np.float64)
    row_bytes = max(1, int(np.prod(a.shape[1:])) * a.dtype.itemsize)
    size = max(1, min(ROWS_BLOCK, a.shape[0], ROWS_BYTES // row_bytes))
    padded = np.zeros(-(-rows.size // size) * size, dtype=np.int32)
    padded[: rows.size] = rows
    blocks = [_take(a, padded[i : i + size]) for i in range(0, padded.size, size)]
    return np.concatenate([np.asarray(b, dtype=np.float64) for b in blocks])[: rows.size]


@jax.jit
def _take(a, rows):
    return a[rows]


def _warn_bad(problem, names, bad) -> None:
    which = ", ".join(n for n, b in zip(names, bad, strict=True) if b)
    warnings.warn(
        f"the Hessian of {problem.name!r} at these params is singular or not positive "
        f"definite in the directions of {which}: their errors are nan (not a minimum, or "
        "parameters the figure of merit does not constrain)",
        RuntimeWarning,
        stacklevel=4,
    )


# -- a factor graph's errors from the arrow of its Hessian -------------------------------------

#: The largest dense Hessian (bytes) made where the arrow's blocks are not positive definite, to
#: judge its singular directions as every other Hessian's are; past it the blocks are kept.
DENSE_BYTES = 1 << 28


def _jacobian_too_big(problem) -> bool:
    """Is ``problem`` a least-squares graph with the Gauss-Newton covariance whose Jacobian
    ``m x n`` is past :data:`DENSE_BYTES` (its errors then come from the arrow of ``JᵀJ``)?"""
    if getattr(problem, "covariance", None) != "gauss-newton" or not _has_arrow(problem):
        return False
    space, residuals = problem.space, problem.residuals
    example = jax.ShapeDtypeStruct((space.n_dims,), jax.dtypes.canonicalize_dtype(float))
    out = jax.eval_shape(lambda v: residuals(space.unravel(v), problem.data), example)
    m = sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(out))
    return m * space.n_dims * 8 > DENSE_BYTES


def _has_arrow(problem) -> bool:
    arrow = getattr(problem.space, "arrow", None)
    return callable(arrow) and bool(arrow().blocks)


#: Rows of the inverse Hessian a step of :meth:`ArrowLaplace.correlated_pairs` makes (its memory
#: is this many rows of ``n``: 40 MB at 9,005 parameters).
PAIR_ROWS = 512


class ArrowLaplace(Laplace):
    """The Laplace approximation of a factor graph, kept as the blocks of its Hessian's arrow.

    A :class:`Laplace` in every attribute: ``errors``, ``std`` and the blocks below come from
    the blocks (memory linear in the number of factors); ``covariance``, ``hessian`` and
    ``correlation`` are made whole (``n x n``) when first read, and kept.

    Attributes:
      inverse: ``H⁻¹`` by blocks (:class:`multistart.result.arrow.ArrowInverse`).
    """

    inverse: ArrowInverse
    _order: np.ndarray  # the flat order's index of each of ``names``
    _std: np.ndarray

    def __init__(self, point, inverse: ArrowInverse, scale: float, **more):
        problem, space, params, vec, names = point
        ends = np.cumsum([0] + [p.size for p in space.priors])
        order = np.concatenate([np.arange(ends[i], ends[i + 1]) for i in space.written_order])
        self._fill(_on_space(space, vec), tuple(names[i] for i in order), order, inverse, scale)
        for key, value in more.items():
            object.__setattr__(self, key, value)
        std = np.sqrt(self._scaled(inverse.diagonal()))
        object.__setattr__(self, "errors", _on_space(space, std, fixed_as=0.0))
        object.__setattr__(self, "_std", std[order])

    @classmethod
    def from_blocks(
        cls, params, names, order: np.ndarray, inverse: ArrowInverse, scale: float, **more
    ) -> ArrowLaplace:
        """An ArrowLaplace from its parts, without the space (a loaded Result's): ``params``
        the point's pytree, ``names`` the flat names in the written order, ``order`` the flat
        index of each of ``names``."""
        self = object.__new__(cls)
        self._fill(params, tuple(names), np.asarray(order), inverse, scale)
        for key, value in more.items():
            object.__setattr__(self, key, value)
        std = np.sqrt(self._scaled(inverse.diagonal()))[self._order]
        object.__setattr__(self, "errors", errors_by_name(params, self.names, std))
        object.__setattr__(self, "_std", std)
        return self

    def _fill(self, params, names, order, inverse, scale) -> None:
        fields = dict(params=params, names=names, scale=scale, kind="hessian", residuals=None)
        fields.update(absolute_sigma=True, dof=None, reduced_chi2=None)
        for key, value in fields.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "inverse", inverse)
        object.__setattr__(self, "_order", order)

    def _scaled(self, a: np.ndarray) -> np.ndarray:
        return self.scale * a if np.isfinite(self.scale) else np.full_like(a, np.inf)

    def _kept(self, key: str, make):
        if key not in self.__dict__:
            object.__setattr__(self, key, make())
        return self.__dict__[key]

    @property
    def std(self) -> np.ndarray:
        """1-sigma errors as one vector in the order of ``names`` (from the blocks)."""
        return self._std

    @property  # type: ignore[override]
    def covariance(self) -> np.ndarray:
        """``(n, n)``, made whole from the blocks when first read (``n²`` memory)."""
        rows = np.ix_(self._order, self._order)
        return self._kept("_covariance", lambda: self._scaled(self.inverse.dense())[rows])

    @property  # type: ignore[override]
    def hessian(self) -> np.ndarray:
        """``(n, n)`` Hessian, made whole from the arrow when first read (``n²`` memory)."""
        rows = np.ix_(self._order, self._order)
        return self._kept("_hessian", lambda: self.inverse.blocks.dense()[rows])

    @property
    def blocks(self) -> ArrowBlocks:
        """The Hessian's arrow (:class:`multistart.result.arrow.ArrowBlocks`)."""
        return self.inverse.blocks

    @property
    def shared_names(self) -> tuple[str, ...]:
        """The shared parameters' flat names (in the order of ``names``)."""
        shared = set(self.blocks.shared.tolist())
        return tuple(n for n, i in zip(self.names, self._order, strict=True) if i in shared)

    @property
    def shared_covariance(self) -> np.ndarray:
        """``(n_shared, n_shared)`` covariance of the shared parameters, in the order of
        :attr:`shared_names` (the Schur complement's inverse, scaled)."""
        where = {int(i): k for k, i in enumerate(self.blocks.shared)}
        pick = [where[int(i)] for i in self._order if int(i) in where]
        return self._scaled(self.inverse.ss)[np.ix_(pick, pick)]

    def correlated_pairs(self, threshold: float) -> list[tuple[int, int, float]]:
        """``(i, j, r)`` for each pair of parameters ``i < j`` (places in ``names``) whose
        correlation ``r`` is finite and above ``threshold`` in magnitude: :attr:`correlation`'s,
        computed :data:`PAIR_ROWS` rows at a time, never ``n x n``."""
        place = np.empty(self._order.size, dtype=np.int64)  # a flat index's place in names
        place[self._order] = np.arange(self._order.size)
        std = np.sqrt(self._scaled(self.inverse.diagonal()))  # flat order
        out: list[tuple[int, int, float]] = []
        for lo in range(0, self._order.size, PAIR_ROWS):
            which = self._order[lo : lo + PAIR_ROWS]  # rows in names order
            with np.errstate(invalid="ignore", divide="ignore"):
                r = self._scaled(self.inverse.rows(which)) / np.outer(std[which], std)
            i, j = np.nonzero(np.isfinite(r) & (np.abs(r) > threshold))
            later = place[j] > lo + i
            i, j = i[later], j[later]
            out += zip((lo + i).tolist(), place[j].tolist(), r[i, j].tolist(), strict=True)
        return out

    def factor_covariance(self, name: str) -> tuple[tuple[str, ...], np.ndarray]:
        """``(names, covariance)`` of factor ``name``'s own parameters (from its block).

        Raises:
          KeyError: no factor of that name has parameters of its own.
        """
        for b, factors in enumerate(self.blocks.factors):
            if name in factors:
                f = factors.index(name)
                cols = self.blocks.index[b][f]
                flat = {int(c): k for k, c in enumerate(cols)}
                pick = [
                    (flat[int(i)], n)
                    for n, i in zip(self.names, self._order, strict=True)
                    if int(i) in flat
                ]
                rows = [k for k, _ in pick]
                cov = self._scaled(self.inverse.own[b][f])[np.ix_(rows, rows)]
                return tuple(n for _, n in pick), cov
        raise KeyError(f"no factor named {name!r} has parameters of its own")


def _arrow_laplace(problem, params, curvature: ArrowCurvature, scale: float, warn: bool):
    """:func:`laplace_problem` of a factor graph: the arrow's blocks, inverted by the Schur
    complement; where a block is not positive definite and the dense Hessian is small
    (:data:`DENSE_BYTES`), that Hessian (a chunk of columns a call), judged as any other."""
    space = problem.space
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
    vec = _ravel_point(space, params)
    names = tuple(flat_names(space.paths, [p.shape for p in space.priors]))
    blocks = curvature.blocks(jnp.asarray(vec, dtype), problem.data)
    m = getattr(problem, "n_data", None)
    s2 = _reduced_chi2(problem, blocks.value, m, vec.size, warn)
    sigma = dict(absolute_sigma=problem.absolute_sigma, dof=None if m is None else m - vec.size)
    sigma["reduced_chi2"] = None if m is None or m <= vec.size else blocks.value / (m - vec.size)
    factor = scale * (1.0 if problem.absolute_sigma else s2)
    eps = float(np.finfo(dtype).eps)
    inverse = invert(blocks, eps)
    point = (problem, space, params, vec, names)
    if inverse.bad.any() and vec.size**2 * 8 <= DENSE_BYTES:
        hess, _ = curvature.dense(jnp.asarray(vec, dtype), problem.data)
        hess = 0.5 * (hess + hess.T)
        dense, bad = _safe_inverse(hess, eps)
        return _laplace(point, hess, dense, bad, factor, "hessian", warn, **sigma)
    if inverse.bad.any() and warn:
        _warn_bad(problem, names, inverse.bad)
    return ArrowLaplace(point, inverse, factor, **sigma)


def _residual_curvature(problem):
    """:func:`residual_curvature` of a least-squares problem over one start's raveled vector
    (its ``covariance`` kind: Gauss-Newton or the full Hessian)."""
    space, residuals = problem.space, problem.residuals

    def flat(vec, data):
        return ravel_pytree(residuals(space.unravel(vec), data))[0]

    return residual_curvature(flat, stacked=False, kind=problem.covariance)


def residual_laplace(problem, params, curvature_fn=None, *, warn: bool = True) -> Laplace:
    """curve_fit's covariance of a least-squares problem at ``params``.

    ``covariance = s² (JᵀJ)⁻¹`` (``kind="gauss-newton"``, from ``J`` itself:
    :func:`multistart.solvers.small.gram_inverse`, :func:`residual_curvature`) or ``2 s² H⁻¹``
    with ``H`` the full Hessian of ``‖r‖²`` (``kind="hessian"``), in physical coordinates;
    ``s² = 1`` with the problem's ``absolute_sigma``, else the reduced χ² ``‖r‖² / (m - n)``
    (``inf``, with a ``RuntimeWarning``, when ``m <= n``), as curve_fit's ``pcov``.

    Args:
      problem: a :class:`multistart.search.residuals.ResidualProblem`.
      params: the point, a params pytree (usually ``result.best_params``).
      curvature_fn: :func:`hessian_function` of the problem, to reuse its compile.
      warn: as :func:`laplace_problem`'s.
    """
    space = problem.space
    fn = hessian_function(problem) if curvature_fn is None else curvature_fn
    if isinstance(fn, ArrowCurvature):
        return _arrow_residual_laplace(problem, params, fn, warn)
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
    vec = _ravel_point(space, params)
    names = tuple(flat_names(space.paths, [p.shape for p in space.priors]))
    out = fn(jnp.asarray(vec[None], dtype), problem.data)
    out = Curvature(*(None if v is None else np.asarray(v) for v in out))  # one point's
    curv, r = np.asarray(out.jac[0], dtype=np.float64), np.asarray(out.r[0], dtype=np.float64)
    m, n, ssr = r.size, vec.size, float(out.ssr[0])
    s2 = float(residual_scale(ssr, m, n, problem.absolute_sigma))
    if not problem.absolute_sigma:
        if m <= n and warn:
            warnings.warn(
                f"{problem.name!r}: {m} residuals for {n} parameters leave no degrees of freedom "
                "for the reduced chi-squared: the covariance is inf (pass absolute_sigma=True "
                "if the residuals are normalised by known sigmas)",
                RuntimeWarning,
                stacklevel=3,
            )
    if problem.covariance == "hessian":
        hess = 0.5 * (curv + curv.T)
        inverse, bad = _safe_inverse(hess, np.finfo(dtype).eps)
        kind = "hessian"
    else:  # (2 JᵀJ)⁻¹ from J itself, so its precision is J's
        hess = 2.0 * (curv.T @ curv)
        inverses, bads = settle_inverses(out)
        inverse, bad, kind = 0.5 * inverses[0], bads[0], "gauss-newton"
    more = dict(absolute_sigma=problem.absolute_sigma, dof=m - n, residuals=r)
    more["reduced_chi2"] = ssr / (m - n) if m > n else None
    point = (problem, space, params, vec, names)
    return _laplace(point, hess, inverse, bad, 2.0 * s2, kind, warn, **more)


def _no_dof_warning(problem, m: int, n: int, warn: bool) -> None:
    if not problem.absolute_sigma and m <= n and warn:
        warnings.warn(
            f"{problem.name!r}: {m} residuals for {n} parameters leave no degrees of freedom "
            "for the reduced chi-squared: the covariance is inf (pass absolute_sigma=True "
            "if the residuals are normalised by known sigmas)",
            RuntimeWarning,
            stacklevel=4,
        )


def _arrow_residual_laplace(problem, params, curvature: ArrowCurvature, warn: bool):
    """:func:`residual_laplace` of a least-squares graph whose Jacobian is past
    :data:`DENSE_BYTES`: ``s² (JᵀJ)⁻¹`` from the arrow of ``2 JᵀJ`` (Gauss-Newton products,
    never ``J`` itself), inverted by the Schur complement (:func:`_arrow_laplace`'s)."""
    space = problem.space
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
    vec = _ravel_point(space, params)
    names = tuple(flat_names(space.paths, [p.shape for p in space.priors]))
    blocks = curvature.blocks(jnp.asarray(vec, dtype), problem.data)
    r = curvature.residuals(jnp.asarray(vec, dtype), problem.data)
    m, n, ssr = r.size, vec.size, float(blocks.value)
    s2 = float(residual_scale(ssr, m, n, problem.absolute_sigma))
    _no_dof_warning(problem, m, n, warn)
    inverse = invert(blocks, float(np.finfo(dtype).eps))
    if inverse.bad.any() and warn:
        _warn_bad(problem, names, inverse.bad)
    more = dict(absolute_sigma=problem.absolute_sigma, dof=m - n, residuals=r)
    more["reduced_chi2"] = ssr / (m - n) if m > n else None
    return ArrowLaplace(
        (problem, space, params, vec, names), inverse, 2.0 * s2, kind="gauss-newton", **more
    )


def residual_scale(ssr, m, n: int, absolute_sigma: bool) -> np.ndarray:
    """curve_fit's ``s²`` for ``m`` residuals and ``n`` parameters: 1 with ``absolute_sigma``,
    else the reduced χ² ``‖r‖² / (m - n)``, ``inf`` where no degree of freedom is left;
    ``ssr`` one sum of squares or an array of them (a batch's), ``m`` one count or one per
    sum (a batch's fits, each with its own points left out)."""
    ssr = np.asarray(ssr, dtype=np.float64)
    if absolute_sigma:
        return np.ones_like(ssr)
    if np.ndim(m) == 0:
        return ssr / (m - n) if m > n else np.full_like(ssr, np.inf)
    m = np.asarray(m)
    return np.where(m > n, ssr / np.maximum(m - n, 1), np.inf)


def gram_inverse(jac: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``((JᵀJ)⁻¹, bad)`` of each ``(m, n)`` Jacobian of a stack ``(k, m, n)``.

    From the SVD of ``J`` with unit columns, as scipy's curve_fit, so the precision is ``J``'s,
    not ``JᵀJ``'s. ``bad`` ``(k, n)``: a parameter whose column is not finite or zero, or
    that takes a part above ``sqrt(eps)`` in a direction whose singular value is below
    ``max(m, n) * eps`` of the largest (scipy's threshold): a parameter the data do not
    determine. The inverse's rows and columns of a bad parameter are ``nan``, the rest the
    inverse on the determined directions (as :func:`_safe_inverse` for a Hessian).
    """
    k, m, n = jac.shape
    eps = np.finfo(np.float64).eps
    finite = np.all(np.isfinite(jac), axis=1)
    jac = np.where(finite[:, None, :], jac, 0.0)
    norms = np.linalg.norm(jac, axis=1)
    bad = ~(finite & (norms > 0))
    d = 1.0 / np.where(bad, 1.0, norms)
    scaled = jac * d[:, None, :]
    if m < n:  # zero rows keep JᵀJ and give the SVD its n - m null directions
        scaled = np.concatenate([scaled, np.zeros((k, n - m, n))], axis=1)
    _, sv, vt = np.linalg.svd(scaled, full_matrices=False)
    ok = sv > sv[:, :1] * max(m, n) * eps
    bad |= np.any((np.abs(vt) > np.sqrt(eps)) & ~ok[:, :, None], axis=1)
    weight = np.where(ok, 1.0 / np.where(ok, sv, 1.0) ** 2, 0.0)
    inverse = (np.swapaxes(vt, 1, 2) * weight[:, None, :]) @ vt * d[:, :, None] * d[:, None, :]
    return np.where(bad[:, :, None] | bad[:, None, :], np.nan, inverse), bad


def _safe_inverse(hess: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(H^-1, bad)``: the inverse on the positive-definite part; ``nan`` rows and columns
    for the parameters (``bad``) in a zero, negative or non-finite curvature direction.

    Scaled to unit diagonal first (so units do not pass for singularity), eigenvalues below
    ``n * eps`` of the largest are bad (as ``numpy.linalg.matrix_rank`` judges), and so is a
    parameter whose component in a bad direction exceeds ``sqrt(eps)``.
    """
    n = hess.shape[0]
    diag = np.diag(hess)
    bad = ~(np.isfinite(diag) & (diag > 0))
    # A non-finite curvature's cross terms are often nan too (0 * inf): that parameter alone is
    # bad; a non-finite cross term between two others makes both bad.
    rest = hess[np.ix_(~bad, ~bad)]
    bad[np.flatnonzero(~bad)] = ~np.all(np.isfinite(rest), axis=1)
    good = np.flatnonzero(~bad)
    inverse = np.full((n, n), np.nan)
    if good.size:
        d = 1.0 / np.sqrt(diag[good])
        scaled = hess[np.ix_(good, good)] * np.outer(d, d)
        lam, vec = np.linalg.eigh(scaled)
        ok = lam > max(lam.max(initial=0.0), 0.0) * good.size * eps
        ok &= lam > 0
        involved = np.any(np.abs(vec[:, ~ok]) > np.sqrt(eps), axis=1)
        sub = (vec[:, ok] / lam[ok]) @ vec[:, ok].T * np.outer(d, d)
        sub[involved, :] = np.nan
        sub[:, involved] = np.nan
        inverse[np.ix_(good, good)] = sub
        bad[good[involved]] = True
    return inverse, bad


def _ravel_point(space, params) -> np.ndarray:
    leaves = space.leaves(params)
    out = []
    for path, prior, leaf in zip(space.paths, space.priors, leaves, strict=True):
        a = np.asarray(leaf, dtype=np.float64)
        if a.shape != prior.shape:
            raise ValueError(
                f"params[{path!r}] must have the shape {prior.shape} of its prior; got {a.shape}"
            )
        out.append(a.ravel())
    return np.concatenate(out)


def _on_space(space, vec: np.ndarray, fixed_as=None):
    """The free parameters' raveled ``vec`` as the space's params pytree (0-d leaves as
    floats), each fixed parameter at its value or at ``fixed_as``."""
    parts = space.split_rows(np.asarray(vec, dtype=np.float64)[None])
    leaves = [
        float(v[0]) if p.shape == () else v[0] for v, p in zip(parts, space.priors, strict=True)
    ]
    return space.unflatten(leaves, fixed_as=fixed_as)


def unflatten_like(params, vec: np.ndarray):
    """A vector in raveled order back to the pytree of ``params`` (0-d leaves as floats).

    >>> unflatten_like({"a": 0.0, "b": np.zeros(2)}, np.array([1.0, 2.0, 3.0]))
    {'a': 1.0, 'b': array([2., 3.])}
    """
    leaves, treedef = jax.tree_util.tree_flatten(params)
    shapes = [np.shape(v) for v in leaves]
    parts = np.split(
        np.asarray(vec, dtype=np.float64), np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
    )
    out = [float(p[0]) if s == () else p.reshape(s) for p, s in zip(parts, shapes, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, out)


def leaf_paths(params) -> list[str]:
    """A params pytree's dotted paths in the order of its leaves (``jax.tree_util``'s).

    >>> leaf_paths({"b": 1.0, "a": {"y": 2.0, "x": 3.0}})
    ['a.x', 'a.y', 'b']
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return [".".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat]


def errors_by_name(params, names, std) -> Any:
    """The errors ``std`` of the flat ``names`` as the pytree of ``params``; a parameter not
    among ``names`` (a fixed one) has 0."""
    leaves = jax.tree_util.tree_leaves(params)
    shapes = [np.shape(v) for v in leaves]
    error = dict(zip(names, np.asarray(std, dtype=np.float64), strict=True))
    flat = [error.get(n, 0.0) for n in flat_names(leaf_paths(params), shapes)]
    return unflatten_like(params, np.array(flat))


def flat_names(paths, shapes) -> list[str]:
    """One name per scalar parameter: ``"q"``, ``"flux[1]"``, ``"cov[0,1]"``.

    >>> flat_names(["q", "flux"], [(), (2,)])
    ['q', 'flux[0]', 'flux[1]']
    """
    names = []
    for path, shape in zip(paths, shapes, strict=True):
        if shape == ():
            names.append(path)
            continue
        names += [f"{path}[{','.join(map(str, i))}]" for i in np.ndindex(shape)]
    return names


def flat_values(params) -> np.ndarray:
    """A params pytree's leaves raveled into one float64 vector (``jax.tree_util`` order)."""
    leaves = jax.tree_util.tree_leaves(params)
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in leaves])


def _num(x: float) -> str:
    return f"{x:.6g}"
