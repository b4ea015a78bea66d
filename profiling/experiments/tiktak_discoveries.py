"""TikTak's rediscovery rule on the 27 NIST problems: solved fits and evaluations by
``max_discoveries``.

``MultiStartLeastSquares(n_starts=32, seed=s, max_discoveries=m)`` (TikTak, its default
strategy) on every problem of ``tests/nist.py`` over the box built from NIST's starting values,
float64, for each ``m`` given. Solved: the worst parameter LRE at least 4 (as
``profiling/nist_strd.py`` counts it). Evaluations: ``result.stats["n_evals"]`` (residual
evaluations, each with its Jacobian), their median and total over the fits. With
``--lbfgs band,band_tiktak`` it runs ``MultiStartLBFGS(n_starts=32, seed=s,
start_strategy=...)`` on the sum of squares instead, one arm per strategy (L-BFGS's default
became ``"band_tiktak"``, TikTak's refills while the local searches are short, on 2026-12-03).
Run from the repository root:

    python profiling/experiments/tiktak_discoveries.py --discoveries none,2,4,8 --seeds 0,1,2
    python profiling/experiments/tiktak_discoveries.py --lbfgs band,band_tiktak --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "tests"))
os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")

import jax  # noqa: E402
import nist  # noqa: E402
import nist_strd  # noqa: E402
import numpy as np  # noqa: E402

import multistart as ms  # noqa: E402


def _fit(problem, seed: int, discoveries, lbfgs: str | None):
    _, residuals = nist_strd.residual_fns(problem)
    space = nist_strd.space_of(problem)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if lbfgs is None:
            search = ms.MultiStartLeastSquares(
                n_starts=32, seed=seed, max_discoveries=discoveries, progress=False
            )
            return search.fit(residuals, space)
        search = ms.MultiStartLBFGS(n_starts=32, seed=seed, start_strategy=lbfgs, progress=False)
        return search.fit(lambda p: jax.numpy.sum(residuals(p) ** 2), space)


def arm(discoveries, seeds, lbfgs: str | None = None) -> str:
    solved, evals, missed, t0 = 0, [], [], time.perf_counter()
    for name in nist.NAMES:
        problem = nist.load(name)
        for seed in seeds:
            result = _fit(problem, seed, discoveries, lbfgs)
            x = np.array([float(result.best_params[k]) for k in problem.names])
            ok = nist.worst_lre(problem, x) >= 4
            solved += ok
            evals.append(int(result.stats["n_evals"]))
            if not ok:
                missed.append(f"{name}/{seed}")
    label = f"max_discoveries={discoveries!s:5s}" if lbfgs is None else f"L-BFGS {lbfgs:11s}"
    return (
        f"{label} solved {solved}/{len(evals)}  median evaluations "
        f"{int(np.median(evals))}  total {sum(evals)}  wall {time.perf_counter() - t0:.0f} s  "
        f"missed {', '.join(missed) or '-'}"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--discoveries", default="none,4", help="comma-separated: none, auto or ints")
    p.add_argument("--seeds", default="0", help="comma-separated ints")
    p.add_argument("--lbfgs", default=None, help="comma-separated strategies: L-BFGS arms")
    args = p.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.lbfgs:
        for strategy in args.lbfgs.split(","):
            print(arm(None, seeds, strategy), flush=True)
        return
    for word in args.discoveries.split(","):
        value = None if word == "none" else word if word == "auto" else int(word)
        print(arm(value, seeds), flush=True)


if __name__ == "__main__":
    main()
