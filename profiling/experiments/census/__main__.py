"""The compile census's command: ``python -m profiling.experiments.census`` (run from the
repository root).

``main`` returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from multistart.__main__ import _number, _positive  # the demo's argparse types

PROG = "python -m profiling.experiments.census"
_positive_float = _number(float, lambda v: 0 < v < float("inf"), "a positive number")


def _names(choices):
    """A comma-separated list of names from ``choices`` (checked, order kept)."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        unknown = [n for n in names if n not in choices]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"must be a comma-separated list of {', '.join(choices)}; got {text!r}"
            )
        return names

    return parse


def _counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(_positive(n.strip()) for n in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of positive integers; got {text!r}"
        ) from None


def _block_name(text: str) -> str:
    if not text or not all(c.isalnum() or c in "-_" for c in text):
        raise argparse.ArgumentTypeError(f"must be letters, digits, '-' or '_'; got {text!r}")
    return text


def _join(values) -> str:
    return ",".join(map(str, values))


def parser() -> argparse.ArgumentParser:
    from . import cells, probe, runner

    full, quick = runner.FULL, runner.QUICK
    p = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Compile census. Each cell (a factor graph: one band, four bands of one shape, of "
            "two or four shapes, or padded to one) is compiled under each transform (vag, "
            "vmap_vag, laxmap_vag, pyloop_vag) in a fresh process with a fresh persistent "
            "compilation cache (cold), then again with that cache (warm). Each phase of a "
            "process is capped in time and each process in memory. Writes one JSON row per "
            "process and, with --markdown, a table into that file's generated block."
        ),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small model and plan (widths {_join(quick['widths'])}, {quick['n_starts']} "
        f"starts, phase cap {quick['phase_cap_s']:g} s): a few minutes",
    )
    p.add_argument(
        "--cells",
        type=_names(tuple(cells.CELLS)),
        default=tuple(cells.CELLS),
        help=f"comma-separated cells (default: all: {','.join(cells.CELLS)})",
    )
    p.add_argument(
        "--transforms",
        type=_names(probe.TRANSFORMS),
        default=probe.TRANSFORMS,
        help=f"comma-separated transforms (default: all: {','.join(probe.TRANSFORMS)})",
    )
    p.add_argument(
        "--widths",
        type=_counts,
        help="comma-separated vmap widths / lax.map batch sizes "
        f"(default: {_join(full['widths'])}; --quick: {_join(quick['widths'])})",
    )
    p.add_argument(
        "--components",
        type=_counts,
        help="comma-separated numbers of MGE components per band, the model's weight "
        f"(default: {_join(full['components'])}; --quick: {_join(quick['components'])})",
    )
    p.add_argument(
        "--n-starts",
        type=_positive,
        help=f"starts swept by laxmap_vag and pyloop_vag (default: {full['n_starts']}; "
        f"--quick: {quick['n_starts']})",
    )
    p.add_argument("--repeats", type=_positive, default=1, help="cold/warm pairs each (default: 1)")
    _add_limits(p, full, quick)
    return p


def _add_limits(p, full: dict, quick: dict) -> None:
    """The caps per process and the outputs."""
    p.add_argument(
        "--phase-cap",
        type=_positive_float,
        metavar="SECONDS",
        help="a process is killed when one phase (a compile, say) runs longer "
        f"(default: {full['phase_cap_s']:g}; --quick: {quick['phase_cap_s']:g})",
    )
    p.add_argument(
        "--memory-cap-mb",
        type=_positive_float,
        metavar="MB",
        help="a process is killed above this resident memory "
        "(default: half the memory available at the start)",
    )
    p.add_argument(
        "--out",
        default="multistart-out/census.json",
        help="the JSON rows (default: %(default)s)",
    )
    p.add_argument(
        "--markdown",
        metavar="FILE",
        help="write the table into FILE's generated block (created if missing)",
    )
    p.add_argument(
        "--block",
        type=_block_name,
        default="census",
        help="name of the generated block in --markdown (default: %(default)s); each block "
        "is replaced on its own, so one file can hold several censuses",
    )
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: tabulate the rows in FILE (into --markdown, or to stdout)",
    )


def _run(args, argv: list[str]) -> int:
    from . import report, runner

    if args.from_json:
        try:
            rows = json.loads(Path(args.from_json).read_text())
            table = report.markdown(rows)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{PROG}: cannot tabulate {args.from_json}: {e}", file=sys.stderr)
            return 2
        if args.markdown:
            return _write_table(args, rows)
        print(table)
        return 0
    try:
        plan = _plan(args)
    except ValueError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    command = shlex.join([*PROG.split(), *argv])
    print(
        f"compile census: {len(runner.measurements(plan))} measurements x {plan.repeats} "
        f"repeat(s), cold and warm; phase cap {plan.phase_cap_s:g} s, memory cap "
        f"{plan.rss_cap_mb:.0f} MB; rows to {args.out}",
        flush=True,
    )
    rows = runner.run_census(plan, args.out, command=command, echo=lambda s: print(s, flush=True))
    if args.markdown:
        return _write_table(args, rows)
    print(report.markdown(rows))
    return 0


def _plan(args):
    from . import runner

    size: dict[str, Any] = dict(runner.QUICK if args.quick else runner.FULL)
    for key in ("widths", "components", "n_starts"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    if args.phase_cap is not None:
        size["phase_cap_s"] = args.phase_cap
    return runner.Plan(
        cells=args.cells,
        transforms=args.transforms,
        repeats=args.repeats,
        rss_cap_mb=args.memory_cap_mb or runner.default_rss_cap_mb(),
        **size,
    )


def _write_table(args, rows) -> int:
    from . import report

    try:
        report.update_file(args.markdown, rows, args.block)
    except (OSError, ValueError) as e:
        print(f"{PROG}: cannot write the table into {args.markdown}: {e}", file=sys.stderr)
        return 2
    print(f"table written to {args.markdown} (block {args.block!r})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the census's command with ``argv`` (default: ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return _run(parser().parse_args(argv), argv)  # argv is recorded with the census's rows


if __name__ == "__main__":
    sys.exit(main())
