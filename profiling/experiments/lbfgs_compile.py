"""Compile seconds of the L-BFGS chunk step against Adam's, on the same objectives, before and
after a change to ``multistart/solvers/lbfgs.py``.

Arms, each compiled in a fresh process with the persistent compilation cache off (the chunk
step's XLA compile, ``lower().compile()``, timed as wall and as process CPU seconds; CPU time
moves less with other jobs on the machine):

  adam         MultiStartAdam
  lbfgs        MultiStartLBFGS as the working tree has it
  lbfgs@REV    the LBFGS solver of ``multistart/solvers/lbfgs.py`` at git revision REV (with
               ``--before REV``), run by the same engine: the "before" of a change

Objectives: ``curve`` (3 parameters, 60 points: the step's own code dominates), ``bench``
(benchmark_model.py: 31 parameters, 4 datasets) and ``image`` (image_model.py: 48
parameters, float64: the model dominates). Width 8, 8 starts; rounds interleave the arms and
the table gives medians and each arm's ratio to Adam's.

    python profiling/experiments/lbfgs_compile.py --before ab06b41 --rounds 3  # the rule before
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # profiling/: the harness and the models
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402


def objective(name: str):
    import jax.numpy as jnp
    import numpy as np

    import multistart as ms

    sys.path.insert(0, str(HERE))
    if name == "curve":
        x = np.linspace(0.0, 10.0, 60)
        y = 3.0 * np.exp(-0.4 * x) + 0.5

        def curve(p):
            return jnp.sum((p["a"] * jnp.exp(-p["k"] * x) + p["c"] - y) ** 2)

        space = {"a": ms.Uniform(0, 10), "k": ms.LogUniform(0.01, 5), "c": ms.Uniform(-2, 2)}
        return curve, space
    if name == "bench":
        import benchmark_model as bm

        return bm.make_objective(), bm.space()
    import image_model

    f, space, _ = image_model.make_problem()
    return f, space


def solver_at(rev: str):
    """The ``LBFGS`` class of ``multistart/solvers/lbfgs.py`` at git revision ``rev``."""
    for where in ("src/multistart", "multistart"):  # the src/ layout, then the one before it
        shown = subprocess.run(
            ["git", "show", f"{rev}:{where}/solvers/lbfgs.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if shown.returncode == 0:
            break
    shown.check_returncode()
    text = shown.stdout
    path = Path(tempfile.mkdtemp()) / "lbfgs_before.py"
    path.write_text(text)
    # a module inside the package, so its relative imports resolve as the original's did
    spec = importlib.util.spec_from_file_location("multistart.solvers.lbfgs_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.LBFGS


def run_arm(arm: str, model: str) -> dict:
    """Compile the chunk step of ``arm`` on ``model`` in this (fresh) process."""
    os.environ["MULTISTART_CACHE_DIR"] = ""
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import multistart as ms
    from multistart.device import backends

    timed = {}

    def lower_and_compile(jitted, what, *args):
        lowered = jitted.lower(*args)
        cpu0, t0 = time.process_time(), time.perf_counter()
        compiled = lowered.compile()
        if "chunk step" in what:
            timed.update(wall=time.perf_counter() - t0, cpu=time.process_time() - cpu0)
            timed["kernels"] = compiled.as_text().count(" fusion(")
        return compiled, time.perf_counter() - t0

    backends.lower_and_compile = lower_and_compile
    common = dict(n_starts=8, batch_size=8, n_steps=3, n_candidates=0, log_every=0)
    if arm == "adam":
        search = ms.MultiStartAdam(progress=False, **common)
    elif arm == "lbfgs":
        search = ms.MultiStartLBFGS(progress=False, **common)
    else:
        search = ms.MultiStartGradient(solver_at(arm.split("@")[1])(), progress=False, **common)
    f, space = objective(model)
    search.fit(f, space)
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="curve,bench,image")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", help="a git revision: add its L-BFGS as an arm")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    harness.add_arguments(parser)
    args = parser.parse_args()
    if args.arm:
        arm, model = args.arm.rsplit(":", 1)
        harness.child_result(run_arm(arm, model))
        return
    arms = ["adam", "lbfgs"] + ([f"lbfgs@{args.before}"] if args.before else [])
    models = args.models.split(",")
    rows: dict[tuple[str, str], list[dict]] = {}
    for model in models:

        def child(arm, model=model):
            row = harness.fresh_process(__file__, "--arm", f"{arm}:{model}", required=False)
            print(f"  {arm} {model}: {row}", file=sys.stderr, flush=True)
            return row

        runs = harness.interleave({arm: functools.partial(child, arm) for arm in arms}, args.rounds)
        for arm, got in runs.items():
            if any(got):
                rows[(arm, model)] = [row for row in got if row is not None]
    report(args, arms, models, rows)


def report(args, arms, models, rows) -> None:
    import jax

    record = harness.Record("lbfgs_compile", args)
    for (arm, model), got in rows.items():
        for key in ("wall", "cpu", "kernels"):
            record.figure(f"{model} {arm} {key}", harness.median(row[key] for row in got))
    print(f"chunk-step compile, width 8; median of {args.rounds} rounds; jax {jax.__version__}")
    print(f"{'objective':10s} {'arm':18s} {'wall s':>7s} {'/ adam':>7s} {'cpu s':>7s} "
          f"{'/ adam':>7s} {'kernels':>8s}")  # fmt: skip
    for model in models:
        for arm in arms:
            if (arm, model) not in rows or ("adam", model) not in rows:
                continue
            wall, cpu = (
                record.ratio(f"{model} {arm} {k} / adam", f"{model} {arm} {k}", f"{model} adam {k}")
                for k in ("wall", "cpu")
            )
            f = record.figures
            print(
                f"{model:10s} {arm:18s} {f[f'{model} {arm} wall']:7.2f} {wall:7.2f} "
                f"{f[f'{model} {arm} cpu']:7.2f} {cpu:7.2f} {f[f'{model} {arm} kernels']:8.0f}"
            )
    record.write(args.json)


if __name__ == "__main__":
    main()
