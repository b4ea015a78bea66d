"""Checks of hyperparameters, each raising a ``ValueError`` that names the argument.

They run in constructors, before anything is traced or compiled: a negative learning rate would
otherwise be accepted and the search would climb uphill. NumPy only (no JAX import).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["integer", "positive", "non_negative", "in_unit_interval", "each", "boolean"]


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number; got {value!r}")
    x = float(value)
    if math.isnan(x):
        raise ValueError(f"{name} must be a number, not nan")
    return x


def integer(value, name: str, minimum: int) -> int:
    """``value`` as an int if it is an integer (not a bool) ``>= minimum``.

    >>> integer(3, "memory", 1)
    3
    >>> integer(0, "memory", 1)
    Traceback (most recent call last):
    ...
    ValueError: memory must be an int >= 1; got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


def boolean(value, name: str) -> bool:
    """``value`` if it is ``True`` or ``False`` (a NumPy bool too).

    >>> boolean(1, "diagonal")
    Traceback (most recent call last):
    ...
    ValueError: diagonal must be True or False; got 1
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def positive(value, name: str, *, schedule: bool = False):
    """``value`` if it is a finite number > 0 (or, with ``schedule``, a callable).

    ``schedule=True`` lets an optax schedule (a callable of the step count) through unchecked:
    its values are only known while the search runs.

    >>> positive(0.05, "learning_rate")
    0.05
    >>> positive(-0.1, "learning_rate")
    Traceback (most recent call last):
    ...
    ValueError: learning_rate must be > 0; got -0.1
    """
    if schedule and callable(value):
        return value
    x = _real(value, name)
    if not (0 < x < math.inf):
        raise ValueError(f"{name} must be > 0; got {x}")
    return value


def non_negative(value, name: str):
    """``value`` if it is a finite number >= 0.

    >>> non_negative(-1e-8, "eps")
    Traceback (most recent call last):
    ...
    ValueError: eps must be >= 0; got -1e-08
    """
    x = _real(value, name)
    if not (0 <= x < math.inf):
        raise ValueError(f"{name} must be >= 0; got {x}")
    return value


def in_unit_interval(value, name: str):
    """``value`` if ``0 <= value < 1`` (a decay rate such as Adam's ``b1``, ``b2``).

    >>> in_unit_interval(1.0, "b2")
    Traceback (most recent call last):
    ...
    ValueError: b2 must be in [0, 1); got 1.0
    """
    x = _real(value, name)
    if not (0 <= x < 1):
        raise ValueError(f"{name} must be in [0, 1); got {x}")
    return value


def each(check, values, name: str, length: int | None = None):
    """Apply ``check`` to each element, naming it ``name[i]``; ``values`` must be a sequence
    (of ``length`` elements when given).

    >>> each(in_unit_interval, (0.9, 1.5), "betas")
    Traceback (most recent call last):
    ...
    ValueError: betas[1] must be in [0, 1); got 1.5
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"{name} must be a sequence; got {values!r}")
    if length is not None and len(values) != length:
        raise ValueError(f"{name} must have {length} elements; got {values!r}")
    for i, v in enumerate(values):
        check(v, f"{name}[{i}]")
    return values
