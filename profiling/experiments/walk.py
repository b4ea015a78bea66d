"""The driver's walk read from the source: issue 71's "returns to a module already left".

A reader starts at ``host/driver.py``'s ``run`` and reads each function of the package once,
the first time a function being read calls it, in the order the calls are written, then goes
back to the caller. The walk is the sequence of modules the reader is in; a return is a step
into a module the walk was in before and left (going back to a caller's module included), and
the calls into a module read before are counted apart. Only calls the source names are
followed: a function or class imported from the package or defined in the module (a class
call reads its ``__init__`` / ``__post_init__``), ``module.function`` through an imported
module, and ``self.method`` in a class; a method called on any other value is not (it needs
the value's type: ``profiling/experiments/reentry.py`` follows a running fit instead).

    python profiling/experiments/walk.py [path/to/src/multistart]
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

DEFAULT = pathlib.Path(__file__).resolve().parents[2] / "src" / "multistart"


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["multistart", *parts])


def _resolve(package: str, level: int, module: str | None) -> str:
    base = package.split(".")
    if level:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


class Index:
    """Every module's top-level functions and classes, and the names it imports."""

    def __init__(self, root: pathlib.Path):
        self.defs: dict[str, dict[str, ast.AST]] = {}
        self.names: dict[str, dict[str, tuple[str, str | None]]] = {}
        self.files: dict[str, str] = {}
        for path in sorted(root.rglob("*.py")):
            name = _module_name(path, root)
            is_package = path.name == "__init__.py"
            package = name if is_package else name.rpartition(".")[0]
            tree = ast.parse(path.read_text())
            self.files[name] = str(path.relative_to(root))
            self.defs[name] = {
                n.name: n
                for n in tree.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
            imported: dict[str, tuple[str, str | None]] = {}
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom):
                    source = _resolve(package, n.level, n.module) if n.level else n.module or ""
                    for a in n.names:  # a name from a module, or a submodule of a package
                        imported[a.asname or a.name] = (source, a.name)
            self.names[name] = imported

    def target(self, module: str, name: str) -> tuple[str, str] | None:
        """``(module, name)`` where ``name`` used in ``module`` is defined, if in the package."""
        for _ in range(5):  # follow re-exports
            if name in self.defs.get(module, {}):
                return module, name
            if name not in self.names.get(module, {}):
                return None
            source, original = self.names[module][name]
            if f"{source}.{original}" in self.defs:  # a module imported by name
                return None
            module, name = source, original or name
        return None

    def module_alias(self, module: str, name: str) -> str | None:
        source, original = self.names.get(module, {}).get(name, ("", None))
        full = f"{source}.{original}"
        return full if full in self.defs else None


def _calls(node: ast.AST) -> list[ast.Call]:
    """The calls in ``node``'s body in the order they are written (outer before inner)."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _function(node: ast.AST, name: str) -> ast.AST | None:
    for n in getattr(node, "body", []):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name:
            return n
    return None


def walk(index: Index, start: tuple[str, str, str | None]):
    seen: set = set()
    modules: list[str] = []
    reopened: list[str] = []

    def step(module: str) -> None:
        if not modules or modules[-1] != module:
            modules.append(module)

    def read(module: str, owner: str | None, node: ast.AST) -> None:
        for call in _calls(node):
            for key in _targets(module, owner, call.func):
                if key in seen:
                    continue
                seen.add(key)
                target_module, target_owner, target = key
                if modules[-1] != target_module and target_module in modules:
                    reopened.append(target_module)
                step(target_module)
                read(target_module, target_owner, target_node(key))
                step(module)

    def target_node(key):
        module, owner, name = key
        if owner is None:
            return index.defs[module][name]
        return _function(index.defs[module][owner], name)

    def _targets(module: str, owner: str | None, func: ast.AST) -> list:
        found: tuple[str, str] | None = None
        if isinstance(func, ast.Name):
            found = index.target(module, func.id)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self" and owner is not None:
                cls = index.defs[module][owner]
                if _function(cls, func.attr) is not None:
                    return [(module, owner, func.attr)]
                return []
            alias = index.module_alias(module, func.value.id)
            if alias is not None:
                found = index.target(alias, func.attr)
        if found is None:
            return []
        where, name = found
        node = index.defs[where][name]
        if isinstance(node, ast.ClassDef):
            inits = [m for m in ("__init__", "__post_init__") if _function(node, m) is not None]
            return [(where, name, m) for m in inits]
        return [(where, None, name)]

    module, owner, name = start
    seen.add(start)
    step(module)
    read(module, owner, index.defs[module][name])
    return modules, reopened, seen


def main() -> None:
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    index = Index(root)
    modules, reopened, seen = walk(index, ("multistart.host.driver", None, "run"))
    returns = [m for i, m in enumerate(modules) if m in modules[:i]]
    short = [index.files[m] for m in modules]
    print(
        f"driver's walk (source): {len(set(modules))} modules, {len(returns)} returns to a "
        f"module already left ({len(reopened)} of them calls, the rest back to a caller), "
        f"{len(seen)} functions read"
    )
    most = collections.Counter(index.files[m] for m in reopened).most_common(12)
    print("most reopened:", ", ".join(f"{m} {c}" for m, c in most))
    moves = collections.Counter(frozenset(p) for p in zip(short, short[1:], strict=False))
    pairs = moves.most_common(12)
    print("most moved between:", ", ".join(" <-> ".join(sorted(p)) + f" {c}" for p, c in pairs))


if __name__ == "__main__":
    main()
