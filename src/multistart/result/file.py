"""A Result's file: one ``.npz`` archive, its arrays as NumPy arrays and the rest as JSON.

Arrays (figures of merit, statuses, steps, history, every start's parameters, the covariance)
are members of the archive; the rest (``best_fom``, ``best_index``, ``stats``, ``paths``,
``config``, the parameter tree) is JSON in its ``__meta__`` member. Nothing is pickled, and
nothing is ever unpickled (``allow_pickle=False``).

A file is written whole or not at all: into a temporary file beside it, flushed to the disk,
then renamed over ``path``, so a search killed while saving leaves the previous file (or none),
never a cut one. Reading checks every member (the archive's CRC-32 of each): a file cut short,
altered or of another kind raises :class:`ResultFileError`, a ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..common import status
from ..common.status import Status
from .arrow import ArrowBlocks, invert
from .laplace import ArrowLaplace, Laplace, errors_by_name
from .uncertainty import Uncertainty

__all__ = ["FORMAT", "VERSION", "ResultFileError", "save", "load"]
__all__ += ["members", "build", "write_atomically", "read_archive", "damaged", "check_format"]

FORMAT, VERSION = "multistart.Result", 1
#: a file whose errors are a factor graph's arrow (:class:`ArrowLaplace`): its blocks, not the
#: ``n x n`` covariance and Hessian. Files without one stay version 1, which any version reads;
#: an older multistart refuses version 2 by name.
ARROW_VERSION = 2
_TREES = ("params", "start_params", "best_params")
#: each format's kind and reader, named when a file of one is read as the other
KINDS = {
    FORMAT: ("Result", "ms.Result.load"),
    "multistart.BatchFits": ("BatchFits", "ms.load_fits"),
}


class ResultFileError(ValueError):
    """A file that is not a readable saved Result (or BatchFits): cut short, altered, or
    another kind."""


def save(result, path, fit: Laplace | None) -> None:
    """Write ``result`` (and the covariance ``fit``, if any) to exactly ``path``, atomically."""
    write_atomically(Path(os.fspath(path)), members(result, fit))


def members(result, fit: Laplace | None) -> dict[str, np.ndarray]:
    """The archive's members for ``result`` (and the covariance ``fit``): ``__meta__``, the
    JSON, and every array (a :class:`multistart.BatchFits` file holds them under a prefix)."""
    arrow = isinstance(fit, ArrowLaplace)
    meta = {
        "format": FORMAT,
        "version": ARROW_VERSION if arrow else VERSION,
        "best_fom": float(result.best_fom),
        "best_index": int(result.best_index),
        "stats": result.stats,
        "paths": list(result.paths),
        "config": result.config,
        "tree": _encode_tree(result.params),
        "n_leaves": len(jax.tree_util.tree_leaves(result.params)),
        "incarnations": [
            {k: (str(v) if k == "status" else v) for k, v in r.items() if "params" not in k}
            for r in result.incarnations
        ],
        "incarnation_keys": list(result.incarnations[0]) if result.incarnations else [],
    }
    if fit is not None:
        meta["laplace"] = {
            "scale": fit.scale,
            "names": list(fit.names),
            "kind": fit.kind,
            "absolute_sigma": fit.absolute_sigma,
            "dof": fit.dof,
            "reduced_chi2": fit.reduced_chi2,
        }
        if isinstance(fit, ArrowLaplace):
            blocks = fit.blocks
            meta["laplace"]["arrow"] = {
                "eps": fit.inverse.eps,
                "value": blocks.value,
                "factors": [list(f) for f in blocks.factors],
            }
    text = json.dumps(meta, default=_json_default, allow_nan=True)
    arrays = {"__meta__": np.frombuffer(text.encode("utf-8"), dtype=np.uint8)}
    arrays.update(_record_arrays(result))
    if arrow:
        arrays.update(_arrow_arrays(fit))
    elif fit is not None:
        arrays["laplace/covariance"] = fit.covariance
        arrays["laplace/hessian"] = fit.hessian
    return arrays


def _arrow_arrays(fit) -> dict[str, np.ndarray]:
    """An :class:`ArrowLaplace`'s members: the Hessian's arrow (memory linear in the number of
    factors), from which loading inverts it again, and the flat index of each name."""
    blocks = fit.blocks
    arrays = {
        "laplace/arrow/order": np.asarray(fit._order),
        "laplace/arrow/shared": blocks.shared,
        "laplace/arrow/S": blocks.S,
    }
    for b, (index, c, h) in enumerate(zip(blocks.index, blocks.C, blocks.B, strict=True)):
        arrays[f"laplace/arrow/index/{b}"] = index
        arrays[f"laplace/arrow/C/{b}"] = c
        arrays[f"laplace/arrow/B/{b}"] = h
    return arrays


def _arrow_laplace(meta: dict, z: dict[str, np.ndarray], params) -> ArrowLaplace:
    """The :class:`ArrowLaplace` of a file: its arrow inverted again (the same errors)."""
    kept = meta["laplace"]["arrow"]
    n_blocks = len(kept["factors"])
    blocks = ArrowBlocks(
        shared=z["laplace/arrow/shared"],
        index=tuple(z[f"laplace/arrow/index/{b}"] for b in range(n_blocks)),
        factors=tuple(tuple(f) for f in kept["factors"]),
        S=z["laplace/arrow/S"],
        C=tuple(z[f"laplace/arrow/C/{b}"] for b in range(n_blocks)),
        B=tuple(z[f"laplace/arrow/B/{b}"] for b in range(n_blocks)),
        value=float(kept["value"]),
    )
    return ArrowLaplace.from_blocks(
        params,
        meta["laplace"]["names"],
        z["laplace/arrow/order"],
        invert(blocks, float(kept["eps"])),
        float(meta["laplace"]["scale"]),
        kind=meta["laplace"]["kind"],
        absolute_sigma=bool(meta["laplace"]["absolute_sigma"]),
        dof=meta["laplace"]["dof"],
        reduced_chi2=meta["laplace"]["reduced_chi2"],
    )


def _record_arrays(result) -> dict[str, np.ndarray]:
    arrays = {
        "foms": np.asarray(result.foms),
        "status": np.array([str(s) for s in result.status], dtype=str),
        "n_steps": np.asarray(result.n_steps),
        "n_evals": np.asarray(result.n_evals),
        "at_bound": np.asarray(result.at_bound),
        "best_step": np.asarray(result.best_step),
        "history": np.asarray(result.history),
        "history_steps": np.asarray(result.history_steps),
        "resurrections": np.asarray(result.resurrections),
    }
    if result.rung is not None:
        arrays["rung"] = np.asarray(result.rung)
    for kind in _TREES:
        for i, leaf in enumerate(jax.tree_util.tree_leaves(getattr(result, kind))):
            arrays[f"{kind}/{i}"] = np.asarray(leaf)
    for kind in ("params", "start_params"):
        per_record = [jax.tree_util.tree_leaves(r[kind]) for r in result.incarnations]
        for i, column in enumerate(zip(*per_record, strict=True)):
            arrays[f"incarnations/{kind}/{i}"] = np.stack([np.asarray(v) for v in column])
    return arrays


def write_atomically(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` as one compressed ``.npz`` at exactly ``path``: written beside it, flushed,
    then renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as f:
            np.savez_compressed(f, **arrays)  # type: ignore[arg-type]  # numpy stub: **kwds
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def load(cls, path) -> Any:
    """Read a Result written by :func:`save` (see :meth:`multistart.Result.load`)."""
    name = os.fspath(path)
    return build(cls, name, read_archive(name))


def build(cls, name: str, arrays: dict[str, np.ndarray]) -> Any:
    """The Result of the archive members ``arrays`` (:func:`members`) read from file ``name``;
    a member missing or altered raises :class:`ResultFileError` naming the file."""
    try:
        return _build(cls, name, arrays)
    except ResultFileError:
        raise
    except Exception as e:  # noqa: BLE001 - an altered record can fail any way
        raise damaged(name, e) from e


def damaged(name: str, error: BaseException, kind: str = "Result") -> ResultFileError:
    """The error for file ``name``, a saved ``kind`` that cannot be read because of ``error``."""
    return ResultFileError(
        f"{name!r} is not a readable multistart {kind} file: it was cut short or altered, or "
        f"it is another kind of file ({type(error).__name__}: {error})"
    )


def read_archive(name: str, kind: str = "Result") -> dict[str, np.ndarray]:
    """Every member of the archive, each read (and its CRC-32 checked) now."""
    with open(name, "rb") as fh:  # a missing file or a folder: the OS's own error
        try:
            archive = np.load(fh, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - BadZipFile, a pickle refused, zlib.error, ...
            raise damaged(name, e, kind) from e
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ResultFileError(f"{name!r} is not a saved multistart {kind} (one NumPy array)")
        with archive:
            if "__meta__" not in archive.files:
                raise ResultFileError(f"{name!r} is not a saved multistart {kind}")
            try:
                return {key: archive[key] for key in archive.files}
            except Exception as e:  # noqa: BLE001 - BadZipFile (CRC), zlib.error, EOFError
                raise damaged(name, e, kind) from e


def check_format(name: str, meta: dict, format_: str, version: int | tuple[int, ...]) -> None:
    """Refuse a header of another format or version (one, or those read), naming the reader
    of another kind."""
    versions = version if isinstance(version, tuple) else (version,)
    found = meta.get("format")
    if found != format_ and found in KINDS:
        (kind, reader), (wanted, _) = KINDS[found], KINDS[format_]
        raise ResultFileError(
            f"{name!r} is a saved {kind}, not a {wanted}: read it with {reader}(path)"
        )
    if found != format_ or meta.get("version") not in versions:
        raise ResultFileError(
            f"{name!r}: unknown format {found!r} version "
            f"{meta.get('version')!r}; this multistart reads {format_} "
            + " or ".join(map(str, versions))
        )


def _build(cls, name: str, z: dict[str, np.ndarray]) -> Any:
    meta = json.loads(z["__meta__"].tobytes().decode("utf-8"))
    check_format(name, meta, FORMAT, (VERSION, ARROW_VERSION))
    n = meta["n_leaves"]

    def tree(kind, scalars=False):
        leaves = [z[f"{kind}/{i}"] for i in range(n)]
        if scalars:  # best_params leaves are per-start values: 0-d back to scalars
            leaves = [a[()] if a.ndim == 0 else a for a in leaves]
        return _decode_tree(meta["tree"], leaves)

    fields = dict(
        foms=z["foms"],
        params=tree("params"),
        start_params=tree("start_params"),
        status=status.members(status.codes_of(z["status"])),
        n_steps=z["n_steps"],
        best_step=z["best_step"],
        history=z["history"],
        history_steps=z["history_steps"],
        n_evals=z.get("n_evals"),
        at_bound=z.get("at_bound"),
        resurrections=z["resurrections"],
        incarnations=_incarnations(meta, z, n),
        rung=z.get("rung"),
    )
    best_params = tree("best_params", scalars=True)
    laplace: Laplace | None = None
    if "laplace" in meta and "arrow" in meta["laplace"]:
        laplace = _arrow_laplace(meta, z, best_params)
    elif "laplace" in meta:
        cov = z["laplace/covariance"]
        laplace = Laplace(
            params=best_params,
            covariance=cov,
            names=tuple(meta["laplace"]["names"]),
            hessian=z["laplace/hessian"],
            scale=float(meta["laplace"]["scale"]),
            errors=errors_by_name(best_params, meta["laplace"]["names"], np.sqrt(np.diag(cov))),
            kind=meta["laplace"].get("kind", "hessian"),  # files before Laplace.kind
            absolute_sigma=bool(meta["laplace"].get("absolute_sigma", True)),
            dof=meta["laplace"].get("dof"),
            reduced_chi2=meta["laplace"].get("reduced_chi2"),
        )
    return cls.of(
        **fields,
        stats=meta["stats"],
        paths=meta["paths"],
        config=meta["config"],
        uncertainty=Uncertainty(laplace=laplace),
    )


def _incarnations(meta: dict, z: dict[str, np.ndarray], n: int) -> list[dict]:
    out = []
    for j, r in enumerate(meta.get("incarnations", [])):
        values = dict(r, status=Status(r["status"]))
        for kind in ("params", "start_params"):
            leaves = [z[f"incarnations/{kind}/{i}"][j] for i in range(n)]
            leaves = [a[()] if a.ndim == 0 else a for a in leaves]
            values[kind] = _decode_tree(meta["tree"], leaves)
        out.append({k: values[k] for k in meta["incarnation_keys"]})
    return out


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"Result.save: {type(x).__name__} {x!r} is not JSON-serialisable")


def _encode_tree(tree, counter=None):
    """A params pytree (nested dicts of arrays) as JSON: dicts as key/value pairs, leaves as
    their index in ``jax.tree_util`` order (which sorts dict keys, as this does)."""
    counter = [0] if counter is None else counter
    if isinstance(tree, dict):
        items = []
        for key in sorted(tree):
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"Result.save: parameter keys must be str or int; got {key!r}")
            items.append([key, _encode_tree(tree[key], counter)])
        return {"dict": items}
    counter[0] += 1
    return {"leaf": counter[0] - 1}


def _decode_tree(code, leaves):
    if "dict" in code:
        return {key: _decode_tree(sub, leaves) for key, sub in code["dict"]}
    return leaves[code["leaf"]]
