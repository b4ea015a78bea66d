"""Many small fits: ``ms.curve_fit(..., batched=True)`` against scipy's ``curve_fit`` looped.

Issue 33's figure. ``--fits`` datasets (default 2,000 and 20,000) of a Gaussian peak on a
background, ``a exp(-((x - mu) / w)^2 / 2) + b`` on 60 points of ``[-3, 3]``, noise 0.1, each
with its own truth drawn at random, every fit from one ``p0 = (1, 0, 1, 0)`` inside the bounds
``a in [0, 10], mu in [-3, 3], w in [0.05, 5], b in [-2, 2]``. Two draws of the truths
(``--truths``):

  centred    a in [1, 3], mu in [-1, 1], w in [0.4, 1.2], b in [-0.5, 0.5]: peaks near p0's
  anywhere   a in [1, 3], mu in [-2.5, 2.5], w in [0.1, 0.5], b in [-1, 1]: narrow peaks
             anywhere, where a local search from p0 can lose the peak (scipy's loop keeps
             about 98 % of them, near FINDINGS' 1,936 of 2,000)

Arms, side by side in one run:

  scipy           ``scipy.optimize.curve_fit`` looped over the datasets (trf with the bounds,
                  one BLAS thread: ``harness.one_blas_thread``)
  1 start cold    ``ms.curve_fit(batched=True, n_starts=1)``, the first call of a fresh
                  process with an empty ``MULTISTART_CACHE_DIR`` (no compiled program, no width
                  on record); the call itself, and the process with its imports in brackets
  1 start warm    the same call in this process, after a first call on other data of the same
                  shapes
  8 starts cold   ``n_starts=8``, as the cold arm
  8 starts warm   ``n_starts=8``, as the warm arm

Each row gives the wall, fits per second, the speed against scipy's loop (its wall over the
arm's), the fits that land within (0.2, 0.1, 0.1, 0.1) of their truth in (a, mu, w, b), and the
compiles JAX was asked for during the call (``multistart.common.monitor.CompileCounter``).

    python profiling/curve_fit_many.py                  # 2,000 and 20,000 fits, both draws
    python profiling/curve_fit_many.py --fits 2000 --truths anywhere --skip-8
    python profiling/curve_fit_many.py --quick --json many.json   # 200 fits; the record
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402

X = np.linspace(-3.0, 3.0, 60)
NOISE = 0.1
P0 = (1.0, 0.0, 1.0, 0.0)  # (a, mu, w, b)
BOUNDS = ([0.0, -3.0, 0.05, -2.0], [10.0, 3.0, 5.0, 2.0])
TRUTHS = {  # where truths are drawn: (low, high) of (a, mu, w, b)
    "centred": ((1.0, -1.0, 0.4, -0.5), (3.0, 1.0, 1.2, 0.5)),
    "anywhere": ((1.0, -2.5, 0.1, -1.0), (3.0, 2.5, 0.5, 1.0)),
}
CLOSE = np.array([0.2, 0.1, 0.1, 0.1])  # a fit this near its truth is good


def peak_np(x, a, mu, w, b):
    return a * np.exp(-0.5 * ((x - mu) / w) ** 2) + b


def peak(x, a, mu, w, b):
    import jax.numpy as jnp

    return a * jnp.exp(-0.5 * ((x - mu) / w) ** 2) + b


def datasets(n: int, seed: int, draw: str) -> tuple[np.ndarray, np.ndarray]:
    """``(truths (n, 4), ydata (n, 60))``."""
    rng = np.random.default_rng(seed)
    truths = rng.uniform(*TRUTHS[draw], size=(n, 4))
    y = np.stack([peak_np(X, *t) for t in truths]) + rng.normal(0.0, NOISE, (n, X.size))
    return truths, y


def good(popt: np.ndarray, truths: np.ndarray) -> int:
    return int(np.sum(np.all(np.abs(popt - truths) <= CLOSE, axis=1)))


def scipy_loop(y: np.ndarray) -> tuple[float, np.ndarray]:
    """``(seconds, popt)`` of scipy's curve_fit over every dataset (nan where it fails)."""
    import scipy.optimize

    popt = np.full((len(y), 4), np.nan)
    with harness.one_blas_thread():
        t0 = time.perf_counter()
        for i, yi in enumerate(y):
            try:
                popt[i] = scipy.optimize.curve_fit(
                    peak_np, X, yi, p0=P0, bounds=BOUNDS, method="trf"
                )[0]
            except RuntimeError:  # no convergence within maxfev: not a good fit
                pass
        return time.perf_counter() - t0, popt


