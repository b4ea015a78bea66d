"""Run the ```python blocks of a Markdown page and check what they print.

A page's blocks run in order in one namespace, so a later block can reuse an earlier fit. A
block is skipped, explicitly, when its fence reads ```python skip or the line before it is
``<!-- no-test -->`` (illustration only: it needs a file or a long run). The first ```text
block after a python block, before the next python block, is what that block prints: its
words must match exactly and its numbers to the digits shown (a page pastes rounded output).
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NO_TEST = "<!-- no-test -->"
_FENCE = re.compile(r"^```([\w-]*)([^\n]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass
class Block:
    """One ```python block: its code, where it starts, and what it should print."""

    code: str
    line: int
    skip: bool
    output: str | None


def python_blocks(path: Path) -> list[Block]:
    """The page's python blocks in order, each with its expected output (or ``None``)."""
    text = path.read_text()
    blocks: list[Block] = []
    for m in _FENCE.finditer(text):
        lang, info, body = m.group(1), m.group(2).strip(), m.group(3)
        if lang == "python":
            before = text[: m.start()].rstrip().splitlines()
            skip = info == "skip" or (bool(before) and before[-1].strip() == NO_TEST)
            line = text.count("\n", 0, m.start()) + 2  # the code's first line, 1-based
            blocks.append(Block(body, line, skip, None))
        elif lang == "text" and blocks and blocks[-1].output is None:
            blocks[-1].output = body
    return blocks


def run_page(path: Path) -> tuple[dict, list[Block]]:
    """Run every python block of ``path`` in one namespace; check each one's printed output.

    Returns the namespace and the blocks that ran. Raises ``AssertionError`` naming the page and
    line when a block prints something other than what the page shows.
    """
    namespace: dict = {"__name__": f"doc:{path.name}"}
    ran = []
    for block in python_blocks(path):
        if block.skip:
            continue
        # Line numbers in a traceback point into the page itself.
        code = compile("\n" * (block.line - 1) + block.code, str(path), "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
        if block.output is not None:
            check_output(out.getvalue(), block.output, f"{path.name}:{block.line}")
        ran.append(block)
    return namespace, ran


def check_output(actual: str, expected: str, where: str) -> None:
    """Words equal; each number equal to the precision the page prints it with."""
    words = lambda s: _NUMBER.sub("#", s).split()  # noqa: E731
    assert words(actual) == words(expected), f"{where} prints\n{actual}\nnot\n{expected}"
    got, shown = _NUMBER.findall(actual), _NUMBER.findall(expected)
    for g, s in zip(got, shown, strict=True):
        if not re.search(r"[.eE]", s):  # a count: exactly
            assert int(g) == int(s), f"{where}: printed {g} where the page shows {s}\n{actual}"
            continue
        decimals = len(re.split(r"[eE]", s)[0].partition(".")[2])
        # A rounded figure may differ from the run by one unit in its last digit, and a
        # float32 fit by a few ulps on another CPU.
        unit = 10.0**-decimals * (abs(float(s)) if "e" in s.lower() else 1.0)
        assert np.isclose(float(g), float(s), rtol=1e-5, atol=1.01 * unit), (
            f"{where}: printed {g} where the page shows {s}\n{actual}"
        )
