"""Starts on several devices and processes: throughput against one process on one device.

Every arm runs in fresh processes, side by side in one run, on the same starts, with a fixed
number of steps (no convergence, so every start steps every step) and a fixed width. Each
process fits twice with a private compilation cache and reports the second fit (the first pays
the compiles). Two figures, as ratios to ``1dev``: *stepping* throughput, starts x steps per
second over steps 2 to the last (``stats["loop_s"] - stats["first_step_s"]``: no planning,
compile or Result), and the *whole fit*'s (its wall time, everything included).

Arms (``W`` the width per device):

  1dev       one process, JAX's default CPU device (XLA may use both cores inside it)
  1dev-1core the same, pinned to one core (``taskset -c 0``): the per-core baseline
  2dev       one process, two logical CPU devices (``XLA_FLAGS``), ``devices=2``: the mesh
  4dev       one process, four logical CPU devices, ``devices=4`` (more devices than cores:
             overhead only, no speed-up to expect)
  2proc      two processes, each pinned to one core, each fitting half the starts
             (``fit(..., part=(i, 2))``); throughput from the slower of the two
  2proc-split  two processes of one JAX job (``ms.distributed.initialize``, gloo), each
             pinned to one core, ``fit`` without ``part=``: the job splits the search into
             two parts and merges them (one exchange at the end); every process gets it all
  2proc-mesh   the same job with a search that couples its starts (``max_evals``, never
             reached): one mesh over both processes' devices, statuses gathered at every
             host sync (``sync_every=1``)

Models: ``image`` (image_model.py, 48 parameters, float64) and ``cheap`` (a 2-parameter
parabola, float32, many starts: the dispatch overhead a mesh adds).

    python profiling/experiments/devices.py --quick
    python profiling/experiments/devices.py --model image --starts 16 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # profiling/: the harness and the models
REPO = HERE.parent

_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp
import multistart as ms
model, n_starts, steps, width, devices, part, job = json.loads(sys.argv[2])
coupled = False
if job is not None:  # [address, process id, coupled]: one process of a two-process JAX job
    ms.distributed.initialize(coordinator_address=job[0], num_processes=2, process_id=job[1])
    coupled = job[2]
if model == "image":
    import image_model
    objective, space, _ = image_model.make_problem()
else:
    def objective(p):
        return jnp.sum((p["x"] - 0.3) ** 2)
    space = {"x": ms.Uniform(-2.0, 2.0, shape=(2,))}
search = ms.MultiStartAdam(n_starts=n_starts, n_steps=steps, batch_size=width, convergence=None,
                           n_candidates=0, devices=devices, log_every=0, progress=False,
                           max_evals=10**15 if coupled else None)
part = None if part is None else tuple(part)
out = []
for _ in range(2):
    t0 = time.perf_counter()
    r = search.fit(objective, space, part=part)
    out.append(time.perf_counter() - t0)
n = int(r.n_steps.sum())  # starts x steps this process ran
st = r.stats
steady = st["loop_s"] - st["first_step_s"]  # steps 2..n_steps, no compile or planning
print("RESULT " + json.dumps({"wall": out, "start_steps": n, "steady_s": steady,
                              "steady_start_steps": n * (steps - 1) / steps,
                              "n_devices": st["n_devices"], "n_compiles": st["n_compiles"],
                              "n_processes": st.get("n_processes", 1),
                              "best": float(r.best_fom)}))
"""


def _env(n_logical: int | None, cache: str) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "MULTISTART_CACHE_DIR": cache,
    }
    env["MULTISTART_LOG_LEVEL"] = "WARNING"
    env.pop("XLA_FLAGS", None)
    if n_logical:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_logical}"
    return env


