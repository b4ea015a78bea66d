"""Where a cold ``curve_fit``'s second goes, beside its peer's (issue 38; profiling/HISTORY.md,
"A fit's compile, taken apart once more").

Each arm runs in a fresh process with an empty cache folder, the arms in turns over
``--rounds`` rounds; JAX's monitoring events give each process's seconds of tracing, of
lowering to StableHLO and of XLA's compiles, summed over the call:

- ``ours cold``: ``fixed_cost.py``'s small ``ms.curve_fit`` (3 parameters, 50 points), the
  process's first;
- ``ours again``: in the same process, right after it, a ``curve_fit`` of another function of
  the same form (a new model: every program traced, lowered and compiled again, with JAX's own
  first-use work done): what the first call pays for being the process's first;
- ``vmap``: one compile and call of the hand-written optimistix vmap of the same model
  (``fixed_cost.py``'s peer), with JAX's defaults.

It prints the medians of each arm's wall and of each kind of work, and the largest compile
(a fit's chunk step; the peer's one program).

    python profiling/experiments/cold_timeline.py --rounds 4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness

import harness  # noqa: E402

KINDS = {
    "trace": "jaxpr_trace_duration",
    "lower": "jaxpr_to_mlir_module_duration",
    "compile": "backend_compile_duration",
}


def _events():
    import jax.monitoring

    seen: list[tuple[str, float]] = []
    jax.monitoring.register_event_duration_secs_listener(lambda n, s, **_: seen.append((n, s)))
    return seen


def _figures(seen, since: int, wall: float) -> dict:
    out = {"wall": wall}
    for kind, suffix in KINDS.items():
        mine = [s for n, s in seen[since:] if n.endswith(suffix)]
        out[kind] = float(sum(mine))
        if kind == "compile":
            out["largest compile"] = float(max(mine, default=0.0))
    return out


def child(arm: str) -> None:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    jax.devices()  # the backend started before anything is timed
    seen = _events()
    x = np.linspace(0.0, 5.0, 50)
    y = 3.0 * np.exp(-x / 1.5) + 0.2 + np.random.default_rng(0).normal(0.0, 0.05, x.size)

    def f(x, a, tau, c):
        return a * jnp.exp(-x / tau) + c

    def g(x, a, tau, c):  # another model of the same form
        return a * jnp.exp(-x / tau) + 1.0001 * c

    out = {}
    if arm == "ours":
        import multistart as ms

        for name, fn in (("ours cold", f), ("ours again", g)):
            n0, t0 = len(seen), time.perf_counter()
            ms.curve_fit(fn, x, y, p0=[1.0, 1.0, 0.0])
            out[name] = _figures(seen, n0, time.perf_counter() - t0)
    else:
        import optimistix as optx

        def fn(p, args):
            return f(x, *p) - y

        solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-12)
        n0, t0 = len(seen), time.perf_counter()
        v = jax.jit(
            jax.vmap(
                lambda y0: optx.least_squares(fn, solver, y0, max_steps=2000, throw=False).value
            )
        )
        jax.block_until_ready(v(jnp.asarray([[1.0, 1.0, 0.0]], jnp.float64)))
        out["vmap"] = _figures(seen, n0, time.perf_counter() - t0)
    harness.child_result(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", choices=("ours", "vmap"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    runs: dict[str, list[dict]] = {}
    for i in range(args.rounds):
        for arm in ("ours", "vmap") if i % 2 == 0 else ("vmap", "ours"):
            with tempfile.TemporaryDirectory() as folder:
                env = {"MULTISTART_CACHE_DIR": folder, "MULTISTART_LOG_LEVEL": "WARNING"}
                result = harness.fresh_process(__file__, "--child", arm, env=env)
            assert result is not None
            for name, figures in result.items():
                if name != "process_s":
                    runs.setdefault(name, []).append(figures)
    columns = ["wall", *KINDS, "largest compile"]
    print(f"medians of {args.rounds} fresh processes, seconds")
    print(f"{'arm':<12}" + "".join(f"{c:>17}" for c in columns))
    for name, figures in runs.items():
        cells = [harness.median([f[c] for f in figures]) for c in columns]
        print(f"{name:<12}" + "".join(f"{v:17.3f}" for v in cells))


if __name__ == "__main__":
    main()
