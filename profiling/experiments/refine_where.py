"""Where a chip's float64 refinement of a batch pays: on the chip or on its host's CPU, by the
number of fits (issue 70: ``multistart.common.xla.REFINE_ON_HOST_FITS``, 1,000, set when the
chip refined in emulated float64 throughout).

For each ``--fits`` count, fresh processes (a fresh compilation cache each), the bound set
so the refinement runs on the host (``host``: past 1,024 fits in blocks,
``multistart.result.laplace.REFINE_BLOCK``), on the host in one program of the whole batch
(``host-one``, ``--one-program``: as before the blocks) or on the chip (``chip``):
``ms.curve_fit(batched=True, n_starts=1)`` of curve_fit_many's peaks with the default float64
answer, the first call, then the median of 3 warm calls on new data of the same shapes. On a
CPU both arms run the same code (there is no chip): ``--fits 50`` is the smoke run. An
experiment: nothing imports it.

    python -m profiling.experiments.refine_where --fits 1000,5000,20000
    python -m profiling.experiments.refine_where --fits 2000,20000 --one-program
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))

import harness  # noqa: E402

ARMS = {"host": 10**9, "host-one": 10**9, "chip": 0}  # REFINE_ON_HOST_FITS in each arm


def child(arm: str, n: int) -> None:
    """One arm in this (fresh) process: the first call and the warm median."""
    import warnings

    import curve_fit_many as cfm
    import numpy as np

    import multistart as ms
    from multistart.common import xla
    from multistart.result import laplace

    xla.REFINE_ON_HOST_FITS = ARMS[arm]
    if arm == "host-one":  # one program of the whole batch, every fit stepping as long as any
        laplace.REFINE_BLOCK = 10**9
    warnings.simplefilter("ignore")
    ys = [cfm.datasets(n, seed, "anywhere")[1] for seed in range(4)]

    def call(y) -> float:
        t0 = time.perf_counter()
        ms.curve_fit(cfm.peak, cfm.X, y, p0=cfm.P0, bounds=cfm.BOUNDS, n_starts=1,
                     batched=True, log_every=0, progress=False)  # fmt: skip
        return time.perf_counter() - t0

    first = call(ys[0])
    warm = float(np.median([call(y) for y in ys[1:]]))
    harness.child_result({"first_s": first, "warm_s": warm, "device": str(xla.refine_device(n))})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fits", default="1000,5000,20000", help="comma-separated fit counts")
    p.add_argument(
        "--one-program",
        action="store_true",
        help="also the host's refinement in one program of the batch (host-one)",
    )
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.child[0], int(a.child[1]))
        return
    arms = [arm for arm in ARMS if a.one_program or arm != "host-one"]
    print(f"{'fits':>8} {'arm':>8} {'first_s':>8} {'warm_s':>8} {'first/host':>10} "
          f"{'warm/host':>9}  refined on")  # fmt: skip
    for n in (int(k) for k in a.fits.split(",")):
        host = None
        for arm in arms:
            env = {"MULTISTART_CACHE_DIR": tempfile.mkdtemp(prefix="refine-where-")}
            out = harness.fresh_process(str(HERE), "--child", arm, str(n), env=env)
            assert out is not None  # (required: a failed child raises)
            host = host or out  # (the host's blocks, the first arm: the ratios' peer)
            ratios = (out["first_s"] / host["first_s"], out["warm_s"] / host["warm_s"])
            print(f"{n:>8} {arm:>8} {out['first_s']:>8.3f} {out['warm_s']:>8.4f} "
                  f"{ratios[0]:>10.2f} {ratios[1]:>9.2f}  {out['device']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
