"""The lead of "Where the least-squares chunk step's compile goes": the population's state in
one block per dtype, measured before it is built.

Today the population is 15 arrays (``multistart.device.step.StartState``'s leaves: the point,
the best point, the rollback point, the solver's three arrays, the counters...), and the chunk
step gathers, selects and scatters each. Here the same body (``chunk_step_parts.variant``: the
chunk step's own, five steps of its loop) is compiled with the state packed into one
``(rows, k)`` block per dtype (float64, int32, int8):

- ``leaves``: today's layout (the reference);
- ``packed storage``: the blocks gathered and scattered, the chunk unpacked for the rest;
- ``packed storage and starts``: also the new starts' initial states selected on the blocks;
- ``packed, the loop's state too``: also each step's state packed again in the loop.

Each arm compiles in its own fresh process (the persistent cache off, its compile the
process's first), arms interleaved over ``--rounds``; printed: the median compile seconds, the
ratio to ``leaves``, XLA's fusions, and whether five steps of the arm give today's state bit
for bit (the packing only moves data).

    python profiling/experiments/packed_population.py Misra1a DanWood --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # chunk_step_parts
sys.path.insert(0, str(HERE.parent))  # harness, fixed_cost
sys.path.insert(0, str(HERE.parent.parent / "tests"))  # nist

import harness  # noqa: E402

ARMS = ("leaves", "packed storage", "packed storage and starts", "packed, the loop's state too")


def _layout(tree):
    """``(treedef, [(dtype, offset, size, shape)] a leaf, {dtype: width})`` of a stacked tree."""
    import jax
    import numpy as np

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    widths: dict[str, int] = {}
    spec = []
    for leaf in leaves:
        name, shape = np.dtype(leaf.dtype).name, tuple(leaf.shape[1:])
        size = int(np.prod(shape)) if shape else 1
        spec.append((name, widths.get(name, 0), size, shape))
        widths[name] = widths.get(name, 0) + size
    return treedef, spec, widths


def _pack(tree, layout):
    import jax
    import jax.numpy as jnp

    _, spec, widths = layout
    leaves = jax.tree_util.tree_leaves(tree)
    blocks = {}
    for name in widths:
        parts = [
            x.reshape(x.shape[0], -1) for x, s in zip(leaves, spec, strict=True) if s[0] == name
        ]
        blocks[name] = jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    return blocks


def _unpack(blocks, layout):
    import jax

    treedef, spec, _ = layout
    leaves = [
        blocks[name][:, offset : offset + size].reshape((blocks[name].shape[0],) + shape)
        for name, offset, size, shape in spec
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _packed_body(start_step, init_rows, layout, *, starts_packed: bool, carry_packed: bool):
    """``chunk_step_parts.variant``'s body on the blocks (five steps of the loop)."""
    import jax
    import jax.numpy as jnp

    from multistart.device.step import _RUNNING, _started

    vstep = jax.vmap(start_step, in_axes=(0, None))

    def started(blocks, new):
        take, u_new = new
        take = take != 0
        chunk = _unpack(blocks, layout)
        chunk = chunk._replace(
            u=jnp.where(take[:, None], u_new, chunk.u),
            status=jnp.where(take, jnp.int8(_RUNNING), chunk.status),
            n_steps=jnp.where(take, 0, chunk.n_steps),
        )
        fresh = (chunk.status == _RUNNING) & (chunk.n_steps == 0)
        blocks = _pack(chunk, layout)

        def start(b):
            made = _pack(init_rows(_unpack(b, layout).u), layout)
            return {k: jnp.where(fresh[:, None], made[k], b[k]) for k in b}

        return jax.lax.cond(jnp.any(fresh), start, lambda b: b, blocks)

    def body(blocks, history, gather, scatter, new):
        chunk_b = {k: v[gather] for k, v in blocks.items()}
        if starts_packed:
            chunk_b = started(chunk_b, new)
            chunk = _unpack(chunk_b, layout)
        else:
            chunk = _started(_unpack(chunk_b, layout), new, init_rows)

        def one(c):
            j, state, h = c
            out = jax.lax.optimization_barrier(
                vstep(_unpack(state, layout) if carry_packed else state, None)
            )
            h = h.at[j, scatter].set(out.best_fom, mode="drop")
            return j + 1, _pack(out, layout) if carry_packed else out, h

        first = (jnp.zeros((), jnp.int32), _pack(chunk, layout) if carry_packed else chunk, history)
        _, state, h = jax.lax.while_loop(lambda c: c[0] < 5, one, first)
        out = state if carry_packed else _pack(state, layout)
        return {k: blocks[k].at[scatter].set(out[k], mode="drop") for k in blocks}, h

    return body


