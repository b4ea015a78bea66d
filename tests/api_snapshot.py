"""What a user of the search classes reads (``help()``, ``inspect``, an IDE), as plain data.

``python tests/api_snapshot.py`` writes ``tests/data/search_api.json`` and the stubs static tools
read the classes' signatures from (``multistart/search/gradient.pyi``, ``least_squares.pyi``):
the classes make their signatures when they are made (:mod:`multistart.search.core`), which an
IDE or a type checker does not run. ``test_search.py`` compares the classes against the snapshot
and the stubs against the classes, so a change to a signature or a docstring is deliberate.
"""

import inspect
import json
import pathlib

import multistart as ms

SEARCHES = [
    "MultiStartGradient",
    "MultiStartAdam",
    "MultiStartProdigy",
    "MultiStartADABelief",
    "MultiStartLion",
    "MultiStartLBFGS",
    "MultiStartLeastSquares",
]
PATH = pathlib.Path(__file__).parent / "data" / "search_api.json"
SEARCH = pathlib.Path(ms.__file__).parent / "search"

#: Each stub: its module, the imports its signatures and bases name, and its classes.
_OPTIONS = "import os\nfrom collections.abc import Sequence\nfrom typing import Any\n\n"
_NAMED = "from ..host.schedule import Schedule\n"
_NAMED_TOO = "from ..solvers.convergence import Convergence\n"
STUBS = {
    "gradient": (
        f"{_OPTIONS}import optax\n\n{_NAMED}from ..solvers import Solver\n{_NAMED_TOO}"
        "from .core import Search\n",
        SEARCHES[:-1],
    ),
    "least_squares": (
        f"{_OPTIONS}{_NAMED}{_NAMED_TOO}from .gradient import MultiStartGradient\n"
        "from .residuals import LeastSquaresSearch\n",
        SEARCHES[-1:],
    ),
}


def snapshot() -> dict:
    """Each search class's signature and docstring, and those of its public methods."""
    out = {}
    for name in SEARCHES:
        cls = getattr(ms, name)
        entry = {"signature": str(inspect.signature(cls)), "doc": inspect.getdoc(cls)}
        entry["__init__"] = str(inspect.signature(cls.__init__))
        for attr in sorted(a for a in dir(cls) if not a.startswith("_")):
            member = inspect.getattr_static(cls, attr)
            if callable(member):
                fn = getattr(cls, attr)
                entry[attr] = {"signature": str(inspect.signature(fn)), "doc": inspect.getdoc(fn)}
        out[name] = entry
    return out


def _parameter(p: inspect.Parameter) -> str:
    """``p`` as ruff formats it in a stub."""
    annotated = p.annotation is not p.empty
    text = f"{p.name}: {p.annotation}" if annotated else p.name
    if p.default is not p.empty:
        default = p.default
        value = f'"{default}"' if isinstance(default, str) else repr(default)
        text += f" = {value}" if annotated else f"={value}"
    return text


def stub(module: str) -> str:
    """The stub of ``multistart.search.<module>``: each class's constructor as
    ``inspect.signature`` reads it."""
    imports, names = STUBS[module]
    lines = [
        "# The search classes' signatures for static tools (IDEs, type checkers), which do not",
        "# run the code that makes them: written by `python tests/api_snapshot.py` from the",
        "# classes; tests/test_search.py checks that they agree.",
        "",
        imports,
        "__all__ = [" + "".join(f'\n    "{name}",' for name in names) + ("\n]" if names else "]"),
    ]
    for name in names:
        cls = getattr(ms, name)
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        lines += ["", f"class {name}({bases}):", "    def __init__(", "        self,"]
        previous = None
        for p in inspect.signature(cls).parameters.values():
            if previous is p.POSITIONAL_ONLY and p.kind is not p.POSITIONAL_ONLY:
                lines.append("        /,")
            if previous is not p.KEYWORD_ONLY and p.kind is p.KEYWORD_ONLY:
                lines.append("        *,")
            lines.append(f"        {_parameter(p)},")
            previous = p.kind
        lines.append("    ) -> None: ...")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    PATH.write_text(json.dumps(snapshot(), indent=1, ensure_ascii=False) + "\n")
    for module in STUBS:
        (SEARCH / f"{module}.pyi").write_text(stub(module))
