"""Where the L-BFGS chunk step's compile time goes: the rule with one part taken out at a time,
against Adam's, on one objective.

``lbfgs_compile.py`` measures the rule as it is (issue 23's figure 4: asked within 1.3x Adam's).
This script asks which part of ``multistart/solvers/lbfgs.py`` the excess is in, by compiling
variants of the rule's step that are wrong on purpose (they are never run, only compiled):

  adam           MultiStartAdam, the reference
  lbfgs          the rule as it is
  state only     the step keeps the state as it came (unpacked, repacked, selected) and moves
                 u by -0.1 g: what carrying the state costs
  no two-loop    H g replaced by gamma g
  no remember    the memory never takes a pair (no shift, no selects)
  no backtrack   a failed trial halves the step (no cubic or quadratic interpolation)
  gram two-loop  the two-loop recursion in Gram form (two triangular solves of m x m on
                 S Yᵀ, Y Yᵀ, S g, Y g): a candidate replacement, same H g to rounding
  one loop       both loops of the recursion in one fori_loop of 2 m iterations (each
                 iteration computes both updates and selects one): another candidate

Each arm's chunk step (width 8, 8 starts) is lowered once; the rounds then re-lower and compile
each in turn in this process, JAX's caches cleared before each, the persistent cache off. The
table gives the median process CPU seconds of ``compile()`` and the ratio to Adam's.

    python profiling/experiments/lbfgs_compile_parts.py --model curve --rounds 5
    python profiling/experiments/lbfgs_compile_parts.py --model image --rounds 3
    python profiling/experiments/lbfgs_compile_parts.py --opt-level 0   # LLVM's level

With ``--opt-level``, what the level costs at run time too: the model's jitted value-and-grad
(at the truth for ``image``, at the prior centres otherwise) compiled at XLA's default level and
at the one asked, each timed over 50 calls a round, side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # profiling/: lbfgs_compile.py, the models
os.environ["MULTISTART_CACHE_DIR"] = ""
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lbfgs_compile  # noqa: E402

import multistart as ms  # noqa: E402
from multistart.device import backends  # noqa: E402
from multistart.solvers import SolverStep  # noqa: E402
from multistart.solvers import lbfgs as rule  # noqa: E402


class StateOnly(rule.LBFGS):
    def step(self, value, grad, u, state, *, scale, value_fn):
        st = rule.LBFGSFields.unpack(state)
        new = st._replace(f=jnp.asarray(value, st.f.dtype))
        u_next = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, u, grad)
        return SolverStep(u_next, rule._select(value > 0, state, new.pack()), 0)


class NoTwoLoop(rule.LBFGS):
    @staticmethod
    def _two_loop(g, mem):
        return mem.gamma * g


class NoRemember(rule.LBFGS):
    def _remember(self, st, s_new, y_new, dots, store):
        return rule._Memory(st.s, st.y, st.rho, st.gamma, st.n_pairs)


class GramTwoLoop(rule.LBFGS):
    @staticmethod
    def _two_loop(g, mem):
        s, y, rho, gamma = mem.s, mem.y, mem.rho, mem.gamma
        eye = jnp.eye(rho.shape[0], dtype=g.dtype)
        upper = jnp.triu(s @ y.T, 1)  # s_i . y_j, j > i
        solve = jax.scipy.linalg.solve_triangular
        a = solve(eye + rho[:, None] * upper, rho * (s @ g), lower=False)
        yq = y @ g - (y @ y.T) @ a
        lower = upper.T
        b = solve(eye + rho[:, None] * lower, rho * (gamma * yq + lower @ a), lower=True)
        return gamma * (g - y.T @ a) + s.T @ (a - b)


class OneLoop(rule.LBFGS):
    @staticmethod
    def _two_loop(g, mem):
        m = mem.rho.shape[0]

        def body(k, carry):
            v, alphas = carry
            first = k < m  # newest to oldest, then oldest to newest
            i = jnp.where(first, m - 1 - k, k - m)
            s_i, y_i, rho_i = mem.s[i], mem.y[i], mem.rho[i]
            v = jnp.where(k == m, mem.gamma * v, v)  # r = gamma q as the second loop begins
            c = rho_i * jnp.vdot(jnp.where(first, s_i, y_i), v)
            v = jnp.where(first, v - c * y_i, v + (alphas[i] - c) * s_i)
            return v, jnp.where(first, alphas.at[i].set(c), alphas)

        return jax.lax.fori_loop(0, 2 * m, body, (g, jnp.zeros_like(mem.rho)))[0]


def _halve(st, value, dots, finite):
    return 0.5 * st.alpha


ARMS = {
    "adam": None,
    "lbfgs": rule.LBFGS,
    "state only": StateOnly,
    "no two-loop": NoTwoLoop,
    "no remember": NoRemember,
    "no backtrack": rule.LBFGS,  # with rule._backtrack patched while it is lowered
    "gram two-loop": GramTwoLoop,
    "one loop": OneLoop,
}


def lower_arms(model: str) -> dict:
    """``arm -> (jitted chunk step, its lowering arguments)``, each arm fitted for 3 steps."""
    f, space = lbfgs_compile.objective(model)
    common = dict(n_starts=8, batch_size=8, n_steps=3, n_candidates=0, log_every=0)
    found, original_compile, original_backtrack = {}, backends.lower_and_compile, rule._backtrack
    for arm, solver in ARMS.items():

        def capture(jitted, what, *args, arm=arm):
            if "chunk step" in what:
                found[arm] = (jitted, args)
            return original_compile(jitted, what, *args)

        backends.lower_and_compile = capture
        rule._backtrack = _halve if arm == "no backtrack" else original_backtrack
        try:
            if solver is None:
                search = ms.MultiStartAdam(progress=False, **common)
            else:
                search = ms.MultiStartGradient(solver(), progress=False, **common)
            search.fit(f, space)
        finally:
            backends.lower_and_compile, rule._backtrack = original_compile, original_backtrack
    return found


def evaluation_cost(model: str, level: int, rounds: int) -> None:
    """Compile seconds and milliseconds an evaluation of the bare value-and-grad of ``model``
    at XLA's default optimisation level and at ``level``, the arms taking turns."""
    from jax.flatten_util import ravel_pytree

    f, space = lbfgs_compile.objective(model)
    if model == "image":
        import image_model

        point = image_model.make_truth()
    else:
        point = {k: 0.5 * (p.lower + p.upper) for k, p in space.items()}
    flat, unravel = ravel_pytree(jax.tree_util.tree_map(jnp.asarray, point))
    jitted = jax.jit(jax.value_and_grad(lambda v: f(unravel(v))))
    arms = {"default": {}, f"level {level}": {"xla_backend_optimization_level": level}}
    compiled, compile_s, eval_s = {}, {}, {a: [] for a in arms}
    for arm, options in arms.items():
        jax.clear_caches()
        lowered = jitted.lower(flat)
        t = time.process_time()
        compiled[arm] = lowered.compile(compiler_options=options)
        compile_s[arm] = time.process_time() - t
        jax.block_until_ready(compiled[arm](flat))
    for r in range(rounds):
        for arm in arms if r % 2 == 0 else list(arms)[::-1]:
            t = time.perf_counter()
            for i in range(50):
                out = compiled[arm](flat + 1e-6 * i)
            jax.block_until_ready(out)
            eval_s[arm].append((time.perf_counter() - t) / 50)
    base = statistics.median(eval_s["default"])
    print(f"\nbare value-and-grad of {model}: compile CPU s, ms an evaluation (median of {rounds})")
    for arm in arms:
        e = statistics.median(eval_s[arm])
        print(f"{arm:10s} compile {compile_s[arm]:6.3f} s   {1e3 * e:8.3f} ms  {e / base:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="curve", choices=["curve", "bench", "image"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--opt-level",
        type=int,
        help="compile every arm with XLA's xla_backend_optimization_level at this (default: "
        "XLA's own)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    jax.config.update("jax_enable_compilation_cache", False)
    arms = lower_arms(args.model)
    cpu: dict[str, list[float]] = {arm: [] for arm in arms}
    kernels = {}
    options = {} if args.opt_level is None else {"xla_backend_optimization_level": args.opt_level}
    for r in range(args.rounds):
        for arm in arms if r % 2 == 0 else list(arms)[::-1]:
            jitted, lower_args = arms[arm]
            jax.clear_caches()  # else compile() is served from memory
            lowered = jitted.lower(*lower_args)
            t = time.process_time()
            compiled = lowered.compile(compiler_options=options)
            cpu[arm].append(time.process_time() - t)
            kernels[arm] = compiled.as_text().count(" fusion(")
    adam = statistics.median(cpu["adam"])
    print(f"chunk-step compile by part, {args.model}, width 8; median of {args.rounds} rounds; "
          f"jax {jax.__version__}; compiler options {options}")  # fmt: skip
    print(f"{'arm':15s} {'cpu s':>7s} {'/ adam':>7s} {'kernels':>8s}")
    for arm, seconds in cpu.items():
        s = statistics.median(seconds)
        print(f"{arm:15s} {s:7.3f} {s / adam:7.2f} {kernels[arm]:8d}")
    if args.opt_level is not None:
        evaluation_cost(args.model, args.opt_level, args.rounds)


if __name__ == "__main__":
    main()
