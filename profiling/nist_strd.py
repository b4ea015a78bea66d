"""NIST StRD nonlinear regression: every arm on the 27 certified problems (issue 31's figures).

Each problem (``tests/nist.py``: data, models, the search box built from NIST's two starting
values) is fitted by every arm in one process, float64; the order of the arms turns by one each
problem so that drift favours none. Arms:

- ``lm``: ``MultiStartLeastSquares(n_starts=32, seed=s)`` on the residuals ``model(b, x) - y``
  over the box (``LogUniform`` for "log" entries, ``Uniform`` for "linear"), defaults otherwise.
- ``lbfgs``: ``MultiStartLBFGS(n_starts=32, seed=s, absolute_sigma=False, n_data=m)`` on the
  sum of squares, the same space (its errors: the Laplace approximation on NIST's scale; NIST
  certifies the linearised ones, which differ by the model's curvature).
- ``trf s1``, ``trf s2``: scipy ``least_squares(method="trf")``, default tolerances, unbounded,
  from NIST's start 1 / start 2; jitted JAX residuals and analytic Jacobian (``jax.jacfwd``).
- ``trf box32``: the same with the box as bounds, from 32 starts drawn in the box (uniform, or
  log-uniform for "log" entries; seeded), the best of 32.
- ``lmfit s1``, ``lmfit s2``: lmfit ``minimize(method="leastsq")`` (MINPACK, its own finite
  differences) on the same jitted residuals; skipped when lmfit is not installed.

Scores: the worst parameter LRE up to relabelling (solved: >= 4), the worst standard deviation
LRE against NIST's in the certified labelling (ours: ``result.errors``; scipy: ``sqrt(diag((JᵀJ)⁻¹)
SSR/dof)`` at its answer; lmfit: ``stderr``), the LRE of the sum of squares at the answer, the
wall, and our status counts. A wall covers building the closures (and the jits they compile)
and the fit, not the errors. scipy and lmfit run with one BLAS thread (``harness.py``). The peer
arms of one problem jit the same residual program: the first of them compiles it, the others
load it from the cache (tens of milliseconds either way).

"Cold": the first fit of that problem by that arm in this process, over an empty persistent
compilation cache (a fresh temporary folder unless ``--cache DIR``). ``--warm`` fits every arm
twice in a row, each time with new closures (as a second run of the script would), and reports
the second; its summary gives both passes' walls. With several seeds only the first seed's fits
are cold: the walls in the summary are the first seed's.

    python profiling/nist_strd.py                      # all 27, seed 0, cold
    python profiling/nist_strd.py --warm --markdown
    python profiling/nist_strd.py --problems MGH09,ENSO --seeds 0,1,2
    python profiling/nist_strd.py --quick --json nist.json    # DanWood, Misra1a; the record

``--json PATH`` writes the run's record (``profiling/harness.py``): every score and wall, each
arm's solved count, and its summed wall against ``trf box32``'s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")

import harness  # noqa: E402
import nist  # noqa: E402  (NumPy only: importing it configures nothing)

N_STARTS = 32
SOLVED = 4.0  # worst parameter LRE
OURS = ("lm", "lbfgs")
SEEDED = (*OURS, "trf box32")
PEERS = ("trf s1", "trf s2", "trf box32", "lmfit s1", "lmfit s2")
REFERENCE = "trf box32"  # the walls' denominator: scipy's 32-start loop
STRATEGY = "auto"  # our arms' start_strategy (--strategy)
QUICK = ("DanWood", "Misra1a")  # --quick: two small problems


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problems", default=",".join(nist.NAMES), help="comma-separated names")
    p.add_argument("--seeds", default="0", help="comma-separated ints, e.g. 0,1,2")
    p.add_argument("--warm", action="store_true", help="fit twice, report the second")
    p.add_argument("--cache", help="persistent compilation cache folder (default: a fresh one)")
    p.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    strategies = ("auto", "band", "sobol", "lhs", "tiktak")  # multistart.START_STRATEGIES, auto
    p.add_argument("--strategy", default="auto", choices=strategies, help="our arms' starts")
    harness.add_arguments(p, quick=f"{', '.join(QUICK)} only (unless --problems)")
    args = p.parse_args(argv)
    if args.quick and args.problems == ",".join(nist.NAMES):
        args.problems = ",".join(QUICK)
    args.problems = [s for s in args.problems.split(",") if s]
    unknown = [s for s in args.problems if s not in nist.MODELS]
    if unknown or not args.problems:
        p.error(
            f"unknown problem(s) {', '.join(unknown) or '(none given)'}; choose from "
            + ", ".join(nist.NAMES)
        )
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds takes comma-separated ints, e.g. 0,1,2; got {args.seeds!r}")
    return args


# -- the problem as each arm sees it --------------------------------------------------------------


def residual_fns(problem):
    """New closures ``(vector, named)``: residuals of a parameter vector and of ``{"b1": ..}``."""
    import jax.numpy as jnp

    model, x, y, names = nist.MODELS[problem.name], problem.x, problem.y, problem.names

    def vector(b):
        return model(b, x, jnp) - y

    def named(p):
        return vector([p[k] for k in names])

    return vector, named


def space_of(problem) -> dict:
    import multistart as ms

    prior = {"log": ms.LogUniform, "linear": ms.Uniform}
    entries = zip(problem.names, nist.box(problem), strict=True)
    return {k: prior[kind](lo, hi) for k, (kind, lo, hi) in entries}


def box_starts(problem, n: int, seed: int) -> np.ndarray:
    """``(n, n_params)`` starts drawn in the box: log-uniform for "log" entries."""
    rng = np.random.default_rng(seed)
    cols = []
    for kind, lo, hi in nist.box(problem):
        if kind == "log":
            cols.append(np.exp(rng.uniform(np.log(lo), np.log(hi), n)))
        else:
            cols.append(rng.uniform(lo, hi, n))
    return np.stack(cols, axis=1)


# -- the arms: each returns (estimate, standard deviations, status, wall) -------------------------


def ours(problem, arm: str, seed: int):
    import jax.numpy as jnp

    import multistart as ms

    t0 = time.perf_counter()
    _, residuals = residual_fns(problem)
    space = space_of(problem)
    kw = dict(n_starts=N_STARTS, seed=seed, start_strategy=STRATEGY)
    if arm == "lm":
        result = ms.MultiStartLeastSquares(**kw).fit(residuals, space)
    else:
        scaled = dict(absolute_sigma=False, n_data=problem.y.size)  # NIST's scale, SSR/(m-n)
        search = ms.MultiStartLBFGS(**kw, **scaled)
        result = search.fit(lambda p: jnp.sum(residuals(p) ** 2), space)
    wall = time.perf_counter() - t0
    x = np.array([float(result.best_params[k]) for k in problem.names])
    sd = np.array([float(result.errors[k]) for k in problem.names])
    status = ", ".join(f"{k} {v}" for k, v in result.status_counts().items())
    return x, sd, status, wall


def trf(problem, arm: str, seed: int):
    import jax
    from scipy.optimize import least_squares

    t0 = time.perf_counter()
    vector, _ = residual_fns(problem)
    fun, jac = jax.jit(vector), jax.jit(jax.jacfwd(vector))
    if arm == "trf box32":
        x0s = box_starts(problem, N_STARTS, seed)
        bounds = tuple(np.array([b[i] for b in nist.box(problem)]) for i in (1, 2))
    else:
        x0s, bounds = [problem.start1 if arm.endswith("s1") else problem.start2], (-np.inf, np.inf)
    fits, raised = [], 0
    kw = dict(method="trf", bounds=bounds, jac=lambda v: np.asarray(jac(v)))
    for x0 in x0s:
        try:
            fits.append(least_squares(lambda v: np.asarray(fun(v)), x0, **kw))
        except (ValueError, np.linalg.LinAlgError):  # "Residuals are not finite ..."
            raised += 1
    wall = time.perf_counter() - t0
    status = f"raised {raised}" if raised else ""
    fits = [r for r in fits if np.isfinite(r.cost)]
    if not fits:
        return np.full(problem.n_params, np.nan), np.full(problem.n_params, np.nan), status, wall
    best = min(fits, key=lambda r: r.cost)
    return best.x, curve_fit_sd(best.jac, 2.0 * best.cost), status, wall


def curve_fit_sd(jac, ssr: float) -> np.ndarray:
    """``sqrt(diag((JᵀJ)⁻¹) SSR/dof)``: the standard deviations NIST certifies. ``dof`` is
    ``m - n``: Rat43's file states 9 degrees of freedom, but its certified ones use 15 - 4."""
    dof = jac.shape[0] - jac.shape[1]
    try:
        return np.sqrt(np.diag(np.linalg.inv(jac.T @ jac)) * ssr / dof)
    except np.linalg.LinAlgError:
        return np.full(jac.shape[1], np.nan)


