"""The map to physical parameters inside the gradient: with and without a fusion boundary.

A start steps in unconstrained coordinates: the engine evaluates ``f(to_physical(u))`` and its
gradient. The map ends in selects (the clip to each prior's bounds); XLA's CPU compiler fuses
them, with the sigmoids and exps before them, into every consumer, so in a model that
broadcasts its parameters over pixels the map is recomputed per pixel in the gradient.
``multistart.model.priors.fusion_boundary`` (an exact product with an identity, which XLA keeps as a
dot) stops that. Arms, side by side in one process, taking turns (the median of 7 rounds), on
the image benchmark (48 parameters, float64) at the same 4 points:

  f at x (peer)       jit(value_and_grad(f)) at physical parameters passed in: no map at all
  map, no boundary    jit(value_and_grad(f o to_physical)) in unconstrained coordinates
  map + leaf boundaries  the same with fusion_boundary on each leaf after the map
  map + one boundary  ``Space.to_model``: the flat vector mapped, one boundary, unravelled
                      (what the engine runs)
  map + opt. barrier  the same with jax.lax.optimization_barrier instead (does not help)
  to_model, vmap 1    "map + one boundary" under ``vmap`` at a batch of one (as the engine's
                      chunk step evaluates a start at width 1)
  engine chunk call   MultiStartLBFGS at width 1: one call of its compiled chunk step (one
                      step of one start: the evaluation, L-BFGS, the guard, the gather and
                      scatter, the call's dispatch), called in a loop as the sweep calls it
  engine per eval     the same search's whole loop (host syncs and bookkeeping included),
                      seconds per evaluation

With ``--others``, the engine with and without the boundary (``priors.fusion_boundary``,
which ``Space.to_model`` calls, swapped for the identity), taking turns, on two models where
the map was not the problem, to show the boundary costs nothing there: the project's multi-dataset
benchmark (``benchmark_model.py``, 31 parameters, 16 starts, widths 1 and 8) and a cheap
2-parameter parabola (8192 starts, widths 512 and 4096, float32). Stepping seconds (steps 2 to
the last), the median of 5 rounds.

    python profiling/experiments/transform_fusion.py
    python profiling/experiments/transform_fusion.py --others
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # profiling/

import image_model  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.model.priors import fusion_boundary  # noqa: E402


def seconds(fn, args, reps=10) -> float:
    t0 = time.perf_counter()
    for r in range(reps):
        jax.block_until_ready(fn(args[r % len(args)]))
    return (time.perf_counter() - t0) / reps


def interleaved(arms: dict, rounds: int = 7) -> dict:
    """Each arm's median over ``rounds`` rounds, the arms taking turns within a round (this
    machine's speed drifts; a drift then hits every arm alike)."""
    for fn, args in arms.values():
        jax.block_until_ready(fn(args[0]))  # compile
    times = {name: [] for name in arms}
    for _ in range(rounds):
        for name, (fn, args) in arms.items():
            times[name].append(seconds(fn, args))
    return {name: float(np.median(t)) for name, t in times.items()}


