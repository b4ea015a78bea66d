"""What the zero-gradient check costs: one JVP trace of the figure of merit, no compile.

Every fit now traces its figure of merit forward once before anything compiles, to refuse a
gradient that is zero everywhere (multistart.model.problem.check_gradient). This prints that trace's
time as a ratio to one compile of ``jit(value_and_grad(fom))``, which every fit pays at least
once (its chunk step compiles more than that), for the README's objective and the demo's
three-band graph, measured side by side in one process.

Run: ``python profiling/experiments/gradient_check_cost.py``.
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from multistart import demo
from multistart.model.problem import as_problem, flat_leaves_without_gradient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import readme_model  # noqa: E402  (the README's model, with the tests that fit it)


def readme_problem():
    chi2, space = readme_model.make_problem(noise=False)
    return as_problem(chi2, space)


def main() -> None:
    problems = [
        ("README chi2", readme_problem()),
        ("demo graph (3 bands)", demo.demo_graph().multistart_problem()),
    ]
    for name, problem in problems:
        example = problem.space.example(jnp.float32)
        t = time.perf_counter()
        flat_leaves_without_gradient(problem, jnp.float32)
        check = time.perf_counter() - t
        value_and_grad = jax.jit(jax.value_and_grad(problem.fom))
        t = time.perf_counter()
        value_and_grad.lower(example, problem.data).compile()
        compile_s = time.perf_counter() - t
        print(f"{name}: gradient check / one value_and_grad compile = {check / compile_s:.3f}")


if __name__ == "__main__":
    main()
