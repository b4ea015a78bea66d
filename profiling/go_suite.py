"""scipy's global-optimisation benchmark suite: which arm finds the global minimum, at what cost.

The functions are scipy's own (``benchmarks/benchmarks/go_benchmark_functions`` in scipy's
source tree, the Jamil & Yang 2013 survey functions with their bounds, ``fglob`` and
``success()``). scipy's wheels do not ship them and this project does not copy them: point
``--go-dir`` (or ``MULTISTART_GO_DIR``) at that folder of a scipy checkout. Each function's
module namespace is rebound to ``jax.numpy`` where numpy's name exists there, so the same code
traces under JAX; functions that then fail to trace, have ``N > --max-dim``, or whose gradient
is zero at a random point (``floor``-built ones) are skipped and listed.

Every arm is given the JAX function and its gradient and runs in one process, with one BLAS
thread (``harness.one_blas_thread``). Solved means the suite's own test, ``|f - fglob| < 1e-5``
(``Benchmark.success``) at the arm's best point. Arms (``ARMS``; ``--arms`` picks some):

  ours          ``MultiStartLBFGS(n_starts=32)`` with the defaults
  ours_tiktak   the same with ``start_strategy="tiktak"``
  ours_box      the defaults with ``start_band=(0, 1)``: candidates over the whole box
  ours_box_tiktak  both
  de            ``scipy.optimize.differential_evolution`` (polish with L-BFGS-B)
  lbfgsb32      scipy L-BFGS-B from 32 uniform starts over the box, best kept
  da            ``scipy.optimize.dual_annealing``

Per arm: solved functions (summed over seeds), the fraction of runs, the median evaluations per
run (gradients counted as evaluations: one value-and-grad is one), wall seconds summed, and the
functions it missed on any seed.

    python profiling/go_suite.py --go-dir PATH --quick          # 24 functions, 1 seed
    python profiling/go_suite.py --go-dir PATH --half --seeds 0,1,2
    python profiling/go_suite.py --go-dir PATH --only EggHolder,UrsemWaves --arms ours,ours_box
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize as so  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import multistart as ms  # noqa: E402


class _NumpyAsJax(types.ModuleType):
    """``np`` inside a suite module: ``jax.numpy``'s name where it has one, numpy's otherwise."""

    def __init__(self):
        super().__init__("numpy_as_jax")

    def __getattr__(self, name):
        return getattr(jnp, name) if hasattr(jnp, name) else getattr(np, name)


def _rebind(module) -> None:
    for name, value in list(vars(module).items()):
        if value is np:
            setattr(module, name, _NumpyAsJax())
        elif (
            callable(value)
            and getattr(value, "__module__", "") is not None
            and (
                isinstance(value, np.ufunc)
                or str(getattr(value, "__module__", "")).startswith("numpy")
            )
            and hasattr(jnp, getattr(value, "__name__", name))
        ):
            setattr(module, name, getattr(jnp, getattr(value, "__name__", name)))


def _import_suite(go_dir: Path):
    """scipy's folder as a package, under a parent whose ``common`` (asv's helpers, imported by
    ``go_benchmark.py`` and unused by the functions) is an empty stand-in."""
    import contextlib

    parent = types.ModuleType("_scipy_benchmarks")
    parent.__path__ = [str(go_dir.parent)]
    common = types.ModuleType("_scipy_benchmarks.common")
    common.safe_import = contextlib.nullcontext  # type: ignore[attr-defined]
    sys.modules.update({parent.__name__: parent, common.__name__: common})
    return importlib.import_module(f"{parent.__name__}.{go_dir.name}")


@dataclass
class Problem:
    name: str
    bench: object
    lower: np.ndarray
    upper: np.ndarray
    fglob: float
    value: Callable = field(repr=False)


def load(go_dir: str, max_dim: int = 10) -> tuple[list[Problem], dict[str, str]]:
    """The suite's functions that trace under JAX, and why each other one was skipped."""
    package = _import_suite(Path(go_dir).resolve())
    base = importlib.import_module(f"{package.__name__}.go_benchmark").Benchmark
    problems, skipped = [], {}
    for mod_name in sorted(
        p.stem for p in Path(go_dir).glob("go_funcs_*.py") if "univariate" not in p.stem
    ):
        module = importlib.import_module(f"{package.__name__}.{mod_name}")
        _rebind(module)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, base) or cls is base or cls.__module__ != module.__name__:
                continue
            why = _check(name, cls, max_dim)
            if isinstance(why, str):
                skipped[name] = why
            else:
                problems.append(why)
    return problems, skipped


