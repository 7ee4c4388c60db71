"""``sim/llm`` is the provider-agnostic pipeline: it knows nothing of a world's folder
layout. A string naming a folder of the world's ``.sim/`` (in code, not in a docstring)
fails, naming the place; the response store is handed its folder by the engine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sim.llm.store import ResponseStore
from sim.ticklog.format import STORE_DIR

LLM = Path(__file__).resolve().parents[2] / "sim" / "llm"


def world_paths(root: Path) -> list[str]:
    """Every string constant under ``root`` that names a ``.sim`` folder (docstrings left
    out: they may say where the engine puts things)."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and (node.value == ".sim" or ".sim/" in node.value)
            ):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_the_llm_layer_names_no_world_folder() -> None:
    found = world_paths(LLM)
    assert not found, "sim/llm names a world's folders (hand the path in):\n" + "\n".join(
        f"  {line}" for line in found
    )


def test_the_scan_finds_a_world_folder(tmp_path: Path) -> None:
    pkg = tmp_path / "llm"
    pkg.mkdir()
    (pkg / "a.py").write_text('"""Files go in .sim/responses."""\nDIR = Path(".sim") / "x"\n')
    (pkg / "b.py").write_text('def f():\n    """.sim/x"""\n    return ".sim/responses"\n')
    assert world_paths(pkg) == ["llm/a.py:2: '.sim'", "llm/b.py:3: '.sim/responses'"]


def test_the_store_keeps_its_files_where_it_is_told(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, STORE_DIR)
    store.discard("intention:bob")
    assert store.changes() == {f"{STORE_DIR}/intention/bob.json": None}
    with pytest.raises(ValueError, match="needs the folder"):
        ResponseStore(tmp_path)
