"""The benchmark scripts under profiling/ name only what the library has.

They are not run by the suite (they take minutes), so a renamed module once broke three of them
silently (`from multistart import sweep` after the sweep family was renamed). Every import of
`multistart` in them, at any depth (most import inside the function that needs it), must
resolve.
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
