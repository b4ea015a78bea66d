"""The named rules against PyAutoFit's at equal steps, and what makes the difference.

PyAutoFit's ``MultiStartAdam`` / ``Prodigy`` / ``ADABelief`` / ``Lion`` are where this
project's core came from; a user moving over runs the same rule on the same model for the same
number of steps and compares. Both benchmarks, 32 starts, 100 steps, width 4, convergence off
in both, float64:

- ``image``: ``profiling/image_model.py`` (48 parameters, eight elliptical Gaussians in four
  bands of different grids);
- ``multi``: ``profiling/benchmark_model.py`` (31 parameters, four datasets of different shapes
  sharing three Gaussian components).

The PyAutoFit arm runs in PyAutoFit's own environment (Python >= 3.12; see
``profiling/experiments/pyautofit_arm.py``), a subprocess of this script, with its defaults:
steps in physical parameters, learning rate 0.01 (Lion 0.001, Prodigy none), starts uniform in the
central 70 % of each prior's unit interval. Without that environment
(``--pyautofit-python``, default ``$MULTISTART_PYAUTOFIT_PYTHON`` or
``/work/pyautofit-env/bin/python``) its arms are skipped with a message. Its figure of merit is
``-2 log posterior``; every arm here is scored by the same jitted χ² at its best point.

Arms per benchmark, rule and seed (``--arms``):

- ``pyautofit``: PyAutoFit's rule, its defaults (cached in ``--runs`` by problem, rule, seed
  and step count; ``--fresh`` reruns, ``--cached-only`` never runs PyAutoFit here);
- ``ours``: ``ms.MultiStart<Rule>`` with its defaults (the diverse filter, logistic coordinates);
- ``broad``: the same with ``n_candidates=0`` (uniform starts in the band, no filter);
- ``their-starts``: the same, from PyAutoFit's own starts (start selection isolated);
- ``physical``: our engine stepping as PyAutoFit does (each parameter its own coordinate: an
  identity map; the χ² and its gradient wherever a step lands, and a huge constant outside
  the box so no such point is a best, as PyAutoFit's log prior makes it ``inf``) with
  PyAutoFit's learning rate, from its starts: the engine reproducing PyAutoFit's answer;
- ``lr``: from PyAutoFit's starts, the learning rate times each of ``--lr-factors``, in our
  coordinates (``lr xF``, F times our default) and in PyAutoFit's (``physical xF``, F times
  PyAutoFit's); not for Prodigy;
- ``grad``: the gradient's scale at PyAutoFit's starts in both coordinate systems, against
  Adam's ``eps`` (1e-8).

Wall seconds include each arm's compile (our arms run with the compilation cache off, as each
PyAutoFit process compiles afresh); PyAutoFit's is its ``fit`` (result files and plots
included) and the note gives its ``run`` alone. On a shared machine only ratios measured in
one run mean anything: use ``--fresh`` for a wall ratio.

    python profiling/experiments/pyautofit_peer.py  # every rule, both, seed 0
    python profiling/experiments/pyautofit_peer.py --problems image --rules adam --arms all \
        --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MULTISTART_CACHE_DIR", "")  # cold compiles, as in the peer's process
HERE = Path(__file__).resolve().parents[1]  # profiling/: the harness and the models
sys.path.insert(0, str(HERE))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import benchmark_model  # noqa: E402
import image_model  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.model.priors import Space  # noqa: E402

RULES = {
    "adam": ms.MultiStartAdam,
    "prodigy": ms.MultiStartProdigy,
    "adabelief": ms.MultiStartADABelief,
    "lion": ms.MultiStartLion,
}
PEER_LR = {"adam": 0.01, "adabelief": 0.01, "lion": 0.001, "prodigy": 1.0}
ARMS = ("pyautofit", "ours", "broad", "their-starts", "physical", "lr", "grad")
DEFAULT_ARMS = ("pyautofit", "ours")
N_STARTS, N_STEPS, WIDTH = 32, 100, 4
DEFAULT_PEER_PYTHON = "/work/pyautofit-env/bin/python"


def problem(name: str):
    """``(objective, space_tree)`` of a benchmark, float64 (``main`` jits the χ² that scores
    every arm once)."""
    if name == "image":
        objective, space_tree, _ = image_model.make_problem()
    else:
        objective, space_tree = benchmark_model.make_objective(), benchmark_model.space()
    return objective, space_tree


def unflat(space: Space, flat) -> dict:
    """Flat ``(n, n_dims)`` vectors in space order to a params pytree with a leading axis."""
    flat = np.asarray(flat, dtype=np.float64)
    leaves, i = [], 0
    for p in space.priors:
        leaves.append(flat[:, i : i + p.size].reshape(len(flat), *p.shape))
        i += p.size
    return space.unflatten(leaves)


def peer_run(args, prob, rule, seed) -> dict | None:
    """PyAutoFit's arm: cached JSON, or a fresh run of ``pyautofit_arm.py`` in its own env."""
    tag = "" if args.n_steps == N_STEPS else f"-{args.n_steps}steps"
    out = Path(args.runs) / f"{prob}-{rule}-{seed}{tag}.json"
    if out.exists() and not args.fresh:
        return json.loads(out.read_text())
    if args.cached_only or not Path(args.pyautofit_python).exists():
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    arm = Path(__file__).with_name("pyautofit_arm.py")
    cmd = [args.pyautofit_python, str(arm), "--problem", prob]
    cmd += ["--rule", rule, "--seed", str(seed), "--out", str(out)]
    cmd += ["--n-starts", str(N_STARTS), "--n-steps", str(args.n_steps)]
    cmd += ["--batch-size", str(WIDTH)]
    with tempfile.TemporaryDirectory(prefix="pyautofit-arm-") as cwd:  # its ./output
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        print(f"PyAutoFit arm failed ({prob}, {rule}, seed {seed}):\n{done.stderr[-3000:]}")
        return None
    return json.loads(out.read_text())


