"""The examples in the modules' docstrings are part of their contract."""

import doctest
import sys
from pathlib import Path

import pytest

import multistart  # loads every module below

# By name from sys.modules: `multistart.laplace` is the function that module exports.
MODULES = [
    "common.checks",
    "common.status",
    "common.tolerance",
    "device.cache",
    "device.chunking",
    "device.distributed",
    "host.config",
    "host.decide",
    "host.iterate",
    "model.graph",
    "model.priors",
    "result.batch",
    "result.core",
    "result.laplace",
    "result.merge",
    "result.minima",
    "search.core",
    "search.gradient",
    "search.least_squares",
    "solvers.convergence",
    "starts.refill",
    "starts.strategies",
    "starts.tiktak",
    "width.budget",
    "width.choice",
    "width.machine",
    "width.timing",
    "width.widths",
]
PACKAGE = Path(multistart.__file__).parent


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    failures, tried = doctest.testmod(
        sys.modules[f"multistart.{name}"], optionflags=doctest.ELLIPSIS
    )
    assert tried > 0 and failures == 0


def test_every_module_with_examples_is_listed():
    with_examples = {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py")
        if ">>> " in p.read_text()
    }
    assert with_examples <= set(MODULES), sorted(with_examples - set(MODULES))
