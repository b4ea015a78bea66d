"""The ``multistart`` command (``python -m multistart`` is the same): ``multistart demo``.

Each subcommand is a ``_<name>(args) -> int`` function registered in :func:`parser`; ``main``
returns the exit status, so tests call ``main([...])`` directly.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "parser"]


def _number(convert, ok, what: str):
    """An argparse type: ``convert(text)`` when ``ok`` accepts it, else an error naming ``what``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}")
        return value

    return parse


_positive = _number(int, lambda v: v >= 1, "a positive integer")
_non_negative = _number(int, lambda v: v >= 0, "an integer >= 0")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="multistart", description="Multi-start gradient fitting in JAX."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="fit a synthetic galaxy seen in three bands (a factor graph) and show the result",
        description=(
            "Fit a synthetic two-component galaxy imaged in three bands (24x24, 32x32 and "
            "48x48 pixels; different PSFs and noise) with MultiStartProdigy: one factor per "
            "band, shape parameters shared, fluxes per band. Prints the best fit against the "
            "truth and a per-start summary, and writes result.npz, starts.csv and demo.png."
        ),
    )
    demo.add_argument("--quick", action="store_true", help="CI-sized run (a few seconds)")
    demo.add_argument(
        "--out", default="multistart-out", help="output folder (default: %(default)s)"
    )
    demo.add_argument(
        "--n-starts", type=_positive, help="number of starts (default: 256; --quick: 8)"
    )
    demo.add_argument(
        "--batch-size", type=_positive, help="starts per compiled call (default: 8; --quick: 4)"
    )
    demo.add_argument(
        "--n-steps", type=_positive, help="maximum steps per start (default: 2000; --quick: 300)"
    )
    demo.add_argument("--seed", type=_non_negative, default=0, help="start seed (default: 0)")
    demo.add_argument("--quiet", action="store_true", help="no progress lines")
    demo.set_defaults(func=_demo)
    return p


def _demo(args) -> int:
    from . import demo

    missing = demo.missing_dependencies()
    if missing:
        print(
            f"multistart demo: needs {' and '.join(missing)}, which the 'plots' extra installs:\n"
            "    pip install 'multistart[plots]'   (from a checkout: pip install -e '.[plots]')",
            file=sys.stderr,
        )
        return 1
    demo.run(
        args.out,
        n_starts=args.n_starts,
        batch_size=args.batch_size,
        n_steps=args.n_steps,
        seed=args.seed,
        quick=args.quick,
        quiet=args.quiet,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``multistart`` command with ``argv`` (default: ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
