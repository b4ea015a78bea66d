"""Successive halving replayed on every start's trajectory: what each setting would have done.

The engine's local searches are deterministic and independent of one another, so a
``schedule="all"`` run's per-step best-so-far (``result.history`` at stride 1), each start's
``n_steps`` and final ``status`` are exactly what a ``schedule="halving"`` run of the same
starts reads at each sync (``sync_every=1``; ``MultiStartLBFGS`` makes one evaluation per start
per step). Calling :func:`multistart.host.schedule.prune` step by step on them
(:func:`replay`) gives
that run's outcome exactly: a pruned start stops where it was pruned, its evaluations are its
steps until then, and the best is the best over the starts when they stopped. ``verify`` checks
that claim against a real halving run (same best, same evaluations, same evaluations to best).

Subcommands (each problem in its own process: some run in float64, some in float32), from
``profiling/experiments/``:

    python halving_replay.py record image --seeds 0 1 2 3 4     # "all" runs, cached
    python halving_replay.py record image --starts 128 --seeds 0
    python halving_replay.py verify peak --seed 0 --r0 10 --eta 3 --grace 1 --keep 1
    python halving_replay.py table                    # replay the grid on the cache
    python halving_replay.py table --csv grid.csv     # ... and every row to a file
    python halving_replay.py table --show 10,3,0.1,2  # one setting, per run
    python halving_replay.py ranks image --seed 0     # where the best start stood
    python halving_replay.py anytime --plot anytime.png  # best so far vs evaluations

Problems (``PROBLEMS``): ``image`` (``image_model.py``, 48 parameters, float64, uniform starts
in the central band as scipy's loop gets them in ``time_to_solution.py``), ``bench``
(``benchmark_model.py``, 31 parameters, float32), ``sines`` (``multimodal.py``'s sum of three
sinusoids, 9 parameters, float64; ``sines0``: the same from uniform starts, without the
filter), ``peak`` (the README's Gaussian peak, 3 parameters, float32)
and ``rosen`` (a 20-dimensional Rosenbrock, float64). All but ``image`` take the engine's
default starts (the broad-start filter). Every run is ``MultiStartLBFGS`` with its default
convergence. Results are cached as ``Result.save`` files in ``--cache`` (default
``/work/halving-cache``, or ``$HALVING_CACHE``), outside git.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent  # profiling/: the benchmark models
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # readme_model
CACHE = Path(os.environ.get("HALVING_CACHE", "/work/halving-cache"))
GRID = {
    "r0": (5, 10, 20, 40, 80),
    "eta": (2, 3, 4),
    "grace": (0.0, 0.1, 0.25, 0.5, 1.0, 2.0),  # 0, 0.5, 1, 2 and two smaller ones
    "keep": (1, 2, 4),
}
# A best within this of max(1, |best|) is the same minimum: starts that converge to one minimum
# in float32 end within a few 1e-6 of each other (bench, peak), different minima of the image
# fit are 1e-3 apart or more.
SAME = 1e-5


# -- the problems ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """A benchmark problem: ``make(seed, n_starts) -> (objective, space, starts or None)``."""

    make: Callable
    x64: bool
    n_starts: int
    n_steps: int
    batch_size: int | str  # any width gives the same result; this one is quick here
    options: tuple = ()  # further options of the search, as (name, value) pairs


def _image(seed, n):
    import image_model
    from peers import draw_starts

    objective, space, _ = image_model.make_problem()
    return objective, space, draw_starts(space, n, seed)


def _bench(seed, n):
    import benchmark_model as bm

    return bm.make_objective(), bm.space(), None


def _sines(seed, n):
    import multimodal

    return multimodal.chi2, multimodal.SPACE, None


def _peak(seed, n):
    import readme_model

    chi2, space = readme_model.make_problem()
    return chi2, space, None


def _rosen(seed, n):
    import jax.numpy as jnp

    import multistart as ms

    def rosenbrock(p):
        x = p["x"]
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    return rosenbrock, {"x": ms.Uniform(-2.0, 2.0, shape=(20,))}, None


PROBLEMS = {
    "image": Problem(_image, True, 32, 1500, 1),
    "bench": Problem(_bench, False, 32, 1500, 4),
    "sines": Problem(_sines, True, 128, 1500, 32),
    # the same from uniform starts, no filter (FINDINGS: scipy's short runs from such starts)
    "sines0": Problem(_sines, True, 128, 1500, 32, (("n_candidates", 0),)),
    "peak": Problem(_peak, False, 64, 500, 8),
    "rosen": Problem(_rosen, True, 128, 1500, 32),
}


def search(name: str, seed: int, n_starts: int, schedule="all"):
    """``(search, objective, space, starts)`` of problem ``name`` (sets float64 if it uses it)."""
    import jax

    import multistart as ms

    p = PROBLEMS[name]
    jax.config.update("jax_enable_x64", p.x64)
    objective, space, starts = p.make(seed, n_starts)
    s = ms.MultiStartLBFGS(
        n_starts=n_starts,
        n_steps=p.n_steps,
        seed=seed,
        batch_size=p.batch_size,
        schedule=schedule,
        max_history=p.n_steps,  # stride 1: every step's best-so-far
        log_every=0,
        progress=False,
        **dict(p.options),
    )
    return s, objective, space, starts


def cache_path(name: str, seed: int, n_starts: int, cache: Path = CACHE) -> Path:
    return cache / f"{name}-n{n_starts}-s{seed}.npz"


def record(name: str, seed: int, n_starts: int, cache: Path = CACHE):
    """The ``schedule="all"`` run of problem ``name``, from the cache or run and cached."""
    import multistart as ms

    path = cache_path(name, seed, n_starts, cache)
    if path.exists():
        return ms.Result.load(path)
    s, objective, space, starts = search(name, seed, n_starts)
    result = s.fit(objective, space, starts=starts)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    result.save(tmp)
    tmp.rename(path)  # a killed run leaves no half-written entry
    return result


# -- the replay --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Runs:
    """What a halving run of the same starts would read at each sync.

    Attributes:
      history: ``(horizon, n)`` each start's best-so-far after each step (its last value once
        it ended).
      n_steps: ``(n,)`` the step at which each start ended (its evaluations, all run).
      status: ``(n,)`` each start's final status code.
      horizon: the search's ``n_steps``.
    """

    history: np.ndarray
    n_steps: np.ndarray
    status: np.ndarray
    horizon: int

    @classmethod
    def of(cls, result) -> Runs:
        """From a ``schedule="all"`` Result with a history at stride 1."""
        steps = np.asarray(result.history_steps)
        if not np.array_equal(steps, np.arange(1, steps.size + 1)):
            raise ValueError("replay needs every step's history: max_history >= n_steps")
        if not np.array_equal(np.asarray(result.n_evals), np.asarray(result.n_steps)):
            raise ValueError("replay needs one evaluation per step (MultiStartLBFGS)")
        if np.any(np.asarray(result.resurrections)) or result.incarnations:
            raise ValueError("replay needs one start per slot (no resurrection, no TikTak)")
        codes = np.array([s.code for s in result.status], np.int8)
        horizon = int(result.config["n_steps"])
        h = np.asarray(result.history, np.float64)
        if h.shape[0] < horizon:  # the search stopped early (every start ended): pad
            h = np.concatenate([h, np.repeat(h[-1:], horizon - h.shape[0], 0)])
        return cls(h, np.asarray(result.n_steps, np.int64), codes, horizon)

    @property
    def best(self) -> float:
        last = self.history[np.maximum(self.n_steps, 1) - 1, np.arange(self.n_steps.size)]
        return float(np.nanmin(last))

    @property
    def evals(self) -> int:
        return int(self.n_steps.sum())

    def evals_to_best(self) -> int:
        return replay(self, None).evals_to_best


@dataclass(frozen=True)
class Replayed:
    """A halving run's outcome: ``best``, ``evals`` (in all), ``evals_to_best``, ``stop`` (each
    start's evaluations), ``pruned`` (per rung) and ``winner`` (the start that ended best)."""

    best: float
    evals: int
    evals_to_best: int
    stop: np.ndarray
    pruned: tuple[int, ...]
    winner: int


