"""Where a warm call of many small fits spends its time, on whatever device JAX has.

``ms.curve_fit(batched=True, n_starts=1, dtype=...)`` over ``--fits`` of curve_fit_many's
peaks: two calls to warm up (new data each), then a third under cProfile; prints the call's
wall, the search's ``stats`` timings, and the profile's top functions by own and by
cumulative time. An experiment: nothing imports it.

    python -m profiling.experiments.warm_many_profile --fits 200000 --dtype float32
    python -m profiling.experiments.warm_many_profile --first --trace   # compiles; device trace
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="warm-many-"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import curve_fit_many as cfm  # noqa: E402
import jax  # noqa: E402

import multistart as ms  # noqa: E402

BATCH_SIZE = {}  # --batch-size and --backend, where given


def call(y, dtype, full_output):
    t0 = time.perf_counter()
    out = ms.curve_fit(
        cfm.peak, cfm.X, y, p0=cfm.P0, bounds=cfm.BOUNDS, n_starts=1, batched=True,
        dtype=dtype, log_every=0, progress=False, full_output=full_output, **BATCH_SIZE,
    )  # fmt: skip
    return time.perf_counter() - t0, out


def compile_table(fn, top: int):
    """``fn()`` with every compile's trace, lowering and XLA compile timed by JAX's monitoring
    events, printed by program (what a first call's wall is made of); returns ``fn()``."""
    import collections

    seen = collections.defaultdict(float)
    counts = collections.Counter()

    def listen(event, duration, **kw):
        if event.startswith("/jax/core/compile") or "cache" in event:
            key = (event.rsplit("/", 1)[-1], kw.get("fun_name", "?"))
            seen[key] += duration
            counts[key] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    jax.monitoring.unregister_event_duration_listener(listen)
    by_event = collections.Counter()
    for (event, _), s in seen.items():
        by_event[event] += s
    print(f"--- first call {wall:.3f} s; compile events summed: {dict(by_event)}")
    for (event, name), s in sorted(seen.items(), key=lambda kv: -kv[1])[:top]:
        print(f"   {s:8.3f} s  x{counts[(event, name)]:<3d} {event:38s} {name[:70]}")
    return out


def traced(fn, prefix: str = "trace-"):
    """``(seconds, profile, path)``: ``fn()`` under JAX's profiler, its wall and its trace
    (a ``jax.profiler.ProfileData``, read from ``path``)."""
    import glob

    folder = tempfile.mkdtemp(prefix=prefix)
    jax.profiler.start_trace(folder)
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    jax.profiler.stop_trace()
    path = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0]
    return wall, jax.profiler.ProfileData.from_file(path), path


def device_trace(fn, top: int) -> None:
    """JAX's profiler over ``fn()``: each device plane's lines, their events' total time by
    name (the chip's own op timings)."""
    import collections

    wall, data, path = traced(fn)
    print(f"--- device trace ({wall:.3f} s traced call; {path})")
    print("planes:", [p.name for p in data.planes])
    for plane in data.planes:
        host = "host" in plane.name.lower() and "/device" not in plane.name
        for line in plane.lines:
            totals = collections.Counter()
            counts = collections.Counter()
            for ev in line.events:
                totals[ev.name] += ev.duration_ns
                counts[ev.name] += 1
            if not totals:
                continue
            total = sum(totals.values())
            print(f"plane {plane.name!r} line {line.name!r}: {total / 1e9:.4f} s in "
                  f"{sum(counts.values())} events")  # fmt: skip
            if host:  # the host's threads: only what moves data or waits for the device
                words = ("transfer", "buffer", "copy", "literal", "tohost", "await", "wait")
                totals = collections.Counter(
                    {k: v for k, v in totals.items() if any(w in k.lower() for w in words)}
                )
            for name, ns in totals.most_common(top):
                print(f"   {ns / 1e6:10.2f} ms  x{counts[name]:<5d} {name[:110]}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fits", type=int, default=200_000)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--full-output", action="store_true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--trace", action="store_true", help="also a device trace of a warm call")
    p.add_argument("--first", action="store_true", help="time the first call's compiles")
    p.add_argument("--batch-size", type=int, help="the batch's width (default: 'auto')")
    p.add_argument("--backend", choices=("loop", "scan"), help="the search's backend")
    a = p.parse_args(argv)
    if a.batch_size:
        BATCH_SIZE["batch_size"] = a.batch_size
    if a.backend:
        BATCH_SIZE["backend"] = a.backend
    print("devices:", jax.devices())
    ys = [cfm.datasets(a.fits, seed, "anywhere")[1] for seed in range(3)]
    for k in range(2):
        if k == 0 and a.first:
            s, _ = compile_table(lambda: call(ys[0], a.dtype, a.full_output), a.top)
        else:
            s, _ = call(ys[k], a.dtype, a.full_output)
        print(f"call {k}: {s:.3f} s")
    jax.config.update("jax_log_compiles", True)  # a warm call should compile nothing
    jax.config.update("jax_explain_cache_misses", True)
    prof = cProfile.Profile()
    prof.enable()
    s, out = call(ys[2], a.dtype, True)
    prof.disable()
    jax.config.update("jax_log_compiles", False)
    jax.config.update("jax_explain_cache_misses", False)
    stats = out[2]["fits"].result.stats
    print(f"profiled call: {s:.3f} s")
    for key in sorted(stats):
        v = stats[key]
        if isinstance(v, (int, float)) and (key.endswith("_s") or "time" in key or "n_" in key):
            print(f"  stats[{key!r}] = {v}")
    for key in ("width_choice", "batch_size", "steps_per_call", "tail"):
        if key in stats:
            print(f"  stats[{key!r}] = {stats[key]}")
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(a.top)
        print(f"--- by {order}")
        print("\n".join(buf.getvalue().splitlines()[5:]))
    if a.trace:
        device_trace(lambda: call(ys[0], a.dtype, a.full_output), a.top)
    for k in range(4):  # unprofiled, after the profile: the warm wall again
        s, _ = call(ys[k % 3], a.dtype, a.full_output)
        print(f"warm again {k}: {s:.3f} s")


if __name__ == "__main__":
    main()
