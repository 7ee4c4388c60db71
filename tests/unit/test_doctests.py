"""The docstring examples of ``sim.testing`` (what users copy first) run and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ("sim.testing.adapters", "sim.testing.stub_server", "sim.testing.counting")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


def test_the_doubles_have_examples() -> None:
    """The control: the run above would notice a failing example (it found some)."""
    finder = doctest.DocTestFinder()
    found = sum(
        len(test.examples)
        for name in MODULES
        for test in finder.find(importlib.import_module(name))
    )
    assert found >= 10
