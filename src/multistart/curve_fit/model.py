"""``f`` traced once, and the residuals ``(f(x, *p) - y) * weight`` as the search's model.

The model takes ``(x, y, weight)`` as an argument of the compiled step, so a refit of the same
``f`` on data of the same shapes compiles nothing (its programs are kept by
:func:`multistart.device.programs.programs_for`, keyed by ``f`` itself as ``jax.jit`` keys its
cache).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..common.digest import Replay
from ..model.priors import Space
from ..model.problem import add_note, tracer_hint


def _name(f) -> str:
    """``f``'s name, or its type's (a callable object)."""
    return getattr(f, "__name__", type(f).__name__)


def _model_key(f, names) -> tuple | None:
    """What curve_fit's programs depend on besides the data's shapes: ``f`` itself (a global it
    reads changing is not noticed, as in ``jax.jit``) and the names; ``None`` if unhashable."""
    try:
        hash(f)
    except TypeError:
        return None
    return ("curve_fit", f, tuple(names))


class _CurveModel:
    """The residuals with ``(x, y, sigma)`` as the program's data and its own space;
    ``rows_per_datum``: the data are a stack of fits, each with that many starts;
    ``empty_data``: ``(n_fits,)`` the fits with too few points to run (``no_data``)."""

    def __init__(self, f, names, space, data, rows_per_datum=None, empty_data=None):
        self.f, self.names, self.space, self.data = f, names, space, data
        self.rows_per_datum, self.empty_data = rows_per_datum, empty_data
        self.__name__ = _name(f)

    def multistart_residual_problem(self):
        extra = {
            "rows_per_datum": self.rows_per_datum,
            "program_key": _model_key(self.f, self.names),
        }
        if self.empty_data is not None:  # a batch's fits with too few points: never started
            extra["empty_data"] = self.empty_data
        residuals = self.weighted(self.f, self.names)
        return residuals, Space(self.space), self.data, self.__name__, extra

    @staticmethod
    def weighted(f, names):
        """``residuals(params, data)``: ``f``'s weighted residuals, ``params`` by name and
        ``data`` ``(x, y, weight)`` (the search's model and the covariance's alike)."""

        def residuals(params, data):
            x, y, weight = data
            r = jnp.ravel(f(x, *(params[k] for k in names)) - y)
            return weight(r) if callable(weight) else r * weight

        return residuals


class _Traced(Replay):
    """``f`` traced once at ``(x, *scalars)``: the shape it returns (``shape``, ``None`` for no
    array), and, called as ``f`` is, its recorded operations replayed (a
    :class:`multistart.common.digest.Replay`), so the covariance program, the spreads and the
    search's step all derive from this one trace of the user's Python; a float32 search's
    refinement in float64 (on a chip) traces ``f`` once more, at float64, and replays that
    (:attr:`~multistart.common.digest.Replay.per_signature`). Hashed and compared as ``f``
    itself, so curve_fit's programs stay keyed by the user's function."""

    per_signature = True

    def __init__(self, f, x, names):
        args = [jax.ShapeDtypeStruct((), jnp.float64) for _ in names]
        traced = jax.jit(lambda x, *p: f(x, *p)).trace(x, *args)
        super().__init__(traced.jaxpr, traced.in_tree, traced.out_tree, f, _name(f))
        self.shape = getattr(traced.out_info, "shape", None)

    def __hash__(self):
        return hash(self.fn)

    def __eq__(self, other):
        return self.fn == (other.fn if isinstance(other, _Traced) else other)


def _trace(f, x, names) -> _Traced:
    """:class:`_Traced` of ``f`` at ``x``; an exception raised while tracing it names ``f``."""
    try:
        return _Traced(f, x, names)
    except Exception as e:
        if getattr(e, "multistart_said", False):  # a tie's error, said as the tie's (hold.py)
            raise
        hint = tracer_hint(e)  # np.exp on a parameter: use jnp.exp
        fix = (
            ""
            if hint is None
            else "; " + hint.removeprefix("multistart: ").replace("the objective", "f")
        )
        add_note(e, f"multistart: raised while tracing f(xdata, {', '.join(names)}){fix}")
        raise


def _check_output(f, x, names, y_shape, what: str = "ydata's shape") -> _Traced:
    """``f`` traced (:func:`_trace`); ``f(x, *params)`` must have ``y_shape`` (as many values,
    as scipy reads it)."""
    traced = _trace(f, x, names)
    shape = traced.shape
    if shape is None or int(np.prod(shape)) != int(np.prod(y_shape)):
        raise ValueError(
            f"f(xdata, *params) must return {what} {tuple(y_shape)}; it returned "
            f"{shape if shape is not None else 'no array'}"
        )
    return traced
