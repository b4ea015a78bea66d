"""The parameters' layout in the population: one flat vector per start, or the space's pytree.

``flat=True`` (the default) steps each start's unconstrained parameters as one vector (fewer,
larger kernels); ``flat=False`` keeps the space's pytree, for a rule keyed to its structure.
:class:`Layout` is the one place that difference is written: every map between physical
starts and the population's rows goes through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..common import xla
from ..model.priors import Space
from .programs import Programs, padded_chunks
from .step import init_population

__all__ = ["Layout", "physical_map"]


@dataclass(frozen=True, eq=False)
class Layout:
    """How one start's unconstrained parameters are laid out in the population.

    Attributes:
      space: the search's space.
      flat: one flat vector per start (else the space's pytree).
      dtype: the float type the search runs in.
    """

    space: Space
    flat: bool
    dtype: Any

    def to_physical(self, u):
        """One start's unconstrained parameters to its physical pytree (traceable): the
        space's params pytree, never the view a model may be called with."""
        if self.flat:
            return self.space.unravel_tree(self.space.forward_flat(u))
        return self.space.to_physical(u)

    def starts(self, x):
        """Physical starts (leading axis) as the population's unconstrained arrays."""
        u = self.space.to_unconstrained(x, dtype=self.dtype)
        if self.flat:
            return jnp.asarray(self.space.ravel(u), self.dtype)
        return jax.tree_util.tree_map(jnp.asarray, u)

    def to_unconstrained(self, x):
        """Physical starts (leading axis) as unconstrained NumPy rows (new starts of a refill)."""
        u = self.space.to_unconstrained(x, dtype=np.dtype(self.dtype))
        return self.space.ravel(u) if self.flat else u

    def one_start_state(self, solver, window: int):
        """Shapes of one start's state (no device work)."""
        dtype = np.dtype(self.dtype)
        if self.flat:
            u1 = jax.ShapeDtypeStruct((1, self.space.n_dims), dtype)
        else:  # the unconstrained pytree has the physical one's shapes
            u1 = self.space.example_tree(dtype, batch=(1,))
        status = jax.ShapeDtypeStruct((1,), np.int8)
        pop = jax.eval_shape(
            lambda u, st: init_population(solver, u, 1, window, status=st), u1, status
        )
        return jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), pop.starts
        )


def physical_map(layout: Layout, width: int, programs: Programs, points=None):
    """The map of the population's rows (the layout's form, a leading axis, any number of
    them) to physical params (NumPy, a leading axis): the Result's and the refills'.

    ``points``: the broad-start filter's :meth:`~multistart.device.evaluator.ValueEvaluator.
    points`, whose program maps flat rows as :meth:`Layout.to_physical` does, bit for bit, so
    the fit compiles nothing more for it. ``None`` (no filter ran): one program of its own,
    ``width`` rows a call, kept in ``programs`` for a refit.
    """
    space = layout.space
    if points is not None:
        return lambda rows: space.unravel_rows(
            points(np.asarray(rows) if layout.flat else space.ravel(rows))
        )
    if layout.flat:
        # flat rows out, the pytree made in NumPy: a program of one output, not one a leaf
        # (a factor graph's thousands of leaves made a compile of minutes)
        def to_physical(u):  # the program's name, as the pytree's was
            return space.forward_flat(u)

        flat = programs.get("to_physical_flat", lambda: xla.jit(jax.vmap(to_physical)))

        def physical_rows(rows):
            parts = [
                np.asarray(flat(chunk))[: hi - lo] for lo, hi, chunk in padded_chunks(rows, width)
            ]
            return space.unravel_rows(np.concatenate(parts))

        return physical_rows
    jitted = programs.get("to_physical", lambda: xla.jit(jax.vmap(layout.to_physical)))

    def physical(rows):
        parts = [
            jax.tree_util.tree_map(lambda a, k=hi - lo: np.asarray(a)[:k], jitted(chunk))
            for lo, hi, chunk in padded_chunks(rows, width)
        ]
        return jax.tree_util.tree_map(lambda *a: np.concatenate(a), *parts)

    return physical
