"""What the steps a call takes cost where a sync idles the device: an experiment (issue 70).

``--image``: the accelerator benchmark's image fit (1,024 L-BFGS starts of 48 parameters on
``--side``² pixels, 100 steps), warm, at each ``--steps-per-call`` (``auto`` and fixed counts),
the median of three warm calls each with its number of calls, beside the hand-written
``jit(vmap(adam))`` under ``lax.scan`` from the same starts, and each arm's ratio to it.

``--gains``: ``steps_per_call="auto"``'s rule (``multistart.host.iterate.AUTO_GAIN``) at each
value, in turns, each in a fresh process on this machine's CPU: the accelerator benchmark's
CPU arm (200,000 small fits, float32; ``--fits``), first and warm walls and their ratio to the
first value's. Nothing imports it.

    python -m profiling.experiments.call_steps --image                       # on the chip
    python -m profiling.experiments.call_steps --gains 0.9,0.98 --rounds 2   # CPU child A/B
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "profiling"))


def image(side: int, counts: list[str]) -> None:
    import accelerator as acc
    import numpy as np

    objective, space = acc._image_problem(side)
    rows = []
    for spc in counts:
        search = acc._lbfgs(1024, 1024, 100, steps_per_call=spc if spc == "auto" else int(spc))
        acc._timed_fit(search, objective, space)
        walls = []
        for _ in range(3):
            wall, result = acc._timed_fit(search, objective, space)
            walls.append(wall)
        rows.append((spc, float(np.median(walls)), result.stats["n_chunk_calls"]))
    hand, _ = acc._hand_adam_scan(objective, space, result.start_params, 100)
    print(f"hand-written scan: {hand:.4f} s")
    for spc, wall, calls in rows:
        print(f"steps_per_call={spc:>5}: warm {wall:.4f} s, {calls} calls, {wall / hand:.3f}x scan")


def child(gain: float, fits: int) -> None:
    import accelerator

    from multistart.host import iterate

    iterate.AUTO_GAIN = gain
    accelerator.child("many", fits, None)


def gains(values: list[float], rounds: int, fits: int) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    runs: dict[float, list[dict]] = {g: [] for g in values}
    for _ in range(rounds):
        for g in values:
            env["MULTISTART_CACHE_DIR"] = tempfile.mkdtemp(prefix="call-steps-")
            out = subprocess.run(
                [sys.executable, "-m", "profiling.experiments.call_steps", "--child", str(g),
                 "--fits", str(fits)],
                env=env, cwd=ROOT, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            line = next(x for x in reversed(out.splitlines()) if x.startswith("RESULT "))
            runs[g].append(json.loads(line.removeprefix("RESULT ")))
    base = sorted(r["warm"] for r in runs[values[0]])[len(runs[values[0]]) // 2]
    for g, rs in runs.items():
        warm = sorted(r["warm"] for r in rs)[len(rs) // 2]
        firsts = ", ".join(f"{r['first']:.2f}" for r in rs)
        warms = ", ".join(f"{r['warm']:.2f}" for r in rs)
        print(f"AUTO_GAIN={g}: first {firsts} s; warm {warms} s; median warm / "
              f"AUTO_GAIN={values[0]}'s {warm / base:.3f}")  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", action="store_true")
    p.add_argument("--side", type=int, default=128)
    p.add_argument("--steps-per-call", default="auto,8,16,32,100")
    p.add_argument("--gains", help="comma-separated AUTO_GAIN values, e.g. 0.9,0.98")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--fits", type=int, default=200_000)
    p.add_argument("--child", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        child(args.child, args.fits)
    elif args.image:
        image(args.side, args.steps_per_call.split(","))
    elif args.gains:
        gains([float(g) for g in args.gains.split(",")], args.rounds, args.fits)
    else:
        p.error("pass --image or --gains")


if __name__ == "__main__":
    main()