def replay(
    runs: Runs, halving, *, every_step: bool = False, rule=None, trace: list | None = None
) -> Replayed:
    """The outcome of ``schedule=halving`` (``None``: ``"all"``) on ``runs``' starts.

    ``rule``: a function with :func:`multistart.host.schedule.prune`'s signature to replay instead
    of it (a variant being measured). ``trace``: a list that gets ``(evaluations so far, best
    so far)`` after every step (the anytime curve).

    Mirrors the host loop (``multistart/host/iterate.py``, ``multistart/host/decide.py``) at
    ``sync_every=1``: at each
    step's sync it notes the best so far, then (not at the last step) calls
    :func:`multistart.host.schedule.prune`. At a sync past rung 0's evaluations where no running
    start reaches a rung, ``prune`` only counts the starts that ended since (at their final best and
    rung, which no longer change), and the next call counts them the same way: so such syncs
    are skipped unless ``every_step``.
    """
    from multistart.common.status import Status
    from multistart.host.schedule import Rungs, prune

    prune = prune if rule is None else rule
    running_code, pruned_code = Status.RUNNING.code, Status.PRUNED.code
    n, idx = runs.n_steps.size, np.arange(runs.n_steps.size)
    stop = runs.n_steps.copy()
    is_pruned = np.zeros(n, bool)
    rungs = Rungs.start(n)
    best_seen, evals_to_best = math.inf, 0
    for t in range(1, runs.horizon + 1):
        ev = np.minimum(t, stop)
        f = np.where(ev > 0, runs.history[np.maximum(ev, 1) - 1, idx], np.inf)
        f = np.where(np.isnan(f), np.inf, f)
        best = float(f.min())
        if best < best_seen:
            best_seen, evals_to_best = best, int(ev.sum())
        if trace is not None:
            trace.append((int(ev.sum()), best_seen))
        alive = (t < runs.n_steps) & ~is_pruned
        if t == runs.horizon or not alive.any():
            break
        if halving is None:
            continue
        status = np.where(is_pruned, pruned_code, np.where(alive, running_code, runs.status))
        due = alive & (ev >= halving.r0 * halving.eta**rungs.next_rung)
        if not (every_step or t <= halving.r0 or due.any()):
            continue
        out, rungs = prune(rungs, halving, status.astype(np.int8), f, ev)
        is_pruned[out] = True
        stop[out] = t
    final = np.where(stop > 0, runs.history[np.maximum(stop, 1) - 1, idx], np.inf)
    final = np.where(np.isnan(final), np.inf, final)
    return Replayed(
        best=float(final.min()),
        evals=int(stop.sum()),
        evals_to_best=evals_to_best,
        stop=stop,
        pruned=tuple(rungs.pruned),
        winner=int(np.argmin(final)),
    )


