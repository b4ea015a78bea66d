"""Every GPU claim the docs make, measured in one run on one device (sized for 8 minutes).

Four comparisons, each against a peer arm measured in the same run, printed as one table and
written as JSON (``--json``, default ``gpu.json`` in the working folder: the harness's record,
``harness.py``, with every section's rows):

1. ``backend="scan"`` against ``backend="loop"``: ``MultiStartLBFGS`` on the image fit
   (``image_model.py``, 48 parameters, float64), ``--starts`` starts in chunks of
   ``--width``, ``--steps`` steps, convergence off; each arm compiled by an untimed first fit,
   then timed once (warm).
2. ``batch_size="auto"`` against the best fixed width in hindsight: the same fit, a fresh
   tuning folder, cold (the first fit, compiles and deciding included) and warm (the second).
3. ``--starts`` starts of the image fit on the default device against scipy's L-BFGS-B
   looped over the same starts on this machine's CPU (``peers.scipy_problem``, a
   jitted value-and-grad on the CPU device): scipy's loop runs ``--scipy-starts`` of them and
   its seconds are scaled to ``--starts`` (per start, as a loop's cost is).
4. ``ms.curve_fit(batched=True)`` on ``--fits`` small fits (``curve_fit_many.py``'s peak, one
   start a fit) cold (the process's first call, compiles included) and warm (new data of the
   same shapes), against scipy's ``curve_fit`` looped over ``--scipy-fits`` of them, scaled.

``--cpu`` runs every comparison at tiny sizes on an 8² one-band image of the same model, in
seconds, so the suite runs it and the script cannot rot; its figures mean nothing.

    python -m profiling.gpu            # on the GPU machine
    python -m profiling.gpu --cpu      # the smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if "--cpu" in sys.argv[1:]:  # JAX's platform is chosen when it starts
    os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
os.environ.setdefault("MULTISTART_CACHE_DIR", tempfile.mkdtemp(prefix="gpu-tuning-"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import curve_fit_many  # noqa: E402
import harness  # noqa: E402
import image_model  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

import multistart as ms  # noqa: E402

FULL = dict(starts=1024, width=128, steps=30, widths=(128, 512, 1024), image_steps=100)
FULL |= dict(scipy_starts=16, fits=100_000, scipy_fits=1000)
CPU = dict(starts=4, width=1, steps=2, widths=(1, 4), image_steps=3)
CPU |= dict(scipy_starts=2, fits=20, scipy_fits=5)


def problem(cpu: bool, device=None):
    """``(objective, space)``: the image fit, or with ``cpu`` an 8² one-band image of it; the
    data placed on ``device`` (default: JAX's default device)."""
    if not cpu:
        with jax.default_device(device or jax.devices()[0]):
            objective, space, _ = image_model.make_problem()
        return objective, space
    jax.config.update("jax_enable_x64", True)
    xx, yy = image_model.grid(8)
    with jax.default_device(device or jax.devices()[0]):
        xx, yy = jnp.asarray(xx), jnp.asarray(yy)
        img = image_model.render(image_model.make_truth(0), xx, yy)

    def tiny_chi2(p):
        return jnp.sum(((image_model.render(p, xx, yy) - img) / 0.1) ** 2)

    return tiny_chi2, image_model.space()


def timed_fit(search, objective, space, starts=None) -> tuple[float, ms.Result]:
    t0 = time.perf_counter()
    result = search.fit(objective, space, starts=starts)
    return time.perf_counter() - t0, result


def lbfgs(n: int, width, steps: int, **kw) -> ms.MultiStartLBFGS:
    return ms.MultiStartLBFGS(
        n_starts=n, batch_size=width, n_steps=steps, seed=0, n_candidates=0, convergence=None,
        progress=False, log_every=0, **kw,
    )  # fmt: skip


def scan_against_loop(size: dict, objective, space) -> list[dict]:
    rows = []
    for backend in ("loop", "scan"):
        search = lbfgs(size["starts"], size["width"], size["steps"], backend=backend)
        timed_fit(search, objective, space)  # compiles
        seconds, result = timed_fit(search, objective, space)
        rows.append(dict(arm=f"backend={backend!r}", warm_s=seconds, best=result.best_fom))
    for r in rows:
        r["ratio"] = r["warm_s"] / rows[0]["warm_s"]
        r["peer"] = "backend='loop' (warm)"
    return rows


def auto_against_fixed(size: dict, objective, space) -> list[dict]:
    rows = []
    for width in (*size["widths"], "auto"):
        search = lbfgs(size["starts"], width, size["steps"])
        cold, result = timed_fit(search, objective, space)
        warm, _ = timed_fit(search, objective, space)
        chosen = result.stats["batch_size"]
        rows.append(dict(arm=f"batch_size={width!r} (width {chosen})", cold_s=cold, warm_s=warm))
    fixed = rows[:-1]
    for key in ("cold_s", "warm_s"):
        best = min(r[key] for r in fixed)
        for r in rows:
            r[key.replace("_s", "_ratio")] = r[key] / best
    for r in rows:
        r["ratio"], r["peer"] = r["warm_ratio"], "the best fixed width (warm; cold ratio too)"
    return rows


def scipy_cpu_loop(size: dict, cpu: bool, starts: dict) -> tuple[float, float]:
    """``(seconds scaled to size["starts"], best)`` of scipy's L-BFGS-B on the CPU device."""
    from peers import scipy_problem

    device = jax.devices("cpu")[0]
    k = size["scipy_starts"]
    with jax.default_device(device):
        objective, space = problem(cpu, device)
        some = jax.tree_util.tree_map(lambda a: np.asarray(a)[:k], starts)
        vg, x0s, bounds = scipy_problem(objective, space, some)
        vg(x0s[0])  # compiles
        options = {"maxiter": size["image_steps"]}
        t0 = time.perf_counter()
        foms = [
            scipy.optimize.minimize(
                lambda v: tuple(np.asarray(a, np.float64) for a in vg(v)),
                x0, jac=True, method="L-BFGS-B", bounds=bounds, options=options,
            ).fun
            for x0 in x0s
        ]  # fmt: skip
        seconds = time.perf_counter() - t0
    return seconds * size["starts"] / k, float(np.min(foms))


def image_against_scipy(size: dict, cpu: bool, objective, space) -> list[dict]:
    search = lbfgs(size["starts"], "auto", size["image_steps"])
    cold, result = timed_fit(search, objective, space)
    warm, result = timed_fit(search, objective, space)
    scipy_s, scipy_best = scipy_cpu_loop(size, cpu, result.start_params)
    peer = f"scipy L-BFGS-B loop on the CPU ({size['scipy_starts']} starts, scaled)"
    return [
        dict(arm=f"{size['starts']} starts, cold", cold_s=cold, ratio=cold / scipy_s, peer=peer),
        dict(arm=f"{size['starts']} starts, warm", warm_s=warm, ratio=warm / scipy_s, peer=peer,
             best=result.best_fom),
        dict(arm="scipy's loop (scaled)", warm_s=scipy_s, ratio=1.0, peer=peer, best=scipy_best),
    ]  # fmt: skip


def curve_fits_against_scipy(size: dict) -> list[dict]:
    n, k = size["fits"], size["scipy_fits"]
    truths, y = curve_fit_many.datasets(n, 0, "anywhere")
    _, y2 = curve_fit_many.datasets(n, 1, "anywhere")
    cold, popt, cold_compiles = curve_fit_many.ours(y2, 1)
    warm, popt, compiles = curve_fit_many.ours(y, 1)
    scipy_s, scipy_popt = curve_fit_many.scipy_loop(y[:k])
    scaled = scipy_s * n / k
    peer = f"scipy curve_fit loop ({k} fits, scaled)"
    good = curve_fit_many.good(popt, truths)
    return [
        dict(arm=f"{n} fits, cold", cold_s=cold, ratio=cold / scaled, peer=peer,
             compiles=cold_compiles),
        dict(arm=f"{n} fits, warm", warm_s=warm, ratio=warm / scaled, peer=peer,
             compiles=compiles, good=f"{good} of {n}"),
        dict(arm="scipy's loop (scaled)", warm_s=scaled, ratio=1.0, peer=peer,
             good=f"{curve_fit_many.good(scipy_popt, truths[:k])} of {k}"),
    ]  # fmt: skip


def table(sections: dict[str, list[dict]]) -> str:
    lines = [f"{'comparison / arm':<52}{'cold s':>9}{'warm s':>9}{'ratio':>8}  peer"]
    for name, rows in sections.items():
        lines.append(name)
        for r in rows:
            cold = f"{r['cold_s']:9.3f}" if "cold_s" in r else f"{'':9}"
            warm = f"{r['warm_s']:9.3f}" if "warm_s" in r else f"{'':9}"
            lines.append(f"  {r['arm']:<50}{cold}{warm}{r['ratio']:8.3f}  {r['peer']}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU: a smoke run")
    parser.add_argument("--json", default="gpu.json", help="where the figures are written")
    for key, value in FULL.items():
        if key != "widths":
            parser.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"default {value}")
    args = parser.parse_args(argv)
    size = dict(CPU if args.cpu else FULL)
    size |= {k: getattr(args, k) for k in FULL if k != "widths" and getattr(args, k) is not None}
    bad = [k for k, v in size.items() if k != "widths" and v < 1]
    if bad:
        parser.error(f"--{bad[0].replace('_', '-')} must be a positive int")
    return args, size


