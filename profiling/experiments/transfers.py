"""What moving a batch's data costs on the device in use: the host-to-device puts and
device-to-host reads a warm call of many small fits makes (issue 70: the syncs of a warm call of
200,000 fits on a TPU waited 0.4 s beyond the chip's own modules).

Each row times, warm, the best of ``--repeat``: putting ``(fits, 60)`` data (float64 NumPy put
in float32, float32 NumPy, float64 NumPy in row blocks joined as float32 on the device as a
batch's data sent ahead goes, a broadcast view of one row, one row broadcast on the device), and
reading back a batch's per-fit answers (``(fits, 4)``, ``(fits, 4, 4)``, ``(fits, 60)``).
An experiment: nothing imports it.

    python -m profiling.experiments.transfers --fits 200000
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from multistart.device import placement


def best(fn, repeat: int) -> float:
    jax.block_until_ready(fn())
    out = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        out = min(out, time.perf_counter() - t0)
    return out


def best_read(shape, repeat: int) -> float:
    """The best time to read a fresh device array of ``shape`` (a read array keeps its host
    copy: each is made anew, outside the time)."""
    make = jax.jit(lambda k: jnp.full(shape, k, jnp.float32))
    out = np.inf
    for k in range(repeat + 1):
        arr = jax.block_until_ready(make(float(k)))
        t0 = time.perf_counter()
        np.asarray(arr)
        out = min(out, time.perf_counter() - t0) if k else out
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fits", type=int, default=200_000)
    p.add_argument("--points", type=int, default=60)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    n, m = a.fits, a.points
    print("devices:", jax.devices())
    rng = np.random.default_rng(0)
    y64 = rng.normal(size=(n, m))
    y32 = y64.astype(np.float32)
    row = np.linspace(0, 1, m)
    view = np.broadcast_to(row, (n, m))
    spread = jax.jit(lambda r: jnp.broadcast_to(r, (n, m)))
    rows = [
        ("put (n, m) float64 as float32", lambda: jax.device_put(y64.astype(np.float32))),
        ("astype float64 -> float32 on the host", lambda: y64.astype(np.float32)),
        ("put (n, m) float32", lambda: jax.device_put(y32)),
        (
            f"put (n, m) float64 in {placement.AHEAD_BLOCKS} blocks, joined float32",
            lambda: placement._put(y64, False, None),
        ),
        ("put a broadcast view (n, m) float32", lambda: jax.device_put(view.astype(np.float32))),
        ("put one row, broadcast on the device", lambda: spread(jax.device_put(row[None]))),
    ]
    mb = n * m * 4 / 1e6
    print(f"{n} fits x {m} points: one (n, m) float32 array is {mb:.1f} MB")
    for name, fn in rows:
        s = best(fn, a.repeat)
        print(f"  {name:50s} {s * 1e3:9.2f} ms")
    for shape in ((n, 4), (n, 4, 4), (n, m)):
        s = best_read(shape, a.repeat)
        print(f"  {'read ' + str(shape) + ' float32':50s} {s * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