def _check(name, cls, max_dim):
    try:
        bench = cls()
    except Exception as e:  # noqa: BLE001 - a suite class that cannot be built is skipped
        return f"construction failed: {e!r}"
    if bench.N > max_dim:
        return f"N = {bench.N} > {max_dim}"
    lower, upper = (np.asarray(b, dtype=np.float64) for b in zip(*bench.bounds, strict=True))
    if not np.all(upper > lower):
        return "empty box"

    def value(x):
        return jnp.asarray(bench.fun(x), dtype=jnp.float64).reshape(())

    probe = np.random.default_rng(0).uniform(lower, upper)
    try:
        f, g = jax.jit(jax.value_and_grad(value))(jnp.asarray(probe))
    except Exception as e:  # noqa: BLE001 - the suite's code may not trace under JAX
        return f"does not trace: {type(e).__name__}"
    if not np.isfinite(float(f)) or not np.all(np.isfinite(np.asarray(g))):
        return "non-finite value or gradient at a random point"
    if not np.any(np.asarray(g)):
        return "zero gradient at a random point (piecewise constant)"
    return Problem(name, bench, lower, upper, float(bench.fglob), value)


def _ours(**options) -> Callable:
    def run(problem: Problem, seed: int):
        space = {"x": ms.Uniform(problem.lower, problem.upper)}
        search = ms.MultiStartLBFGS(n_starts=32, seed=seed, progress=False, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = search.fit(lambda p: problem.value(p["x"]), space)
        return np.asarray(result.best_params["x"], dtype=np.float64), int(result.stats["n_evals"])

    return run


def _scipy_vg(problem: Problem):
    vg = jax.jit(jax.value_and_grad(problem.value))
    count = {"n": 0}

    def fun(x):
        count["n"] += 1
        f, g = vg(jnp.asarray(x))
        return float(f), np.asarray(g, dtype=np.float64)

    def f_only(x):
        return fun(x)[0]

    return fun, f_only, count


def _de(problem: Problem, seed: int):
    fun, f_only, count = _scipy_vg(problem)
    bounds = list(zip(problem.lower, problem.upper, strict=True))
    r = so.differential_evolution(f_only, bounds, seed=seed, polish=True)
    return np.asarray(r.x), count["n"]


def _da(problem: Problem, seed: int):
    fun, f_only, count = _scipy_vg(problem)
    bounds = list(zip(problem.lower, problem.upper, strict=True))
    r = so.dual_annealing(f_only, bounds, seed=seed)
    return np.asarray(r.x), count["n"]


def _lbfgsb32(problem: Problem, seed: int):
    fun, _, count = _scipy_vg(problem)
    bounds = list(zip(problem.lower, problem.upper, strict=True))
    rng = np.random.default_rng(seed)
    best_x, best_f = None, np.inf
    for x0 in rng.uniform(problem.lower, problem.upper, size=(32, problem.lower.size)):
        r = so.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds)
        if r.fun < best_f:
            best_x, best_f = r.x, r.fun
    return np.asarray(best_x), count["n"]


ARMS: dict[str, Callable] = {
    "ours": _ours(),
    "ours_tiktak": _ours(start_strategy="tiktak"),
    "ours_box": _ours(start_band=(0.0, 1.0)),
    "ours_box_tiktak": _ours(start_band=(0.0, 1.0), start_strategy="tiktak"),
    "de": _de,
    "lbfgsb32": _lbfgsb32,
    "da": _da,
}


def solved(problem: Problem, x: np.ndarray) -> bool:
    """The suite's own test at ``x`` (``Benchmark.success``), on numpy values."""
    try:
        return bool(problem.bench.success(np.asarray(x, dtype=np.float64)))
    except Exception:  # noqa: BLE001 - success() calls fun, which may need numpy input
        f = float(problem.value(jnp.asarray(x)))
        return bool(abs(f - problem.fglob) < 1e-5)


