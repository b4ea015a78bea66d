"""The identity's text: would hashing the per-start step's jaxpr, instead of its lowered text,
cut a cold fit's fixed cost? (Issue 38; measured, not adopted: profiling/HISTORY.md, "The
identity's lowering, measured".)

A fit's identity (checkpoints, the tuning record) hashes the lowered StableHLO of its traced
figure of merit and per-start step, a lowering of a program the fit never compiles. This script
measures the alternative two ways:

1. In this process, for ``fixed_cost.py``'s small ``curve_fit`` model and two NIST problems
   (``MultiStartLeastSquares``'s step): the per-start step traced afresh (JAX's caches emptied,
   as a fit's first trace finds them), then its text made one way or the other, ``--rounds``
   times each in turns (medians): ``lower().as_text()`` against ``str(jaxpr)``.
2. With ``--before PATH`` and ``--after PATH`` (two checkouts of the library, say one whose
   ``multistart.common.digest.trace_text`` returns ``str(traced.jaxpr)``): the cold
   ``ms.curve_fit`` of ``fixed_cost.py`` in fresh processes, each with an empty cache folder,
   the two checkouts in turns over ``--rounds``, beside one compile and call of the
   hand-written optimistix vmap of the same model (``fixed_cost.py``'s peer arm); medians,
   each as a ratio to the vmap's.

    python profiling/experiments/identity_text.py --rounds 10
    python profiling/experiments/identity_text.py --before /tmp/lowered --after /tmp/jaxpr \
        --rounds 10
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="identity-text-"))
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness, fixed_cost
sys.path.insert(0, str(HERE.parent.parent / "tests"))  # nist

import harness  # noqa: E402

FIXED_COST = HERE.parent / "fixed_cost.py"


def _steps() -> dict:
    """``{name: (start_step, one_start, data)}``: the per-start step each model's fit traces,
    captured from the driver's ``trace_search`` during one short fit."""
    import jax
    import jax.numpy as jnp
    import nist
    import numpy as np
    from fixed_cost import Counted
    from nist_strd import space_of

    import multistart as ms
    import multistart.host.driver as driver
    import multistart.host.identity as identity

    jax.config.update("jax_enable_x64", True)
    grabbed: dict = {}
    real = driver.trace_search

    def spy(problem, dtype, start_step, one_start):
        grabbed["step"] = (start_step, one_start, identity.datum(problem))
        return real(problem, dtype, start_step, one_start)

    driver.trace_search = spy
    out = {}
    try:
        x = np.linspace(0.0, 5.0, 50)
        y = 3.0 * np.exp(-x / 1.5) + 0.2 + np.random.default_rng(0).normal(0.0, 0.05, x.size)
        ms.curve_fit(lambda x, a, tau, c: a * jnp.exp(-x / tau) + c, x, y, p0=[1.0, 1.0, 0.0])
        out["curve_fit (3 parameters)"] = grabbed.pop("step")
        for name in ("DanWood", "Misra1a"):
            problem = nist.load(name)
            search = ms.MultiStartLeastSquares(n_starts=32, seed=0, n_steps=2, log_every=0)
            search.fit(Counted(problem).named, space_of(problem))
            out[f"{name} (least squares)"] = grabbed.pop("step")
    finally:
        driver.trace_search = real
    return out


def texts(rounds: int) -> None:
    """Part 1: each model's step text made both ways, in turns (medians)."""
    import jax

    print(f"The per-start step's text, made {rounds} times each way (medians, seconds)")
    print(f"  {'model':<26}{'lowered':>9}{'jaxpr':>9}{'ratio':>8}  text sizes (characters)")
    for name, (step, one, data) in _steps().items():

        def fresh(step=step, one=one, data=data):  # JAX's caches emptied, as a fit finds them
            jax.clear_caches()
            return jax.jit(step).trace(one, data)

        arms = {
            "lowered": lambda: _timed(fresh, lambda t: t.lower().as_text()),
            "jaxpr": lambda: _timed(fresh, lambda t: str(t.jaxpr)),
        }
        runs = harness.interleave(arms, rounds)
        low, jxp = (harness.median(s for s, _ in runs[k]) for k in ("lowered", "jaxpr"))
        sizes = f"{len(runs['lowered'][0][1]):,} / {len(runs['jaxpr'][0][1]):,}"
        print(f"  {name:<26}{low:>9.4f}{jxp:>9.4f}{jxp / low:>8.3f}  {sizes}")


def _timed(trace, make):
    """``(seconds, text)`` of ``make(trace())``, the trace untimed."""
    traced = trace()
    t0 = time.perf_counter()
    text = make(traced)
    return time.perf_counter() - t0, text


def cold_fits(before: str, after: str, rounds: int) -> None:
    """Part 2: the cold curve_fit of two checkouts, and the vmap peer, in fresh processes."""
    arms = {
        "before": ("ours", before),
        "after": ("ours", after),
        "vmap": ("vmap", after),
    }
    runs: dict[str, list] = {name: [] for name in arms}
    for i in range(rounds):
        for name in list(arms) if i % 2 == 0 else list(arms)[::-1]:
            child, library = arms[name]
            with tempfile.TemporaryDirectory() as folder:
                env = {"MULTISTART_CACHE_DIR": folder, "PYTHONPATH": library}
                got = harness.fresh_process(FIXED_COST, "--child", child, env=env)
            runs[name].append(got["seconds"])
    figures = {name: harness.median(walls) for name, walls in runs.items()}
    print()
    harness.print_ratios(
        f"A cold ms.curve_fit, fresh processes, {rounds} rounds in turns (medians)",
        figures,
        peer="vmap",
    )
    print(f"  after / before: {figures['after'] / figures['before']:.3f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", help="a checkout of the library (the reference)")
    parser.add_argument("--after", help="another checkout, measured against --before")
    args = parser.parse_args(argv)
    if args.before and args.after:  # first: this process has not started JAX's backend yet
        cold_fits(args.before, args.after, args.rounds)
    texts(args.rounds)


if __name__ == "__main__":
    main()
