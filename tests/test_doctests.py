"""The examples in the bookkeeping modules' docstrings are part of their contract."""

import doctest

import pytest

import multistart.chunking
import multistart.convergence
import multistart.minima
import multistart.priors


@pytest.mark.parametrize(
    "module", [multistart.chunking, multistart.convergence, multistart.minima, multistart.priors]
)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
