"""How much of a warm batch of small fits runs outside the search's device loop (issue 70's CPU
target: at most 25 % for 200,000 fits; 53 % before, the per-fit covariances on the host).

    python profiling/experiments/outside_loop.py                 # 200,000 fits, float64 and float32
    python profiling/experiments/outside_loop.py --fits 20000 --dtypes float64

For each precision: a first call (other data), then warm calls on new data, interleaved; the
share is ``1 - stats["loop_s"] / wall`` of each warm call (the device loop: the chunk steps and
the reads between them; outside it: the problem's assembly, the starts, the per-fit
covariances, statuses and reports). The same peak fits as ``profiling/curve_fit_many.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from profiling import harness  # noqa: E402

harness.one_blas_thread()

from profiling import curve_fit_many as cfm  # noqa: E402
from profiling.accelerator import _library  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=200_000)
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.fits < 1 or args.repeats < 1:
        parser.error("--fits and --repeats must be positive")
    _, first = cfm.datasets(args.fits, 1, "anywhere")
    truths, y = cfm.datasets(args.fits, 0, "anywhere")
    print(f"{args.fits} fits; BLAS {harness.blas_threads()}")
    for dtype in args.dtypes.split(","):
        _library(first, dtype)
        shares, walls = [], []
        for _ in range(args.repeats):
            wall, popt = _library(y, dtype)
            shares.append(_library.outside)
            walls.append(wall)
        print(f"{dtype}: warm {harness.median(walls):.2f} s, outside the device loop "
              f"{min(shares):.0%}-{max(shares):.0%}, good {cfm.good(popt, truths)}")  # fmt: skip


if __name__ == "__main__":
    main()
