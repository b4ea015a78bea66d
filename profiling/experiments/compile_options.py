"""XLA's CPU options against a chunk step's compile (issue 38; profiling/HISTORY.md, "The
elemental emitters: a third off every compile", and "A fit's compile, taken apart once more").

One cold ``MultiStartLeastSquares(n_starts=32, seed=0)`` fit of a NIST problem (default
Misra1a) runs once, and the chunk step's StableHLO is kept as it goes to XLA. That same
module is then compiled again and again in this process, under XLA's defaults and under
each option set below, the sets in turns over ``--rounds`` rounds. The script prints each
set's fastest and median compile, its ratio to the defaults' median, and the kernels (fusions)
in the compiled program. Only the compile is timed, on the same program, so the tracing, the
lowering and the width choice do not enter.

    python profiling/experiments/compile_options.py
    python profiling/experiments/compile_options.py --problem DanWood --rounds 6

The module is read off ``jax._src.compiler.backend_compile_and_load``, an internal of JAX (an
experiment, not the library).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness, fixed_cost, nist_strd
sys.path.insert(0, str(HERE.parent.parent / "tests"))  # nist

import harness  # noqa: E402

ELEMENTAL = {"xla_cpu_use_fusion_emitters": False}  # what the library sets on a CPU
SETS = {
    "XLA's defaults": {},
    "elemental emitters": ELEMENTAL,
    "LLVM level 0": {"xla_backend_optimization_level": 0},
    "fast min and max": {"xla_cpu_enable_fast_min_max": True},
    # on top of the elemental emitters: the other CPU options a compile accepts (stop 67)
    "+ cheap LLVM passes": {**ELEMENTAL, "xla_llvm_disable_expensive_passes": True},
    "+ codegen split 1": {**ELEMENTAL, "xla_cpu_parallel_codegen_split_count": 1},
    "+ codegen split 4": {**ELEMENTAL, "xla_cpu_parallel_codegen_split_count": 4},
    "+ no XNNPACK": {**ELEMENTAL, "xla_cpu_use_xnnpack": False},
    "+ plain scheduler": {
        **ELEMENTAL,
        "xla_cpu_enable_concurrency_optimized_scheduler": False,
    },
    "+ vectors of 128 bits": {**ELEMENTAL, "xla_cpu_prefer_vector_width": 128},
}


def chunk_step_module(problem_name: str) -> str:
    """The StableHLO text of the chunk step a cold fit of ``problem_name`` compiles."""
    os.environ["MULTISTART_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_options_")
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    import jax
    from jax._src import compiler

    jax.config.update("jax_enable_x64", True)
    import nist
    from fixed_cost import Counted
    from nist_strd import space_of

    import multistart as ms

    seen: dict[str, str] = {}
    real = compiler.backend_compile_and_load

    def keep(backend, module, devices, options, callbacks):
        name = str(module.operation.attributes["sym_name"])
        seen[name] = module.operation.get_asm(enable_debug_info=False)
        return real(backend, module, devices, options, callbacks)

    compiler.backend_compile_and_load = keep
    try:
        problem = nist.load(problem_name)
        ms.MultiStartLeastSquares(n_starts=32, seed=0, progress=False).fit(
            Counted(problem).named, space_of(problem)
        )
    finally:
        compiler.backend_compile_and_load = real
    (name,) = [n for n in seen if "chunk_step" in n]
    return seen[name]


def compile_once(text: str, overrides: dict):
    """Compile the StableHLO ``text`` under ``overrides``: ``(seconds, kernels)``."""
    import jax
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    device = jax.devices()[0]
    devices = xla_client.DeviceList((device,))
    options = compiler.get_compile_options(
        num_replicas=1, num_partitions=1, env_options_overrides=overrides
    )
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        t0 = time.perf_counter()
        executable = compiler.backend_compile_and_load(device.client, module, devices, options, [])
        seconds = time.perf_counter() - t0
    return seconds, executable.hlo_modules()[0].to_string().count(" fusion(")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="Misra1a")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    text = chunk_step_module(args.problem)
    times: dict[str, list[float]] = {name: [] for name in SETS}
    kernels: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, overrides in SETS.items():
            seconds, kernels[name] = compile_once(text, overrides)
            times[name].append(seconds)
    base = harness.median(times["XLA's defaults"])
    print(f"{args.problem}'s chunk step (32 starts), compiled {args.rounds} times under each set")
    print(f"{'options':<22}{'min s':>8}{'median s':>10}{'/ defaults':>12}{'kernels':>9}")
    for name, values in times.items():
        mid = harness.median(values)
        print(f"{name:<22}{min(values):8.3f}{mid:10.3f}{mid / base:12.2f}{kernels[name]:9d}")


if __name__ == "__main__":
    main()