def ours(y: np.ndarray, n_starts: int) -> tuple[float, np.ndarray, int]:
    """``(seconds, popt, compiles)`` of one batched ``ms.curve_fit`` call."""
    import multistart as ms
    from multistart.common.monitor import CompileCounter

    with CompileCounter() as compiles:
        t0 = time.perf_counter()
        popt, _ = ms.curve_fit(
            peak, X, y, p0=P0, bounds=BOUNDS, n_starts=n_starts, batched=True, log_every=0
        )
        seconds = time.perf_counter() - t0
    return seconds, popt, compiles.total


def cold(n: int, seed: int, draw: str, n_starts: int) -> dict:
    """An arm in a fresh process with an empty cache folder (what its call and the whole
    process took, and what it found)."""
    with tempfile.TemporaryDirectory() as folder:
        env = {"MULTISTART_CACHE_DIR": folder, "MULTISTART_LOG_LEVEL": "WARNING"}
        argv = ["--child", n, "--seed", seed, "--truths", draw, "--child-starts", n_starts]
        return harness.fresh_process(__file__, *argv, env=env)


def child(n: int, seed: int, draw: str, n_starts: int) -> None:
    """A cold arm's process: one call, its figures handed back to the parent."""
    truths, y = datasets(n, seed, draw)
    seconds, popt, compiles = ours(y, n_starts)
    harness.child_result({"seconds": seconds, "good": good(popt, truths), "compiles": compiles})


def row(name: str, seconds: float, n: int, scipy_s: float, n_good: int, compiles, note=""):
    speed = scipy_s / seconds
    print(
        f"{name:<16}{seconds:>9.2f}{note:<9}{n / seconds:>11.0f}{speed:>9.1f}x"
        f"{n_good:>8}{compiles!s:>10}"
    )


def figure(record: harness.Record, n: int, seed: int, draw: str, eight: bool) -> None:
    truths, y = datasets(n, seed, draw)
    _, y2 = datasets(n, seed + 1, draw)  # new data of the same shapes, for the warm calls
    scipy_s, popt = scipy_loop(y)
    print(f"\n{n} fits, truths {draw} (scipy's loop {scipy_s:.2f} s; every arm fits the same)")
    print(f"{'arm':<16}{'wall s':>9}{'':<9}{'fits/s':>11}{'speed':>10}{'good':>8}{'compiles':>10}")
    row("scipy", scipy_s, n, scipy_s, good(popt, truths), "-")
    key = f"{n} {draw}"
    record.figure(f"{key} scipy s", scipy_s)
    record.figure(f"{key} scipy good", good(popt, truths))
    for k in (1, 8) if eight else (1,):
        first = cold(n, seed, draw, k)
        process = f" ({first['process_s']:.1f})"
        name = f"{k} start{'s' if k > 1 else ''}"
        row(f"{name} cold", first["seconds"], n, scipy_s, first["good"], first["compiles"], process)
        ours(y2, k)  # this process's first call of these shapes (its compiles)
        seconds, popt, compiles = ours(y, k)
        row(f"{name} warm", seconds, n, scipy_s, good(popt, truths), compiles)
        arms = {
            "cold": (first["seconds"], first["good"], first["compiles"]),
            "warm": (seconds, good(popt, truths), compiles),
        }
        for when, (wall, n_good, n_compiles) in arms.items():
            arm = f"{key} {name} {when}"
            record.figure(f"{arm} s", wall)
            record.figure(f"{arm} good", n_good)
            record.figure(f"{arm} compiles", n_compiles)
            record.ratio(f"{arm} / scipy", f"{arm} s", f"{key} scipy s")
        record.figure(f"{key} {name} cold process s", first["process_s"])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--truths", default="centred,anywhere", help="comma-separated draws")
    parser.add_argument("--skip-8", action="store_true", help="no 8-start arms")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # a cold arm's process
    parser.add_argument("--child-starts", type=int, default=1, help=argparse.SUPPRESS)
    harness.add_arguments(parser, quick="200 fits, truths anywhere, no 8-start arms")
    args = parser.parse_args(argv)
    if args.quick:
        args.fits, args.truths, args.skip_8 = [200], "anywhere", True
    if any(n < 1 for n in args.fits):
        parser.error("--fits takes positive numbers of fits")
    args.truths = args.truths.split(",")
    unknown = [t for t in args.truths if t not in TRUTHS]
    if unknown:
        parser.error(f"unknown --truths {', '.join(unknown)}; choose from {', '.join(TRUTHS)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        child(args.child, args.seed, args.truths[0], args.child_starts)
        return
    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; cores {os.cpu_count()}")
    print(f"BLAS (scipy's arm runs with one thread): {harness.blas_threads()}")
    record = harness.Record("curve_fit_many", args)
    for draw in args.truths:
        for n in args.fits:
            figure(record, n, args.seed, draw, not args.skip_8)
    record.write(args.json)


if __name__ == "__main__":
    main()
