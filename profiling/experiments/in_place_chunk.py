"""A fit in one chunk, stepped in place: what the chunk step's compile and a cold fit save when
a chunk as wide as the population is neither gathered nor scattered. (Issue 38; profiling/
HISTORY.md, "A chunk as wide as the population, stepped where it lies".)

Two checkouts of the library (``--before PATH``, ``--after PATH``) in turns over ``--rounds``,
each fit in a fresh process with an empty cache folder (cold: nothing compiled, no tuning
record), beside the hand-written optimistix vmap of ``fixed_cost.py`` (its peer arm, one
compile and call of the same model, in a process of its own):

- ``curve_fit``: ``fixed_cost.py``'s small ``ms.curve_fit`` (3 parameters, 50 points), its wall;
- ``--problem NAME`` (default DanWood): ``MultiStartLeastSquares(n_starts=32, seed=0)``'s first
  fit of a NIST problem, its wall and the chunk step's compile seconds (JAX's monitoring
  events: the longest backend compile of the fit, the chunk step's).

Medians over the rounds, as ratios: after against before, and each against the vmap. With
``--image``, instead: the heavy image fit (``profiling/image_model.py``, 48 parameters) at width
32 of 32 starts, ``MultiStartLBFGS(n_steps=40, convergence=None)``, its steady seconds a step
(a second fit of the same search, timed, over its 40 steps), the two checkouts in turns, and
the median of each round's after / before.

    python profiling/experiments/in_place_chunk.py --before /tmp/before --after . --rounds 6
    python profiling/experiments/in_place_chunk.py --before /tmp/before --after . --image --rounds 6

``--program`` (no checkouts): the image fit's chunk step alone, in this process, both ways at
width 32: on a population of 32 rows (in place) and of 33 (gathered, the extra row idle), five
L-BFGS steps a call, the two in turns over ``--rounds`` calls each (medians), and whether they
leave the same state. With ``XLA_FLAGS=--xla_cpu_use_thunk_runtime=false`` (XLA's older CPU
runtime) or under ``taskset -c 0`` (one core), the same comparison without the runtime's
concurrency.

    python profiling/experiments/in_place_chunk.py --program --rounds 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness, fixed_cost, nist_strd
sys.path.insert(0, str(HERE.parent.parent / "tests"))  # nist

import harness  # noqa: E402

FIXED_COST = HERE.parent / "fixed_cost.py"


def child(problem_name: str) -> None:
    """One cold first fit of a NIST problem in this process: its wall and compile seconds."""
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    import jax
    import jax.monitoring
    import nist
    from fixed_cost import Counted
    from nist_strd import space_of

    jax.config.update("jax_enable_x64", True)
    compiles: list[float] = []

    def listen(name, seconds, **_):
        if name.endswith("backend_compile_duration"):
            compiles.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    import multistart as ms

    problem = nist.load(problem_name)
    search = ms.MultiStartLeastSquares(n_starts=32, seed=0, progress=False)
    t0 = time.perf_counter()
    result = search.fit(Counted(problem).named, space_of(problem))
    wall = time.perf_counter() - t0
    harness.child_result(
        {
            "seconds": wall,
            "chunk_compile_s": max(compiles),
            "width": result.stats.get("batch_size"),
        }
    )


def image_child() -> None:
    """The image fit's steady seconds a step at width 32, in this process."""
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    import image_model

    import multistart as ms

    objective, space, _ = image_model.make_problem()
    search = ms.MultiStartLBFGS(
        n_starts=32, n_steps=40, batch_size=32, convergence=None, progress=False, seed=0
    )
    search.fit(objective, space)  # its compile
    t0 = time.perf_counter()
    result = search.fit(objective, space)
    harness.child_result(
        {"step_s": (time.perf_counter() - t0) / 40, "best": float(result.best_fom)}
    )


def image_rounds(before: str, after: str, rounds: int) -> None:
    """``--image``: the two checkouts' steady steps in turns; each round's ratio, and the median."""
    me = Path(__file__).resolve()
    ratios, bests = [], set()
    for i in range(rounds):
        got = {}
        for name, library in (("before", before), ("after", after))[:: 1 if i % 2 == 0 else -1]:
            with tempfile.TemporaryDirectory() as folder:
                env = {"MULTISTART_CACHE_DIR": folder, "PYTHONPATH": str(Path(library).resolve())}
                got[name] = harness.fresh_process(me, "--child", "image", env=env)
        ratios.append(got["after"]["step_s"] / got["before"]["step_s"])
        bests |= {got["after"]["best"], got["before"]["best"]}
        print(
            f"  round {i + 1}: {got['before']['step_s']:.4f} s a step before, "
            f"{got['after']['step_s']:.4f} after, ratio {ratios[-1]:.3f}"
        )
    print(f"the image fit at width 32, after / before a step: median {harness.median(ratios):.3f}")
    print(f"  best figures of merit: {', '.join(f'{b:.9g}' for b in sorted(bests))}")


