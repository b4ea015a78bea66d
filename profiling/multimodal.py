"""Successes per second on a multimodal fit: a sum of three sinusoids, 9 parameters.

The signal is ``y(t) = sum_k a_k sin(2 pi f_k t + phi_k)`` on 200 samples over 5 s, plus
Gaussian noise of known sigma 0.3; the figure of merit is chi-squared. Each sinusoid's
frequency (Uniform 0.2-2.5 Hz), amplitude (Uniform 0.1-3) and phase (Uniform -pi..pi) is
unknown, so the landscape has a basin per frequency alias (about 1/5 s = 0.2 Hz wide) in each of
three dimensions, and a wide poor basin where the amplitudes are small. A start *succeeds* when
its final chi-squared is within 1 of the true parameters' chi-squared (any of the 3! label
orders counts).

Arms (a list: one more arm is one more entry in ``ARMS``), each run for every seed with the
same number of local searches (``--starts``) and steps (``--steps``), in one process:

  scipy         ``scipy.optimize.minimize(method="L-BFGS-B", jac=True)`` with a jitted
                value-and-grad, in a loop over the same uniform band starts the filter-off arm
                uses (the library's ``"band"`` stream for that seed), ``maxiter=--steps``
  adam_nofilter ``MultiStartAdam(n_candidates=0)``: independent uniform starts
  adam_rank     the old filter, reimplemented inline: the same ``10 x n_starts`` candidates
                ranked by figure of merit and the best ``n_starts`` passed as ``starts=``
  adam_diverse  ``MultiStartAdam()`` with the default filter: ranked, then thinned by multi-level
                single linkage's critical distance
                (``multistart.starts.strategies.diverse_candidates``)
  lbfgs_indep   ``MultiStartLBFGS`` with 4 x ``--starts`` independent local searches from the
                default filter, under a budget of 100 evaluations per local search
                (``max_evals``)
  lbfgs_tiktak  ``MultiStartLBFGS(start_strategy="tiktak")``: ``--starts`` slots running the same
                4 x ``--starts`` local searches TikTak's way, under the same budget

For the two L-BFGS arms "successes" counts local searches (TikTak's replaced ones included),
so both are per local search like the other arms' per start.

Per arm: successes (summed over seeds), success fraction, wall seconds (summed; each fit
compiles its own programs, scipy's value-and-grad is compiled once before timing), successes
per second, both as ratios to scipy, and the fraction of seeds with at least one success.
Every arm runs with one BLAS thread (``peers.py``: scipy's loop is otherwise slowed by
OpenBLAS's spinning threads; the engine's arms do not use BLAS in their loop).

    python profiling/multimodal.py --quick     # 32 starts, 500 steps, 3 seeds (about a minute)
    python profiling/multimodal.py             # 128 starts, 1500 steps, 8 seeds
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
os.environ.setdefault("MULTISTART_CACHE_DIR", "")  # every fit pays its compile, as a first run

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import harness  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy.optimize import minimize  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.model.priors import Space  # noqa: E402
from multistart.starts.strategies import StartStream, rank_candidates  # noqa: E402

BAND = (0.15, 0.85)
SIGMA = 0.3
T = np.linspace(0.0, 5.0, 200)
TRUTH = {
    "f": np.array([0.7, 1.3, 2.1]),
    "a": np.array([2.0, 1.5, 1.0]),
    "phi": np.array([0.5, -1.0, 2.0]),
}
SPACE = {
    "f": ms.Uniform(0.2, 2.5, shape=(3,)),
    "a": ms.Uniform(0.1, 3.0, shape=(3,)),
    "phi": ms.Uniform(-np.pi, np.pi, shape=(3,)),
}


def signal(p, t=T):
    return jnp.sum(
        p["a"][:, None] * jnp.sin(2 * jnp.pi * p["f"][:, None] * t + p["phi"][:, None]), 0
    )


Y = np.asarray(signal(TRUTH)) + SIGMA * np.random.default_rng(0).normal(size=T.size)


def chi2(p):
    return jnp.sum(((Y - signal(p)) / SIGMA) ** 2)


TRUTH_FOM = float(chi2(TRUTH))


def band_starts(n: int, seed: int):
    """The first ``n`` draws of the library's ``"band"`` stream: what ``n_candidates=0`` runs."""
    return StartStream(Space(SPACE), "band", BAND, np.random.default_rng(seed)).draw(n)


