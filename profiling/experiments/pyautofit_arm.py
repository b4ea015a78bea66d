"""PyAutoFit's multi-start rule on a project benchmark: the peer arm of ``pyautofit_peer.py``.

Runs in PyAutoFit's own environment (Python >= 3.12, ``pip install autofit``), never in the
project's: ``pyautofit_peer.py`` starts it as a subprocess. It imports the benchmark models
from this source tree (``profiling/image_model.py``, ``profiling/benchmark_model.py``), so both
arms fit the same data with the same model code. Each benchmark is a PyAutoFit factor graph:
one ``AnalysisFactor`` per band or dataset, all sharing the model's priors, as a PyAutoFit user
would write it.

    python profiling/experiments/pyautofit_arm.py --problem image --rule adam --seed 0 \
        --out arm.json

PyAutoFit writes its output folder under the working directory (``pyautofit_peer.py`` runs
this in a temporary one).

Writes a JSON object: the rule's settings, wall seconds of ``search.fit`` (compile included)
and of the search's own ``run`` within it (without PyAutoFit's result files and plots),
PyAutoFit's best figure of merit (``-2 log posterior``), its best point and its starts, both as
flat vectors in the order of the project's space (``multistart.Space(space).ravel``), so the
caller evaluates the same χ² at both arms' points and can feed these starts to its engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # profiling/: the harness and the models
sys.path[:0] = [str(HERE), str(HERE.parent)]

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import autofit as af  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

RULES = {
    "adam": "MultiStartAdam",
    "prodigy": "MultiStartProdigy",
    "adabelief": "MultiStartADABelief",
    "lion": "MultiStartLion",
}


def _prior(p, i=None):
    """The PyAutoFit prior of element ``i`` of a project prior (Uniform or LogUniform)."""
    import multistart as ms

    lo = float(np.ravel(p.lower)[0 if i is None else i])
    hi = float(np.ravel(p.upper)[0 if i is None else i])
    if isinstance(p, ms.LogUniform):
        return af.LogUniformPrior(lower_limit=lo, upper_limit=hi)
    return af.UniformPrior(lower_limit=lo, upper_limit=hi)


class Scalars:
    """A model component whose parameters are named scalars (``k0``, ``k1``, ...)."""

    def __init__(self, **kwargs):
        self.values = kwargs


def scalar_model(paths_priors):
    """An ``af.Collection`` with one scalar prior per element of the project's space.

    Returns the collection and, per flat index of the project's space, the attribute path of
    its prior, so that vectors can be reordered between the two layouts.
    """
    leaves = {}
    names = []
    for _path, prior in paths_priors:
        for i in range(prior.size):
            key = f"k{len(names)}"
            leaves[key] = _prior(prior, i if prior.shape else None)
            names.append(key)
    model = af.Model(Scalars, **leaves)
    return model, names


def project_layout(space_tree):
    from multistart.model.priors import Space

    space = Space(space_tree)
    return space, list(zip(space.paths, space.priors, strict=True))


def graph_for(problem: str):
    """``(factors, model, space, names)`` of one benchmark as a PyAutoFit factor graph."""
    if problem == "image":
        import image_model

        space_tree = image_model.space()
        data = image_model.make_data(0)
    else:
        import benchmark_model

        space_tree = benchmark_model.space()
        data = benchmark_model.make_data()
    space, layout = project_layout(space_tree)
    model, names = scalar_model(layout)

    def params_of(instance):
        flat = jnp.stack([jnp.asarray(instance.values[n], jnp.float64) for n in names])
        return space.unravel(flat)

    factors = []
    for band, d in data.items():
        analysis = _analysis(problem, band, d, params_of)
        factors.append(af.AnalysisFactor(prior_model=model, analysis=analysis))
    return factors, model, space, names


def _analysis(problem, band, d, params_of):
    if problem == "image":
        import image_model

        xx, yy = jnp.asarray(d["xx"]), jnp.asarray(d["yy"])
        img, sigma = jnp.asarray(d["img"]), float(d["sigma"])

        def loglike(p):
            return -0.5 * jnp.sum(((image_model.render(p, xx, yy) - img) / sigma) ** 2)
    else:
        import benchmark_model

        y = jnp.asarray(d)

        def loglike(p):
            return -0.5 * jnp.sum(((benchmark_model.model(p, band) - y) / 0.1) ** 2)

    class Band(af.Analysis):
        def log_likelihood_function(self, instance):
            return loglike(params_of(instance))

    return Band(use_jax=True)


def run(problem, rule, seed, n_starts, n_steps, batch_size, learning_rate):
    factors, model, space, names = graph_for(problem)
    graph = af.FactorGraphModel(*factors, use_jax=True)
    kwargs = {} if learning_rate is None else {"learning_rate": learning_rate}
    search = getattr(af, RULES[rule])(
        name=f"{problem}-{rule}-{seed}",
        n_starts=n_starts,
        n_steps=n_steps,
        batch_size=batch_size,
        seed=seed,
        convergence=af.MultiStartGradientConvergence(check_for_convergence=False),
        iterations_per_log=10**6,
        **kwargs,
    )
    run_s = _time_run(search)
    t0 = time.perf_counter()
    result = search.fit(model=graph.global_prior_model, analysis=graph)
    wall = time.perf_counter() - t0
    gmodel = graph.global_prior_model
    order = _graph_order(gmodel, model)
    samples = result.samples
    best = np.asarray(samples.parameter_lists[0], dtype=float)
    # The starts PyAutoFit drew: its own broad-start draw, replayed with the same seed (every
    # draw is finite on these models, so the draw is the start list).
    starts = np.asarray(search._broad_starts(gmodel, _finite, jnp), dtype=float)
    return {
        "problem": problem,
        "rule": rule,
        "search": RULES[rule],
        "seed": seed,
        "n_starts": n_starts,
        "n_steps": n_steps,
        "batch_size": batch_size,
        "learning_rate": search.learning_rate,
        "autofit_version": getattr(af, "__version__", "?"),
        "wall_s": wall,
        "run_s": run_s.get("s"),
        "best_fom": -2.0 * float(samples.log_posterior_list[0]),
        "best": best[order].tolist(),
        "starts": starts[:, order].tolist(),
    }


def _time_run(search) -> dict:
    """Time the search's own ``run`` (starts, compiles, steps), apart from what ``fit`` adds
    around it (output folders, result files, plots): filled in when ``run`` returns."""
    timed, run = {}, search.run

    def run_and_time(*args, **kwargs):
        t0 = time.perf_counter()
        out = run(*args, **kwargs)
        timed["s"] = time.perf_counter() - t0
        return out

    search.run = run_and_time
    return timed


def _finite(vector):
    return 0.0, np.zeros(len(vector))


def _graph_order(gmodel, model):
    """Index into the graph's parameter vector of each of ``model``'s scalars, in order."""
    position = {id(p): j for j, p in enumerate(gmodel.priors_ordered_by_id)}
    out = []
    j = 0
    while hasattr(model, f"k{j}"):
        out.append(position[id(getattr(model, f"k{j}"))])
        j += 1
    return np.array(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", choices=("image", "multi"), default="image")
    ap.add_argument("--rule", choices=tuple(RULES), default="adam")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-starts", type=int, default=32)
    ap.add_argument("--n-steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    record = run(
        args.problem,
        args.rule,
        args.seed,
        args.n_starts,
        args.n_steps,
        args.batch_size,
        args.learning_rate,
    )
    out.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
