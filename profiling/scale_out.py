"""Parts on an engine against one process, on the same cores: what ``ms.fit_parts`` costs.

One run measures both arms side by side on the same search (fixed steps, no convergence, so
every start steps every step; a fixed width):

  one-process  ``search.fit(objective, space)`` in this process (XLA may use every core)
  ENGINE       ``ms.fit_parts(search, objective, space, 4, submit=...)``: 4 parts on 2 worker
               processes of 1 CPU each (Dask's ``LocalCluster`` or a local Ray), started here
               on 127.0.0.1

Each arm runs once cold (the engine's workers import JAX and compile; this process compiles)
and then ``--repeats`` times warm, taking turns (``harness.interleave``); the figure is the ratio
of the medians,
engine / one process (above 1: the engine is slower). On one machine expect about 1: parts
are for fault tolerance and many machines, not for speed on one. The engine's start-up is
printed apart.

    python -m profiling.scale_out --quick
    python -m profiling.scale_out --engine ray --starts 512 --steps 400
    python -m profiling.scale_out --quick --json scale_out.json   # and write the record
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from pathlib import Path

import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

import multistart as ms  # noqa: E402


def objective(p):  # cheap and multimodal: each start's cost is the step's
    x = p["x"]
    return jnp.sum((x - 0.3) ** 2) + 0.1 * jnp.sum(jnp.cos(8.0 * x))


SPACE = {"x": ms.Uniform(-1.0, 1.0, shape=(4,))}


@contextlib.contextmanager
def engine(name: str):
    """A ``submit`` on 2 local workers of 1 CPU, while the engine runs."""
    if name == "dask":
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        )
        with cluster, Client(cluster) as client:
            yield functools.partial(client.submit, pure=False)
    else:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before Ray reads them
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1
        import ray

        def submit(fn, *args):
            return ray.remote(num_cpus=1, max_retries=3)(fn).remote(*args).future()

        ray.init(num_cpus=2, include_dashboard=False)
        try:
            yield submit
        finally:
            ray.shutdown()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["dask", "ray"], default="dask")
    ap.add_argument("--starts", type=int, default=512)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    harness.add_arguments(ap, quick="64 starts, 100 steps, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.starts, args.steps, args.repeats = 64, 100, 1
    search = ms.MultiStartAdam(
        n_starts=args.starts,
        batch_size=16,
        n_steps=args.steps,
        seed=0,
        convergence=None,
        log_every=0,
    )
    ms.set_log_level("WARNING")
    os.environ["MULTISTART_LOG_LEVEL"] = "WARNING"  # the workers, started below, read it
    one = functools.partial(search.fit, objective, SPACE)
    t0 = time.perf_counter()
    with engine(args.engine) as submit:
        startup = time.perf_counter() - t0
        parts = functools.partial(ms.fit_parts, search, objective, SPACE, 4, submit=submit)
        cold = {"one-process": timed(one), args.engine: timed(parts)}
        arms = {"one-process": lambda: timed(one), args.engine: lambda: timed(parts)}
        warm = {arm: harness.median(t) for arm, t in harness.interleave(arms, args.repeats).items()}
        same = (parts().foms == one().foms).all()
    print(f"{args.starts} starts x {args.steps} steps; {args.engine}: 4 parts on 2 workers")
    print(f"{args.engine} start-up: {startup:.1f} s (not in the figures below)")
    record = harness.Record("scale_out", args)
    record.figure(f"{args.engine} start-up s", startup)
    for arm in cold:
        print(f"{arm:>12}: cold {cold[arm]:.2f} s, warm median {warm[arm]:.2f} s")
        record.figure(f"{arm} cold s", cold[arm])
        record.figure(f"{arm} warm s", warm[arm])
    ratio = {
        when: record.ratio(
            f"{args.engine} / one-process, {when}",
            f"{args.engine} {when} s",
            f"one-process {when} s",
        )
        for when in ("cold", "warm")
    }
    print(f"ratio {args.engine} / one-process: cold {ratio['cold']:.2f}, warm {ratio['warm']:.2f}")
    print(f"merged foms equal to one process's: {bool(same)}")
    record.notes["merged foms equal to one process's"] = bool(same)
    record.write(args.json)


if __name__ == "__main__":
    main()
