"""A warm call's timeline on the device in use: the host's functions and the device's programs
by the time each began (JAX's profiler, its Python tracer on), so what keeps the device idle
before its first step and after its last shows as a gap between them (issue 70).

Two warm-ups, ``--warm`` calls timed, then one traced call: 200,000 of curve_fit_many's
peaks (``many``: ``ms.curve_fit(batched=True, n_starts=1, dtype="float32")``, new data each
call), or the accelerator benchmark's image fit (``image``: 1,024 L-BFGS starts,
``batch_size="auto"``). The traced call is slower than an untraced one (the tracer's own
cost); its gaps, not its total, are the figure. An experiment: nothing imports it.

    python -m profiling.experiments.call_timeline many image
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import accelerator as acc  # noqa: E402
import curve_fit_many as cfm  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from profiling.experiments import warm_many_profile as wmp  # noqa: E402

#: The library's functions shown (by name), where they took at least MIN_MS.
SHOWN = (
    "curve_fit", "_read", "send_ahead", "_model_and_starts", "run", "prepare", "build",
    "_population", "iterate", "sweep", "sync", "assemble", "records", "fits",
    "_batch_covariances", "_batch_fits", "copy_tree", "settle_inverses", "chunk_calls",
    "identity_config", "starts", "_inside", "_check_finite", "near_bound", "__init__",
)  # fmt: skip
MIN_MS = 0.3


def timeline(fn, label: str) -> None:
    """Trace ``fn()`` and print the library's functions and the device's programs by start."""
    wall, profile, _ = wmp.traced(fn, "timeline-")
    rows = []
    for plane in profile.planes:
        for line in plane.lines:
            if plane.name.startswith("/device") and line.name == "XLA Modules":
                rows += [(e.start_ns, e.duration_ns, "DEVICE " + e.name[:60]) for e in line.events]
            if plane.name == "/host:CPU" and line.name in ("python3", "python"):
                for e in line.events:  # the Python tracer's: "$file.py:line name"
                    shown = e.name.startswith("$") and e.name.split(" ")[-1] in SHOWN
                    if shown and e.duration_ns >= MIN_MS * 1e6:
                        rows.append((e.start_ns, e.duration_ns, e.name[1:90]))
    rows.sort()
    print(f"--- {label}: the traced call {wall:.4f} s")
    t = rows[0][0] if rows else 0
    for start, duration, name in rows:
        print(f"  {(start - t) / 1e6:9.2f} +{duration / 1e6:8.2f} ms  {name}")


def many(warm: int) -> None:
    ys = [cfm.datasets(200_000, seed, "anywhere")[1] for seed in range(3)]
    for k in range(2):
        wmp.call(ys[k], "float32", False)
    walls = [wmp.call(ys[k % 3], "float32", False)[0] for k in range(warm)]
    print("many warm, s:", [round(w, 3) for w in walls], f"(median {np.median(walls):.3f})")
    timeline(lambda: wmp.call(ys[2], "float32", False), "many")


def image(warm: int) -> None:
    side = 128 if jax.default_backend() != "cpu" else 16
    objective, space = acc._image_problem(side)
    search = acc._lbfgs(1024, "auto", 100)
    acc._timed_fit(search, objective, space)
    walls = [acc._timed_fit(search, objective, space)[0] for _ in range(warm)]
    print("image warm, s:", [round(w, 4) for w in walls], f"(median {np.median(walls):.4f})")
    timeline(lambda: acc._timed_fit(search, objective, space), "image")
    result = acc._timed_fit(search, objective, space)[1]
    hand_s, _ = acc._hand_adam_scan(objective, space, result.start_params, 100)
    print(f"hand-written scan, warm: {hand_s:.4f} s")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calls", nargs="*", choices=("many", "image"), default=["many", "image"])
    p.add_argument("--warm", type=int, default=5, help="warm calls timed before the trace")
    a = p.parse_args(argv)
    print("devices:", jax.devices())
    for name in a.calls:
        {"many": many, "image": image}[name](a.warm)


if __name__ == "__main__":
    main()