def child(name: str, arm: str) -> None:
    """One arm in this process: its compile timed (the process's first), then five steps of
    it and of today's body from the same state, compared bit for bit."""
    import chunk_step_parts as parts  # installs its capture of the chunk step's parts
    import fixed_cost
    import jax
    import jax.numpy as jnp
    import nist
    import numpy as np

    from multistart.device.step import PopState

    problem = nist.load(name)
    fixed_cost.ours(problem, False)  # one fit of the library: its start step, captured
    jax.config.update("jax_enable_compilation_cache", False)
    jax.clear_caches()
    step, init_rows = parts._grab["start_step"], parts._grab["init_rows"]
    n, rows, width = len(problem.names), parts.ROWS, parts.WIDTH
    rng = np.random.default_rng(0)
    starts = init_rows(jnp.asarray(rng.uniform(-1.0, 1.0, (rows, n))))
    starts = starts._replace(n_steps=jnp.asarray(rng.integers(0, 2, rows), jnp.int32))
    pop = PopState(starts, jnp.zeros((10, rows)))
    layout = _layout(starts)
    gather = jnp.asarray(rng.permutation(rows)[:width], jnp.int32)
    take = jnp.asarray(rng.integers(0, 2, width), jnp.int32)
    new = (take, jnp.asarray(rng.uniform(-1.0, 1.0, (width, n))))
    today = jax.jit(parts.variant(step, init_rows))
    if arm == "leaves":
        fn, args = today, (pop, gather, gather, new)
    else:
        body = _packed_body(
            step,
            init_rows,
            layout,
            starts_packed=arm != "packed storage",
            carry_packed=arm == "packed, the loop's state too",
        )
        fn, args = jax.jit(body), (_pack(starts, layout), pop.history, gather, gather, new)
    lowered = fn.lower(*args)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    fusions = compiled.as_text().count(" fusion(")
    out = compiled(*args)
    reference = today(pop, gather, gather, new)
    got = out if arm == "leaves" else PopState(_unpack(out[0], layout), out[1])
    same = all(
        np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
        for a, b in zip(
            jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(reference), strict=True
        )
    )
    harness.child_result({"compile_s": compile_s, "fusions": fusions, "same": same})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=["Misra1a"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("PROBLEM", "ARM"))
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return
    env = {"MULTISTART_LOG_LEVEL": "ERROR", "MULTISTART_CACHE_DIR": None}
    for name in args.problems:
        runs: dict[str, list] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                with tempfile.TemporaryDirectory() as folder:
                    env["MULTISTART_CACHE_DIR"] = folder
                    runs[arm].append(harness.fresh_process(__file__, "--child", name, arm, env=env))
        base = harness.median([r["compile_s"] for r in runs["leaves"]])
        print(f"{name}: compile s (median of {args.rounds}), / leaves, fusions, bit for bit")
        for arm, rs in runs.items():
            s = harness.median([r["compile_s"] for r in rs])
            same = all(r["same"] for r in rs)
            print(f"  {arm:<30}{s:7.3f}{s / base:7.2f}x{rs[0]['fusions']:6d}  {same}")


if __name__ == "__main__":
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")
    main()