def _spawn(args, *, n_logical=None, core=None, part=None, job=None, cache):
    cmd = [sys.executable, "-c", _WORKER, str(HERE), json.dumps([*args, part, job])]
    if core is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core), *cmd]
    return subprocess.Popen(
        cmd, env=_env(n_logical, cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _read(proc) -> dict:
    out, err = proc.communicate(timeout=1800)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"worker failed:\n{out}\n{err}")


def _free_address() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def run_arm(arm: str, model: str, n_starts: int, steps: int, width: int) -> dict:
    cache = tempfile.mkdtemp(prefix="ms-devices-")
    try:
        if arm == "2proc":
            procs = [
                _spawn(
                    [model, n_starts, steps, width, 1], core=i, part=[i, 2], cache=f"{cache}/{i}"
                )
                for i in range(2)
            ]
            outs = [_read(p) for p in procs]
            return {
                "wall": max(o["wall"][1] for o in outs),
                "start_steps": sum(o["start_steps"] for o in outs),
                "steady_s": max(o["steady_s"] for o in outs),
                "steady_start_steps": sum(o["steady_start_steps"] for o in outs),
                "n_compiles": [o["n_compiles"] for o in outs],
                "best": min(o["best"] for o in outs),
            }
        if arm in ("2proc-split", "2proc-mesh"):
            address = _free_address()
            procs = [
                _spawn(
                    [model, n_starts, steps, width, 1],
                    core=i,
                    job=[address, i, arm == "2proc-mesh"],
                    cache=cache,  # one folder for the job: JAX writes it from process 0
                )
                for i in range(2)
            ]
            outs = [_read(p) for p in procs]
            assert all(o["n_processes"] == 2 for o in outs), outs
            return {  # every process holds every start's record: count them once
                "wall": max(o["wall"][1] for o in outs),
                "start_steps": outs[0]["start_steps"],
                "steady_s": max(o["steady_s"] for o in outs),
                "steady_start_steps": outs[0]["steady_start_steps"],
                "n_compiles": [o["n_compiles"] for o in outs],
                "best": outs[0]["best"],
            }
        n_dev = {"1dev": 1, "1dev-1core": 1, "2dev": 2, "4dev": 4}[arm]
        core = 0 if arm == "1dev-1core" else None
        o = _read(
            _spawn(
                [model, n_starts, steps, width, n_dev],
                n_logical=n_dev if n_dev > 1 else None,
                core=core,
                cache=cache,
            )
        )
        return {
            "wall": o["wall"][1],
            "start_steps": o["start_steps"],
            "steady_s": o["steady_s"],
            "steady_start_steps": o["steady_start_steps"],
            "n_compiles": o["n_compiles"],
            "best": o["best"],
        }
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["image", "cheap", "both"], default="both")
    ap.add_argument("--starts", type=int, default=None, help="default: 16 image, 8192 cheap")
    ap.add_argument("--steps", type=int, default=None, help="default: 40 image, 200 cheap")
    ap.add_argument(
        "--width", type=int, default=None, help="per device; default 1 image, 512 cheap"
    )
    ap.add_argument("--arms", default="1dev,1dev-1core,2dev,4dev,2proc,2proc-split,2proc-mesh")
    ap.add_argument("--quick", action="store_true", help="fewer starts and steps")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    models = ["image", "cheap"] if a.model == "both" else [a.model]
    defaults = {"image": (16, 40, 1), "cheap": (8192, 200, 512)}
    quick = {"image": (8, 15, 1), "cheap": (2048, 50, 256)}
    print(f"{os.cpu_count()} CPUs; taskset {'found' if shutil.which('taskset') else 'missing'}")
    table = {}
    for model in models:
        n, steps, width = (quick if a.quick else defaults)[model]
        n = a.starts or n
        steps = a.steps or steps
        width = a.width or width
        rows = {}
        for arm in a.arms.split(","):
            t0 = time.perf_counter()
            rows[arm] = r = run_arm(arm, model, n, steps, width)
            r["throughput"] = r["start_steps"] / r["wall"]
            r["steady"] = r["steady_start_steps"] / r["steady_s"]
            arm_s = time.perf_counter() - t0
            print(
                f"  {model:5s} {arm:11s} {r['start_steps']:7d} start-steps: fit {r['wall']:.2f} s "
                f"({r['throughput']:.1f}/s), stepping {r['steady']:.1f}/s; compiles "
                f"{r['n_compiles']}; arm {arm_s:.0f} s",
                flush=True,
            )
        base = rows.get("1dev")
        print(f"{model}: {n} starts x {steps} steps, width {width} per device")
        print("  arm         stepping / 1dev   whole fit / 1dev")
        for arm, r in rows.items():
            ratio = r["steady"] / base["steady"] if base else float("nan")
            whole = r["throughput"] / base["throughput"] if base else float("nan")
            print(f"  {arm:11s} {ratio:14.2f}   {whole:16.2f}")
        table[model] = {"starts": n, "steps": steps, "width": width, "arms": rows}
    if a.json:
        a.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
