"""Where the least-squares chunk step's compile goes: the whole chunk step against its parts.

Issue 38's first fits are the chunk step's compile. For each NIST problem named, one search
fit (``fixed_cost.py``'s, 32 starts) hands over its start step and ``init_rows`` (captured
from ``make_chunk_step``); then, with the persistent compilation cache off, variants of
``multistart.device.step.make_chunk_step``'s body are compiled at a width of 32 rows of 256:
the whole of it, then each with one part taken out (the rows' gather and scatter, ``_started``
which makes new starts, the history's write, the ``while_loop``), then the vmapped step alone;
and, as the peer, the hand-written optimistix vmap of ``fixed_cost.py`` (its whole program).
Printed per arm: compile seconds, the ratio to the whole chunk step's, XLA's fusions.

    python profiling/experiments/chunk_step_parts.py Misra1a DanWood
    python profiling/experiments/chunk_step_parts.py Misra1a DanWood --library-options --rounds 5

``--library-options``: the library's arms compile with the options every program of a fit
has (``multistart.common.xla.options()``: on a CPU, XLA's elemental emitters) and the peer
with JAX's defaults, as a user compiles it; without it, every arm has JAX's defaults.
``--rounds``: each arm compiled that many times, the arms in turns, the median printed.

The variants are for timing only (never run): their arithmetic is the chunk step's, their
bookkeeping is not.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="chunk-parts-"))
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # profiling/: fixed_cost, harness
sys.path.insert(0, str(HERE.parent.parent / "tests"))  # nist

import harness  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import multistart.host.driver as driver  # noqa: E402
from multistart.common import xla  # noqa: E402
from multistart.device.step import PopState, _started  # noqa: E402

jax.config.update("jax_enable_x64", True)

WIDTH, ROWS = 32, 256
_grab: dict = {}
_make = driver.make_chunk_step


def _spy(start_step, init_rows, rows_per_datum=None, history_stride=1):
    _grab["start_step"], _grab["init_rows"] = start_step, init_rows
    return _make(start_step, init_rows, rows_per_datum, history_stride)


driver.make_chunk_step = _spy


def variant(start_step, init_rows, *, gs=True, start=True, history=True, loop=True):
    """The chunk step's body (``make_chunk_step``) with the parts named ``False`` left out."""
    vstep = jax.vmap(start_step, in_axes=(0, None))

    def body(pop, gather, scatter, new):
        take = (lambda a: a[gather]) if gs else (lambda a: a[:WIDTH])
        chunk = jax.tree_util.tree_map(take, pop.starts)
        if start:
            chunk = _started(chunk, new, init_rows)

        def one(c):
            j, ch, h = c
            out = jax.lax.optimization_barrier(vstep(ch, None))
            if history:
                h = h.at[j, scatter].set(out.best_fom, mode="drop")
            return j + 1, out, h

        first = (jnp.zeros((), jnp.int32), chunk, pop.history)
        _, chunk, h = jax.lax.while_loop(lambda c: c[0] < 5, one, first) if loop else one(first)
        if not gs:
            return chunk, h
        starts = jax.tree_util.tree_map(
            lambda a, b: a.at[scatter].set(b, mode="drop"), pop.starts, chunk
        )
        return PopState(starts, h)

    return body


def compiled(f, *args, options=None) -> tuple[float, int]:
    jax.clear_caches()
    lowered = jax.jit(f, compiler_options=options).lower(*args)
    t0 = time.perf_counter()
    exe = lowered.compile()
    return time.perf_counter() - t0, exe.as_text().count(" fusion(")


def one_problem(name: str, library_options: bool, rounds: int) -> None:
    import fixed_cost
    import nist
    import optimistix as optx

    problem = nist.load(name)
    fixed_cost.ours(problem, False)  # one fit: the library's own program, and the capture
    jax.config.update("jax_enable_compilation_cache", False)
    # JAX decides once a process whether its persistent cache is used: decided again, so
    # every arm's every round compiles
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()
    step, init_rows = _grab["start_step"], _grab["init_rows"]
    n = len(problem.names)
    pop = PopState(init_rows(jnp.zeros((ROWS, n))), jnp.zeros((10, ROWS)))
    rows = jnp.arange(WIDTH, dtype=jnp.int32)
    new = (jnp.zeros(WIDTH, jnp.int32), jnp.zeros((WIDTH, n)))
    arms = {
        "the chunk step": {},
        "without gather/scatter": dict(gs=False),
        "without _started": dict(start=False),
        "without the history": dict(history=False),
        "without the while_loop": dict(loop=False),
        "the vmapped step alone": dict(gs=False, start=False, history=False, loop=False),
    }
    ours = xla.options() if library_options else None
    programs = {
        k: (variant(step, init_rows, **v), (pop, rows, rows, new), ours) for k, v in arms.items()
    }
    vector = fixed_cost.Counted(problem).vector
    solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12)
    peer = jax.vmap(
        lambda y0: (
            optx.least_squares(
                lambda y, _: vector(y), solver, y0, max_steps=2000, throw=False
            ).value
        )
    )
    programs["optimistix's vmap (peer)"] = (peer, (jnp.zeros((WIDTH, n)),), None)
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in programs}
    for i in range(rounds):
        for arm in list(programs)[:: 1 if i % 2 == 0 else -1]:
            f, args, options = programs[arm]
            runs[arm].append(compiled(f, *args, options=options))
    out = {k: (harness.median(s for s, _ in v), v[0][1]) for k, v in runs.items()}
    whole = out["the chunk step"][0]
    how = "the library's options, the peer JAX's defaults" if library_options else "JAX's defaults"
    print(f"{name} ({how}; median of {rounds}): compile s, / the chunk step, fusions")
    for arm, (seconds, fusions) in out.items():
        print(f"  {arm:<28}{seconds:7.3f}{seconds / whole:7.2f}x{fusions:6d}")
    jax.config.update("jax_enable_compilation_cache", True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=["Misra1a"])
    parser.add_argument("--library-options", action="store_true")
    parser.add_argument("--rounds", type=int, default=1)
    cli = parser.parse_args()
    for problem_name in cli.problems:
        one_problem(problem_name, cli.library_options, cli.rounds)
