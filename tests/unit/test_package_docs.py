"""Each package under ``sim/`` says in its ``__init__`` docstring what it owns (``Owns:``),
what it may import (``May import:``) and where the next one of its kind goes (``Next:``);
and what it says it may import is true: every other part of sim the package imports
(``tests/unit/test_layers.py``'s graph) is named there, and each named one exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.unit.test_layers import SIM, layer_graph

MARKERS = ("Owns:", "May import:", "Next:")
#: a part of sim named in a docstring: ``sim.llm``, ``sim.llm``'s
UNIT = re.compile(r"\bsim\.(\w+)")


def packages() -> list[Path]:
    """The top-level packages under ``sim/``."""
    return sorted(p.parent for p in SIM.glob("*/__init__.py"))


def paragraph(doc: str, marker: str) -> str:
    """The text from a line starting with ``marker`` to the next blank line."""
    start = re.search(rf"^{re.escape(marker)}", doc, re.M)
    if start is None:
        return ""
    end = doc.find("\n\n", start.start())
    return doc[start.start() : None if end < 0 else end]


def problems_of(package: Path, doc: str | None, imports: set[str]) -> list[str]:
    where = f"sim/{package.name}/__init__.py"
    if not doc:
        return [f"{where} has no docstring"]
    out = [
        f"{where}'s docstring has no paragraph starting {marker!r}"
        for marker in MARKERS
        if not paragraph(doc, marker)
    ]
    named = {f"sim.{unit}" for unit in UNIT.findall(paragraph(doc, "May import:"))}
    out += [
        f"{where}: 'May import:' does not name {unit}, which the package imports"
        for unit in sorted(imports - named)
    ]
    units = {p.stem if p.suffix == ".py" else p.name for p in SIM.iterdir()}
    out += [
        f"{where}: 'May import:' names {unit}, which is no part of sim"
        for unit in sorted(named)
        if unit.removeprefix("sim.") not in units
    ]
    return out


def test_every_package_says_what_it_owns_may_import_and_where_the_next_goes() -> None:
    graph = layer_graph()
    problems: list[str] = []
    for package in packages():
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        problems += problems_of(package, doc, graph.get(f"sim.{package.name}", set()))
    assert not problems, "package docstrings out of step with the code:\n  " + "\n  ".join(problems)


def test_the_check_sees_an_import_left_unsaid_and_a_marker_missing() -> None:
    """The control: a package importing what its docstring does not name, a name that is no
    part of sim, and a docstring without ``Next:``."""
    doc = "What.\n\nOwns: x.\n\nMay import: ``sim.errors``, ``sim.nosuch``.\n\nNext: here.\n"
    found = problems_of(SIM / "engine", doc, {"sim.errors", "sim.world"})
    assert found == [
        "sim/engine/__init__.py: 'May import:' does not name sim.world, which the package imports",
        "sim/engine/__init__.py: 'May import:' names sim.nosuch, which is no part of sim",
    ]
    assert problems_of(SIM / "engine", doc.replace("Next:", "Then:"), {"sim.errors"}) == [
        "sim/engine/__init__.py's docstring has no paragraph starting 'Next:'",
        "sim/engine/__init__.py: 'May import:' names sim.nosuch, which is no part of sim",
    ]
