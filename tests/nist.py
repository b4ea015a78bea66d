"""NIST's Statistical Reference Datasets for nonlinear least squares (StRD): the 27 problems.

The files in ``tests/data/nist/`` are NIST's, unchanged (public domain; copied from lmfit's
source distribution, ``lmfit-1.3.4/NIST_STRD``). Each holds the data, two starting points and the
certified parameters, standard deviations and residual sum of squares to 11 digits.

What a test or a benchmark needs, and nothing that imports the library:

- :func:`load` reads a problem; :data:`NAMES` lists them, :data:`MODELS` holds each model as
  ``model(b, x)`` over a parameter vector, written with ``jax.numpy`` (or NumPy: ``xp=``).
- :func:`box` is the search box built from NIST's two starting values alone.
- :func:`lre` is the log relative error of the StRD literature, and :func:`worst_lre` the worst
  parameter's, up to the relabelling of interchangeable components (:data:`SYMMETRIES`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import permutations
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "nist"
PI = 3.141592653589793238462643383279
LRE_CAP = 11.0  # the files' digits

# -- the models: model(b, x, xp) over the parameter vector b --------------------------------------


def _bennett5(b, x, xp):
    return b[0] * (b[1] + x) ** (-1.0 / b[2])


def _boxbod(b, x, xp):
    return b[0] * (1.0 - xp.exp(-b[1] * x))


def _chwirut(b, x, xp):
    return xp.exp(-b[0] * x) / (b[1] + b[2] * x)


def _danwood(b, x, xp):
    return b[0] * x ** b[1]


def _enso(b, x, xp):
    return b[0] + (
        b[1] * xp.cos(2 * PI * x / 12)
        + b[2] * xp.sin(2 * PI * x / 12)
        + b[4] * xp.cos(2 * PI * x / b[3])
        + b[5] * xp.sin(2 * PI * x / b[3])
        + b[7] * xp.cos(2 * PI * x / b[6])
        + b[8] * xp.sin(2 * PI * x / b[6])
    )


def _eckerle4(b, x, xp):
    return (b[0] / b[1]) * xp.exp(-0.5 * ((x - b[2]) / b[1]) ** 2)


def _gauss(b, x, xp):
    return (
        b[0] * xp.exp(-b[1] * x)
        + b[2] * xp.exp(-((x - b[3]) ** 2) / b[4] ** 2)
        + b[5] * xp.exp(-((x - b[6]) ** 2) / b[7] ** 2)
    )


def _rational_cubic(b, x, xp):  # Hahn1, Thurber
    return (b[0] + b[1] * x + b[2] * x**2 + b[3] * x**3) / (
        1 + b[4] * x + b[5] * x**2 + b[6] * x**3
    )


def _kirby(b, x, xp):
    return (b[0] + b[1] * x + b[2] * x**2) / (1 + b[3] * x + b[4] * x**2)


def _lanczos(b, x, xp):
    return b[0] * xp.exp(-b[1] * x) + b[2] * xp.exp(-b[3] * x) + b[4] * xp.exp(-b[5] * x)


def _mgh09(b, x, xp):
    return b[0] * (x**2 + x * b[1]) / (x**2 + x * b[2] + b[3])


def _mgh10(b, x, xp):
    return b[0] * xp.exp(b[1] / (x + b[2]))


def _mgh17(b, x, xp):
    return b[0] + b[1] * xp.exp(-x * b[3]) + b[2] * xp.exp(-x * b[4])


def _misra1a(b, x, xp):
    return b[0] * (1.0 - xp.exp(-b[1] * x))


def _misra1b(b, x, xp):
    return b[0] * (1.0 - (1.0 + b[1] * x / 2) ** (-2.0))


def _misra1c(b, x, xp):
    return b[0] * (1.0 - (1.0 + 2 * b[1] * x) ** (-0.5))


def _misra1d(b, x, xp):
    return b[0] * b[1] * x * (1.0 + b[1] * x) ** (-1.0)


def _nelson(b, x, xp):  # the response is log(y): see load()
    return b[0] - b[1] * x[..., 0] * xp.exp(-b[2] * x[..., 1])


def _rat42(b, x, xp):
    return b[0] / (1.0 + xp.exp(b[1] - b[2] * x))


def _rat43(b, x, xp):
    return b[0] / (1.0 + xp.exp(b[1] - b[2] * x)) ** (1.0 / b[3])


def _roszman1(b, x, xp):
    return b[0] - b[1] * x - xp.arctan(b[2] / (x - b[3])) / PI


MODELS = {
    "Bennett5": _bennett5,
    "BoxBOD": _boxbod,
    "Chwirut1": _chwirut,
    "Chwirut2": _chwirut,
    "DanWood": _danwood,
    "ENSO": _enso,
    "Eckerle4": _eckerle4,
    "Gauss1": _gauss,
    "Gauss2": _gauss,
    "Gauss3": _gauss,
    "Hahn1": _rational_cubic,
    "Kirby2": _kirby,
    "Lanczos1": _lanczos,
    "Lanczos2": _lanczos,
    "Lanczos3": _lanczos,
    "MGH09": _mgh09,
    "MGH10": _mgh10,
    "MGH17": _mgh17,
    "Misra1a": _misra1a,
    "Misra1b": _misra1b,
    "Misra1c": _misra1c,
    "Misra1d": _misra1d,
    "Nelson": _nelson,
    "Rat42": _rat42,
    "Rat43": _rat43,
    "Roszman1": _roszman1,
    "Thurber": _rational_cubic,
}
NAMES = tuple(sorted(MODELS, key=str.lower))

#: Groups of parameter indices that may trade places without changing the model: the
#: exponentials of Lanczos, the two peaks of Gauss, the two cycles of ENSO (and MGH17's two
#: decays). An estimate is scored against the certified values under its best relabelling.
SYMMETRIES = {
    "Lanczos1": [(0, 1), (2, 3), (4, 5)],
    "Lanczos2": [(0, 1), (2, 3), (4, 5)],
    "Lanczos3": [(0, 1), (2, 3), (4, 5)],
    "Gauss1": [(2, 3, 4), (5, 6, 7)],
    "Gauss2": [(2, 3, 4), (5, 6, 7)],
    "Gauss3": [(2, 3, 4), (5, 6, 7)],
    "ENSO": [(3, 4, 5), (6, 7, 8)],
    "MGH17": [(1, 3), (2, 4)],
}


@dataclass(frozen=True)
class Problem:
    """One StRD problem as its file states it."""

    name: str
    x: np.ndarray  # (m,) or (m, 2) for Nelson
    y: np.ndarray  # (m,) the response (Nelson: log y, as the model is stated)
    start1: np.ndarray
    start2: np.ndarray
    certified: np.ndarray  # the certified parameters
    certified_sd: np.ndarray  # their certified standard deviations
    certified_ssr: float  # the certified residual sum of squares
    dof: int
    difficulty: str  # NIST's level: "lower", "average" or "higher"

    @property
    def n_params(self) -> int:
        return self.certified.size

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"b{i + 1}" for i in range(self.n_params))

    def model(self, b, x=None, xp=np):
        """The model at parameters ``b`` (a vector, or a dict ``{"b1": ..}``)."""
        if isinstance(b, dict):
            b = [b[k] for k in self.names]
        return MODELS[self.name](b, self.x if x is None else x, xp)

    def residuals(self, b, xp=np):
        return self.model(b, xp=xp) - self.y


_NUMBER = r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?"


def load(name: str) -> Problem:
    """Read ``tests/data/nist/<name>.dat``."""
    text = (DATA / f"{name}.dat").read_text()
    row = rf"^\s*b\d+\s*=\s*({_NUMBER})\s+({_NUMBER})\s+({_NUMBER})\s+({_NUMBER})"
    params = re.findall(row, text, re.M)
    table = np.array(params, dtype=np.float64)
    ssr = float(re.search(rf"Residual Sum of Squares:\s*({_NUMBER})", text).group(1))
    data_at = [m.end() for m in re.finditer(r"^Data:\s+y.*$", text, re.M)][-1]
    rows = np.array([line.split() for line in text[data_at:].strip().splitlines()], np.float64)
    y, x = rows[:, 0], (rows[:, 1] if rows.shape[1] == 2 else rows[:, 1:])
    if name == "Nelson":  # NIST states the model for log(y)
        y = np.log(y)
    level = re.search(r"(\w+) Level of Difficulty", text).group(1).lower()
    # m - n: Rat43's file says 9 degrees of freedom, but its certified standard deviations
    # are those of 15 - 4 = 11
    return Problem(name, x, y, *table.T, ssr, y.size - table.shape[0], level)


def box(problem: Problem) -> list[tuple[str, float, float]]:
    """The search box from NIST's two starting values alone, one ``(kind, lower, upper)`` a
    parameter: ``("log", min/10, max*10)`` when both starts are positive, otherwise
    ``("linear", -10 m, 10 m)`` with ``m`` the larger magnitude of the two."""
    out = []
    for a, b in zip(problem.start1, problem.start2, strict=True):
        if a > 0 and b > 0:
            out.append(("log", min(a, b) / 10, max(a, b) * 10))
        else:
            m = max(abs(a), abs(b))
            out.append(("linear", -10 * m, 10 * m))
    return out


def lre(estimate, certified) -> np.ndarray:
    """The log relative error ``-log10(|est - cert| / |cert|)``, elementwise, capped at 11
    (and 0 for a non-finite estimate or one off by more than the value itself)."""
    est, cert = np.asarray(estimate, np.float64), np.asarray(certified, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(est - cert) / np.abs(cert)
        out = -np.log10(rel)
    out = np.where(rel == 0, LRE_CAP, out)
    out = np.where(np.isfinite(est), out, 0.0)
    return np.clip(np.nan_to_num(out, nan=0.0), 0.0, LRE_CAP)


def relabellings(name: str, n: int):
    """Every index order under which the model is the same (the identity first)."""
    groups = SYMMETRIES.get(name)
    if not groups:
        yield list(range(n))
        return
    for order in permutations(range(len(groups))):
        index = list(range(n))
        for slot, group in zip(groups, (groups[i] for i in order), strict=True):
            for i, j in zip(slot, group, strict=True):
                index[i] = j
        yield index


def worst_lre(problem: Problem, estimate, target=None) -> float:
    """The worst parameter's LRE against ``target`` (default: the certified values), under the
    estimate's best relabelling. Magnitudes are compared where only a square enters the model
    (the widths of Gauss' peaks)."""
    target = problem.certified if target is None else np.asarray(target)
    est = np.asarray(estimate, np.float64)
    if problem.name.startswith("Gauss"):
        est = est.copy()
        est[[4, 7]] = np.abs(est[[4, 7]])
    best = 0.0
    for index in relabellings(problem.name, problem.n_params):
        best = max(best, float(np.min(lre(est[index], target))))
    return best


def best_order(problem: Problem, estimate) -> list[int]:
    """The indices that put the estimate in the certified values' labelling (its best
    relabelling): ``estimate[best_order(...)]`` and ``errors[best_order(...)]``."""
    est = np.asarray(estimate, np.float64)
    if problem.name.startswith("Gauss"):
        est = est.copy()
        est[[4, 7]] = np.abs(est[[4, 7]])
    orders = list(relabellings(problem.name, problem.n_params))
    scores = [float(np.min(lre(est[i], problem.certified))) for i in orders]
    return orders[int(np.argmax(scores))]


def relabelled(problem: Problem, estimate) -> np.ndarray:
    """The estimate in the certified values' labelling (its best relabelling)."""
    return np.asarray(estimate, np.float64)[best_order(problem, estimate)]


def ssr_lre(problem: Problem, ssr: float) -> float:
    return float(lre(ssr, problem.certified_ssr))


def digits(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:4.1f}"
