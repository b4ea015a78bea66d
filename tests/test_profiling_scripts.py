"""The benchmark scripts under profiling/ name only what the library has.

They are not run by the suite (they take minutes), so a renamed module once broke three of them
silently (`from multistart import sweep` after the sweep family was renamed). Every import of
`multistart` in them, at any depth (most import inside the function that needs it), must
resolve. And a script's command line refuses nonsense before it fits anything.
"""

import ast
import importlib

import pytest
from markdown_blocks import ROOT

SCRIPTS = sorted((ROOT / "profiling").rglob("*.py"))


def _library_imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("multistart"):
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("multistart"):
                    yield alias.name, None


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_library_import_of_a_profiling_script_resolves(script):
    for module, name in _library_imports(script):
        imported = importlib.import_module(module)
        if name is None or hasattr(imported, name):
            continue
        importlib.import_module(f"{module}.{name}")  # a submodule not yet imported


def _script(name, monkeypatch):
    """A profiling script loaded as a module (its ``sys.path`` entries undone after the test)."""
    import importlib.util
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location(name, ROOT / "profiling" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--problems", "MGH09,Nope"], "unknown problem(s) Nope;"),
        (["--problems", ","], "unknown problem(s) (none given)"),
        (["--seeds", "0,x"], "--seeds takes comma-separated ints"),
        (["--strategy", "random"], "--strategy: invalid choice: 'random'"),
    ],
)
def test_nist_strd_refuses_nonsense_as_a_usage_error(argv, message, monkeypatch, capsys):
    nist_strd = _script("nist_strd", monkeypatch)
    with pytest.raises(SystemExit) as stop:
        nist_strd.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_nist_strd_reads_its_problems_and_seeds(monkeypatch):
    args = _script("nist_strd", monkeypatch).parse_args(
        ["--problems", "MGH09,ENSO", "--seeds", "0,2"]
    )
    assert (args.problems, args.seeds, args.warm) == (["MGH09", "ENSO"], [0, 2], False)