def flat(x) -> np.ndarray:
    return np.concatenate([np.asarray(x[k]) for k in ("f", "a", "phi")], axis=-1)


def unflat(v):
    return {"f": v[..., 0:3], "a": v[..., 3:6], "phi": v[..., 6:9]}


_VG = jax.jit(jax.value_and_grad(lambda v: chi2(unflat(v))))
_V = jax.jit(jax.vmap(lambda v: chi2(unflat(v))))


def arm_scipy(n_starts: int, n_steps: int, seed: int) -> np.ndarray:
    x0 = flat(band_starts(n_starts, seed))
    priors = [SPACE[k] for k in ("f", "a", "phi")]
    bounds = [(float(p.lower[i]), float(p.upper[i])) for p in priors for i in range(3)]

    def fun(v):
        value, grad = _VG(v)
        return float(value), np.asarray(grad, dtype=np.float64)

    return np.array(
        [
            minimize(
                fun, x, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": n_steps}
            ).fun
            for x in x0
        ]
    )


def arm_adam_nofilter(n_starts: int, n_steps: int, seed: int) -> np.ndarray:
    search = ms.MultiStartAdam(n_starts=n_starts, n_steps=n_steps, seed=seed, n_candidates=0)
    return np.asarray(search.fit(chi2, SPACE).foms)


def arm_adam_rank(n_starts: int, n_steps: int, seed: int) -> np.ndarray:
    # The filter as it was before the diversity rule: the best n_starts of 10 x n_starts.
    cand = band_starts(10 * n_starts, seed)
    chosen, _ = rank_candidates(np.asarray(_V(flat(cand))), n_starts)
    starts = {k: v[chosen] for k, v in cand.items()}
    search = ms.MultiStartAdam(n_starts=n_starts, n_steps=n_steps, seed=seed)
    return np.asarray(search.fit(chi2, SPACE, starts=starts).foms)


def arm_adam_diverse(n_starts: int, n_steps: int, seed: int) -> np.ndarray:
    search = ms.MultiStartAdam(n_starts=n_starts, n_steps=n_steps, seed=seed)
    return np.asarray(search.fit(chi2, SPACE).foms)


LOCAL_PER_SLOT = 4  # the L-BFGS arms run 4 local searches per slot (TikTak's default n_local)
EVALS_PER_LOCAL = 100  # and share a budget of this many evaluations per local search


def _local_foms(result: ms.Result) -> np.ndarray:
    """Every local search's best figure of merit (TikTak's replaced ones included)."""
    replaced = [inc["fom"] for inc in result.incarnations if inc["replaced_at"] is not None]
    return np.concatenate([np.asarray(result.foms), np.asarray(replaced, dtype=np.float64)])


def arm_lbfgs_independent(n_starts: int, n_steps: int, seed: int) -> np.ndarray:
    # As many independent local searches as TikTak runs, from the default (diverse) filter,
    # under the same evaluation budget.
    n = LOCAL_PER_SLOT * n_starts
    search = ms.MultiStartLBFGS(
        n_starts=n, n_steps=n_steps, seed=seed, max_evals=n * EVALS_PER_LOCAL
    )
    return _local_foms(search.fit(chi2, SPACE))


def arm_lbfgs_tiktak(n_starts: int, n_steps: int, seed: int) -> np.ndarray:
    n = LOCAL_PER_SLOT * n_starts
    search = ms.MultiStartLBFGS(
        n_starts=n_starts,
        n_steps=n_steps,
        seed=seed,
        start_strategy="tiktak",
        n_local=n,
        max_evals=n * EVALS_PER_LOCAL,
    )
    return _local_foms(search.fit(chi2, SPACE))


