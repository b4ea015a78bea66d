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
  ours_round1   the defaults with ``n_local=128``: one round of TikTak's weights (the default
                before 2026-12-05, which runs two)
  ours_band     ``MultiStartLBFGS(n_starts=32, start_strategy="band")`` (the default before
                2026-12-03)
  ours_halving  the defaults with ``schedule="halving"``: the race of the local searches
  ours_band_halving  ``start_strategy="band"`` with ``schedule="halving"``
  ours_sobol    the same with ``start_strategy="sobol"``
  ours_tiktak   the same with ``start_strategy="tiktak"``
  ours_box      the defaults with ``start_band=(0, 1)``: candidates over the whole box
  ours_box99    the defaults with ``start_band=(0.01, 0.99)``: all but the 1 % next to a bound
  ours_box_tiktak  both (``n_local`` 4 x 32 = 128 local searches)
  ours_box99_tiktak  TikTak with ``start_band=(0.01, 0.99)``
  ours_box_tiktak64, ours_box_tiktak96, ours_box_tiktak192  both, with 64, 96 or 192 local
                searches (all but ``_all`` end by TikTak's default ``max_discoveries``)
  ours_box_tiktak_all  both, with ``max_discoveries=None``: every one of the 128 local searches
  de            ``scipy.optimize.differential_evolution`` (polish with L-BFGS-B)
  lbfgsb32      scipy L-BFGS-B from 32 uniform starts over the box, best kept
  da            ``scipy.optimize.dual_annealing``

Per arm: solved functions (summed over seeds), the fraction of runs, the median evaluations per
run (gradients counted as evaluations: one value-and-grad is one; our arms' count includes the
filter's candidates, value-only as DE's are), wall seconds summed, and the functions it missed
on any seed; then every missed run, how far above ``fglob`` its best ended (``f - fglob`` by
seed; in ``--json``'s runs each run is ``(solved, evaluations, wall s, f - fglob)``).

``--budget N`` compares the arms at equal evaluation budgets: each is stopped at ``N``
evaluations of a function and sized to spend them (ours: ``N // 4`` filter candidates and
``max_evals`` the rest, checked at host syncs, so a run can overshoot by a step of each running
start; a one-wave strategy gets ``N // 40`` starts, TikTak 32 slots refilled until the budget is
spent; scipy's arms run until it is, their best point kept).

    python profiling/go_suite.py --go-dir PATH --quick          # 24 functions, 1 seed
    python profiling/go_suite.py --go-dir PATH --half --seeds 0,1,2
    python profiling/go_suite.py --go-dir PATH --only EggHolder,UrsemWaves --arms ours,ours_box
    python profiling/go_suite.py --go-dir PATH --quick --budget 2000 --arms ours,ours_tiktak
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


# --budget N: every arm is stopped at N evaluations of a function (its filter's candidates
# included) and sized to use them. A one-wave strategy gets one start per PER_START
# evaluations (a tenth of them the filter's candidates, the default ratio); TikTak keeps 32
# slots and refills them until the budget is spent; scipy's arms run until it is.
PER_START = 40


class _Spent(Exception):
    """A scipy arm's budget is spent (raised from its objective, caught by the arm)."""


def _ours(**options) -> Callable:
    def run(problem: Problem, seed: int, budget: int | None = None):
        space = {"x": ms.Uniform(problem.lower, problem.upper)}
        sized = dict(n_starts=32)
        if budget is not None:
            n_candidates = budget // 4
            sized = dict(n_candidates=n_candidates, max_evals=budget - n_candidates)
            if options.get("start_strategy") == "tiktak":
                sized.update(n_starts=32, n_local=n_candidates)
            else:
                sized.update(n_starts=max(8, budget // PER_START))
        search = ms.MultiStartLBFGS(seed=seed, progress=False, **sized, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = search.fit(lambda p: problem.value(p["x"]), space)
        # the filter's candidates are evaluations too (of the value alone, as DE's are)
        evals = int(result.stats["n_evals"]) + int(result.stats.get("n_candidates", 0))
        evals += int(result.stats.get("n_explore_candidates", 0))
        return np.asarray(result.best_params["x"], dtype=np.float64), evals

    return run


class _Counted:
    """A scipy arm's objective: counts evaluations, keeps the best point, and raises
    :class:`_Spent` once ``budget`` were made."""

    def __init__(self, problem: Problem, budget: int | None):
        self.vg = jax.jit(jax.value_and_grad(problem.value))
        self.budget, self.n = budget, 0
        self.best_x, self.best_f = None, np.inf

    def __call__(self, x):
        if self.budget is not None and self.n >= self.budget:
            raise _Spent
        self.n += 1
        f, g = self.vg(jnp.asarray(x))
        f = float(f)
        if f < self.best_f:
            self.best_x, self.best_f = np.array(x, dtype=np.float64), f
        return f, np.asarray(g, dtype=np.float64)

    def f_only(self, x):
        return self(x)[0]


def _scipy(method: Callable) -> Callable:
    def run(problem: Problem, seed: int, budget: int | None = None):
        fun = _Counted(problem, budget)
        bounds = list(zip(problem.lower, problem.upper, strict=True))
        try:
            method(fun, bounds, problem, seed, budget)
        except _Spent:
            pass
        return fun.best_x, fun.n

    return run


def _de(fun, bounds, problem, seed, budget):
    so.differential_evolution(
        fun.f_only, bounds, seed=seed, polish=True, maxiter=10**6 if budget else 1000
    )


def _da(fun, bounds, problem, seed, budget):
    so.dual_annealing(fun.f_only, bounds, seed=seed, maxfun=budget or 10**7)


def _lbfgsb32(fun, bounds, problem, seed, budget):
    """L-BFGS-B from uniform starts over the box: 32, or as many as the budget allows."""
    rng = np.random.default_rng(seed)
    n_starts = 32 if budget is None else 10**6
    for _ in range(n_starts):
        x0 = rng.uniform(problem.lower, problem.upper)
        so.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds)


ARMS: dict[str, Callable] = {
    "ours": _ours(),
    "ours_round1": _ours(n_local=128),
    "ours_band": _ours(start_strategy="band"),
    "ours_halving": _ours(schedule="halving"),
    "ours_band_halving": _ours(start_strategy="band", schedule="halving"),
    "ours_sobol": _ours(start_strategy="sobol"),
    "ours_tiktak": _ours(start_strategy="tiktak"),
    "ours_box": _ours(start_band=(0.0, 1.0)),
    "ours_box99": _ours(start_band=(0.01, 0.99)),
    "ours_box_tiktak": _ours(start_band=(0.0, 1.0), start_strategy="tiktak"),
    "ours_box99_tiktak": _ours(start_band=(0.01, 0.99), start_strategy="tiktak"),
    "ours_box_tiktak64": _ours(start_band=(0.0, 1.0), start_strategy="tiktak", n_local=64),
    "ours_box_tiktak96": _ours(start_band=(0.0, 1.0), start_strategy="tiktak", n_local=96),
    "ours_box_tiktak192": _ours(start_band=(0.0, 1.0), start_strategy="tiktak", n_local=192),
    "ours_box_tiktak_all": _ours(
        start_band=(0.0, 1.0), start_strategy="tiktak", max_discoveries=None
    ),
    "de": _scipy(_de),
    "lbfgsb32": _scipy(_lbfgsb32),
    "da": _scipy(_da),
}


def solved(problem: Problem, x: np.ndarray) -> bool:
    """The suite's own test at ``x`` (``Benchmark.success``), on numpy values."""
    try:
        return bool(problem.bench.success(np.asarray(x, dtype=np.float64)))
    except Exception:  # noqa: BLE001 - success() calls fun, which may need numpy input
        return bool(gap(problem, x) < 1e-5)


def gap(problem: Problem, x: np.ndarray) -> float:
    """How far above the recorded global minimum ``x`` is: ``f(x) - fglob`` (the function as
    traced for the arms; negative where ``x`` is below the recorded ``fglob``)."""
    return float(problem.value(jnp.asarray(x, dtype=jnp.float64))) - problem.fglob


def run(problems, arms, seeds, budget=None) -> dict:
    """Every arm on every problem and seed:
    ``{arm: {name: [(solved, evals, wall, f - fglob), ...]}}``."""
    out: dict = {a: {} for a in arms}
    for problem in problems:
        for arm in arms:
            for seed in seeds:
                t0 = time.perf_counter()
                try:
                    with harness.one_blas_thread():
                        x, evals = ARMS[arm](problem, seed, budget)
                    ok, above = solved(problem, x), gap(problem, x)
                except Exception as e:  # noqa: BLE001 - one function's failure is one miss
                    print(f"  {arm} {problem.name} seed {seed}: {type(e).__name__}: {e}")
                    ok, evals, above = False, 0, float("nan")
                wall = time.perf_counter() - t0
                out[arm].setdefault(problem.name, []).append((ok, evals, wall, above))
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


def missed_runs(out, seeds) -> str:
    """Each arm's missed runs, a function a line: how far above ``fglob`` each seed's best
    ended (``f - fglob``; the suite solves below 1e-5)."""
    lines = []
    for arm, per in out.items():
        for name, rs in sorted(per.items()):
            if all(r[0] for r in rs):
                continue
            gaps = ", ".join(
                f"{seed}: {'solved' if r[0] else f'{r[3]:.2g}'}"
                for seed, r in zip(seeds, rs, strict=True)
            )
            lines.append(f"{arm:10s} {name:20s} {gaps}")
    return "\n".join(lines)


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
    parser.add_argument("--quarter", action="store_true", help="every fourth function")
    harness.add_arguments(parser, quick="every eighth function")  # --json: the per-run rows too
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        help="evaluations per function, every arm stopped there and sized to use them",
    )
    args = parser.parse_args(argv)
    if not args.go_dir or not Path(args.go_dir).is_dir():
        parser.error("--go-dir (or MULTISTART_GO_DIR) must name scipy's go_benchmark_functions")
    if args.budget is not None and args.budget < 4 * PER_START:
        parser.error(f"--budget must be at least {4 * PER_START} evaluations")
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
    elif args.quarter:
        problems = problems[::4]
    elif args.half:
        problems = problems[::2]
    out = run(problems, arms, seeds, args.budget)
    print(table(out, len(problems), seeds))
    print("missed runs, f - fglob by seed:")
    print(missed_runs(out, seeds))
    if args.json:
        write_record(args.json, args, out, skipped)


if __name__ == "__main__":
    main()