def same(best: float, ref: float) -> bool:
    """Is ``best`` the same minimum as ``ref`` (within :data:`SAME`)?"""
    return best - ref <= SAME * max(1.0, abs(ref))


def settings(grid: dict = GRID):
    """Every :class:`multistart.Halving` of ``grid``."""
    from multistart import Halving

    for r0, eta, grace, keep in itertools.product(*grid.values()):
        yield Halving(r0=r0, eta=eta, grace=grace, keep=keep)


# -- a candidate rule: the cut moves too ------------------------------------------------------


def moving_cut(rungs, halving, status, best_fom, n_evals):
    """:func:`multistart.host.schedule.prune` with one change (a candidate, measured by
    ``anytime``): a start outside a rung's cut continues only if its projection beats the cut
    *projected the same way*, by the median decrease of the starts inside the cut. Where every
    start still falls fast (a long fit's early rungs), the cut falls with them, and only the
    starts falling faster than it are kept; where the starts inside the cut have converged it
    is the default rule."""
    from multistart.host import schedule

    class Moving(schedule._Working):
        def judge(self, k, arriving, f, h):
            self.grow(k)
            self.reached[k].extend(float(f[i]) for i in arriving)
            values = np.sort(np.asarray(self.competitors(k)))
            m = max(h.keep, math.ceil(values.size / h.eta))
            cut = values[min(m, values.size) - 1]
            fall = {int(i): schedule._decrease(self.last_f[i], f[i]) for i in arriving}
            inside = [fall[int(i)] for i in arriving if f[i] <= cut]
            moved = cut - h.grace * h.eta * (float(np.median(inside)) if inside else 0.0)
            pruned = []
            for i in arriving:
                if f[i] <= cut or f[i] - h.grace * h.eta * fall[int(i)] < moved:
                    self.next_rung[i] = k + 1
                    self.last_f[i] = f[i]
                else:
                    pruned.append(int(i))
                    self.pruned[k] += 1
            return pruned

    original = schedule._Working
    schedule._Working = Moving  # prune() builds its working copy from this name
    try:
        return schedule.prune(rungs, halving, status, best_fom, n_evals)
    finally:
        schedule._Working = original