def program_rounds(rounds: int) -> None:
    """``--program``: the image fit's chunk step in place against gathered, in this process."""
    import functools

    import image_model
    import jax
    import jax.numpy as jnp
    import numpy as np

    from multistart.device.chunking import chunk_indices
    from multistart.device.step import (
        clock,
        init_population,
        init_rows,
        make_chunk_step,
        make_start_step,
    )
    from multistart.model.priors import Space
    from multistart.solvers import LBFGS

    objective, space, truth = image_model.make_problem()
    flat = Space(space)
    n, k, window, solver = 32, 5, 8, LBFGS()
    step = make_start_step(lambda u, d: objective(flat.to_model(u)), solver, None, 8)
    chunk_step = make_chunk_step(step, functools.partial(init_rows, solver, window))
    program = jax.jit(chunk_step, donate_argnums=0)
    one = jax.tree_util.tree_map(lambda a: np.asarray(a)[None], truth)
    u = np.random.default_rng(0).normal(size=(n + 1, flat.ravel(one).shape[1])) * 0.5
    new = (np.zeros(n, np.int8), np.zeros((n, u.shape[1])))
    state, taken, seconds = {}, {}, {"in place": [], "gathered": []}
    for name, rows in (("in place", n), ("gathered", n + 1)):
        pop = init_population(solver, jnp.asarray(u[:rows]), 2000, window)
        (gather, scatter) = chunk_indices(np.arange(n), n, rows)[0]
        state[name] = (jax.tree_util.tree_map(jnp.array, pop), gather, scatter)
        taken[name] = 0
    for i in range(rounds + 1):  # the first call of each compiles and warms: not timed
        for name in list(seconds) if i % 2 == 0 else list(seconds)[::-1]:
            pop, gather, scatter = state[name]
            t0 = time.perf_counter()
            pop = jax.block_until_ready(
                program(pop, gather, scatter, new, clock(taken[name], k), None)
            )
            if i:
                seconds[name].append((time.perf_counter() - t0) / k)
            state[name], taken[name] = (pop, gather, scatter), taken[name] + k
    med = {name: harness.median(s) for name, s in seconds.items()}
    leaves = jax.tree_util.tree_leaves
    same = all(
        np.array_equal(np.asarray(a)[:n], np.asarray(b)[:n])
        for a, b in zip(
            leaves(state["in place"][0].starts), leaves(state["gathered"][0].starts), strict=True
        )
    )
    print(f"The image fit's chunk step at width 32, {rounds} calls of {k} steps each (medians)")
    print(f"  in place {med['in place']:.4f} s a step, gathered {med['gathered']:.4f}")
    print(f"  in place / gathered: {med['in place'] / med['gathered']:.3f}; same state: {same}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="a checkout of the library (the reference)")
    p.add_argument("--after", help="another checkout, measured against --before")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--problem", default="DanWood", help="a NIST problem (tests/nist.py)")
    p.add_argument("--image", action="store_true", help="the image fit's steady step instead")
    p.add_argument("--program", action="store_true", help="its chunk step alone, both ways")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return image_child() if args.child == "image" else child(args.child)
    if args.program:
        return program_rounds(args.rounds)
    if not (args.before and args.after):
        p.error("give --before and --after: two checkouts of the library")
    if args.image:
        return image_rounds(args.before, args.after, args.rounds)
    me = Path(__file__).resolve()
    arms = {
        "curve_fit before": (FIXED_COST, ("--child", "ours"), args.before),
        "curve_fit after": (FIXED_COST, ("--child", "ours"), args.after),
        f"{args.problem} before": (me, ("--child", args.problem), args.before),
        f"{args.problem} after": (me, ("--child", args.problem), args.after),
        "vmap": (FIXED_COST, ("--child", "vmap"), args.after),
    }
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for i in range(args.rounds):
        for name in list(arms) if i % 2 == 0 else list(arms)[::-1]:
            script, child_args, library = arms[name]
            with tempfile.TemporaryDirectory() as folder:
                env = {"MULTISTART_CACHE_DIR": folder, "PYTHONPATH": str(Path(library).resolve())}
                runs[name].append(harness.fresh_process(script, *child_args, env=env))
    med = {
        name: {
            k: harness.median(r[k] for r in got)
            for k in ("seconds", "chunk_compile_s")
            if k in got[0]
        }
        for name, got in runs.items()
    }
    vmap = med["vmap"]["seconds"]
    print(f"Cold fits in fresh processes, {args.rounds} rounds in turns (medians)")
    print(f"  {'arm':<20}{'wall s':>9}{'/ vmap':>9}{'chunk compile s':>17}")
    for name, m in med.items():
        compile_s = f"{m['chunk_compile_s']:.3f}" if "chunk_compile_s" in m else "-"
        print(f"  {name:<20}{m['seconds']:>9.3f}{m['seconds'] / vmap:>9.3f}{compile_s:>17}")
    for what in ("curve_fit", args.problem):
        a, b = med[f"{what} after"], med[f"{what} before"]
        line = f"  {what}, after / before: wall {a['seconds'] / b['seconds']:.3f}"
        if "chunk_compile_s" in a:
            line += f", chunk step's compile {a['chunk_compile_s'] / b['chunk_compile_s']:.3f}"
        print(line)
    widths = {r.get("width") for r in runs[f"{args.problem} after"]}
    print(f"  {args.problem}'s width: {', '.join(map(str, sorted(widths)))} (32 starts)")


if __name__ == "__main__":
    main()
