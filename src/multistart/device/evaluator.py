"""The figure of merit alone at many points: the broad-start filter's evaluator.

One compiled ``vmap`` of the figure of merit over fixed-width chunks, swept by a Python loop
(:func:`multistart.device.programs.padded_chunks`), with the out-of-memory back-off of every program
here. The filter evaluates thousands of candidates with it at the cost of one compile. The
same program returns each point's physical parameters beside its value: the Result's map of
its starts' rows (:func:`multistart.device.layout.physical_map`), so a fit compiles no program
of its own for that map.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..common import log, xla
from .oom import is_out_of_memory
from .programs import Programs, lower_and_compile, padded_chunks, retry_narrower

__all__ = ["ValueEvaluator", "FILTER_NAME"]

FILTER_NAME = "multistart_filter_chunk"


class ValueEvaluator:
    """The figure of merit alone, at many points: one compiled ``vmap`` over fixed-width chunks.

    ``fom_u(u, data)`` is evaluated at each row of a ``(n_rows, n_dims)`` array by a Python loop
    over chunks of exactly ``width`` rows (the ragged last one padded, its outputs dropped), so
    any number of rows costs one compile. Chunks are dispatched without waiting, and the values
    come back to the host once, at the end. Calling it gives the values; :meth:`points` gives
    the points they were evaluated at, from the same program.

    Args:
      fom_u: ``fom_u(u, data) -> (scalar, point)`` at one flat unconstrained point ``u``: its
        figure of merit and the flat physical point it was evaluated at.
      width: rows per compiled call.
      data: the model's data (an argument of the compiled program, not a constant in it),
        put on the device here and kept there until :meth:`release`.
      name: the compiled function's name (stable across processes: it is part of the program).
      programs: where the jitted evaluator is kept for a refit of the same model (default:
        nowhere).
    """

    def __init__(
        self, fom_u, *, width: int, data, name: str = FILTER_NAME, programs: Programs | None = None
    ):
        def jitted():
            def chunk(u, data):
                return jax.vmap(fom_u, in_axes=(0, None))(u, data)

            chunk.__name__ = chunk.__qualname__ = name
            return xla.jit(chunk)

        self._programs = programs or Programs()
        self._jit = self._programs.get(("values", name), jitted)
        self._name = name
        self.width = int(width)
        self._host_data = data
        self.data = jax.device_put(data)
        placed = jax.tree_util.tree_leaves(self.data)
        self._devices = placed[0].devices() if placed else None  # where the program runs
        self.compiled: Any = None
        self.compile_s = 0.0
        self.backoffs: list[dict[str, int]] = []
        self._shape: tuple[int, Any] | None = None

    def compile(self, n_dims: int, dtype) -> float:
        """Compile for ``(width, n_dims)`` rows of ``dtype``; returns the seconds taken."""
        self._shape = (n_dims, dtype)
        example = jax.ShapeDtypeStruct((self.width, n_dims), dtype)
        # kept with the jitted function: a refit of the same model lowers nothing again
        compiled = self._programs.get(("values compiled", self._name, example), dict)
        if self.width in compiled:
            self.compiled, seconds = compiled[self.width][0], 0.0
            return seconds
        self.compiled, seconds = lower_and_compile(
            self._jit, "the broad-start filter", example, self._device_data()
        )
        compiled[self.width] = (self.compiled, seconds)
        self.compile_s += seconds
        return seconds

    def __call__(self, u: np.ndarray) -> np.ndarray:
        """The figure of merit at every row of ``u`` (NumPy in, NumPy out, in row order).

        A chunk that runs out of memory halves the width, recompiles and evaluates again
        (nothing is donated, so nothing is lost), down to width 1 and then a clear error.
        """
        return self._retrying(u)[0]

    def points(self, u: np.ndarray) -> np.ndarray:
        """The flat physical point of every row of ``u`` (``fom_u``'s second output), with the
        same back-off."""
        return self._retrying(u)[1]

    def _retrying(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.compiled is None:
            raise RuntimeError("ValueEvaluator.compile() must be called before evaluating")
        try:
            return self._evaluate(u)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            first = exc

        def halve(old: int, failure: BaseException) -> int:
            self.width = old // 2
            self.backoffs.append({"from": old, "to": self.width})
            log.logger.warning(
                "broad-start filter out of memory at width %d; retrying at %d", old, self.width
            )
            assert self._shape is not None  # compiled before it could run out of memory
            self.compile(*self._shape)
            return self.width

        return retry_narrower(
            lambda: self._evaluate(u),
            first,
            width=self.width,
            halve=halve,
            fatal="the broad-start filter ran out of memory even at width 1: one evaluation of "
            "this model does not fit the device",
        )

    def release(self) -> None:
        """Let go of the data's device copy (the search's steps hold their own): a later call
        puts the data on the device again, for that call (unless :meth:`share` gave it the
        steps' copy)."""
        self.data = None

    def share(self, host_data, device_data) -> bool:
        """Evaluate on ``device_data``, the search's own device copy of ``host_data``, from now
        on: after :meth:`release`, the Result's and each refill's map of rows would otherwise
        put the whole data on the device again at every call. Taken only where ``host_data``
        is this evaluator's data and ``device_data`` lies whole on the device its program was
        compiled for (the steps on one device; on a mesh it is spread over several). Returns
        whether it was taken."""
        leaves = jax.tree_util.tree_leaves(device_data)
        mine = host_data is self._host_data and self._devices is not None
        mine = mine and all(
            isinstance(a, jax.Array) and a.devices() == self._devices for a in leaves
        )
        if mine:
            self.data = device_data
        return mine

    def _device_data(self):
        """The data on the device: the kept copy, or (after :meth:`release`) a new one. A
        program compiled by a back-off after the release takes the data as any other does."""
        return jax.device_put(self._host_data) if self.data is None else self.data

    def _evaluate(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        data = self._device_data()
        outs = [(self.compiled(c, data), hi - lo) for lo, hi, c in padded_chunks(u, self.width)]
        if not outs:
            return np.zeros((0,), dtype=u.dtype), np.zeros(u.shape, dtype=u.dtype)
        values = np.concatenate([np.asarray(v)[:n] for (v, _), n in outs])
        points = np.concatenate([np.asarray(x)[:n] for (_, x), n in outs])
        return values, points
