"""docs/profiling.md's tables, written from the benchmarks' records in ``profiling/records/``.

A record is what a benchmark writes with ``--json PATH`` (``harness.py``): the machine, the
commit, every figure and every ratio of one run. The page holds generated blocks between
marker comments, each naming the records it shows (a file name or a glob under the records'
folder)::

    <!-- records: fixed_cost.json -->
    ...written here...
    <!-- /records -->

and ``<!-- records-index -->`` ... ``<!-- /records-index -->`` for a table of every record kept.
Everything outside the markers is prose, written by hand. Run from the repository root::

    python -m profiling.report            # rewrite the page's blocks from the records
    python -m profiling.report --check    # exit 1 if the page is not what the records write

The suite runs ``--check`` (tests/test_benchmarks.py), so a record changed without the page, or
a table edited by hand, fails it. To add a figure: run the benchmark with
``--json profiling/records/NAME.json`` on a clean checkout, add a block naming it, run this.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "profiling" / "records"
PAGE = ROOT / "docs" / "profiling.md"
BLOCK = re.compile(r"(<!-- records: (?P<names>[^>]+?) -->\n)(?P<body>.*?)(<!-- /records -->)", re.S)
INDEX = re.compile(r"(<!-- records-index -->\n)(?P<body>.*?)(<!-- /records-index -->)", re.S)


def number(value) -> str:
    """A figure as the page prints it: counts with thousands separators, others to 3-4 digits;
    a list of figures (the runs a median was taken of) each so, in order.

    >>> number([4.753, 4.534, 12000])
    '4.75, 4.53, 12,000'
    """
    if isinstance(value, list | tuple):
        return ", ".join(number(v) for v in value)
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return value
    value = float(value)
    if math.isnan(value):
        return "–"
    if value == int(value) and abs(value) >= 1:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def provenance(name: str, record: dict) -> str:
    """Where a record's figures came from: its file, command, date, commit and machine."""
    m, c = record.get("machine", {}), record.get("commit", {})
    sha = (c.get("sha") or "?")[:7]
    dirty = " with uncommitted changes" if c.get("dirty") else ""
    device = m.get("device") or m.get("processor") or "?"
    cores = m.get("cpus_usable") or m.get("cpu_count")
    return (
        f"`profiling/records/{name}`: `{record.get('command', '?')}`, "
        f"{str(record.get('created', '?'))[:10]}, commit `{sha}`{dirty}; {device}, "
        f"{cores} CPU cores, jax {m.get('jax')}" + ("; `--quick`" if record.get("quick") else "")
    )


def _sections(record: dict) -> list[str]:
    """A record whose notes hold sections of rows (the accelerator's): one table a section."""
    out: list[str] = []
    for section, rows in record["notes"]["sections"].items():
        if not rows:
            continue
        keys = list(dict.fromkeys(k for row in rows for k in row))
        out += ["", f"`{section}`:", ""]
        out += table(keys, [[number(row.get(k)) for k in keys] for row in rows])
    return out


def _ratios(record: dict) -> list[str]:
    """A record's ratios (an arm's figure over its peer's, the same run), or its figures."""
    figures, ratios = record["figures"], record["ratios"]
    if not ratios:
        return ["", *table(["figure", "value"], [[n, number(v)] for n, v in figures.items()])]
    rows = []
    for name, r in ratios.items():
        arm, peer = r.get("arm"), r.get("peer")
        rows.append(
            [
                name,
                f"**{number(r['value'])}**",
                number(figures[arm]) if arm in figures else "",
                number(figures[peer]) if peer in figures else "",
            ]
        )
    return ["", *table(["ratio", "value", "arm", "peer"], rows)]


def render(names: list[str], records: dict[str, dict]) -> str:
    """The block for the records ``names`` (globs allowed), each with where it came from."""
    chosen = [n for n in records if any(fnmatch.fnmatch(n, g) for g in names)]
    if not chosen:
        raise ValueError(f"no record in {RECORDS} matches {', '.join(names)}")
    out: list[str] = []
    for name in chosen:
        record = records[name]
        out += ["", provenance(name, record)]
        sections = record.get("notes", {}).get("sections")
        out += _sections(record) if sections else _ratios(record)
    return "\n".join(out).lstrip("\n") + "\n"


def render_index(records: dict[str, dict]) -> str:
    rows = []
    for name, record in records.items():
        c = record.get("commit", {})
        rows.append(
            [
                f"`{record.get('benchmark')}`",
                f"`{name}`",
                str(record.get("created", "?"))[:10],
                f"`{(c.get('sha') or '?')[:7]}`",
                record.get("machine", {}).get("device", "?"),
                number(len(record["ratios"])),
            ]
        )
    header = ["benchmark", "record", "recorded", "commit", "device", "ratios"]
    return "\n".join(table(header, rows)) + "\n"


def load(folder: Path) -> dict[str, dict]:
    return {p.name: harness.read_record(p) for p in sorted(folder.glob("*.json"))}


def write(page_text: str, records: dict[str, dict]) -> str:
    """``page_text`` with every generated block rewritten from ``records``."""

    def block(match: re.Match) -> str:
        names = match["names"].split()
        return match.group(1) + render(names, records) + match.group(4)

    text = BLOCK.sub(block, page_text)
    return INDEX.sub(lambda m: m.group(1) + render_index(records) + m.group(3), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    parser.add_argument("--page", type=Path, default=PAGE, help="default: %(default)s")
    parser.add_argument("--records", type=Path, default=RECORDS, help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        records = load(args.records)
        before = args.page.read_text()
        after = write(before, records)
    except (OSError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if not BLOCK.search(before) and not INDEX.search(before):
        print(f"report: {args.page} has no generated block", file=sys.stderr)
        return 2
    if args.check:
        if after != before:
            print(f"{args.page} is not what the records write: run python -m profiling.report")
            return 1
        print(f"{args.page} is what the {len(records)} records write")
        return 0
    if after != before:
        args.page.write_text(after)
    print(f"{args.page}: {len(BLOCK.findall(after))} blocks from {len(records)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
