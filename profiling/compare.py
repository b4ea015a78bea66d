"""Two benchmark records side by side: every ratio and figure they share, and B's over A's.

A record is what a benchmark writes with ``--json PATH`` (``profiling/harness.py``). Compare a
run on two commits, or on two machines::

    git checkout main && python profiling/fixed_cost.py --json before.json
    git checkout my-branch && python profiling/fixed_cost.py --json after.json
    python -m profiling.compare before.json after.json

The ratios (an arm against its peer in the same run) are the figures to read across machines
and days; the raw figures (seconds) are shown too, for a run on the same machine. A name in
one record only is listed apart. Given one record, it prints that record's ratios, as a
markdown table with ``--markdown`` (for docs/profiling.md)::

    python -m profiling.compare after.json --markdown
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402


def load(path: str) -> dict:
    try:
        return harness.read_record(path)
    except ValueError as e:
        raise SystemExit(f"compare: {e}") from e


def _values(record: dict, key: str) -> dict[str, float]:
    items = record[key].items()
    return {k: (v["value"] if isinstance(v, dict) else v) for k, v in items}


def rows(a: dict, b: dict, key: str) -> list[tuple[str, float, float, float]]:
    """``(name, A, B, B / A)`` for every name in both records' ``key`` ("ratios", "figures")."""
    va, vb = _values(a, key), _values(b, key)
    out = []
    for name in [n for n in va if n in vb]:
        x, y = float(va[name]), float(vb[name])
        out.append((name, x, y, y / x if x and math.isfinite(x) else float("nan")))
    return out


def describe(record: dict, path: str) -> str:
    m, c = record.get("machine", {}), record.get("commit", {})
    sha = (c.get("sha") or "?")[:10] + (" (dirty)" if c.get("dirty") else "")
    return (
        f"{path}: {record.get('benchmark')} at {sha}, {record.get('created', '?')}; "
        f"{m.get('cpu_count')} cores, {m.get('device', m.get('processor'))}, "
        f"jax {m.get('jax')}, python {m.get('python')}"
        + ("; --quick" if record.get("quick") else "")
    )


def report(a: dict, b: dict, paths: tuple[str, str]) -> str:
    lines = [f"A = {describe(a, paths[0])}", f"B = {describe(b, paths[1])}"]
    if a.get("benchmark") != b.get("benchmark"):
        lines.append("note: the records are of different benchmarks")
    for key, title in (("ratios", "ratios (arm / its peer, same run)"), ("figures", "figures")):
        table = rows(a, b, key)
        if not table:
            continue
        width = max(len(r[0]) for r in table) + 2
        lines += ["", title, f"  {'name':<{width}}{'A':>12}{'B':>12}{'B / A':>9}"]
        lines += [f"  {n:<{width}}{x:>12.4g}{y:>12.4g}{q:>9.3f}" for n, x, y, q in table]
        only = sorted(set(a[key]) ^ set(b[key]))
        if only:
            lines.append(f"  in one record only: {', '.join(only)}")
    return "\n".join(lines)


def one(record: dict, path: str, markdown: bool) -> str:
    """One record's ratios: each arm against its peer, measured in the same run."""
    lines = [describe(record, path), ""]
    ratios = [(name, r["value"], r.get("peer", "")) for name, r in record["ratios"].items()]
    if markdown:
        lines += ["| ratio | value | peer |", "| --- | --- | --- |"]
        lines += [f"| {n} | {v:.3g} | {p} |" for n, v, p in ratios]
    else:
        width = max((len(n) for n, _, _ in ratios), default=4) + 2
        lines += [f"  {n:<{width}}{v:>10.4g}  {p}" for n, v, p in ratios]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="the first record (A)")
    parser.add_argument("b", nargs="?", help="the second record (B); without it, A's ratios")
    parser.add_argument("--markdown", action="store_true", help="one record's ratios as a table")
    args = parser.parse_args(argv)
    if args.b is None:
        print(one(load(args.a), args.a, args.markdown))
    else:
        print(report(load(args.a), load(args.b), (args.a, args.b)))


if __name__ == "__main__":
    main(sys.argv[1:])
