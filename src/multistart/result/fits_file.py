"""A batch's fits in one file (:meth:`multistart.BatchFits.save`, :func:`multistart.load_fits`).

One ``.npz`` archive, written and read as a Result's (:mod:`multistart.result.file`): whole or
not at all, every member's CRC-32 checked on reading, nothing pickled. Its members:

- ``__meta__``: JSON: the format and its version, the number of fits, and the fields that are
  plain values (the parameters' names, the starts a fit, what held each held parameter);
- ``fits/<field>``: each array field (``popt``, ``pcov``, ...; statuses by name);
- ``result/<member>``: the whole search's Result, the members its own file holds.

What goes in is :class:`multistart.BatchFits`' own list of fields, each declared with how it
is kept (:func:`kept`): a field added to the class that way is saved and loaded with no change
here. A file without one of the class's fields (written before the field was added) loads it
from the field's default where the field has one, and is refused, naming it, where it has
none; members this version does not know (a newer version's fields) are not read.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..common.status import Status
from . import file
from .core import Result
from .file import ResultFileError

__all__ = ["FORMAT", "VERSION", "ARRAY", "STATUS", "VALUE", "RESULT", "kept", "save", "load"]

FORMAT, VERSION = "multistart.BatchFits", 1
KIND = "BatchFits"

# How a field is kept: an array as it is (``fits/<field>``), an array of Status values by
# name, a JSON value in the header, or a whole Result (``<field>/<member>``).
ARRAY, STATUS, VALUE, RESULT = "array", "status", "value", "result"
_HOW = (ARRAY, STATUS, VALUE, RESULT)


def kept(how: str, *, per_fit: bool = False, **field_options) -> Any:
    """A :class:`multistart.BatchFits` field, kept in its file as ``how`` (:data:`ARRAY`,
    :data:`STATUS`, :data:`VALUE` or :data:`RESULT`); ``per_fit``: its leading axis is the
    fits (checked on reading). ``field_options`` are :func:`dataclasses.field`'s (a
    ``default`` lets files written before the field was added load)."""
    if how not in _HOW:
        raise ValueError(f"how must be one of {_HOW}; got {how!r}")
    return dataclasses.field(metadata={"file": how, "per_fit": per_fit}, **field_options)


def save(fits, path) -> None:
    """Write ``fits`` (a :class:`multistart.BatchFits`) to exactly ``path``, atomically."""
    header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "n_fits": fits.n_fits}
    values: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for f in dataclasses.fields(fits):
        how, value = _how(f), getattr(fits, f.name)
        if how == VALUE:
            values[f.name] = value
        elif how == ARRAY:
            arrays[f"fits/{f.name}"] = np.asarray(value)
        elif how == STATUS:
            arrays[f"fits/{f.name}"] = np.array([str(s) for s in value], dtype=str)
        else:  # the search's Result: without a covariance, a batch's has none (pcov is it)
            for key, member in file.members(value, None).items():
                arrays[f"{f.name}/{key}"] = member
    header["values"] = values
    text = json.dumps(header, default=_json_default, allow_nan=True)
    arrays["__meta__"] = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    file.write_atomically(Path(os.fspath(path)), arrays)


def load(cls, path) -> Any:
    """Read a ``cls`` (:class:`multistart.BatchFits`) written by :func:`save`.

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError (:class:`multistart.result.file.ResultFileError`): the file is not a saved
        BatchFits (cut short, altered, of another kind or version, a member missing or of
        the wrong length); the message names the file.
    """
    name = os.fspath(path)
    members = file.read_archive(name, KIND)
    try:
        return _build(cls, name, members)
    except ResultFileError:
        raise
    except Exception as e:  # noqa: BLE001 - an altered member can fail any way
        raise file.damaged(name, e, KIND) from e


def _build(cls, name: str, z: dict[str, np.ndarray]) -> Any:
    header = json.loads(z["__meta__"].tobytes().decode("utf-8"))
    file.check_format(name, header, FORMAT, VERSION)
    n_fits, values = int(header["n_fits"]), header["values"]
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        how, key = _how(f), f"fits/{f.name}"
        if how == RESULT:
            prefix = f"{f.name}/"
            inner = {k[len(prefix) :]: v for k, v in z.items() if k.startswith(prefix)}
            present = "__meta__" in inner
        else:
            present = f.name in values if how == VALUE else key in z
        if not present:
            if _has_default(f):
                continue  # a file from before the field: the class's default
            raise _lacks(name, f.name)
        if how == RESULT:
            fields[f.name] = file.build(Result, name, inner)
        elif how == VALUE:
            fields[f.name] = values[f.name]
        elif how == ARRAY:
            fields[f.name] = z[key]
        else:
            fields[f.name] = np.array([Status(str(s)) for s in z[key]], dtype=object)
        if f.metadata["per_fit"] and np.shape(fields[f.name])[:1] != (n_fits,):
            raise ResultFileError(
                f"{name!r} is not a readable multistart BatchFits file: its {f.name} holds "
                f"{np.shape(fields[f.name])[:1]} fits, its header {n_fits}"
            )
    return cls(**fields)


def _how(f: dataclasses.Field) -> str:
    how = f.metadata.get("file")
    if how is None:  # a field added without saying how it is kept would be lost silently
        raise TypeError(f"BatchFits.{f.name} says not how it is kept in a file: declare it kept()")
    return how


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _lacks(name: str, field: str) -> ResultFileError:
    return ResultFileError(
        f"{name!r} is not a readable multistart BatchFits file: it lacks the fits' {field!r}"
    )


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"BatchFits.save: {type(x).__name__} {x!r} is not JSON-serialisable")
