"""What a user of the search classes reads (``help()``, ``inspect``, an IDE), as plain data.

``python tests/api_snapshot.py`` writes ``tests/data/search_api.json``; ``test_search.py``
compares the classes against it, so a change to a signature or a docstring is deliberate.
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


if __name__ == "__main__":
    PATH.write_text(json.dumps(snapshot(), indent=1, ensure_ascii=False) + "\n")