CANDIDATES = {"moving cut": moving_cut}


def anytime(runs: Runs, halving, rule=None) -> tuple[np.ndarray, np.ndarray]:
    """``(evaluations, best so far)`` after each step of a replay (``halving=None``: "all")."""
    trace: list = []
    replay(runs, halving, rule=rule, trace=trace)
    ev, best = np.array(trace, dtype=np.float64).T
    return ev, best


def best_at(curve: tuple[np.ndarray, np.ndarray], budget: float) -> float:
    """The best so far once ``budget`` evaluations were spent (``inf`` before the first step;
    a run that ended earlier keeps its last best)."""
    ev, best = curve
    i = int(np.searchsorted(ev, budget, side="right")) - 1
    return float(best[i]) if i >= 0 else math.inf


def above(halved, full, ref: float) -> tuple[float, float] | None:
    """The first and the last budget at which ``halved``'s best lies above (worse than)
    ``full``'s by more than :data:`SAME` of ``max(1, |ref|)``; ``None`` if it never does."""
    budgets = np.union1d(halved[0], full[0])
    worse = [
        b for b in budgets if best_at(halved, b) - best_at(full, b) > SAME * max(1.0, abs(ref))
    ]
    return (float(worse[0]), float(worse[-1])) if worse else None


FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def cmd_anytime(args) -> None:
    """Best so far against evaluations for "all", the default Halving and the candidates."""
    from multistart import Halving

    runs_list = cached(args.cache)
    if args.problems:
        runs_list = [r for r in runs_list if r[0] in args.problems]
    default = Halving()
    arms = {"halving": (default, None), **{k: (default, v) for k, v in CANDIDATES.items()}}
    print(
        f'best so far at a budget of evaluations (a fraction of "all"\'s), relative to '
        f'"all"\'s final best: (best - final) / max(1, |final|); {default}'
    )
    head = "".join(f"{f:>9g}" for f in FRACTIONS)
    print(f'{"problem":>8}{"n":>5}{"seed":>5} {"arm":<11}{head}  evals  above "all": from-to')
    curves = {}
    for name, n, seed, runs in runs_list:
        full = anytime(runs, None)
        total, final = full[0][-1], full[1][-1]
        scale = max(1.0, abs(final))
        rows = {"all": full, **{k: anytime(runs, h, r) for k, (h, r) in arms.items()}}
        curves[(name, n, seed)] = (total, final, rows)
        for arm, c in rows.items():
            cells = "".join(f"{(best_at(c, f * total) - final) / scale:>9.2g}" for f in FRACTIONS)
            span = None if arm == "all" else above(c, full, final)
            where = "never" if span is None else f"{span[0] / total:.3f}-{span[1] / total:.3f}"
            where = "-" if arm == "all" else where
            print(f"{name:>8}{n:>5}{seed:>5} {arm:<11}{cells}{c[0][-1] / total:>7.2f}  {where}")
    if args.plot:
        plot_anytime(curves, args.plot)