def ours(rule, seed, objective, space_tree, *, starts=None, n_steps=N_STEPS, **options) -> dict:
    """One fit of our named rule at the benchmark's settings: its best point, wall, result."""
    search = RULES[rule](
        n_starts=N_STARTS,
        batch_size=WIDTH,
        n_steps=n_steps,
        seed=seed,
        convergence=None,
        progress=False,
        **options,
    )
    t0 = time.perf_counter()
    result = search.fit(objective, space_tree, starts=starts)
    return {"wall_s": time.perf_counter() - t0, "best": result.best_params, "result": result}


def physical_arm(rule, seed, objective, space, their_starts, lr, n_steps) -> dict:
    """Our engine stepping as PyAutoFit does, from its starts with its learning rate.

    Each parameter is its own coordinate (``Normal(0, 1)``: an identity map), and the figure
    of merit is PyAutoFit's: the χ² (its gradient wherever a step lands, so a start outside
    the box keeps stepping), plus a huge constant outside the priors' box, so such a point is
    never anyone's best (PyAutoFit's is ``inf`` there, through the log prior).
    """
    tree = space.unflatten(ms.Normal(0.0, 1.0, shape=p.shape) for p in space.priors)
    lo = [jnp.asarray(p.lower_bound) for p in space.priors]
    hi = [jnp.asarray(p.upper_bound) for p in space.priors]

    def peer_fom(params):
        leaves = space.leaves(params)
        out = [jnp.any((v < a) | (v > b)) for v, a, b in zip(leaves, lo, hi, strict=True)]
        penalty = jnp.where(jnp.any(jnp.stack(out)), 1e30, 0.0)
        return objective(params) + jax.lax.stop_gradient(penalty)

    lr_kw = {} if rule == "prodigy" else {"learning_rate": lr}
    return ours(rule, seed, peer_fom, tree, starts=their_starts, n_steps=n_steps, **lr_kw)


def grad_scale(objective, space: Space, starts_flat) -> dict:
    """Median and smallest |∂χ²/∂coordinate| over the starts, in each coordinate system."""

    def chi2_u(u):
        return objective(space.unravel(space.forward_flat(u)))

    def chi2_x(x):
        return objective(space.unravel(x))

    x = jnp.asarray(starts_flat)
    u = jnp.asarray(np.stack([space.ravel(space.to_unconstrained(unflat(space, x)))]))[0]
    gu = np.abs(np.asarray(jax.jit(jax.vmap(jax.grad(chi2_u)))(u)))
    gx = np.abs(np.asarray(jax.jit(jax.vmap(jax.grad(chi2_x)))(x)))
    return {
        "logistic: median |g|": float(np.median(gu)),
        "logistic: min |g|": float(gu.min()),
        "physical: median |g|": float(np.median(gx)),
        "physical: min |g|": float(gx.min()),
    }


def inside(space: Space, best) -> bool:
    """Is a best point inside every prior's bounds (PyAutoFit's steps can leave them)?"""
    return all(
        bool(np.all(p.contains(v))) for p, v in zip(space.priors, space.leaves(best), strict=True)
    )


