"""Run the ```python blocks of a Markdown page and check what they print.

A page's blocks run in order in one namespace, so a later block can reuse an earlier fit. The
fence's info string says how a block runs; nothing is skipped:

- ```python: once, in the page's namespace.
- ```python rerun: twice in a row (the block claims it can be run again, e.g. a resumed
  checkpoint), and both runs must print what the page shows.
- ```python file=NAME: a file the page shows (a script, a module a script imports); it is not
  run in the namespace. The page's own test writes it out and runs it as the page says (in
  subprocesses where it needs several processes); :func:`file_blocks` lists them, and
  ``tests/test_docs.py`` checks that every one is run.

The first ```text block after a python block, before the next python block, is what that block
prints: its words must match exactly and each number to the precision the page prints it with
(:func:`check_output`); a count the page marks ``≈`` (a float32 fit's evaluations, which move
with the machine's rounding) agrees within :data:`ABOUT` of the page's.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```([\w-]*)([^\n]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_INFO = re.compile(r"^(?:|rerun|file=[\w.-]+\.py)$")
#: How far a count the page shows as ``≈N`` may be from ``N`` (relative): a float32 fit's path
#: rounds differently on another CPU (AVX-512 or AVX2 kernels), and the evaluations it takes
#: move by a few of a thousand (948 on one machine, 933 on another, for the README's report).
ABOUT = 0.05


@dataclass
class Block:
    """One ```python block: its code, where it starts, how it runs, what it should print."""

    code: str
    line: int
    output: str | None
    rerun: bool = False
    file: str | None = None


def python_blocks(path: Path) -> list[Block]:
    """The page's python blocks in order, each with its expected output (or ``None``).

    Raises:
      ValueError: a python fence with an info string other than ``rerun`` or ``file=NAME.py``
        (a misspelt one would otherwise change how, or whether, a block runs).
    """
    text = path.read_text()
    blocks: list[Block] = []
    for m in _FENCE.finditer(text):
        lang, info, body = m.group(1), m.group(2).strip(), m.group(3)
        line = text.count("\n", 0, m.start()) + 2  # the code's first line, 1-based
        if lang == "python":
            if not _INFO.match(info):
                raise ValueError(f"{path.name}:{line}: unknown python fence info {info!r}")
            file = info.partition("=")[2] or None
            blocks.append(Block(body, line, None, rerun=info == "rerun", file=file))
        elif lang == "text" and blocks and blocks[-1].output is None:
            blocks[-1].output = body
    return blocks


def file_blocks(path: Path) -> dict[str, Block]:
    """The page's ``file=NAME`` blocks by name."""
    return {b.file: b for b in python_blocks(path) if b.file}


def write_files(path: Path, folder: Path) -> list[Path]:
    """Write the page's ``file=NAME`` blocks into ``folder``; returns their paths."""
    out = []
    for name, block in file_blocks(path).items():
        target = folder / name
        target.write_text(block.code)
        out.append(target)
    return out


def run_page(path: Path) -> tuple[dict, list[Block]]:
    """Run the page's python blocks (not its files) in one namespace; check what each prints.

    Returns the namespace and the blocks that ran. Raises ``AssertionError`` naming the page and
    line when a block prints something other than what the page shows.
    """
    namespace: dict = {"__name__": f"doc:{path.name}"}
    ran = []
    for block in python_blocks(path):
        if block.file:
            continue
        # Line numbers in a traceback point into the page itself; the page's code runs as a
        # user's would, without this module's `from __future__ import annotations`.
        code = compile("\n" * (block.line - 1) + block.code, str(path), "exec", dont_inherit=True)
        for run in range(2 if block.rerun else 1):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, namespace)
            if block.output is not None:
                again = " (run again)" if run else ""
                check_output(out.getvalue(), block.output, f"{path.name}:{block.line}{again}")
        ran.append(block)
    return namespace, ran


def check_output(actual: str, expected: str, where: str) -> None:
    """Words equal; each printed number equal to the page's at the precision the page shows.

    A page may show a number rounded (``395.68`` for a run's ``395.68134``): the run's number
    must round to it, within half a unit of the page's last digit, so no wrong digit passes. A
    count (no decimal point) must be equal. A number ending in its point (``1.``, NumPy's way
    of printing a whole number in a float array) is exact: ``1.`` is not ``0.99``.
    """
    words = lambda s: _NUMBER.sub("#", s).split()  # noqa: E731
    about = [m.group(1) == "≈" for m in re.finditer(f"(≈?)(?:{_NUMBER.pattern})", expected)]
    page = expected.replace("≈", "")
    assert words(actual) == words(page), f"{where} prints\n{actual}\nnot\n{expected}"
    got, shown = _NUMBER.findall(actual), _NUMBER.findall(page)
    for g, s, near in zip(got, shown, about, strict=True):
        ok = _near(g, s) if near else _agrees(g, s)
        assert ok, f"{where}: printed {g} where the page shows {'≈' * near}{s}\n{actual}"


def _near(got: str, shown: str) -> bool:
    """Whether the printed count ``got`` is within :data:`ABOUT` of the page's ``≈shown``."""
    if re.search(r"[.eE]", shown):
        raise ValueError(f"≈ marks a count, not {shown!r}")
    return re.fullmatch(r"[-+]?\d+", got) is not None and abs(int(got) - int(shown)) <= ABOUT * abs(
        int(shown)
    )


def _agrees(got: str, shown: str) -> bool:
    """Whether the printed number ``got`` is the page's ``shown`` at the page's precision."""
    mantissa, _, exponent = shown.lower().partition("e")
    if not re.search(r"[.eE]", shown):  # a count: equal, and printed as one
        return re.fullmatch(r"[-+]?\d+", got) is not None and int(got) == int(shown)
    if mantissa.endswith("."):
        return Decimal(got) == Decimal(shown)
    decimals = len(mantissa.partition(".")[2])
    half_unit = Decimal(5).scaleb(-decimals - 1 + int(exponent or 0))
    return abs(Decimal(got) - Decimal(shown)) <= half_unit