def plot_anytime(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({k[0] for k in curves})
    cols = min(3, len(names))
    rows_ = -(-len(names) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.5 * cols, 3.4 * rows_), squeeze=False)
    styles = {"all": "-", "halving": "--", "moving cut": ":"}
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        for (problem, _n, seed), (total, final, rows) in curves.items():
            if problem != name:
                continue
            for arm, (ev, best) in rows.items():
                gap = np.maximum((best - final) / max(1.0, abs(final)), 1e-9)
                ax.step(ev / total, gap, styles.get(arm, "-"), where="post", lw=1, color=f"C{seed}")
        ax.set(xscale="log", yscale="log", title=name, xlabel='evaluations / "all"\'s')
    for row in axes:
        row[0].set_ylabel("best so far - final (relative)")
    fig.suptitle('solid: "all"; dashed: Halving(); dotted: the moving cut; colour: draw')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


# -- the commands ------------------------------------------------------------------------------


def cmd_record(args) -> None:
    for seed in args.seeds:
        n = args.starts or PROBLEMS[args.problem].n_starts
        r = record(args.problem, seed, n, args.cache)
        runs = Runs.of(r)
        print(
            f"{args.problem} n={n} seed={seed}: best {runs.best:.10g}, {runs.evals} evaluations "
            f"(median {np.median(runs.n_steps):.0f} a start), {r.status_counts()}",
            flush=True,
        )


def cmd_verify(args) -> None:
    """A real halving run against the replay of the cached "all" run of the same starts."""
    from multistart import Halving

    n = args.starts or PROBLEMS[args.problem].n_starts
    runs = Runs.of(record(args.problem, args.seed, n, args.cache))
    halving = Halving(r0=args.r0, eta=args.eta, grace=args.grace, keep=args.keep)
    s, objective, space, starts = search(args.problem, args.seed, n, halving)
    real = s.fit(objective, space, starts=starts)
    fast, slow = replay(runs, halving), replay(runs, halving, every_step=True)
    rows = {
        "best": (float(real.best_fom), fast.best, slow.best),
        "evals": (int(real.stats["n_evals"]), fast.evals, slow.evals),
        "evals_to_best": (real.stats["evals_to_best"], fast.evals_to_best, slow.evals_to_best),
        "pruned per rung": (tuple(real.stats["rungs"]["pruned"]), fast.pruned, slow.pruned),
        "evals per start": (
            np.asarray(real.n_evals).tolist(),
            fast.stop.tolist(),
            slow.stop.tolist(),
        ),
    }
    print(f"{args.problem} n={n} seed={args.seed} {halving}: real run, replay, replay every step")
    ok = True
    for key, (a, b, c) in rows.items():
        agree = a == b == c
        ok &= agree
        shown = (a, b, c) if key != "evals per start" else ("...",) * 3
        print(f"  {key:16s} {'same' if agree else 'DIFFERENT'}  {shown}")
    print(f"replay {'is' if ok else 'is NOT'} exact; 'all': best {runs.best:.10g}, {runs.evals}")
    if not ok:
        raise SystemExit(1)


def cached(cache: Path = CACHE) -> list[tuple[str, int, int, Runs]]:
    """``(problem, n_starts, seed, runs)`` of every cached "all" run."""
    import multistart as ms

    out = []
    for path in sorted(cache.glob("*-n*-s*.npz")):
        name, n, seed = path.stem.rsplit("-", 2)
        if name in PROBLEMS and not path.stem.endswith(".tmp"):
            out.append((name, int(n[1:]), int(seed[1:]), Runs.of(ms.Result.load(path))))
    return out