def main(argv=None) -> None:
    args, size = parse_args(argv)
    t0 = time.perf_counter()
    device = jax.devices()[0]
    objective, space = problem(args.cpu)
    sections = {
        "scan backend against the loop": scan_against_loop(size, objective, space),
        '"auto" against the best fixed width': auto_against_fixed(size, objective, space),
        "the image fit against scipy's loop on the CPU": image_against_scipy(
            size, args.cpu, objective, space
        ),
        "curve_fit(batched=True) against scipy's loop": curve_fits_against_scipy(size),
    }
    header = f"{device.device_kind} ({device.platform}); jax {jax.__version__}; sizes {size}"
    print(header)
    print(table(sections))
    wall = time.perf_counter() - t0
    print(f"total {wall:.1f} s")
    record = harness.Record("gpu", args)
    record.quick = args.cpu  # the smoke run's figures mean nothing
    for name, rows in sections.items():
        for r in rows:
            for key in ("cold_s", "warm_s"):
                if key in r:
                    record.figure(f"{name}: {r['arm']} {key}", r[key])
            record.ratios[f"{name}: {r['arm']}"] = {"value": r["ratio"], "peer": r["peer"]}
    data = dict(device=device.device_kind, platform=device.platform, jax=jax.__version__)
    data |= dict(sizes=size, wall_s=wall, sections=sections)
    Path(args.json).write_text(json.dumps({**record.as_dict(), **data}, indent=1, default=str))


if __name__ == "__main__":
    main()
