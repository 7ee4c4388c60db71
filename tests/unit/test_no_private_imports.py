"""sim imports nothing from a dependency's private modules (a leading ``_`` in the path
or the imported name): those move between releases without notice."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "sim"
DEPENDENCIES = (
    "openai",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "aiohttp",
    "yarl",
    "pydantic",
    "click",
    "orjson",
)
#: the check as a one-line grep would do it (``grep -rE`` over sim/)
PATTERN = re.compile(
    r"^\s*(from|import)\s+(openai|httpx2?|httpcore2?|aiohttp|yarl)(\.\w+)*\._", re.MULTILINE
)


def private_imports(source: str) -> list[str]:
    found = [match.group(0).strip() for match in PATTERN.finditer(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] not in DEPENDENCIES:
                continue
            names = [alias.name for alias in node.names]
            if any(p.startswith("_") for p in parts) or any(n.startswith("_") for n in names):
                found.append(f"from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in DEPENDENCIES and any(p.startswith("_") for p in parts):
                    found.append(f"import {alias.name}")
    return found


def test_the_check_finds_what_it_looks_for() -> None:
    assert private_imports("from openai.lib._pydantic import to_strict_json_schema\n")
    assert private_imports(
        "try:\n    from httpcore2._utils import is_socket_readable\nexcept ImportError:\n    pass\n"
    )
    assert private_imports("from openai import _exceptions\n")
    assert private_imports("import httpx2._transports.default\n")
    assert not private_imports("from openai import AsyncOpenAI\nimport httpcore2\n")
    assert private_imports("from aiohttp._http_parser import HttpResponseParser\n")
    assert not private_imports("from sim.providers._openai_common import Connections\n")


def test_sim_imports_no_private_module_of_a_dependency() -> None:
    files = sorted(SIM.rglob("*.py"))
    assert len(files) > 20
    offenders = {
        str(path.relative_to(SIM.parent)): found
        for path in files
        if (found := private_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}
