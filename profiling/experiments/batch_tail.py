"""What a batch's stragglers cost: the spectra batch at its ``n_steps`` against a tenth of it.

``spectra_batch.py``'s 500 two-line spectra, ``ms.curve_fit(batched=True)`` at 32 starts a fit
and a fixed width (254, so no width choice differs between arms), each arm's first call
untimed (compiles) and its second, on new spectra, timed: the default ``n_steps`` (800: 100 a
parameter) against ``n_steps=100``, in turns (``--rounds``). Printed per timed call: the wall,
the start-steps, the chunk calls and the fits whose χ² is at most scipy's (one start each,
looped). The difference is what the starts still running after step 100 cost (16 of 16,000
run to 800): a step of a narrow chunk costs nearly what a wide one does on a CPU.

    python profiling/experiments/batch_tail.py --rounds 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="batch-tail-"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # profiling/: the models

import jax  # noqa: E402
import numpy as np  # noqa: E402
import spectra_batch as spectra  # noqa: E402

import multistart as ms  # noqa: E402

jax.config.update("jax_enable_x64", True)


def fit(y, **options):
    t0 = time.perf_counter()
    popt, _, info, _, _ = ms.curve_fit(
        spectra.model,
        spectra.X,
        y,
        p0=spectra.P0,
        bounds=(spectra.LOWER, spectra.UPPER),
        sigma=spectra.NOISE,
        absolute_sigma=True,
        batched=True,
        full_output=True,
        log_every=0,
        batch_size=254,
        **options,
    )
    return time.perf_counter() - t0, popt, info["fits"].result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spectra", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    first, second = spectra.spectra(args.spectra, 0), spectra.spectra(args.spectra, 1)
    _, ref = spectra.scipy_loop(second)
    good = spectra.chi2(ref, second) * (1 + 1e-6)
    arms = {"n_steps default (800)": {}, "n_steps=100": {"n_steps": 100}}
    for options in arms.values():
        fit(first, **options)  # compiles
    for r in range(args.rounds):
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            wall, popt, result = fit(second, **arms[name])
            ok = int((spectra.chi2(popt, second) <= good).sum())
            steps = int(np.asarray(result.n_steps).sum())
            calls = result.stats["n_chunk_calls"]
            print(f"{name:<22} {wall:6.2f} s  start-steps {steps}  calls {calls}  ok {ok}")


if __name__ == "__main__":
    main()
