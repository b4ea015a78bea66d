"""Worked example: a rugged landscape with holes, where starts matter.

A 4-parameter Rastrigin-like objective (many local minima) that is undefined (nan) on a slab
of the space, the way a physical model fails where its parameters make no sense. The search
uses the broad-start filter (Sobol' candidates, the best kept) and resurrection (starts that
die in the slab are replaced), groups the ended starts into distinct minima, and checkpoints
so that a resumed run reproduces the uninterrupted one.

Run ``python workspace_tests/rugged_landscape.py`` (``--quick`` for the CI size). Asserts: the
global minimum is found, no start is left dead while the reserve lasts, the minima are
distinct, and a search stopped half-way and resumed gives the same record.
"""

from __future__ import annotations

import argparse
import signal
import tempfile

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.device.sweeper import Sweeper  # noqa: E402


def rugged(p):
    x = p["x"]
    value = jnp.sum(x**2 - 2.0 * jnp.cos(2 * jnp.pi * x)) + 8.0
    return jnp.where((x[0] > 1.2) & (x[0] < 2.5), jnp.nan, value)  # the slab: undefined


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small, for CI")
    args = parser.parse_args()
    n_starts, n_steps = (32, 300) if args.quick else (128, 1500)
    space = {"x": ms.Uniform(-4.0, 4.0, shape=(4,))}
    base = dict(
        n_starts=n_starts,
        n_steps=n_steps,
        seed=1,
        n_candidates=40 * n_starts,
        start_strategy="sobol",
        resurrect=2,
        learning_rate=0.05,
        convergence=ms.Convergence(window=40, rtol=0.0, atol=1e-10),
    )

    result = ms.MultiStartAdam(**base).fit(rugged, space)
    print(result)
    print("best x:", np.round(result.best_params["x"], 4))
    assert result.best_fom < 1e-6, result.best_fom  # the global minimum, 0 at x = 0
    assert not any(s is ms.Status.NONFINITE for s in result.status)
    minima = result.distinct_minima(xtol=1e-3, ftol=1e-6)
    print(
        f"{len(minima)} distinct minima; best {minima[0].fom:.3g} reached by "
        f"{minima[0].n_starts} start(s); resurrections {result.stats['n_resurrections']}"
    )
    assert len(minima) > 1 and minima[0].fom == result.best_fom

    # Stop the same search half-way (as Ctrl-C would), then resume it from its checkpoint.
    # A process started in the background ignores SIGINT, and a search leaves it ignored:
    # give it Python's default handler, as an interactive session has.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory() as folder:
        stop_at, original = n_steps // 2, Sweeper.sweep

        def step(self, pop, t, n=1, *rest):  # a call of steps t + 1 to t + n
            if t < stop_at <= t + n:
                signal.raise_signal(signal.SIGINT)
            return original(self, pop, t, n, *rest)

        Sweeper.sweep = step
        search = ms.MultiStartAdam(**base, checkpoint_dir=folder, checkpoint_every=50)
        try:
            search.fit(rugged, space)
            raise AssertionError("the search was not interrupted")
        except ms.SearchInterrupted as stopped:
            print(
                f"interrupted at step {stopped.result.stats['n_steps_run']}, "
                f"checkpoint {stopped.checkpoint}"
            )
        finally:
            Sweeper.sweep = original
        resumed = search.fit(rugged, space, resume=True)
    np.testing.assert_array_equal(resumed.foms, result.foms)
    np.testing.assert_array_equal(resumed.params["x"], result.params["x"])
    np.testing.assert_array_equal(resumed.history, result.history)
    assert list(resumed.status) == list(result.status)
    print("resumed run reproduces the uninterrupted one")


if __name__ == "__main__":
    main()
