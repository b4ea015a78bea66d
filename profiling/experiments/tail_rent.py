"""The tail's narrowing rule on the spectra's one-start fit (issue 38; profiling/HISTORY.md, "A
tail narrows once it has cost a compile").

In a fresh process with an empty cache folder, the sequence ``profiling/spectra_batch.py``
runs: 32-start fits of two sets of 500 spectra, then the one-start fit of the first, its call
timed. Two rules for the tail, in turns over ``--rounds`` rounds, each in its own process:

- ``rent``: the library's (``TailPrice.pays``): narrow once the tail so far has cost the
  narrower program's compile, and the steps left could repay it;
- ``steps left``: stop 65's rule, put back by hand for the comparison: narrow when the steps
  left, at most ``n_steps - step``, could repay the compile.

Each round prints the one-start call's wall, the chunk steps it compiled and where it narrowed;
then the median walls and their ratio. Whether ``steps left`` narrows depends on the prices the
width choice measured, so its rounds spread.

    python profiling/experiments/tail_rent.py --rounds 4
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # harness, spectra_batch

import harness  # noqa: E402

RULES = ("rent", "steps left")


def child(rule: str) -> None:
    """The sequence in this process, under ``rule``; the one-start call's figures."""
    os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")
    import jax

    jax.config.update("jax_enable_x64", True)
    import spectra_batch

    from multistart.common.monitor import CompileCounter
    from multistart.host.decide import TailPrice

    if rule == "steps left":

        def pays(self, step, width, narrow, since):
            return (self.n_steps - step) * self.start_s * (width - narrow) > self.compile_s

        TailPrice.pays = pays  # type: ignore[method-assign]
    first, second = spectra_batch.spectra(500, 0), spectra_batch.spectra(500, 1)
    spectra_batch.ours(first, 32, "auto")
    spectra_batch.ours(second, 32, "auto")
    with CompileCounter() as compiles:
        seconds, _, result = spectra_batch.ours(first, 1, "auto")
    harness.child_result(
        {
            "seconds": seconds,
            "chunk_steps": compiles.counts.get("jit(multistart_chunk_step)", 0),
            "narrowed": result.stats.get("narrowed", []),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", choices=RULES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    walls: dict[str, list[float]] = {rule: [] for rule in RULES}
    for i in range(args.rounds):
        for rule in RULES[:: 1 if i % 2 == 0 else -1]:
            with tempfile.TemporaryDirectory() as folder:
                got = harness.fresh_process(
                    Path(__file__).resolve(), "--child", rule, env={"MULTISTART_CACHE_DIR": folder}
                )
            walls[rule].append(got["seconds"])
            where = ", ".join(f"{n['from']}->{n['to']} at {n['step']}" for n in got["narrowed"])
            print(
                f"  round {i + 1}, {rule:<10}: one-start call {got['seconds']:.2f} s, "
                f"{got['chunk_steps']} chunk step(s) compiled, narrowed: {where or 'no'}"
            )
    mid = {rule: harness.median(v) for rule, v in walls.items()}
    print(
        f"one-start call, medians: rent {mid['rent']:.2f} s, steps left {mid['steps left']:.2f} s;"
        f" rent / steps left {mid['rent'] / mid['steps left']:.2f}"
    )


if __name__ == "__main__":
    main()
