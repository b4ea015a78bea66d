"""The library stays readable: no function in `multistart/` longer than 60 lines (issue 25), and
the page that draws its import layers draws the contract CI checks (issue 32).

ruff's C901 (in pyproject.toml) bounds how tangled a function is; this bounds how long, with
its docstring, as the issue measured it.
"""

import ast

import pytest
from markdown_blocks import ROOT

LIMIT = 60


def test_no_library_function_is_over_60_lines():
    long = []
    for path in sorted((ROOT / "multistart").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these: " + "; ".join(long)


def test_the_architecture_page_draws_the_import_layers():
    """docs/architecture.md's layers are the import-linter contract's, line for line."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [
        c["layers"] for c in contracts["contracts"] if c.get("containers") == ["multistart"]
    ]
    page = (ROOT / "docs" / "architecture.md").read_text()
    drawn = page.split("## Layers", 1)[1].split("```")[1].strip().splitlines()
    assert drawn == layers
