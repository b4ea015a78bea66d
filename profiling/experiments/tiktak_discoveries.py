"""TikTak's rediscovery rule on the 27 NIST problems: solved fits and evaluations by
``max_discoveries``.

``MultiStartLeastSquares(n_starts=32, seed=s, max_discoveries=m)`` (TikTak, its default
strategy) on every problem of ``tests/nist.py`` over the box built from NIST's starting values,
float64, for each ``m`` given. Solved: the worst parameter LRE at least 4 (as
``profiling/nist_strd.py`` counts it). Evaluations: ``result.stats["n_evals"]`` (residual
evaluations, each with its Jacobian), their median and total over the fits. Run from the
repository root:

    python profiling/experiments/tiktak_discoveries.py --discoveries none,2,4,8 --seeds 0,1,2
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


def arm(discoveries, seeds) -> str:
    solved, evals, missed, t0 = 0, [], [], time.perf_counter()
    for name in nist.NAMES:
        problem = nist.load(name)
        for seed in seeds:
            _, residuals = nist_strd.residual_fns(problem)
            search = ms.MultiStartLeastSquares(
                n_starts=32, seed=seed, max_discoveries=discoveries, progress=False
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = search.fit(residuals, nist_strd.space_of(problem))
            x = np.array([float(result.best_params[k]) for k in problem.names])
            ok = nist.worst_lre(problem, x) >= 4
            solved += ok
            evals.append(int(result.stats["n_evals"]))
            if not ok:
                missed.append(f"{name}/{seed}")
    return (
        f"max_discoveries={discoveries!s:5s} solved {solved}/{len(evals)}  median evaluations "
        f"{int(np.median(evals))}  total {sum(evals)}  wall {time.perf_counter() - t0:.0f} s  "
        f"missed {', '.join(missed) or '-'}"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--discoveries", default="none,4", help="comma-separated: none, auto or ints")
    p.add_argument("--seeds", default="0", help="comma-separated ints")
    args = p.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    seeds = [int(s) for s in args.seeds.split(",")]
    for word in args.discoveries.split(","):
        value = None if word == "none" else word if word == "auto" else int(word)
        print(arm(value, seeds), flush=True)


if __name__ == "__main__":
    main()
