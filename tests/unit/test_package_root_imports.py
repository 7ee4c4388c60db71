"""No module inside ``sim`` imports from ``sim/__init__``: that module re-exports names
lazily for users, so a module of a lower layer reaching up to it would depend on the
whole package. ``import sim`` and ``from sim import NAME`` (NAME not a module of the
package) fail, naming every place; ``from sim import safefs`` imports the module
``sim.safefs`` itself and is allowed."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "sim"


def submodules(root: Path) -> set[str]:
    """The names of the modules and packages directly under the package ``root``."""
    return {p.stem for p in root.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in root.glob("*/__init__.py")
    }


def uplinks(root: Path) -> list[str]:
    """Every import of the package ``root``'s own ``__init__`` by a module inside it."""
    package = root.name
    modules = submodules(root)
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package:
                        found.append(f"{where}:{node.lineno}: import {package}")
            elif isinstance(node, ast.ImportFrom) and node.module == package and not node.level:
                for alias in node.names:
                    if alias.name not in modules:
                        found.append(f"{where}:{node.lineno}: from {package} import {alias.name}")
    return found


def test_no_module_imports_from_the_package_root() -> None:
    found = uplinks(SIM)
    assert not found, (
        "modules inside sim import from sim/__init__ (import from the defining module):\n"
        + "\n".join(f"  {line}" for line in found)
    )


def test_the_scan_finds_an_import_from_the_root(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.leaf import VERSION\n")
    (pkg / "leaf.py").write_text("VERSION = '1'\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from pkg import VERSION\nfrom pkg import leaf\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    import pkg\n    import pkg.leaf\n")
    (pkg / "sub" / "c.py").write_text("from pkg.leaf import VERSION\nfrom pkg import sub\n")
    assert uplinks(pkg) == [
        "pkg/sub/a.py:1: from pkg import VERSION",
        "pkg/sub/b.py:2: import pkg",
    ]