def grid_rows(runs_list, halvings) -> list[dict]:
    """One row per cached run and setting: evaluations as a fraction of "all"'s, best relative
    to "all"'s best, and the evaluations to the best (as a fraction of "all"'s evaluations)."""
    rows = []
    for name, n, seed, runs in runs_list:
        ref = replay(runs, None)
        for h in halvings:
            out = replay(runs, h)
            rows.append(
                {
                    "problem": name,
                    "n": n,
                    "seed": seed,
                    **{k: getattr(h, k) for k in GRID},
                    "evals": out.evals / ref.evals,
                    "rel": (out.best - ref.best) / max(1.0, abs(ref.best)),
                    "same": same(out.best, ref.best),
                    "to_best": out.evals_to_best / ref.evals,
                    "all_to_best": ref.evals_to_best / ref.evals,
                }
            )
    return rows


def cmd_table(args) -> None:
    runs_list = cached(args.cache)
    if args.problems:
        runs_list = [r for r in runs_list if r[0] in args.problems]
    grid = dict(GRID, grace=tuple(args.graces)) if args.graces else GRID
    rows = grid_rows(runs_list, list(settings(grid)))
    if args.csv:
        import csv

        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print_summary(rows, runs_list, args.top)
    for text in args.show:
        key = tuple(float(v) for v in text.split(","))
        print_runs(rows, key)
        print_problems(rows, key)


def _key(r: dict) -> tuple:
    return tuple(r[k] for k in GRID)