def lmfit_arm(problem, arm: str, seed: int):
    import jax
    import lmfit

    t0 = time.perf_counter()
    vector, _ = residual_fns(problem)
    fun, names = jax.jit(vector), problem.names
    params = lmfit.Parameters()
    for k, v in zip(names, problem.start1 if arm.endswith("s1") else problem.start2, strict=True):
        params.add(k, value=float(v))
    try:
        out = lmfit.minimize(
            lambda p: np.asarray(fun(np.array([p[k].value for k in names]))),
            params,
            method="leastsq",
        )
    except ValueError as e:  # NaN residuals at some trial point
        nan = np.full(problem.n_params, np.nan)
        return nan, nan, f"raised: {str(e)[:40]}", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    x = np.array([out.params[k].value for k in names])
    sd = np.array([np.nan if out.params[k].stderr is None else out.params[k].stderr for k in names])
    return x, sd, "", wall


# -- scores ---------------------------------------------------------------------------------------


def certified_order(problem, x) -> list[int]:
    """The index order that puts ``x`` in the certified labelling (``nist.worst_lre``'s choice)."""
    x = np.asarray(x, np.float64).copy()
    if problem.name.startswith("Gauss"):
        x[[4, 7]] = np.abs(x[[4, 7]])
    orders = list(nist.relabellings(problem.name, problem.n_params))
    return max(orders, key=lambda i: float(np.min(nist.lre(x[i], problem.certified))))


