"""The library stays readable: no function in `multistart/` longer than 60 lines (issue 25).

ruff's C901 (in pyproject.toml) bounds how tangled a function is; this bounds how long, with
its docstring, as the issue measured it.
"""

import ast

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
