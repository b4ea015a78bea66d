"""The Result of a search: the best fit and every start's record."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .minima import cluster_minima
from .status import Status

__all__ = ["Result", "Minimum"]


@dataclass(frozen=True)
class Minimum:
    """One distinct local minimum reached by one or more starts.

    Attributes:
      fom: the best figure of merit among its starts.
      params: the physical parameters of that best start.
      starts: indices of the starts that reached it, best first.
    """

    fom: float
    params: Any
    starts: tuple[int, ...]

    @property
    def n_starts(self) -> int:
        return len(self.starts)


_FORMAT, _VERSION = "multistart.Result", 1
_RECORD_COLUMNS = ("index", "fom", "status", "n_steps", "n_evals", "best_step")
_START_PREFIX = "start:"
_PLOTS_HINT = "pip install 'multistart[plots]'"


@dataclass
class Result:
    """What a search returns. Figures of merit are always minimised.

    Attributes:
      best_params: physical parameters of the best start (the same pytree as the space).
      best_fom: the best figure of merit (``inf`` when no start was ever finite).
      best_index: index of the best start (``-1`` when no start was ever finite).
      foms: ``(n_starts,)`` each start's best figure of merit.
      params: each start's best physical parameters (leaves with a leading ``n_starts`` axis).
      start_params: where each start began (physical, leading ``n_starts`` axis).
      status: ``(n_starts,)`` array of :class:`multistart.Status`.
      n_steps: ``(n_starts,)`` engine steps each start took (one evaluation each).
      n_evals: ``(n_starts,)`` evaluations of the objective each start made: its steps plus
        any its rule made itself (an optax line search's trials).
      best_step: ``(n_starts,)`` the step at which each start found its best (``-1``: never).
      history: ``(n_rows, n_starts)`` best-so-far figure of merit per recorded step and start.
      history_steps: ``(n_rows,)`` the step (1-based count of steps taken) of each history row.
      stats: run statistics: ``n_compiles`` (compiles of the chunk step), ``n_compiles_total``,
        ``compile_s``, ``wall_s``, ``n_evals``, ``batch_size``, ... .
      paths: dotted parameter names, in the order of the space's leaves.
      config: the search's configuration, for the record.
      resurrections: ``(n_starts,)`` how many times each slot's start was replaced
        (``resurrect``); all zeros without resurrection.
      incarnations: with resurrection, one record (a dict: ``slot``, ``incarnation``, ``fom``,
        ``params``, ``start_params``, ``status``, ``n_steps``, ``best_step``, ``started_at``,
        ``replaced_at``) for every start that ever ran in a slot that was resurrected, the final
        one included (``replaced_at`` is ``None``). The per-slot arrays above show each slot's
        best incarnation (lowest finite figure of merit; the latest on ties or when none was
        finite), and ``history`` is the slot's best over its incarnations so far, so a replaced
        start's best point is never lost.
    """

    best_params: Any
    best_fom: float
    best_index: int
    foms: np.ndarray
    params: Any
    start_params: Any
    status: np.ndarray
    n_steps: np.ndarray
    best_step: np.ndarray
    history: np.ndarray
    history_steps: np.ndarray
    stats: dict = field(default_factory=dict)
    paths: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    resurrections: np.ndarray | None = None
    incarnations: list = field(default_factory=list)
    n_evals: np.ndarray | None = None

    def __post_init__(self):
        if self.n_evals is None:
            self.n_evals = np.asarray(self.n_steps).copy()
        if self.resurrections is None:
            self.resurrections = np.zeros(np.shape(self.foms)[0], dtype=np.int64)

    @property
    def n_starts(self) -> int:
        return int(self.foms.shape[0])

    @property
    def best_history(self) -> np.ndarray:
        """Best-so-far over all starts at each history row."""
        h = np.where(np.isnan(self.history), np.inf, self.history)
        return h.min(axis=1) if h.size else h.reshape(0)

    def status_counts(self) -> dict[str, int]:
        counts = Counter(str(s) for s in self.status)
        return {str(s): counts[str(s)] for s in Status if counts[str(s)]}

    def ranked(self) -> np.ndarray:
        """Start indices from best to worst figure of merit (non-finite last)."""
        f = np.where(np.isfinite(self.foms), self.foms, np.inf)
        return np.argsort(f, kind="stable")

    def distinct_minima(
        self, xtol: float = 1e-6, ftol: float = 1e-6, *, include_nonfinite: bool = False
    ) -> list[Minimum]:
        """Group the ended starts into distinct local minima, best first.

        Two starts share a minimum when their figures of merit agree within ``ftol`` and every
        parameter within ``xtol`` (relative above magnitude 1, absolute below), as in MATLAB's
        MultiStart. Starts stopped as ``nonfinite`` are left out unless ``include_nonfinite``
        (their best finite point, if any, then takes part); starts with no finite figure of
        merit never do.

        Returns:
          A list of :class:`Minimum` (fom, params, starts), sorted by figure of merit.
        """
        leaves = jax.tree_util.tree_leaves(self.params)
        x = np.concatenate([np.asarray(v).reshape(self.n_starts, -1) for v in leaves], axis=1)
        f = np.asarray(self.foms, dtype=np.float64).copy()
        if not include_nonfinite:
            f[np.array([s is Status.NONFINITE for s in self.status], dtype=bool)] = np.inf
        labels = cluster_minima(x, f, xtol=xtol, ftol=ftol)
        minima = []
        for label in range(labels.max(initial=-1) + 1):
            members = np.flatnonzero(labels == label)
            members = members[np.argsort(f[members], kind="stable")]
            head = int(members[0])
            params = jax.tree_util.tree_map(lambda a, h=head: np.asarray(a)[h], self.params)
            minima.append(Minimum(float(f[head]), params, tuple(int(m) for m in members)))
        return minima

    def start(self, i: int) -> dict:
        """One start's record as a dict."""
        return {
            "index": i,
            "fom": float(self.foms[i]),
            "status": self.status[i],
            "n_steps": int(self.n_steps[i]),
            "best_step": int(self.best_step[i]),
            "resurrections": int(self.resurrections[i]),
            "params": jax.tree_util.tree_map(lambda a: np.asarray(a)[i], self.params),
        }

    # -- results as data --------------------------------------------------------------------

    def to_dataframe(self):
        """One row per start, as a ``pandas.DataFrame``.

        Columns: ``index``, ``fom``, ``status`` (the :class:`multistart.Status` value, e.g.
        ``"converged"``), ``n_steps``, ``best_step``, then each parameter at the start's best
        by dotted name (an array parameter expands to ``name[i]`` or ``name[i,j]`` columns),
        then where each start began, as ``start:<column>``.

        pandas is an optional dependency (the ``plots`` extra): a search on a cluster node
        needs only NumPy, and ``save``/``load`` keep every record without it.

        Raises:
          ImportError: pandas is not installed.
          ValueError: a parameter's column name collides with a record column.
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                f"Result.to_dataframe() needs pandas; install it with {_PLOTS_HINT}"
            ) from e
        columns: dict[str, np.ndarray] = {
            "index": np.arange(self.n_starts),
            "fom": np.asarray(self.foms),
            "status": np.array([str(s) for s in self.status], dtype=object),
            "n_steps": np.asarray(self.n_steps),
            "n_evals": np.asarray(self.n_evals),
            "best_step": np.asarray(self.best_step),
        }
        params = _expand_columns(self.paths, jax.tree_util.tree_leaves(self.params))
        for name in params:
            if name in columns:
                raise ValueError(
                    f"parameter column {name!r} collides with the record column {name!r}; "
                    "rename the parameter to tabulate this result"
                )
        columns.update(params)
        starts = _expand_columns(self.paths, jax.tree_util.tree_leaves(self.start_params))
        columns.update({_START_PREFIX + k: v for k, v in starts.items()})
        return pd.DataFrame(columns)

    def save(self, path) -> None:
        """Write every field to one ``.npz`` file at ``path`` (exactly that path).

        Arrays (figures of merit, statuses, steps, history, every start's parameters) are NumPy
        arrays in the archive; the rest (``best_fom``, ``best_index``, ``stats``, ``paths``,
        ``config``, the parameter tree) is JSON in its ``__meta__`` entry. Nothing is
        pickled. ``stats`` and ``config`` must hold JSON values (NumPy scalars and arrays are
        converted; tuples come back as lists); dict keys in the parameter tree must be
        ``str`` or ``int``.
        """
        leaves = {
            kind: jax.tree_util.tree_leaves(getattr(self, kind))
            for kind in ("params", "start_params", "best_params")
        }
        meta = {
            "format": _FORMAT,
            "version": _VERSION,
            "best_fom": float(self.best_fom),
            "best_index": int(self.best_index),
            "stats": self.stats,
            "paths": list(self.paths),
            "config": self.config,
            "tree": _encode_tree(self.params),
            "n_leaves": len(leaves["params"]),
            "incarnations": [
                {k: (str(v) if k == "status" else v) for k, v in r.items() if "params" not in k}
                for r in self.incarnations
            ],
            "incarnation_keys": list(self.incarnations[0]) if self.incarnations else [],
        }
        text = json.dumps(meta, default=_json_default, allow_nan=True)
        arrays = {
            "__meta__": np.frombuffer(text.encode("utf-8"), dtype=np.uint8),
            "foms": np.asarray(self.foms),
            "status": np.array([str(s) for s in self.status], dtype=str),
            "n_steps": np.asarray(self.n_steps),
            "n_evals": np.asarray(self.n_evals),
            "best_step": np.asarray(self.best_step),
            "history": np.asarray(self.history),
            "history_steps": np.asarray(self.history_steps),
        }
        for kind, kind_leaves in leaves.items():
            for i, leaf in enumerate(kind_leaves):
                arrays[f"{kind}/{i}"] = np.asarray(leaf)
        arrays["resurrections"] = np.asarray(self.resurrections)
        for kind in ("params", "start_params"):
            per_record = [jax.tree_util.tree_leaves(r[kind]) for r in self.incarnations]
            for i, column in enumerate(zip(*per_record, strict=True)):
                arrays[f"incarnations/{kind}/{i}"] = np.stack([np.asarray(v) for v in column])
        with open(os.fspath(path), "wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path) -> Result:
        """Read a Result written by :meth:`save` (no pickle is ever loaded)."""
        with np.load(os.fspath(path), allow_pickle=False) as z:
            if "__meta__" not in z.files:
                raise ValueError(f"{os.fspath(path)!r} is not a saved multistart Result")
            meta = json.loads(z["__meta__"].tobytes().decode("utf-8"))
            if meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
                raise ValueError(
                    f"{os.fspath(path)!r}: unknown format {meta.get('format')!r} version "
                    f"{meta.get('version')!r}; this multistart reads {_FORMAT} {_VERSION}"
                )
            n = meta["n_leaves"]

            def tree(kind, scalars=False):
                leaves = [z[f"{kind}/{i}"] for i in range(n)]
                if scalars:  # best_params leaves are per-start values: 0-d back to scalars
                    leaves = [a[()] if a.ndim == 0 else a for a in leaves]
                return _decode_tree(meta["tree"], leaves)

            incarnations = []
            for j, r in enumerate(meta.get("incarnations", [])):
                values = dict(r, status=Status(r["status"]))
                for kind in ("params", "start_params"):
                    leaves = [z[f"incarnations/{kind}/{i}"][j] for i in range(n)]
                    leaves = [a[()] if a.ndim == 0 else a for a in leaves]
                    values[kind] = _decode_tree(meta["tree"], leaves)
                incarnations.append({k: values[k] for k in meta["incarnation_keys"]})
            return cls(
                best_params=tree("best_params", scalars=True),
                best_fom=float(meta["best_fom"]),
                best_index=int(meta["best_index"]),
                foms=z["foms"],
                params=tree("params"),
                start_params=tree("start_params"),
                status=np.array([Status(s) for s in z["status"]], dtype=object),
                n_steps=z["n_steps"],
                best_step=z["best_step"],
                history=z["history"],
                history_steps=z["history_steps"],
                stats=meta["stats"],
                paths=meta["paths"],
                config=meta["config"],
                resurrections=z["resurrections"],
                incarnations=incarnations,
                n_evals=z["n_evals"] if "n_evals" in z.files else None,
            )

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.status_counts().items())
        return (
            f"Result(best_fom={self.best_fom:.6g}, best_index={self.best_index}, "
            f"n_starts={self.n_starts}, status: {counts}, "
            f"n_compiles={self.stats.get('n_compiles')}, wall_s={self.stats.get('wall_s', 0):.3g})"
        )


def _expand_columns(paths: list[str], leaves: list) -> dict[str, np.ndarray]:
    """``{column: (n_starts,) values}``; an array parameter gives one column per element."""
    out: dict[str, np.ndarray] = {}
    for name, leaf in zip(paths, leaves, strict=True):
        a = np.asarray(leaf)
        if a.ndim == 1:
            out[name] = a
            continue
        for idx in np.ndindex(a.shape[1:]):
            out[f"{name}[{','.join(str(i) for i in idx)}]"] = a[(slice(None), *idx)]
    return out


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"Result.save: {type(x).__name__} {x!r} is not JSON-serialisable")


def _encode_tree(tree, counter=None):
    """A params pytree (nested dicts of arrays) as JSON: dicts as key/value pairs, leaves as
    their index in ``jax.tree_util`` order (which sorts dict keys, as this does)."""
    counter = [0] if counter is None else counter
    if isinstance(tree, dict):
        items = []
        for key in sorted(tree):
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"Result.save: parameter keys must be str or int; got {key!r}")
            items.append([key, _encode_tree(tree[key], counter)])
        return {"dict": items}
    counter[0] += 1
    return {"leaf": counter[0] - 1}


def _decode_tree(code, leaves):
    if "dict" in code:
        return {key: _decode_tree(sub, leaves) for key, sub in code["dict"]}
    return leaves[code["leaf"]]