def score(problem, x, sd) -> dict:
    with np.errstate(all="ignore"):
        ssr = float(np.sum((problem.model(x) - problem.y) ** 2))
    sd = np.asarray(sd, np.float64)[certified_order(problem, x)]
    return {
        "worst": nist.worst_lre(problem, x),
        "sd": float(np.min(nist.lre(sd, problem.certified_sd))),
        "ssr": nist.ssr_lre(problem, ssr) if np.isfinite(ssr) else 0.0,
    }


# -- the run --------------------------------------------------------------------------------------


def run(args, arms: tuple[str, ...]) -> dict:
    """``{(problem, arm, seed): row}``; a row has the scores, ``status``, ``wall`` and, with
    ``--warm``, ``cold`` (the first pass's wall; ``wall`` is then the second's)."""
    rows = {}
    for i, name in enumerate(args.problems):
        problem = nist.load(name)
        turn = i % len(arms)
        for arm in arms[turn:] + arms[:turn]:
            for seed in args.seeds if arm in SEEDED else args.seeds[:1]:
                fit = ours if arm in OURS else trf if arm.startswith("trf") else lmfit_arm
                passes = [fit(problem, arm, seed) for _ in range(1 + args.warm)]
                x, sd, status, wall = passes[-1]
                row = {**score(problem, x, sd), "status": status, "wall": wall}
                if args.warm:
                    row["cold"] = passes[0][3]
                rows[name, arm, seed] = row
                print(
                    f"{name:9s} {arm:9s} seed {seed}: worst LRE {row['worst']:4.1f}  sd "
                    f"{row['sd']:4.1f}  wall {wall:6.2f} s  {status}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def print_table(headers, rows, markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(headers) + " |\n|" + " --- |" * len(headers))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max(len(c) for c in col) for col in zip(headers, *rows, strict=True)]
    for r in [headers, *rows]:
        cells = [c.rjust(w) for c, w in zip(r, widths, strict=True)]
        print("  ".join([r[0].ljust(widths[0]), *cells[1:]]))


def report(args, arms, rows, lmfit_note: str) -> None:
    seeds = args.seeds

    def cell(name, arm, key, fmt):
        use = seeds if arm in SEEDED else seeds[:1]
        return " / ".join(fmt(rows[name, arm, s][key]) for s in use)

    what = {
        "worst parameter LRE (up to relabelling)": ("worst", "{:.1f}".format),
        "standard deviation LRE (worst parameter)": ("sd", "{:.1f}".format),
        "sum of squares LRE": ("ssr", "{:.1f}".format),
        f"wall, s ({'second fit' if args.warm else 'cold'})": ("wall", "{:.2f}".format),
    }
    pass_ = "second pass, new closures, programs from the cache" if args.warm else "cold"
    print(
        f"NIST StRD, {len(args.problems)} problems, float64, seeds {seeds}, {pass_}; "
        f"cells with several values are per seed{lmfit_note}"
    )
    for title, (key, fmt) in what.items():
        print(f"\n{title}\n")
        print_table(
            ["problem", *arms],
            [[n, *(cell(n, a, key, fmt) for a in arms)] for n in args.problems],
            args.markdown,
        )
    print("\nstatus counts (ours)\n")
    print_table(
        ["problem", *OURS],
        [[n, *(cell(n, a, "status", str) for a in OURS)] for n in args.problems],
        args.markdown,
    )
    summary(args, arms, rows)


def summary(args, arms, rows) -> None:
    seeds, first = args.seeds, args.seeds[0]
    passes = {"cold": "cold", "wall": "warm"} if args.warm else {"wall": "cold"}
    total = {(a, k): sum(rows[n, a, first][k] for n in args.problems) for a in arms for k in passes}
    headers = ["arm", f"solved of {len(args.problems)}"]
    for label in passes.values():
        headers += [f"{label} wall, s", f"{label} / {REFERENCE}"]
    table = []
    for a in arms:
        solved = [
            sum(rows[n, a, s]["worst"] >= SOLVED for n in args.problems)
            for s in (seeds if a in SEEDED else seeds[:1])
        ]
        r = [a, " / ".join(map(str, solved))]
        for k in passes:
            r += [f"{total[a, k]:.1f}", f"{total[a, k] / total[REFERENCE, k]:.2f}"]
        table.append(r)
    print(
        f"\nsummary: solved = worst parameter LRE >= {SOLVED:g} (per seed); walls summed over "
        f"the problems, seed {first}\n"
    )
    print_table(headers, table, args.markdown)


def write_record(args, arms, rows) -> None:
    record = harness.Record("nist_strd", args)
    for (name, arm, seed), row in rows.items():
        for key in ("worst", "sd", "ssr", "wall", *(("cold",) if args.warm else ())):
            record.figure(f"{name} {arm} seed {seed} {key}", row[key])
    first = args.seeds[0]
    for arm in arms:
        use = args.seeds if arm in SEEDED else args.seeds[:1]
        solved = sum(rows[n, arm, s]["worst"] >= SOLVED for n in args.problems for s in use)
        record.figure(f"{arm} solved", solved)
        record.figure(f"{arm} wall s", sum(rows[n, arm, first]["wall"] for n in args.problems))
    for arm in arms:
        record.ratio(f"{arm} wall / {REFERENCE}", f"{arm} wall s", f"{REFERENCE} wall s")
    record.write(args.json)


def main(argv=None) -> None:
    global STRATEGY
    args = parse_args(argv)
    STRATEGY = args.strategy
    os.environ["MULTISTART_CACHE_DIR"] = args.cache or tempfile.mkdtemp(prefix="nist-cache-")
    import jax

    jax.config.update("jax_enable_x64", True)
    import scipy.optimize  # noqa: F401  (loads scipy's BLAS before one_blas_thread)

    import multistart as ms

    try:
        import lmfit  # noqa: F401

        arms, note = (*OURS, *PEERS), ""
    except ImportError:
        arms = tuple(a for a in (*OURS, *PEERS) if not a.startswith("lmfit"))
        note = "; lmfit not installed: its arms skipped"
    ms.configure_compilation_cache()  # the scipy and lmfit arms' jits are cached too
    jax.block_until_ready(jax.jit(lambda a: a + 1.0)(1.0))  # the backend starts before any arm
    print(
        f"cache {os.environ['MULTISTART_CACHE_DIR']}; jax {jax.__version__}; "
        f"BLAS: {harness.blas_threads()} (1 inside the run)",
        file=sys.stderr,
    )
    with harness.one_blas_thread():
        rows = run(args, arms)
    report(args, arms, rows, note)
    write_record(args, arms, rows)


if __name__ == "__main__":
    main()
