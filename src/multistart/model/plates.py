"""A factor graph's space: the params pytree a user sees, and the stacked view its model reads.

A graph's parameters are one pytree, each factor's own under its name
(``{"x0": ..., "g": {"flux": ...}, "r": {"flux": ...}}``): that is what a Result holds, what
starts are given as and what errors are named by. Evaluated leaf by leaf, though, that pytree
makes a program that grows with the number of factors. So a :class:`GraphSpace` hands the model
a view of its own, :class:`GraphParams`: the factors a graph stacks (a *plate*, as numpyro calls
a set of conditionally independent terms) read their own parameters as one array per parameter
with a leading factor axis, gathered from the flat vector the search steps in one operation, and
their priors are stacked the same way. The program's size then depends on the kinds of factor,
not on how many there are of each. The flat vector, and everything a user sees, keep the pytree's
order.

A :class:`GraphSpace` also knows where each factor's own coordinates are in the flat vector
(:meth:`GraphSpace.arrow`): the Hessian of a graph is an arrow (a block a factor and the shared
rows), which is how its errors are computed (:mod:`multistart.result.arrow`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .priors import HalfBounded, LogUniform, Normal, Prior, Space, Uniform

__all__ = ["Arrow", "GraphParams", "GraphSpace", "Plate", "prior_kind", "stack_priors"]


class GraphParams(NamedTuple):
    """What a factor graph's figure of merit is evaluated at when it stacks factors.

    Attributes:
      shared: the shared parameters, as in the params pytree.
      own: one entry a group of the graph (its order): a stacked group's own parameters, each
        leaf with a leading axis of its factors; any other group's, a tuple of its factors' own
        parameters (``{}`` for a factor with none).
    """

    shared: dict
    own: tuple


@dataclass(frozen=True)
class Plate:
    """Factors the graph evaluates together (one log-likelihood, one data layout).

    Attributes:
      names: the factors' names, in graph order.
      own: whether they have parameters of their own.
      stacked: their data and own parameters carry a leading factor axis and one ``vmap`` of
        the log-likelihood evaluates them.
    """

    names: tuple[str, ...]
    own: bool
    stacked: bool


@dataclass(frozen=True)
class Arrow:
    """Where the coordinates of a graph's flat vector sit in the arrow of its Hessian.

    Attributes:
      shared: ``(n_shared,)`` the flat indices of the parameters no factor owns.
      blocks: one ``(n_factors, k)`` array of flat indices per number ``k`` of own coordinates:
        row ``i`` holds factor ``factors[b][i]``'s own coordinates.
      factors: the factor names of each block's rows.
    """

    shared: np.ndarray
    blocks: tuple[np.ndarray, ...]
    factors: tuple[tuple[str, ...], ...]

    @property
    def n_own(self) -> int:
        """The largest number of own coordinates of a factor (0 when none has any)."""
        return max((b.shape[1] for b in self.blocks), default=0)


def prior_kind(prior: Prior):
    """What factors must share, parameter by parameter, for their priors to stack: the class,
    the shape and (for :class:`HalfBounded`) the side."""
    return (type(prior), prior.shape, getattr(prior, "sign", None))


def stack_priors(priors: Sequence[Prior]) -> Prior | None:
    """One prior over a leading axis of ``priors`` (of one :func:`prior_kind`), whose
    ``log_prob`` is the sum of theirs; ``None`` for a class this does not know how to stack
    (a prior of the user's own)."""
    cls = type(priors[0])

    def stacked(attr: str) -> np.ndarray:
        return np.stack([getattr(p, attr) for p in priors])

    if cls in (Uniform, LogUniform):
        return cls(stacked("lower"), stacked("upper"))
    if cls is Normal:
        return Normal(stacked("mean"), stacked("sigma"))
    if cls is HalfBounded:
        side = "lower" if isinstance(priors[0], HalfBounded) and priors[0].sign > 0 else "upper"
        return HalfBounded(stacked("bound"), stacked("typical"), side)
    return None


@dataclass(frozen=True, eq=False)
class _Leaf:
    """One leaf of the model's view: the public leaves it is made of and how to read it."""

    name: str | None  # None: a fixed parameter (not stepped)
    paths: tuple[str, ...]  # the params pytree's leaves it holds (several: stacked)
    shape: tuple[int, ...]
    index: np.ndarray | None  # its flat coordinates (C order of shape); None when fixed
    value: np.ndarray | None  # a fixed leaf's value
    prior: Prior | None  # one prior over the whole leaf, where the priors stack
    priors: tuple[Prior, ...]  # else each stacked factor's


class GraphSpace(Space):
    """The space of a factor graph: its params pytree, and the view its model is evaluated at.

    Everything a :class:`~multistart.model.priors.Space` does on the params pytree is the
    same. What the model is called with (:meth:`unravel`, :meth:`example`, :meth:`view`) is a
    :class:`GraphParams` where a group of factors is stacked, else the params pytree itself.

    Args:
      tree: the graph's (nested) dict of priors: the shared ones at the top, each factor's own
        under its name.
      shared: the top-level keys of ``tree`` that are shared parameters.
      plates: the graph's groups of factors, in order.
    """

    def __init__(self, tree: dict, shared: Sequence[str], plates: Sequence[Plate], *, argname: str):
        super().__init__(tree, argname=argname)
        self.shared_keys = tuple(shared)
        self.plates = tuple(plates)
        self.stacking = any(p.stacked and p.own for p in self.plates)
        ends = np.cumsum([0] + [p.size for p in self.priors])
        self._at = {
            path: (int(ends[i]), prior)
            for i, (path, prior) in enumerate(zip(self.paths, self.priors, strict=True))
        }
        self._arrow = self._make_arrow()
        if self.stacking:
            self._leaves, self._view_def = self._model_leaves()

    # -- the model's view ------------------------------------------------------------------

    def _model_leaves(self):
        """The view's leaves in its ``jax.tree_util`` order, and its tree structure."""
        shared = {k: self.tree[k] for k in self.shared_keys}
        own: list[Any] = []
        for plate in self.plates:
            if plate.stacked:
                own.append(self.tree[plate.names[0]] if plate.own else {})
            else:
                own.append(tuple(self.tree[n] if plate.own else {} for n in plate.names))
        is_prior = lambda x: isinstance(x, Prior)  # noqa: E731
        view_def = jax.tree_util.tree_structure(GraphParams(shared, tuple(own)), is_leaf=is_prior)
        leaves = [self._single(p) for p in _paths(shared)]
        for plate, entry in zip(self.plates, own, strict=True):
            if plate.stacked:
                leaves += [self._stacked(plate.names, rel) for rel in _paths(entry)]
            else:
                for n, sub in zip(plate.names, entry, strict=True):
                    leaves += [self._single(f"{n}.{rel}") for rel in _paths(sub)]
        return leaves, view_def

    def _single(self, path: str) -> _Leaf:
        if path in self.fixed:
            value = self.fixed[path].value
            return _Leaf(None, (path,), value.shape, None, value, None, ())
        offset, prior = self._at[path]
        index = np.arange(offset, offset + prior.size)
        return _Leaf(path, (path,), prior.shape, index, None, prior, (prior,))

    def _stacked(self, names: tuple[str, ...], rel: str) -> _Leaf:
        paths = tuple(f"{n}.{rel}" for n in names)
        label = f"{{{names[0]}, ..., {names[-1]}}}.{rel}" if len(names) > 2 else None
        label = label or f"{{{', '.join(names)}}}.{rel}"
        if paths[0] in self.fixed:  # fixed in every factor: fixed-ness is part of the kind
            value = np.stack([self.fixed[p].value for p in paths])
            return _Leaf(None, paths, value.shape, None, value, None, ())
        priors = tuple(self._at[p][1] for p in paths)
        index = np.stack([self._at[p][0] + np.arange(priors[0].size) for p in paths]).ravel()
        shape = (len(names), *priors[0].shape)
        return _Leaf(label, paths, shape, index, None, stack_priors(priors), priors)

    def unravel(self, vec):
        """JAX: one start's ``(n_dims,)`` physical vector to what the model is called with:
        a :class:`GraphParams` where the graph stacks factors (a stacked parameter is one
        gather of its factors' coordinates), else the params pytree."""
        if not self.stacking:
            return self.unravel_tree(vec)
        leaves = [_read(leaf, vec) for leaf in self._leaves]
        return jax.tree_util.tree_unflatten(self._view_def, leaves)

    def example(self, dtype, batch: tuple[int, ...] = ()):
        """``jax.ShapeDtypeStruct`` of what the model is called with (see :meth:`unravel`)."""
        if not self.stacking:
            return self.example_tree(dtype, batch)
        structs = [jax.ShapeDtypeStruct(batch + leaf.shape, dtype) for leaf in self._leaves]
        return jax.tree_util.tree_unflatten(self._view_def, structs)

    def example_names(self) -> list[str | None]:
        """For each leaf of :meth:`example`, the parameter it holds (``"{a, ..., z}.flux"``:
        the ``flux`` of the stacked factors ``a`` to ``z``); ``None`` for a fixed one."""
        if not self.stacking:
            return super().example_names()
        return [leaf.name for leaf in self._leaves]

    def view(self, params):
        """The :class:`GraphParams` of one start's params pytree (JAX or NumPy), stacking each
        stacked group's own parameters; the pytree itself where nothing is stacked. Passing
        a :class:`GraphParams` returns it."""
        if not self.stacking or isinstance(params, GraphParams):
            return params
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        if treedef != self.treedef:
            raise ValueError(
                f"params structure {treedef} does not match the space's {self.treedef}"
            )
        by_path = {_dotted(path): leaf for path, leaf in flat}
        traced = any(isinstance(leaf, jax.Array) for _, leaf in flat)
        xp: Any = jnp if traced else np
        out = []
        for leaf in self._leaves:
            values = [by_path[p] for p in leaf.paths]
            one = len(values) == 1
            out.append(values[0] if one else xp.stack([xp.asarray(v) for v in values]))
        return jax.tree_util.tree_unflatten(self._view_def, out)

    def log_prob(self, x):
        """Sum of the priors' log-densities at ``x``, a params pytree or a
        :class:`GraphParams` (one start, JAX); a stacked parameter's priors as one."""
        if not isinstance(x, GraphParams):
            return super().log_prob(x)
        total: Any = 0.0
        for leaf, value in zip(self._leaves, jax.tree_util.tree_leaves(x), strict=True):
            if leaf.name is None:
                continue
            if leaf.prior is not None:
                total = total + leaf.prior.log_prob(value)
            else:  # priors of the user's own kind: each factor's on its own row
                for i, prior in enumerate(leaf.priors):
                    total = total + prior.log_prob(value[i])
        return total

    # -- the Hessian's structure -----------------------------------------------------------

    def _make_arrow(self) -> Arrow:
        owned: dict[int, list[tuple[str, np.ndarray]]] = {}
        taken = np.zeros(self.n_dims, dtype=bool)
        for plate in self.plates:
            if not plate.own:
                continue
            for n in plate.names:
                index = [
                    self._at[f"{n}.{rel}"][0] + np.arange(self._at[f"{n}.{rel}"][1].size)
                    for rel in _paths(self.tree[n])
                    if f"{n}.{rel}" in self._at
                ]
                if not index:
                    continue
                cols = np.concatenate(index)
                taken[cols] = True
                owned.setdefault(cols.size, []).append((n, cols))
        blocks = tuple(np.stack([c for _, c in rows]) for rows in owned.values())
        factors = tuple(tuple(n for n, _ in rows) for rows in owned.values())
        return Arrow(np.flatnonzero(~taken), blocks, factors)

    def arrow(self) -> Arrow:
        """Where the shared and each factor's own coordinates are in the flat vector."""
        return self._arrow


def _read(leaf: _Leaf, vec):
    """A leaf of the model's view from one start's flat physical vector."""
    if leaf.index is None:
        return jnp.asarray(leaf.value, jnp.result_type(vec))
    lo = int(leaf.index[0]) if leaf.index.size else 0
    if np.array_equal(leaf.index, np.arange(lo, lo + leaf.index.size)):
        return jnp.reshape(vec[lo : lo + leaf.index.size], leaf.shape)
    return jnp.reshape(vec[leaf.index], leaf.shape)


def _paths(tree) -> list[str]:
    """The dotted paths of a (nested) dict of priors' leaves, in ``jax.tree_util`` order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Prior))
    return [_dotted(path) for path, _ in flat]


def _dotted(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
