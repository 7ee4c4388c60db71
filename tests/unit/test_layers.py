"""The layer order, derived from the imports: no package cycle, and docs/architecture.md
draws the order the code has.

Every ``import`` counts, wherever it stands: at the top of a module, inside a function (kept
there so ``sim --help`` stays fast) or under ``TYPE_CHECKING``. A cycle hidden by an import
inside a function is still a cycle between two packages' jobs.
"""

from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "sim"
ARCHITECTURE = REPO / "docs" / "architecture.md"


def unit_of(module: str) -> str | None:
    """The layer a module belongs to: ``sim.X`` for a subpackage's or a top module's."""
    parts = module.split(".")
    if parts[0] != "sim" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every sim module ``path`` imports, relative imports resolved; ``from sim import x``
    names the submodule ``sim.x`` when there is one (else the package facade, left out)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    return imports_in(path.read_text(), package)


def imports_in(source: str, package: str) -> set[str]:
    """The sim modules ``source`` (a module of ``package``) imports, at any depth."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                sub = SIM.parent / Path(*candidate.split("."))
                if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
                    out.add(candidate)
                else:
                    out.add(target)
    return {m for m in out if m == "sim" or m.startswith("sim.")}


def layer_graph() -> dict[str, set[str]]:
    """Layer -> the layers it imports (the ``sim`` facade, which imports lazily, left out)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(SIM.rglob("*.py")):
        source = unit_of(module_name(path))
        if source is None:
            continue
        graph[source]
        for target in map(unit_of, imported_modules(path)):
            if target is not None and target != source:
                graph[source].add(target)
    return dict(graph)


def layer_depths(graph: dict[str, set[str]]) -> dict[str, int]:
    """0 for a layer that imports no other, else one more than its deepest import."""
    depth: dict[str, int] = {}
    for unit in graphlib.TopologicalSorter(graph).static_order():
        depth[unit] = 1 + max((depth[d] for d in graph.get(unit, ())), default=-1)
    return depth


def test_no_package_imports_another_that_imports_it_back() -> None:
    graph = layer_graph()
    try:
        layer_depths(graph)
    except graphlib.CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        pytest.fail(f"package cycle: {cycle}", pytrace=False)


def test_the_cycle_check_sees_imports_inside_functions_and_type_checking() -> None:
    """The control: imports inside a function and under ``TYPE_CHECKING`` are edges, and
    two layers importing each other are a cycle."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from sim.config import Config\n"
        "def f():\n    from ..engine import stack\n    from sim import safefs\n"
    )
    assert imports_in(source, "sim.llm") == {"sim.config", "sim.engine.stack", "sim.safefs"}
    graph = {"sim.a": {"sim.b"}, "sim.b": {"sim.a"}}
    with pytest.raises(graphlib.CycleError):
        layer_depths(graph)


def rendered_order() -> str:
    depths = layer_depths(layer_graph())
    by_depth: dict[int, list[str]] = defaultdict(list)
    for unit, d in depths.items():
        by_depth[d].append(unit.removeprefix("sim."))
    lines = [f"{d}: {' '.join(sorted(by_depth[d]))}" for d in sorted(by_depth, reverse=True)]
    return "\n".join(lines)


def test_architecture_doc_shows_the_layer_order_the_imports_have() -> None:
    """docs/architecture.md's "Layer order" block is what the imports give (regenerate it
    with ``python -m tests.unit.test_layers``)."""
    text = ARCHITECTURE.read_text()
    start = text.index("<!-- layers -->\n```\n") + len("<!-- layers -->\n```\n")
    end = text.index("```\n<!-- /layers -->", start)
    assert text[start:end].rstrip("\n") == rendered_order(), (
        "docs/architecture.md's layer order is stale: run `python -m tests.unit.test_layers`"
    )


if __name__ == "__main__":
    text = ARCHITECTURE.read_text()
    head, _, rest = text.partition("<!-- layers -->\n")
    _, _, tail = rest.partition("<!-- /layers -->")
    block = f"<!-- layers -->\n```\n{rendered_order()}\n```\n<!-- /layers -->"
    from tests.unit.test_architecture_doc import reordered  # the listing in the same order

    ARCHITECTURE.write_text(reordered(f"{head}{block}{tail}"))
