"""One class per name in the package: a class name defined twice under ``sim/`` (in two
modules, or twice in one) fails, naming every place it is defined."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "sim"


def class_places(root: Path) -> dict[str, list[str]]:
    """Every class name under ``root`` (nested classes included), with where it is defined."""
    places: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                places[node.name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return places


def twice(root: Path) -> dict[str, list[str]]:
    return {name: where for name, where in class_places(root).items() if len(where) > 1}


def test_no_class_name_is_defined_twice() -> None:
    found = twice(SIM)
    assert not found, "class names defined more than once under sim/ (rename one of each):\n" + (
        "\n".join(f"  {name}: {', '.join(where)}" for name, where in sorted(found.items()))
    )


def test_the_scan_finds_a_name_defined_twice(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("class Runner:\n    pass\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("def f():\n    class Runner:\n        pass\n")
    (tmp_path / "pkg" / "c.py").write_text("class Other:\n    pass\n")
    assert twice(tmp_path / "pkg") == {"Runner": ["pkg/a.py:1", "pkg/sub/b.py:2"]}
