"""The broad-start filter's batched evaluator against evaluating candidates one at a time.

Arms, in one process, on the same candidates (drawn by the library's Sobol' stream), repeated
and interleaved; medians reported as ratios to the one-at-a-time loop:

  batched W    the filter's evaluator (``multistart.starts.strategies.filter_evaluator``): one
               compiled ``vmap`` over chunks of W candidates, the ragged last chunk padded
  one_by_one   ``jax.jit`` of the single-point objective, called per candidate, each value
               read back (``float``) as a per-candidate filter loop does
  one_async    the same jitted single-point objective, every call dispatched before any value
               is read back (the most a per-candidate loop can get from async dispatch)

Steady throughput (compile excluded: each arm is compiled and warmed up once first) is the
figure; the compile time of each arm is printed as a ratio too.

    python profiling/experiments/filter_throughput.py  # 10 000 candidates, 10-D
    python profiling/experiments/filter_throughput.py --candidates 10000 \
        --widths 8,64,256,1024 --repeats 21
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # profiling/
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
os.environ.setdefault("MULTISTART_CACHE_DIR", "")  # measure compiles, not cache loads

import harness  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.model.problem import as_problem  # noqa: E402
from multistart.starts.strategies import StartStream, filter_evaluator  # noqa: E402


def rastrigin(p):
    """A cheap multimodal objective (10 parameters by default)."""
    x = p["x"]
    return 10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2.0 * jnp.pi * x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=10_000)
    parser.add_argument("--dims", type=int, default=10)
    parser.add_argument("--widths", default="8,64,256,1024")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    space = {"x": ms.Uniform(-5.12, 5.12, shape=(args.dims,))}
    problem = as_problem(rastrigin, space)
    sp = problem.space
    dtype = jnp.float32
    cand = StartStream(sp, "sobol", (0.15, 0.85), np.random.default_rng(0)).draw(args.candidates)
    u = sp.ravel(sp.to_unconstrained(cand, dtype=np.float32))

    arms, compile_s = {}, {}
    for w in (int(s) for s in args.widths.split(",")):
        evaluator = filter_evaluator(problem, dtype, w)
        compile_s[f"batched {w}"] = evaluator.compile_s
        arms[f"batched {w}"] = evaluator

    def fom_u(x, data):
        return problem.fom(sp.unravel(sp.forward_flat(x)), data)

    t0 = time.perf_counter()
    single = jax.jit(fom_u).lower(jax.ShapeDtypeStruct((sp.n_dims,), dtype), ()).compile()
    compile_s["one_by_one"] = compile_s["one_async"] = time.perf_counter() - t0
    rows = [u[i] for i in range(len(u))]

    def one_by_one(_):
        return np.array([float(single(r, ())) for r in rows])

    def one_async(_):
        outs = [single(r, ()) for r in rows]
        return np.array([float(o) for o in outs])

    arms["one_by_one"], arms["one_async"] = one_by_one, one_async

    # every arm must agree on the values (to float32 rounding)
    ref = arms["one_by_one"](u)
    for name, fn in arms.items():
        np.testing.assert_allclose(fn(u), ref, rtol=1e-5, atol=1e-4, err_msg=name)

    def timed(fn):
        t0 = time.perf_counter()
        fn(u)
        return time.perf_counter() - t0

    names = list(arms)
    times = harness.interleave(
        {name: lambda fn=arms[name]: timed(fn) for name in names}, args.repeats
    )
    base = harness.median(times["one_by_one"])
    base_c = compile_s["one_by_one"]
    print(
        f"{args.candidates} candidates of a {args.dims}-D Rastrigin (float32, "
        f"{jax.devices()[0].platform}, {os.cpu_count()} cores), median of {args.repeats} "
        "interleaved repeats"
    )
    print(f"{'arm':<14} {'candidates/s vs one_by_one':>27} {'compile vs one_by_one':>22}")
    for name in names:
        speed = base / harness.median(times[name])
        print(f"{name:<14} {speed:>27.1f} {compile_s[name] / base_c:>22.2f}")


if __name__ == "__main__":
    main()