def main() -> None:
    f, space, truth = image_model.make_problem()
    from multistart.model.problem import as_problem

    sp = as_problem(f, space).space
    rng = np.random.default_rng(0)
    starts = sp.from_unit([rng.uniform(0.15, 0.85, (4, *p.shape)) for p in sp.priors])
    u = np.asarray(sp.ravel(sp.to_unconstrained(starts)))
    us = [u[i] for i in range(4)]
    xs = [sp.unravel(sp.forward_flat(v)) for v in us]

    def through(boundary):
        def g(v):
            return f(boundary(sp.unravel(sp.forward_flat(v))))

        return jax.jit(jax.value_and_grad(g))

    search = ms.MultiStartLBFGS(
        n_starts=4, batch_size=1, n_steps=25, convergence=None, n_candidates=0, progress=False
    )
    user = {k: np.stack([np.asarray(x[k]) for x in xs]) for k in xs[0]}
    chunk_call = engine_chunk_call(search, f, space, user)
    rows = interleaved(
        {
            "f at x (peer)": (jax.jit(jax.value_and_grad(f)), xs),
            "map, no boundary": (through(lambda x: x), us),
            "map + leaf boundaries": (through(fusion_boundary), us),
            "map + one boundary": (jax.jit(jax.value_and_grad(lambda v: f(sp.to_model(v)))), us),
            "map + opt. barrier": (through(jax.lax.optimization_barrier), us),
            "to_model, vmap 1": (
                jax.jit(jax.vmap(jax.value_and_grad(lambda v: f(sp.to_model(v))))),
                [v[None] for v in us],
            ),
            "engine chunk call": chunk_call,
        }
    )
    st = search.fit(f, space, starts=user).stats
    rows["engine per eval"] = (st["loop_s"] - st["first_step_s"]) / (st["n_evals"] * 24 / 25)
    base = rows["f at x (peer)"]
    platform = jax.devices()[0].platform
    print(f"image model, 48 parameters, float64, {platform}; jax {jax.__version__}")
    print(f"{'arm':22s} {'ms/eval':>8s} {'/ peer':>7s}")
    for name, s in rows.items():
        print(f"{name:22s} {s * 1e3:8.2f} {s / base:7.2f}")


def engine_chunk_call(search, f, space, starts):
    """``(call, args)`` for :func:`interleaved`: one call of the search's compiled chunk step at
    its width on a copy of its first step's population, each call stepping the one before's
    population, as :meth:`multistart.device.backends.Backend.run` does."""
    from multistart.device import sweeper as sweeper_module
    from multistart.device.programs import copy_tree

    seen = {}
    sweep = sweeper_module.Sweeper.sweep

    def spy(self, pop, t, n=1):
        if "pop" not in seen:
            seen.update(pop=copy_tree(self.backend.place(pop)), sweeper=self)
        return sweep(self, pop, t, n)

    sweeper_module.Sweeper.sweep = spy
    try:
        search.fit(f, space, starts=starts)
    finally:
        sweeper_module.Sweeper.sweep = sweep
    sweeper = seen["sweeper"]
    backend, compiled, one = sweeper.backend, sweeper.compiled, sweeper._args[:1]
    state = {"pop": seen["pop"]}

    def call(clock):
        state["pop"] = backend.run(compiled, state["pop"], one, clock)
        return state["pop"]

    return call, [np.array([0, 1, 0], np.int32)]  # the clock: one step after none


def others() -> None:
    import benchmark_model
    import jax.numpy as jnp

    from multistart.model import priors

    def parabola(p):
        return jnp.sum((p["x"] - 0.3) ** 2)

    cases = {
        "benchmark_model": (
            benchmark_model.make_objective(),
            benchmark_model.space(),
            16,
            30,
            (1, 8),
        ),
        "cheap parabola": (
            parabola,
            {"x": ms.Uniform(-2.0, 2.0, shape=(2,))},
            8192,
            100,
            (512, 4096),
        ),
    }
    boundary = priors.fusion_boundary
    times: dict = {}
    try:
        for _ in range(5):
            for arm in ("boundary", "none"):
                priors.fusion_boundary = boundary if arm == "boundary" else (lambda t: t)
                for model, (f, space, n, steps, widths) in cases.items():
                    for w in widths:
                        search = ms.MultiStartAdam(
                            n_starts=n, n_steps=steps, batch_size=w, convergence=None,
                            n_candidates=0, progress=False, log_every=0,
                        )  # fmt: skip
                        st = search.fit(f, space).stats
                        times.setdefault((model, w, arm), []).append(
                            st["loop_s"] - st["first_step_s"]
                        )
    finally:
        priors.fusion_boundary = boundary
    print(f"{'model':16s} {'width':>5s} {'boundary s':>10s} {'none s':>8s} {'ratio':>6s}")
    for model, (_, _, _, _, widths) in cases.items():
        for w in widths:
            b, n = (float(np.median(times[(model, w, a)])) for a in ("boundary", "none"))
            print(f"{model:16s} {w:5d} {b:10.4f} {n:8.4f} {b / n:6.2f}")


if __name__ == "__main__":
    others() if "--others" in sys.argv[1:] else main()