def run(problems, arms, seeds) -> dict:
    """Every arm on every problem and seed: ``{arm: {name: [(solved, evals, wall), ...]}}``."""
    out: dict = {a: {} for a in arms}
    for problem in problems:
        for arm in arms:
            for seed in seeds:
                t0 = time.perf_counter()
                try:
                    with harness.one_blas_thread():
                        x, evals = ARMS[arm](problem, seed)
                    ok = solved(problem, x)
                except Exception as e:  # noqa: BLE001 - one function's failure is one miss
                    print(f"  {arm} {problem.name} seed {seed}: {type(e).__name__}: {e}")
                    ok, evals = False, 0
                out[arm].setdefault(problem.name, []).append((ok, evals, time.perf_counter() - t0))
        line = "  ".join(
            f"{a} {sum(r[0] for r in out[a][problem.name])}/{len(seeds)}" for a in arms
        )
        print(f"{problem.name:18s} N={problem.lower.size:2d}  {line}", flush=True)
    return out


def table(out, n_problems, seeds) -> str:
    rows = [
        "| arm | solved runs | of | fraction | median evaluations | wall s | missed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm, per in out.items():
        runs = [r for rs in per.values() for r in rs]
        n_ok = sum(r[0] for r in runs)
        missed = sorted(n for n, rs in per.items() if not all(r[0] for r in rs))
        rows.append(
            f"| {arm} | {n_ok} | {len(runs)} | {n_ok / max(len(runs), 1):.3f} | "
            f"{int(np.median([r[1] for r in runs])) if runs else 0} | "
            f"{sum(r[2] for r in runs):.0f} | {', '.join(missed[:12])}"
            f"{' ...' if len(missed) > 12 else ''} |"
        )
    return "\n".join(rows)


def write_record(path: str, args, out: dict, skipped: dict) -> None:
    """The per-run records (``"runs"``, ``"skipped"``) in the harness's record: each arm's solved
    runs, median evaluations and wall, and their ratios against scipy's 32-start loop
    (``lbfgsb32``; the first arm when it is not run)."""
    record = harness.Record("go_suite", args)
    for arm, per in out.items():
        runs = [r for rs in per.values() for r in rs]
        record.figure(f"{arm} solved", sum(r[0] for r in runs))
        record.figure(f"{arm} runs", len(runs))
        record.figure(f"{arm} median evaluations", np.median([r[1] for r in runs]) if runs else 0)
        record.figure(f"{arm} wall s", sum(r[2] for r in runs))
    peer = "lbfgsb32" if "lbfgsb32" in out else next(iter(out))
    for arm in out:
        for key in ("solved", "median evaluations", "wall s"):
            record.ratio(f"{arm} {key} / {peer}", f"{arm} {key}", f"{peer} {key}")
    data = {**record.as_dict(), "skipped": skipped, "runs": out}
    Path(path).write_text(json.dumps(data, indent=1, default=str))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--go-dir", default=os.environ.get("MULTISTART_GO_DIR"))
    parser.add_argument("--arms", default="ours,ours_tiktak,de,lbfgsb32")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--max-dim", type=int, default=10)
    parser.add_argument("--only", default="", help="comma-separated function names")
    parser.add_argument("--half", action="store_true", help="every second function")
    parser.add_argument("--quick", action="store_true", help="every eighth function")
    parser.add_argument("--json", default="", help="write the record and per-run records here")
    args = parser.parse_args(argv)
    if not args.go_dir or not Path(args.go_dir).is_dir():
        parser.error("--go-dir (or MULTISTART_GO_DIR) must name scipy's go_benchmark_functions")
    arms = args.arms.split(",")
    for arm in arms:
        if arm not in ARMS:
            parser.error(f"--arms: {arm!r} is not one of {sorted(ARMS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds takes comma-separated ints; got {args.seeds!r}")
    jax.config.update("jax_enable_x64", True)
    problems, skipped = load(args.go_dir, args.max_dim)
    print(f"{len(problems)} functions trace under JAX; {len(skipped)} skipped")
    if args.only:
        wanted = set(args.only.split(","))
        problems = [p for p in problems if p.name in wanted]
    elif args.quick:
        problems = problems[::8]
    elif args.half:
        problems = problems[::2]
    out = run(problems, arms, seeds)
    print(table(out, len(problems), seeds))
    if args.json:
        write_record(args.json, args, out, skipped)


if __name__ == "__main__":
    main()
