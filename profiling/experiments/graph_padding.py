"""Compile time of a multi-band graph with and without padding to a common grid.

Arms (the demo's bands: 24x24, 32x32 and 48x48 pixels; see ``multistart.demo``):

- ``one_band``: the 48x48 band alone (one factor), the reference.
- ``hetero``: the three bands as they are: three distinct data shapes.
- ``padded``: the three bands zero-padded to 48x48 (``pad_to_common_shape=True``).
- ``padded_vmap``: padded and stacked, the log-likelihood vmapped over the band axis
  (``pad_to_common_shape=True, vmap_factors=True``).

Each arm runs in a fresh Python process with the persistent compilation cache disabled, and
measures three things:

- ``step``: compile of the search's chunk step (``MultiStartProdigy``, ``batch_size`` starts),
  as ``result.stats["compile_s"]`` reports it: what a user waits for;
- ``vg``: compile of a bare ``jit(vmap(value_and_grad(fom)))`` at the same width: the model's
  own share, independent of the engine's step;
- ``run``: seconds per step after the compile (padding costs extra pixels at run time).

Rounds interleave the arms (``harness.interleave``: the order reversed every other round) and
the table reports medians and ratios to ``one_band`` and to ``hetero``, all from this one run.
Absolute seconds are noise on a shared machine; the ratios are the figure. ``--json PATH``
writes the run's record.

Run: ``python profiling/experiments/graph_padding.py`` (``--rounds 3 --batch-size 4 --steps 30``).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # profiling/

import harness  # noqa: E402

ARMS = {
    "one_band": dict(bands=["i"], pad_to_common_shape=False, vmap_factors=False),
    "hetero": dict(bands=["g", "r", "i"], pad_to_common_shape=False, vmap_factors=False),
    "padded": dict(bands=["g", "r", "i"], pad_to_common_shape=True, vmap_factors=False),
    "padded_vmap": dict(bands=["g", "r", "i"], pad_to_common_shape=True, vmap_factors=True),
}


def measure(arm: str, batch_size: int, steps: int) -> dict:
    """One arm, in this (fresh) process: compile and run times in seconds."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import numpy as np

    import multistart as ms
    from multistart import demo

    spec = ARMS[arm]
    data = demo.make_bands()
    graph = demo.demo_graph(
        {b: data[b] for b in spec["bands"]},
        pad_to_common_shape=spec["pad_to_common_shape"],
        vmap_factors=spec["vmap_factors"],
    )
    problem = graph.multistart_problem()
    centre = graph.space.from_unit(
        [np.full((batch_size, *p.shape), 0.5) for p in graph.space.priors]
    )
    centre = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), centre)
    vg = jax.jit(jax.vmap(jax.value_and_grad(problem.fom), in_axes=(0, None)))
    t0 = time.perf_counter()
    vg.lower(centre, problem.data).compile()
    vg_s = time.perf_counter() - t0

    search = ms.MultiStartProdigy(
        n_starts=batch_size, batch_size=batch_size, n_steps=steps, convergence=None, log_every=0
    )
    result = search.fit(graph)
    st = result.stats
    run_s = (st["loop_s"] - st["first_step_s"]) / max(st["n_steps_run"] - 1, 1)
    return {"step": st["compile_s"], "vg": vg_s, "run": run_s}


def run_arm(arm: str, batch_size: int, steps: int) -> dict:
    """One arm in a fresh process (the persistent compilation cache off there)."""
    env = {"JAX_COMPILATION_CACHE_DIR": None, "MULTISTART_LOG_LEVEL": "WARNING"}
    argv = ["--arm", arm, "--batch-size", batch_size, "--steps", steps]
    m = harness.fresh_process(__file__, *argv, env=env)
    print(
        f"{arm:<12} step {m['step']:.2f} s  vg {m['vg']:.2f} s  run {m['run'] * 1e3:.2f} ms/step",
        flush=True,
    )
    return m


def table(medians: dict[str, dict], rounds: int) -> str:
    base, het = medians["one_band"], medians["hetero"]
    lines = [
        f"median of {rounds} rounds; ratios to one_band (x1) and to hetero (xH)",
        f"{'arm':<12} {'step s':>7} {'x1':>6} {'xH':>6}   {'vg s':>6} {'x1':>6} {'xH':>6}"
        f"   {'run ms':>7} {'x1':>6} {'xH':>6}",
    ]
    for arm, m in medians.items():
        row = f"{arm:<12}"
        for key, scale, width in (("step", 1, 7), ("vg", 1, 6), ("run", 1e3, 7)):
            row += f" {m[key] * scale:>{width}.2f} {m[key] / base[key]:>6.2f}"
            row += f" {m[key] / het[key]:>6.2f}  "
        lines.append(row.rstrip())
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    harness.add_arguments(parser)
    args = parser.parse_args()
    if args.arm:
        harness.child_result(measure(args.arm, args.batch_size, args.steps))
        return
    arms = {a: functools.partial(run_arm, a, args.batch_size, args.steps) for a in ARMS}
    samples = harness.interleave(arms, args.rounds)
    medians = {
        a: {k: harness.median(s[k] for s in samples[a]) for k in ("step", "vg", "run")}
        for a in ARMS
    }
    print(table(medians, args.rounds))
    record = harness.Record("graph_padding", args)
    for arm, m in medians.items():
        for key, value in m.items():
            record.figure(f"{arm} {key} s", value)
    for arm in ARMS:
        for key in ("step", "vg", "run"):
            for peer in ("one_band", "hetero"):
                record.ratio(f"{arm} {key} / {peer}", f"{arm} {key} s", f"{peer} {key} s")
    record.write(args.json)


if __name__ == "__main__":
    main()
