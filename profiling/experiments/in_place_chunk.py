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

Medians over the rounds, as ratios: after against before, and each against the vmap.

    python profiling/experiments/in_place_chunk.py --before /tmp/before --after . --rounds 6
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="a checkout of the library (the reference)")
    p.add_argument("--after", help="another checkout, measured against --before")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--problem", default="DanWood", help="a NIST problem (tests/nist.py)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child)
    if not (args.before and args.after):
        p.error("give --before and --after: two checkouts of the library")
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
