"""No side channels in the call pipeline: what a layer needs travels in the request or in
the objects the stack's builder returns, never in a ``ContextVar`` (issue 26).

A call's identity is ``ModelRequest.call``, a batch's session ``ModelRequest.batch``, where
its streamed text goes ``ModelRequest.stream_to``; the
runner reads the budget, pools and endpoints from the ``Stack`` the builder returns. A
ContextVar in these packages would let a layer read, or change, what its caller never
passed it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[2] / "sim"
#: the packages of the call pipeline and what builds and drives it
PACKAGES = ("llm", "providers", "engine", "policy")


def context_var_lines(source: str) -> list[int]:
    """The lines of ``source`` that import ``contextvars`` or name a ``ContextVar``."""
    return [
        getattr(node, "lineno", 0)
        for node in ast.walk(ast.parse(source))
        if (isinstance(node, ast.Import) and any(a.name == "contextvars" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and node.module == "contextvars")
        or (isinstance(node, ast.Name) and node.id == "ContextVar")
        or (isinstance(node, ast.Attribute) and node.attr == "ContextVar")
    ]


def test_the_call_pipeline_has_no_context_var() -> None:
    files = [f for package in PACKAGES for f in sorted((SIM / package).rglob("*.py"))]
    assert len(files) > 40  # the packages are where this test looks
    found = [
        f"{f.relative_to(SIM.parent).as_posix()}:{line}"
        for f in files
        for line in context_var_lines(f.read_text())
    ]
    assert not found, f"a ContextVar side channel in the call pipeline: {found}"


@pytest.mark.parametrize(
    "source",
    [
        "import contextvars\n",
        "from contextvars import ContextVar\n",
        "x: 'ContextVar[int]'\ny = ContextVar('y')\n",
        "import contextvars as c\nv = c.ContextVar('v')\n",
    ],
)
def test_the_check_finds_each_way_of_making_one(source: str) -> None:
    assert context_var_lines(source)
    assert not context_var_lines("from dataclasses import field\n")
