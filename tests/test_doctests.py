"""The examples in the modules' docstrings are part of their contract."""

import doctest
import sys

import pytest

import multistart  # noqa: F401  (loads every module below)

# By name from sys.modules: `multistart.laplace` is the function that module exports.
MODULES = [
    "chunking",
    "convergence",
    "minima",
    "priors",
    "laplace",
    "checks",
    "status",
    "result",
    "parts",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    failures, tried = doctest.testmod(
        sys.modules[f"multistart.{name}"], optionflags=doctest.ELLIPSIS
    )
    assert tried > 0 and failures == 0