def print_summary(rows: list[dict], runs_list, top: int) -> None:
    """Per setting: the runs that kept "all"'s best, the worst best (relative), and the
    evaluations as a fraction of "all"'s, on the image fit (where runs are long) and the rest."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(_key(r), []).append(r)
    names = sorted({name for name, *_ in runs_list})
    print(f"{len(runs_list)} runs of {', '.join(names)}; {len(by)} settings")
    print(f'same best: within {SAME:g} of max(1, |best|); evaluations / "all"\'s: mean, max')
    print(
        f"{'r0':>4}{'eta':>4}{'grace':>6}{'keep':>5}{'same':>8}{'worst rel':>11}"
        f"{'image same':>11}{'evals':>6}{'max':>6}{'others same':>12}{'evals':>6}{'max':>6}"
    )

    def order(kv):
        image = [r for r in kv[1] if r["problem"] == "image"]
        return (-sum(r["same"] for r in kv[1]), max((r["evals"] for r in image), default=0))

    for key, rs in sorted(by.items(), key=order)[:top]:
        image = [r for r in rs if r["problem"] == "image"]
        other = [r for r in rs if r["problem"] != "image"]
        cells = []
        for part in (image, other):
            ev = np.array([r["evals"] for r in part]) if part else np.zeros(1)
            cells.append(
                f"{sum(r['same'] for r in part):>4}/{len(part):<3}{ev.mean():>6.2f}{ev.max():>6.2f}"
            )
        print(
            f"{key[0]:>4}{key[1]:>4}{key[2]:>6}{key[3]:>5}{sum(r['same'] for r in rs):>4}/"
            f"{len(rs):<3}{max(r['rel'] for r in rs):>11.2e}   {cells[0]}     {cells[1]}"
        )


def print_runs(rows: list[dict], key: tuple) -> None:
    """One setting, per problem and seed."""
    print(f"\nr0={key[0]:g} eta={key[1]:g} grace={key[2]:g} keep={key[3]:g}, per run:")
    print(
        f"{'problem':>8}{'starts':>7}{'seed':>5}{'evals / all':>12}{'best vs all (rel)':>19}"
        f"{'to best / all':>14}{'all: to best':>13}"
    )
    for r in rows:
        if _key(r) == key:
            print(
                f"{r['problem']:>8}{r['n']:>7}{r['seed']:>5}{r['evals']:>12.3f}{r['rel']:>19.2e}"
                f"{r['to_best']:>14.3f}{r['all_to_best']:>13.3f}"
            )


def print_problems(rows: list[dict], key: tuple) -> None:
    """One setting, per problem: runs that kept the best, the worst best, the evaluations."""
    print(f"\nr0={key[0]:g} eta={key[1]:g} grace={key[2]:g} keep={key[3]:g}, per problem:")
    print(
        f"{'problem':>8}{'starts':>7}{'same best':>10}{'worst rel':>10}{'evals / all':>13}"
        f"{'to best / all':>15}{'all: to best':>14}"
    )
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if _key(r) == key:
            groups.setdefault((r["problem"], r["n"]), []).append(r)
    for (name, n), rs in groups.items():
        ev, tb = [r["evals"] for r in rs], [r["to_best"] for r in rs]
        at = [r["all_to_best"] for r in rs]
        print(
            f"{name:>8}{n:>7}{sum(r['same'] for r in rs):>6}/{len(rs):<3}"
            f"{max(r['rel'] for r in rs):>10.3f}{min(ev):>7.2f}-{max(ev):.2f}"
            f"{min(tb):>9.2f}-{max(tb):.2f}{min(at):>9.2f}-{max(at):.2f}"
        )


def cmd_ranks(args) -> None:
    """Where the start that ended best (and the runner-up) stood after each number of
    evaluations: its rank among the starts' bests so far, its best, the median and the min."""
    n = args.starts or PROBLEMS[args.problem].n_starts
    runs = Runs.of(record(args.problem, args.seed, n, args.cache))
    final = runs.history[runs.n_steps - 1, np.arange(n)]
    first, second = np.argsort(final)[:2]
    print(
        f"{args.problem} n={n} seed={args.seed}: best {final[first]:.7g} (start {first}), "
        f"runner-up {final[second]:.7g} (start {second})"
    )
    print(f"{'evals':>6}{'rank':>6}{'its best':>14}{'median':>14}{'min':>14}{'runner-up rank':>16}")
    for t in (1, 3, 10, 30, 90, 160, 270, 480, 640, 810, 960, 1280, 1500):
        if t > runs.horizon:
            break
        h = runs.history[t - 1]
        rank = int(np.sum(h < h[first])) + 1
        print(
            f"{t:>6}{rank:>6}{h[first]:>14.7g}{np.median(h):>14.7g}{h.min():>14.7g}"
            f"{int(np.sum(h < h[second])) + 1:>16}"
        )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=CACHE)
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help='run (or load) "all" runs')
    rec.add_argument("problem", choices=sorted(PROBLEMS))
    rec.add_argument("--seeds", type=int, nargs="+", default=[0])
    rec.add_argument("--starts", type=int, default=None)
    ver = sub.add_parser("verify", help="a real halving run against its replay")
    ver.add_argument("problem", choices=sorted(PROBLEMS))
    ver.add_argument("--seed", type=int, default=0)
    ver.add_argument("--starts", type=int, default=None)
    ver.add_argument("--r0", type=int, default=10)
    ver.add_argument("--eta", type=int, default=3)
    ver.add_argument("--grace", type=float, default=1.0)
    ver.add_argument("--keep", type=int, default=1)
    rk = sub.add_parser("ranks", help="where the best start stood along the way")
    rk.add_argument("problem", choices=sorted(PROBLEMS))
    rk.add_argument("--seed", type=int, default=0)
    rk.add_argument("--starts", type=int, default=None)
    tab = sub.add_parser("table", help="replay the grid on every cached run")
    tab.add_argument("--csv", type=Path, default=None, help="every row to this file")
    tab.add_argument("--problems", nargs="+", default=None, help="only these problems")
    tab.add_argument("--graces", type=float, nargs="+", default=None, help="replace the grid's")
    tab.add_argument("--top", type=int, default=30, help="settings shown, best first")
    tab.add_argument(
        "--show", nargs="*", default=[], help="per run for these settings: r0,eta,grace,keep"
    )
    at = sub.add_parser("anytime", help='best so far against evaluations: "all", halving')
    at.add_argument("--problems", nargs="+", default=None, help="only these problems")
    at.add_argument("--plot", type=Path, default=None, help="also draw the curves to this PNG")
    args = ap.parse_args(argv)
    commands = {
        "record": cmd_record,
        "verify": cmd_verify,
        "ranks": cmd_ranks,
        "table": cmd_table,
        "anytime": cmd_anytime,
    }
    commands[args.command](args)


if __name__ == "__main__":
    main()