def run_one(args, prob, rule, seed, objective, space_tree, chi2) -> list[dict]:
    """Every asked-for arm of one benchmark, rule and seed; prints a line per arm."""
    space = Space(space_tree)
    rows: list[dict] = []

    def row(arm, rec, note=""):
        best = jax.tree_util.tree_map(np.asarray, rec["best"])
        r = {"problem": prob, "rule": rule, "seed": seed, "arm": arm, "wall_s": rec["wall_s"]}
        r.update(chi2=float(chi2(best)), inside=inside(space, best), note=note)
        rows.append(r)
        print(_fmt(r, rows[0] if rows[0]["arm"] == "pyautofit" else None), flush=True)

    peer = peer_run(args, prob, rule, seed) if "pyautofit" in args.arms else None
    if "pyautofit" in args.arms and peer is None:
        print(
            f"(PyAutoFit arm skipped: no run cached in {args.runs} and no environment at "
            f"{args.pyautofit_python}, or --cached-only)"
        )
    if peer is not None:
        best = _first(unflat(space, [peer["best"]]))
        run_s = peer.get("run_s")
        note = f"lr {peer['learning_rate']}" + (f"; its run {run_s:.1f} s" if run_s else "")
        row("pyautofit", {"wall_s": peer["wall_s"], "best": best}, note)
    fit = functools.partial(ours, rule, seed, objective, space_tree, n_steps=args.n_steps)
    if "ours" in args.arms:
        row("ours", fit())
    if "broad" in args.arms:
        row("broad", fit(n_candidates=0), "n_candidates=0")
    if peer is not None:
        _cause_rows(args, rule, seed, objective, space, peer, fit, row, rows)
    return rows


def _cause_rows(args, rule, seed, objective, space, peer, fit, row, rows) -> None:
    """The arms that need PyAutoFit's starts: coordinates, learning rate, gradient scale."""
    their = unflat(space, peer["starts"])
    if "their-starts" in args.arms:
        row("their-starts", fit(starts=their))
    physical = functools.partial(physical_arm, rule, seed, objective, space, their)
    if "physical" in args.arms:
        row("physical", physical(PEER_LR[rule], args.n_steps), f"lr {PEER_LR[rule]}")
    if "lr" in args.arms and rule != "prodigy":
        default = RULES[rule]().solver.hyperparameters()["learning_rate"]
        for f in args.lr_factors:
            lr = default * f
            row(f"lr x{f:g}", fit(starts=their, learning_rate=lr), f"their starts, lr {lr:g}")
            lr = PEER_LR[rule] * f
            row(f"physical x{f:g}", physical(lr, args.n_steps), f"lr {lr:g}")
    if "grad" in args.arms:
        g = grad_scale(objective, space, np.asarray(peer["starts"]))
        print("   gradient scale at PyAutoFit's starts (Adam's eps is 1e-8):", _round(g))
        rows.append({"problem": peer["problem"], "rule": rule, "seed": seed, "arm": "grad", **g})


def _first(tree):
    return jax.tree_util.tree_map(lambda a: a[0], tree)


def _round(d):
    return {k: float(f"{v:.3g}") for k, v in d.items()}


def _fmt(r, peer) -> str:
    ratio = ""
    if peer is not None and r is not peer:
        ratio = f"  χ² {r['chi2'] / peer['chi2']:.4f}x  wall {r['wall_s'] / peer['wall_s']:.2f}x"
    flag = "" if r["inside"] else "  (best point outside the priors)"
    return (
        f"{r['problem']:5s} {r['rule']:9s} seed {r['seed']}  {r['arm']:13s} "
        f"χ² {r['chi2']:12.1f}  {r['wall_s']:6.1f} s{ratio}{flag}  {r['note']}"
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="+", choices=("image", "multi"), default=["image", "multi"])
    ap.add_argument("--rules", nargs="+", choices=tuple(RULES), default=list(RULES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--n-steps", type=int, default=N_STEPS, help="steps in every arm")
    ap.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), help=f"of {ARMS} or 'all'")
    ap.add_argument("--lr-factors", nargs="+", type=float, default=[0.2, 2.0, 4.0])
    ap.add_argument(
        "--pyautofit-python",
        default=os.environ.get("MULTISTART_PYAUTOFIT_PYTHON", DEFAULT_PEER_PYTHON),
    )
    ap.add_argument(
        "--runs",
        default=str(Path(tempfile.gettempdir()) / "multistart-pyautofit-runs"),
        help="where PyAutoFit's arms are kept (JSON per problem, rule, seed, steps)",
    )
    ap.add_argument("--fresh", action="store_true", help="rerun cached PyAutoFit arms")
    ap.add_argument("--cached-only", action="store_true", help="never run PyAutoFit here")
    ap.add_argument("--out", default=None, help="write every row as JSON here")
    args = ap.parse_args(argv)
    args.arms = ARMS if args.arms == ["all"] else tuple(args.arms)
    bad = set(args.arms) - set(ARMS)
    if bad:
        ap.error(f"unknown arms {sorted(bad)}; choose from {ARMS} or 'all'")
    ms.set_log_level("WARNING")
    rows = []
    for prob in args.problems:
        objective, space_tree = problem(prob)
        chi2 = jax.jit(objective)
        for rule in args.rules:
            for seed in args.seeds:
                rows += run_one(args, prob, rule, seed, objective, space_tree, chi2)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
