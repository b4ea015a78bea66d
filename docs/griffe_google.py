"""A griffe extension: two forms of Google-style docstrings (as Sphinx's napoleon reads them)
that griffe does not, so that the API reference renders them and ``mkdocs build --strict``
still checks every parameter a docstring names against the signature.

- ``Example:`` is the section ``Examples:`` (griffe knows only the plural).
- ``a, b: text`` in ``Args:`` documents ``a`` and ``b`` with the same text.
"""

from __future__ import annotations

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", flags=re.M)
_NAMES = re.compile(r"^(\s+)(\**\w+(?:, \**\w+)+): (.*)$")


def _split_entries(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _NAMES.match(lines[i])
        if m is None:
            out.append(lines[i])
            i += 1
            continue
        indent, names, text = m.groups()
        j = i + 1  # the entry's continuation lines are indented deeper than its name
        while (
            j < len(lines)
            and lines[j].strip()
            and len(lines[j]) - len(lines[j].lstrip()) > len(indent)
        ):
            j += 1
        for name in names.split(", "):
            out.append(f"{indent}{name}: {text}")
            out.extend(lines[i + 1 : j])
        i = j
    return out


class GoogleAsNapoleon(griffe.Extension):
    """Rewrite the two forms before griffe parses a docstring (the source is untouched)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is None:
            return
        value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
        obj.docstring.value = "\n".join(_split_entries(value.split("\n")))
