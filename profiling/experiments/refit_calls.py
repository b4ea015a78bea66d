"""A refit's calls: ``steps_per_call="auto"`` starting where the fits before it reached,
against starting from one step a call again (issue 38; profiling/HISTORY.md, "A refit starts
at the steps a call reached").

For each NIST problem, two ``MultiStartLeastSquares(n_starts=32, seed=0)`` searches of it are
fitted once, then refitted in turns over ``--rounds`` rounds in this one process:

- ``learned``: the library as it is: a refit of the model takes the ``k`` (steps a call) the
  fits before it reached, kept with the model's programs;
- ``from 1``: the same refit with that record emptied before each fit (the key under which the
  driver keeps it is swapped for a new one, an internal of the library: an experiment, not the
  library), so its calls take 1, 2, 4, ... steps again, as every fit did before.

Both arms share the compiled programs, so only the calls differ. The script prints each arm's
median wall and chunk calls a refit, their ratio, and whether the two arms' best figures of
merit and every start's parameters agree bit for bit.

    python profiling/experiments/refit_calls.py
    python profiling/experiments/refit_calls.py --problems DanWood,MGH09 --rounds 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness, fixed_cost, nist_strd
sys.path.insert(0, str(HERE.parent.parent / "tests"))  # nist

import harness  # noqa: E402

PROBLEMS = "DanWood,Misra1a,BoxBOD,MGH09,Eckerle4,Thurber"


def refits(name: str, rounds: int) -> dict:
    """The two arms' refits of one problem, in turns: walls, chunk calls, and agreement."""
    import jax
    import nist
    from fixed_cost import Counted
    from nist_strd import space_of

    import multistart as ms
    import multistart.host.driver as driver

    problem = nist.load(name)
    counted, space = Counted(problem), space_of(problem)
    learned_key = driver.STEPS_LEARNED
    arms = ("learned", "from 1")
    searches = {arm: ms.MultiStartLeastSquares(n_starts=32, seed=0) for arm in arms}
    for search in searches.values():
        search.fit(counted.named, space)  # compiles (once: the second finds the programs kept)

    def fit(arm: str):
        driver.STEPS_LEARNED = learned_key if arm == "learned" else object()  # a fresh record
        try:
            t0 = time.perf_counter()
            result = searches[arm].fit(counted.named, space)
            return time.perf_counter() - t0, result
        finally:
            driver.STEPS_LEARNED = learned_key

    runs: dict[str, list] = {arm: [] for arm in searches}
    for i in range(rounds):
        order = list(searches) if i % 2 == 0 else list(searches)[::-1]
        for arm in order:
            runs[arm].append(fit(arm))
    a, b = runs["learned"][-1][1], runs["from 1"][-1][1]
    leaves = zip(
        jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params), strict=True
    )
    same = bool(np.array_equal(a.foms, b.foms, equal_nan=True)) and all(
        np.array_equal(x, y, equal_nan=True) for x, y in leaves
    )
    return {
        arm: (
            harness.median([w for w, _ in r]),
            harness.median([x.stats["n_chunk_calls"] for _, x in r]),
        )
        for arm, r in runs.items()
    } | {"same": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default=PROBLEMS, help="comma-separated NIST names")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    import jax

    jax.config.update("jax_enable_x64", True)
    print(f"refits of MultiStartLeastSquares(n_starts=32), {args.rounds} each, in turns (medians)")
    print(
        f"{'problem':<10}{'learned ms':>11}{'from 1 ms':>11}{'ratio':>7}"
        f"{'calls learned':>15}{'calls from 1':>14}  same"
    )
    for name in args.problems.split(","):
        r = refits(name, args.rounds)
        (wa, ca), (wb, cb) = r["learned"], r["from 1"]
        print(
            f"{name:<10}{1e3 * wa:11.2f}{1e3 * wb:11.2f}{wa / wb:7.2f}{ca:15.0f}{cb:14.0f}  "
            f"{r['same']}"
        )


if __name__ == "__main__":
    main()