@dataclass
class Arm:
    name: str
    run: Callable[[int, int, int], np.ndarray]  # (n_starts, n_steps, seed) -> final foms


ARMS = [
    Arm("scipy", arm_scipy),
    Arm("adam_nofilter", arm_adam_nofilter),
    Arm("adam_rank", arm_adam_rank),
    Arm("adam_diverse", arm_adam_diverse),
    Arm("lbfgs_indep", arm_lbfgs_independent),
    Arm("lbfgs_tiktak", arm_lbfgs_tiktak),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=128)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, default=8)
    harness.add_arguments(parser, quick="32 starts, 500 steps, 3 seeds")
    args = parser.parse_args()
    if args.quick:
        args.starts, args.steps, args.seeds = 32, 500, 3
    _VG(flat(TRUTH)), _V(flat(TRUTH)[None])  # compile the peer's functions before timing

    print(
        f"sum of 3 sinusoids, 9 parameters, chi2(truth) = {TRUTH_FOM:.2f}; {args.starts} starts, "
        f"{args.steps} steps, seeds 0..{args.seeds - 1}; success: chi2 <= chi2(truth) + 1"
    )
    rows = {}
    for seed in range(args.seeds):
        # Arms alternate order by seed, so a slow spell on the shared machine hits them alike.
        arms = ARMS if seed % 2 == 0 else ARMS[::-1]
        for arm in arms:
            t0 = time.perf_counter()
            with harness.one_blas_thread():  # scipy's best setting (peers.py); the same for all
                foms = arm.run(args.starts, args.steps, seed)
            wall = time.perf_counter() - t0
            hits = int(np.sum(foms <= TRUTH_FOM + 1.0))
            row = rows.setdefault(arm.name, {"hits": 0, "wall": 0.0, "seeds_hit": 0})
            row["hits"] += hits
            row["wall"] += wall
            row["seeds_hit"] += hits > 0
            print(
                f"  seed {seed} {arm.name:14s} successes {hits:3d}  best {np.min(foms):9.2f}  "
                f"wall {wall:6.1f} s",
                flush=True,
            )

    n = args.starts * args.seeds
    ref = rows[ARMS[0].name]
    ref_rate = ref["hits"] / ref["wall"]
    print()
    print(
        f"{'arm':14s} {'successes':>9s} {'fraction':>8s} {'wall/scipy':>10s} "
        f"{'succ/s':>8s} {'succ/s vs scipy':>15s} {'seeds hit':>9s}"
    )
    for arm in ARMS:
        r = rows[arm.name]
        rate = r["hits"] / r["wall"]
        vs = f"{rate / ref_rate:.2f}" if ref_rate > 0 else "n/a"
        print(
            f"{arm.name:14s} {r['hits']:9d} {r['hits'] / n:8.3%} {r['wall'] / ref['wall']:10.2f} "
            f"{rate:8.3f} {vs:>15s} {r['seeds_hit'] / args.seeds:9.0%}"
        )
    record = harness.Record("multimodal", args)
    for arm in ARMS:
        for key in ("hits", "wall", "seeds_hit"):
            record.figure(f"{arm.name} {key}", rows[arm.name][key])
        row = rows[arm.name]
        record.figure(f"{arm.name} successes per s", row["hits"] / row["wall"])
    peer = ARMS[0].name
    for arm in ARMS[1:]:
        record.ratio(f"{arm.name} wall / {peer}", f"{arm.name} wall", f"{peer} wall")
        if ref["hits"]:
            record.ratio(
                f"{arm.name} successes per s / {peer}",
                f"{arm.name} successes per s",
                f"{peer} successes per s",
            )
    record.write(args.json)


if __name__ == "__main__":
    main()
