"""The engine against hand-written alternatives on the multi-dataset benchmark objective.

Arms (same starts, same Adam, same float32 objective, each in a fresh process with the
persistent compilation cache off, interleaved and repeated; medians reported):

  engine      MultiStartAdam(batch_size=W): guards, per-start bests, history, repacking
  hand_loop   a hand-written fused loop: jit(vmap(value_and_grad + adam + apply)) per chunk of
              W starts, chunk states kept in a Python list (no guards, no bookkeeping)
  per_start   jit(value_and_grad + adam + apply) of one start, looped over the starts
  lax_map     jit(lax.map(step, batch_size=W)) over all starts, one call per step
  full_vmap   jit(vmap(step)) over all starts, one call per step

Figures: time to first step (from the call to the end of the first step: tracing, compiling,
initialising and one step) and steady seconds per step afterwards, both as ratios to the hand
loop measured in the same run. ``--json PATH`` writes the run's record (``harness.py``).

    python profiling/experiments/engine_vs_hand.py                  # defaults: 16 starts, width 4
    python profiling/experiments/engine_vs_hand.py --repeats 5 --steps 80 --json engine_vs_hand.json
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # profiling/: the harness and the models
sys.path.insert(0, str(HERE))

import harness  # noqa: E402

ARMS = ["engine", "hand_loop", "per_start", "lax_map", "full_vmap"]


def run_arm(arm: str, n_starts: int, width: int, steps: int) -> dict:
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import jax.numpy as jnp
    import numpy as np
    import optax

    sys.path.insert(0, str(HERE))
    import benchmark_model as bm

    import multistart as ms
    from multistart.device.chunking import chunk_slices
    from multistart.model.priors import Space
    from multistart.starts.strategies import uniform_band_starts

    chi2 = bm.make_objective()
    space_tree = bm.space()

    if arm == "engine":
        t0 = time.perf_counter()
        search = ms.MultiStartAdam(
            n_starts=n_starts,
            batch_size=width,
            n_steps=steps,
            seed=0,
            convergence=None,
            log_every=0,
            learning_rate=0.05,
            n_candidates=0,  # the same uniform starts as the hand-written arms, no filter
        )
        result = search.fit(chi2, space_tree)
        st = result.stats
        assert st["n_compiles"] == 1
        # the loop's own time after the first step (the Result's assembly is not a step)
        steady = (st["loop_s"] - st["first_step_s"]) / (steps - 1)
        return {
            "first_step_s": st["first_step_s"],
            "steady_step_s": steady,
            "best": result.best_fom,
            "since_call_s": time.perf_counter() - t0,
        }

    t0 = time.perf_counter()
    space = Space(space_tree)
    x0 = uniform_band_starts(space, n_starts, np.random.default_rng(0))
    u0 = jax.tree_util.tree_map(jnp.asarray, space.to_unconstrained(x0, dtype=np.float32))
    opt = optax.adam(0.05)

    def f_u(u):
        return chi2(space.to_physical(u))

    def step(u, s):
        value, grad = jax.value_and_grad(f_u)(u)
        updates, s = opt.update(grad, s, u)
        return optax.apply_updates(u, updates), s, value

    def take(tree, lo, hi, pad):
        def one(a):
            rows = a[lo:hi]
            return jnp.concatenate([rows, jnp.repeat(rows[-1:], pad, axis=0)]) if pad else rows

        return jax.tree_util.tree_map(one, tree)

    if arm == "hand_loop":
        vstep = jax.jit(jax.vmap(step))
        vinit = jax.jit(jax.vmap(opt.init))
        chunks = []
        for lo, hi, pad in chunk_slices(n_starts, width):
            u = take(u0, lo, hi, pad)
            chunks.append((u, vinit(u)))

        def sweep(chunks):
            out = []
            for u, s in chunks:
                u, s, v = vstep(u, s)
                out.append((u, s, v))
            return [(u, s) for u, s, _ in out], [v for _, _, v in out]

    elif arm == "per_start":
        sstep = jax.jit(step)
        sinit = jax.jit(opt.init)
        chunks = []
        for i in range(n_starts):
            u = jax.tree_util.tree_map(lambda a, i=i: a[i], u0)
            chunks.append((u, sinit(u)))

        def sweep(chunks):
            out = [sstep(u, s) for u, s in chunks]
            return [(u, s) for u, s, _ in out], [v for _, _, v in out]

    elif arm in ("lax_map", "full_vmap"):
        if arm == "lax_map":
            body = jax.jit(lambda u, s: jax.lax.map(lambda a: step(*a), (u, s), batch_size=width))
        else:
            body = jax.jit(jax.vmap(step))
        chunks = [(u0, jax.jit(jax.vmap(opt.init))(u0))]

        def sweep(chunks):
            ((u, s),) = chunks
            u, s, v = body(u, s)
            return [(u, s)], [v]
    else:
        raise SystemExit(f"unknown arm {arm}")

    chunks, values = sweep(chunks)
    jax.block_until_ready(values)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(steps - 1):
        chunks, values = sweep(chunks)
    jax.block_until_ready(values)
    steady = (time.perf_counter() - t1) / (steps - 1)
    return {"first_step_s": first, "steady_step_s": steady}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-starts", type=int, default=16)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # child mode
    harness.add_arguments(parser)
    args = parser.parse_args()
    if args.arm:
        harness.child_result(run_arm(args.arm, args.n_starts, args.width, args.steps))
        return

    arms = args.arms.split(",")
    sizes = ["--n-starts", args.n_starts, "--width", args.width, "--steps", args.steps]
    child = functools.partial(harness.fresh_process, __file__)
    runs = harness.interleave(
        {a: functools.partial(child, "--arm", a, *sizes) for a in arms}, args.repeats
    )
    record = harness.Record("engine_vs_hand", args)
    for arm in arms:
        for key in ("first_step_s", "steady_step_s"):
            record.figure(f"{arm} {key}", harness.median(r[key] for r in runs[arm]))
    print(
        f"multi-dataset objective: 31 parameters, 4 datasets of different shapes; "
        f"{args.n_starts} starts, width {args.width}, {args.steps} steps, "
        f"median of {args.repeats} fresh processes per arm"
    )
    print(f"{'arm':<11} {'first step / hand':>18} {'steady step / hand':>19}")
    for arm in arms:
        f, s = (
            record.ratio(f"{arm} {key} / hand_loop", f"{arm} {key}", f"hand_loop {key}")
            for key in ("first_step_s", "steady_step_s")
        )
        print(f"{arm:<11} {f:>18.3f} {s:>19.3f}")
    record.write(args.json)


if __name__ == "__main__":
    main()
