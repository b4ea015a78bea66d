"""One identity for "the same search of the same model", shared by checkpoints and tuning.

A search is identified by three hashes, each stable across processes:

- ``model``: the lowered figure of merit (StableHLO text, which holds no Python object
  addresses), every array it captures, its data, the space and the dtype;
- ``rule``: the lowered per-start step, which holds the model and the rule with its
  hyperparameters (an optax learning rate is a constant of the program), the guard and the
  convergence settings, plus the arrays the step captures;
- ``config``: the search's configuration as JSON, without ``n_steps`` (a search may be resumed
  with a larger one; the checkpoint records it separately).

The identity also keeps the values behind the hashes that a person can read (the rule's name
and hyperparameters, the configuration), so a mismatch can say what differs.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..common import background, xla
from ..common.digest import hash_array, trace_text
from ..model.problem import datum
from .config import SearchConfig

__all__ = [
    "SearchIdentity",
    "Traces",
    "trace_search",
    "search_identity",
    "describe_difference",
    "config_hash",
    "programs_key",
]


#: A search whose data (and captured arrays) pass this many bytes, and that writes no
#: checkpoint, hashes them on a worker thread while it runs (hashlib lets go of the GIL): the
#: data of 200,000 small fits took 61 ms to hash on a TPU VM's host, before the first step.
HASH_LATER_BYTES = 8 << 20


@dataclass(frozen=True)
class SearchIdentity:
    """The three hashes of a search, and what a person needs to read a difference."""

    digests: Any  # "model", "rule", "config" -> hash, or a Future of that dict (hashed later)
    program: str  # the lowered step's hash alone (the tuning record's key uses it)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def hashes(self) -> dict[str, str]:
        """What the Result and checkpoints record (waiting for the worker, where it hashes)."""
        digests = self.digests
        return digests.result() if isinstance(digests, Future) else digests

    def record(self) -> dict[str, Any]:
        """What a checkpoint stores: the hashes and the readable values."""
        return {**self.hashes, "values": self.values}


def _comparable(config: dict, ignore=()) -> dict:
    # options a resumed search may change (budgets, width, display: config.OnResume)
    return {k: v for k, v in config.items() if not SearchConfig.resumable(k) and k not in ignore}


def config_hash(config: dict) -> str:
    """The ``config`` hash of an identity: its JSON values, less the options a resumed search
    may change."""
    values = json.loads(json.dumps(config, default=str))
    return hashlib.sha256(json.dumps(_comparable(values), sort_keys=True).encode()).hexdigest()[:32]


class Traces(NamedTuple):
    """The lowered figure of merit and per-start step, each ``(text, captured arrays)``: what
    an identity hashes besides the data's values and the configuration (the same for a refit
    of new data of the same shapes, so a refit may reuse them)."""

    fom: tuple[str, list]
    step: tuple[str, list]


def trace_search(problem, dtype, start_step, one_start) -> tuple[Traces, Any]:
    """One trace each of the figure of merit and of the step (tracing a large model is not
    free), for one row's data (one dataset of a stack); and the step's trace itself, which
    the chunk step replays (:func:`multistart.common.digest.replay`) instead of tracing the
    step's Python a second time."""
    data = datum(problem)
    *step, traced = trace_text(start_step, one_start, data, keep=True)
    return Traces(trace_text(problem.fom, problem.space.example(dtype), data), tuple(step)), traced


def search_identity(
    problem, dtype, traces: Traces, config: dict, *, later: bool = False
) -> SearchIdentity:
    """The identity of fitting ``problem`` with the step of ``traces`` under ``config``.

    A fit makes it once, when its starts are planned (:func:`multistart.host.engine.build`);
    a resumed fit makes one more before the plan, without the starts, to refuse another
    search's checkpoint before the filter compiles. ``later``: hash arrays past
    :data:`HASH_LATER_BYTES` on a worker thread (the hashes are read when the Result is made).
    """
    program = hashlib.sha256(traces.step[0].encode()).hexdigest()
    values = json.loads(json.dumps(config, default=str))
    arrays = [*traces.fom[1], *jax.tree_util.tree_leaves(problem.data), *traces.step[1]]

    def digests() -> dict[str, str]:
        model = hashlib.sha256()
        model.update(repr(problem.space).encode())
        model.update(str(np.dtype(dtype)).encode())
        text, consts = traces.fom
        model.update(text.encode())
        for const in consts:
            hash_array(model, const)
        for leaf in jax.tree_util.tree_leaves(problem.data):
            hash_array(model, leaf)
        rule = hashlib.sha256(program.encode())
        rule.update(model.hexdigest().encode())
        for const in traces.step[1]:
            hash_array(rule, const)
        return {
            "model": model.hexdigest()[:32],
            "rule": rule.hexdigest()[:32],
            "config": config_hash(values),
        }

    if later and sum(getattr(a, "nbytes", 0) for a in arrays) > HASH_LATER_BYTES:
        return SearchIdentity(background.submit("identity", digests), program, values)
    return SearchIdentity(digests(), program, values)


def describe_difference(old: dict, new: SearchIdentity, ignore=()) -> str | None:
    """What differs between a stored identity record and ``new``, in words (``None``: same).

    ``ignore``: configuration keys not compared (``"starts"`` before the plan is made).
    """
    if old.get("model") != new.hashes["model"]:
        return "another model (its figure of merit, data, space or dtype differ)"
    before = _comparable(old.get("values", {}), ignore)
    after = _comparable(new.values, ignore)
    same = before == after if ignore else old.get("config") == new.hashes["config"]
    if not same:
        keys = sorted(set(before) | set(after))
        changed = [
            f"{k} {before.get(k)!r} -> {after.get(k)!r}"
            for k in keys
            if before.get(k) != after.get(k)
        ]
        return "another configuration (" + ("; ".join(changed) or "its settings differ") + ")"
    if old.get("rule") != new.hashes["rule"]:
        return (
            f"another rule or hyperparameters ({before.get('rule')!r} "
            f"{before.get('hyperparameters')!r} -> {after.get('rule')!r} "
            f"{after.get('hyperparameters')!r}; the compiled step differs)"
        )
    return None


def programs_key(problem, solver, options: SearchConfig, dtype):
    """What the jitted functions of a fit of ``problem`` depend on but take as no argument,
    and the shapes they are compiled for (:func:`multistart.device.programs.programs_for`): the
    model's key, the rule and the options the programs may depend on; ``None`` when the
    problem has no ``program_key`` or the rule is not described by plain values."""
    rule = vars(solver)
    plain = (int, float, str, bool, type(None))
    if problem.program_key is None or not all(isinstance(v, plain) for v in rule.values()):
        return None
    shapes = tuple(
        (np.shape(a), jnp.result_type(a).name) for a in jax.tree_util.tree_leaves(problem.data)
    )
    return (
        problem.program_key,
        repr(problem.space),
        str(np.dtype(dtype)),
        type(solver),
        tuple(sorted(rule.items())),
        jax.tree_util.tree_structure(problem.data),
        shapes,
        problem.rows_per_datum,
        options.program_key(),  # every option the programs may depend on (SearchConfig's fields)
        jax.process_count(),
        xla.platform(),  # a chip's programs solve entry by entry (solvers/small.py)
    )
