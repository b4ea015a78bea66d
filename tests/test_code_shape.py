"""The library stays readable: no function in `multistart/` longer than 60 lines (issue 25), and
the page that draws its import layers draws the contract CI checks (issue 32), and that
contract holds (import-linter, run here as CI runs it).

ruff's C901 (in pyproject.toml) bounds how tangled a function is; this bounds how long, with
its docstring, as the issue measured it.
"""

import ast
import os
import subprocess
import sys

import pytest
from markdown_blocks import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which import-linter needs there too
    import tomli as tomllib

LIMIT = 60


def test_no_library_function_is_over_60_lines():
    long = []
    for path in sorted((ROOT / "src" / "multistart").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these: " + "; ".join(long)


def _import_contracts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_the_import_layers_hold():
    """The contract CI's ``lint-imports`` checks, checked by the suite too (about a second)."""
    pytest.importorskip("importlinter")
    path = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    code = "import sys, importlinter.cli as c; sys.exit(c.lint_imports(no_cache=True))"
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    n = len(_import_contracts()["contracts"])
    assert f"Contracts: {n} kept, 0 broken." in run.stdout, run.stdout


def test_the_architecture_page_draws_the_import_layers():
    """docs/architecture.md's layers are the import-linter contract's, line for line."""
    contracts = _import_contracts()
    (layers,) = [
        c["layers"] for c in contracts["contracts"] if c.get("containers") == ["multistart"]
    ]
    page = (ROOT / "docs" / "architecture.md").read_text()
    drawn = page.split("## Layers", 1)[1].split("```")[1].strip().splitlines()
    assert drawn == layers


def test_the_architecture_page_draws_every_package_s_layers():
    """docs/architecture.md's second block draws each package's contract, and a package on
    disk without a contract (or a contract for a package that is gone) fails here."""
    contracts = _import_contracts()["contracts"]
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page.split("## Layers", 1)[1].split("```")[3].strip().splitlines()
    drawn = {line.split()[0].rstrip("/"): line.split(None, 1)[1] for line in block}
    want = {}
    for c in contracts:
        (container,) = c.get("containers", [None])
        if container and container != "multistart":
            want[container.split(".", 1)[1]] = " > ".join(c["layers"])
        if c["type"] == "independence":
            names = " | ".join(m.rsplit(".", 1)[1] for m in c["modules"])
            want[c["modules"][0].split(".")[1]] = f"{names} (independent)"
    assert drawn == want
    packages = {p.parent.name for p in (ROOT / "src" / "multistart").glob("*/__init__.py")}
    assert packages == set(want)


def test_no_test_imports_from_the_benchmarks():
    """The library's tests stand on the library alone: ``profiling/`` measures it, and its
    benchmarks run as a user runs them (``tests/test_benchmarks.py``), in a process of their
    own."""
    importers = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n == "profiling" or n.startswith("profiling.") for n in names):
                importers.append(path.name)
    assert importers == []
