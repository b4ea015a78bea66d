"""What a batch's stragglers cost: every start run to its end, against a tenth of ``n_steps``
and against the batch's rule that ends a fit's stragglers once its best is re-found.

``spectra_batch.py``'s 500 two-line spectra, ``ms.curve_fit(batched=True)`` at 32 starts a fit
and a fixed width (254, so no width choice differs between arms), each arm's first call
untimed (compiles) and its second, on new spectra, timed, in turns (``--rounds``): every start
run to its end (``rediscoveries=None``, the default ``n_steps``, 800: 100 a parameter), the
same with ``n_steps=100``, and the batch's default (``rediscoveries=3``: a fit's starts still
running end at the next multiple of 16 steps once 3 of its settled starts found its best).
Printed per timed call: the wall, the start-steps, the chunk calls, the starts ended as
``refound`` and at ``n_steps``, the fits whose χ² is at most scipy's (one start each, looped),
and the largest change of a fit's χ² (relative) and parameters against the first arm's.

Then, read off the first arm's last Result (nothing run again): what a rule ending a fit's other
starts at the exact step of its ``k``-th rediscovery would have saved. Every start of a batch
starts at step 0, so a start that ended settled (``converged`` or ``stalled``) at step ``s``
with a χ² within ``1e-6`` (relative) of its fit's best re-found that best at ``s``; a rule
ending a fit's other starts at its ``k``-th rediscovery would have saved the steps its starts
took after it. Printed for ``k`` = 2, 3, 4: the start-steps saved, the starts at ``n_steps`` it
would have ended, and the fits whose best start itself ended later (their best χ² then the
re-found one, within ``1e-6``).

    python profiling/experiments/batch_tail.py --rounds 2
    python profiling/experiments/batch_tail.py --spectra 100 --rounds 2
    python profiling/experiments/batch_tail.py --rediscoveries 2,3,4          # the count
    python profiling/experiments/batch_tail.py --periods 8,16,32              # the period

An arm ``rediscoveries=k /p`` ends a fit's stragglers at every ``p``-th step.
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
from multistart.host import iterate  # noqa: E402
from multistart.host.iterate import REFOUND_EVERY  # noqa: E402

jax.config.update("jax_enable_x64", True)


def fit(y, period: int = REFOUND_EVERY, **options):
    """A batched fit of ``y`` with the rule's period ``period`` (the host loop's constant,
    patched for the call: an experiment's knob, not an option)."""
    iterate.REFOUND_EVERY = period
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
        **{"rediscoveries": None, **options},
    )
    return time.perf_counter() - t0, popt, info["fits"].result


def rediscovery(result, n_starts: int, k: int) -> tuple[int, int, int]:
    """``(start-steps saved, starts at n_steps ended, fits whose best start ended later)`` by
    ending a fit's other starts at its ``k``-th rediscovery of its best (see the module doc)."""
    foms = np.asarray(result.foms, dtype=np.float64).reshape(-1, n_starts)
    steps = np.asarray(result.n_steps, dtype=np.int64).reshape(-1, n_starts)
    status = np.asarray(result.status).reshape(-1, n_starts)
    settled = (status == "converged") | (status == "stalled")
    saved = capped = later = 0
    for f, n, ok, st in zip(foms, steps, settled, status, strict=True):
        finite = np.where(np.isfinite(f), f, np.nan)
        best = np.nanmin(finite)
        found = np.sort(n[ok & (f <= best * (1 + 1e-6))])
        if found.size < k:
            continue
        at = found[k - 1]
        saved += int(np.maximum(0, n - at).sum())
        capped += int(np.sum((st == "max_steps") & (n > at)))
        later += int(n[int(np.nanargmin(finite))] > at)
    return saved, capped, later


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spectra", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--rediscoveries", default="3", help="comma-separated counts, an arm each (default 3)"
    )
    parser.add_argument(
        "--periods",
        default=str(REFOUND_EVERY),
        help=f"comma-separated periods of the rule in steps, an arm each (default {REFOUND_EVERY})",
    )
    args = parser.parse_args()
    first, second = spectra.spectra(args.spectra, 0), spectra.spectra(args.spectra, 1)
    _, ref = spectra.scipy_loop(second)
    good = spectra.chi2(ref, second) * (1 + 1e-6)
    arms: dict[str, dict] = {"every start (800)": {}, "n_steps=100": {"n_steps": 100}}
    for k in (int(v) for v in args.rediscoveries.split(",")):
        for period in (int(v) for v in args.periods.split(",")):
            arms[f"rediscoveries={k} /{period}"] = {"rediscoveries": k, "period": period}
    for options in arms.values():
        fit(first, **options)  # compiles
    base = fit(second, **arms["every start (800)"])[1]  # the answers the others are held to
    for r in range(args.rounds):
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            wall, popt, result = fit(second, **arms[name])
            c2, c2_base = spectra.chi2(popt, second), spectra.chi2(base, second)
            ok = int((c2 <= good).sum())
            steps = int(np.asarray(result.n_steps).sum())
            calls = result.stats["n_chunk_calls"]
            status = np.asarray(result.status)
            print(
                f"{name:<22} {wall:6.2f} s  start-steps {steps}  calls {calls}  refound "
                f"{int(np.sum(status == 'refound'))}  at n_steps "
                f"{int(np.sum(status == 'max_steps'))}  ok {ok}  χ² change "
                f"{np.max(np.abs(c2 - c2_base) / c2_base):.1e}  params change "
                f"{np.max(np.abs(popt - base)):.1e}"
            )
            if not arms[name]:
                last = result
    total = int(np.asarray(last.n_steps).sum())
    capped = int(np.sum(np.asarray(last.status) == "max_steps"))
    print(
        f"a rule ending at the exact step, read off the first arm's Result ({capped} at n_steps):"
    )
    for k in (2, 3, 4):
        saved, ended, later = rediscovery(last, 32, k)
        print(
            f"  k={k}: {saved} of {total} start-steps saved ({saved / total:.0%}), {ended} "
            f"at n_steps ended, {later} fits' best start ending later"
        )


if __name__ == "__main__":
    main()
