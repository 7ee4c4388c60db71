"""docs/architecture.md's listing is true to the code: every module and package under
``sim/`` is named in it, every ``.py`` file and package it names exists where it says, and
its top-level entries stand in the order of the generated layer block (top layer first).

The listing is the second fenced block, after the layer block. A line at column 0 starts
an entry (``sim/engine/``, ``sim/world.py``, ``tools/docsamples.py``); the lines below it,
indented, belong to it: ``  name.py`` lines for a package's modules, and prose. A module
of a package is named when its file name (``repair.py``) stands in its top-level
package's entry; a package inside one (``sim/analysis/report/``) when ``report/`` does; a
top-level module needs an entry of its own.

``python -m tests.unit.test_layers`` rewrites the layer block and puts the entries in its
order; a missing module has to be described by hand (the failure says which and where).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.unit.test_layers import ARCHITECTURE, REPO, SIM, layer_depths, layer_graph

#: a ``.py`` file named anywhere in an entry (``route.py's Route``: ``route.py``)
PY_TOKEN = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*\w+\.py)(?!\w)")
#: a package named in an entry (``report/``, ``http/:``), a directory of its package
PACKAGE_TOKEN = re.compile(r"(?<![\w./-])(\w+)/(?=[\s:,)]|$)", re.M)
#: files every package has, not described one by one
UNLISTED = {"__init__.py"}


@dataclass
class Entry:
    """One top-level entry of the listing: its first word and its lines."""

    key: str
    lines: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def path(self) -> Path:
        return REPO / self.key

    @property
    def unit(self) -> str | None:
        """Its layer in the layer block (``sim.engine``); ``None`` outside ``sim/``."""
        if not self.key.startswith("sim/"):
            return None
        return "sim." + self.key.removeprefix("sim/").removesuffix("/").removesuffix(".py")


def listing_span(text: str) -> tuple[int, int]:
    """Where the listing's lines stand in the document: the fenced block after the layers."""
    after = text.index("<!-- /layers -->")
    start = text.index("```\n", after) + len("```\n")
    return start, text.index("```\n", start)


def entries(text: str) -> list[Entry]:
    start, end = listing_span(text)
    out: list[Entry] = []
    for line in text[start:end].splitlines():
        if line and not line[0].isspace():
            out.append(Entry(line.split()[0], [line]))
        elif out:
            out[-1].lines.append(line)
    return out


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def packages(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("__init__.py") if p.parent != root)


def missing_from_doc(listed: list[Entry]) -> list[str]:
    """Each module or package under ``sim/`` the listing does not name, and where it goes."""
    by_key = {e.key: e for e in listed}
    problems: list[str] = []
    for path in python_files(SIM):
        rel = path.relative_to(SIM)
        if path.name in UNLISTED:
            continue
        if len(rel.parts) == 1:
            if f"sim/{rel}" not in by_key:
                problems.append(
                    f"sim/{rel} is not in the listing: add an entry `sim/{rel}  what it holds`"
                )
            continue
        top = f"sim/{rel.parts[0]}/"
        entry = by_key.get(top)
        named = entry is not None and path.name in PY_TOKEN.findall(entry.text)
        if not named:
            where = f"under `{top}`" if entry is not None else f"in an entry `{top}` (none yet)"
            problems.append(
                f"sim/{rel} is not named in the listing: add a line `  {path.name}  what it "
                f"holds` {where}"
            )
    for package in packages(SIM):
        rel = package.relative_to(SIM)
        if len(rel.parts) == 1:
            if f"sim/{rel}/" not in by_key:
                problems.append(f"package sim/{rel}/ has no entry: add `sim/{rel}/  what it owns`")
            continue
        top = f"sim/{rel.parts[0]}/"
        entry = by_key.get(top)
        if entry is None or package.name not in PACKAGE_TOKEN.findall(entry.text):
            problems.append(
                f"package sim/{rel}/ is not named in the listing: add `{package.name}/` "
                f"(what it owns) under `{top}`"
            )
    return problems


def _exists(token: str, entry: Entry) -> bool:
    """Whether ``token`` (a ``.py`` file an entry names) is a file where the entry means."""
    if token.split("/")[0] in ("sim", "tools", "tests", "bench"):
        return (REPO / token).is_file()
    if entry.key.endswith("/"):  # a package's entry: a file in it, at any depth, or sim/...
        return (SIM / token).is_file() or any(
            p.as_posix().endswith("/" + token) for p in python_files(entry.path)
        )
    return (SIM / token).is_file() or (entry.path.parent / token).is_file()


def entry_lines(entry: Entry) -> list[str]:
    """An entry's ``  name.py`` / ``  name/`` lines (its prose left out)."""
    return [line.split()[0] for line in entry.lines[1:] if re.match(r"^  \S", line)]


def absent_from_code(listed: list[Entry]) -> list[str]:
    """Each entry, ``.py`` file or package the listing names that is not where it says."""
    problems: list[str] = []
    for entry in listed:
        if entry.key.endswith("/"):
            if not entry.path.is_dir():
                problems.append(f"the listing's entry `{entry.key}` is not a folder of the repo")
                continue
            for name in PACKAGE_TOKEN.findall("\n".join(entry_lines(entry))):
                if (
                    not any(p.name == name for p in packages(entry.path))
                    and not (entry.path / name).is_dir()
                ):
                    problems.append(f"`{entry.key}` names `{name}/`, which is not a folder in it")
        elif not entry.path.is_file():
            problems.append(f"the listing's entry `{entry.key}` is not a file of the repo")
        for token in PY_TOKEN.findall(entry.text):
            if token != entry.key and not _exists(token, entry):
                problems.append(
                    f"`{entry.key}` names `{token}`, which is not a module there "
                    f"(moved, renamed or removed?)"
                )
    return problems


def layer_order(listed: list[Entry]) -> list[Entry]:
    """The entries in the layer block's order: top layer first, the listing's order within
    a layer; entries outside the layers (data, tools) last."""
    depths = layer_depths(layer_graph())
    return sorted(listed, key=lambda e: -depths.get(e.unit or "", -1))


def reordered(text: str) -> str:
    """The document with the listing's entries in the layer order (``python -m
    tests.unit.test_layers`` writes it)."""
    start, end = listing_span(text)
    body = "".join(line + "\n" for e in layer_order(entries(text)) for line in e.lines)
    return text[:start] + body + text[end:]


def test_every_module_and_package_under_sim_is_named() -> None:
    problems = missing_from_doc(entries(ARCHITECTURE.read_text()))
    assert not problems, "docs/architecture.md's listing is missing:\n  " + "\n  ".join(problems)


def test_every_module_and_package_the_listing_names_exists() -> None:
    problems = absent_from_code(entries(ARCHITECTURE.read_text()))
    assert not problems, "docs/architecture.md's listing is stale:\n  " + "\n  ".join(problems)


def test_the_listing_follows_the_layer_order() -> None:
    listed = entries(ARCHITECTURE.read_text())
    expected = [e.key for e in layer_order(listed)]
    assert [e.key for e in listed] == expected, (
        "docs/architecture.md's listing is not in the layer order (top layer first): run "
        "`python -m tests.unit.test_layers`; expected: " + ", ".join(expected)
    )


def test_the_checks_see_a_missing_a_stale_and_a_misplaced_name() -> None:
    """The control: a module left out, one named under the wrong package, and a package
    out of order are each found, and named."""
    text = ARCHITECTURE.read_text()
    listed = entries(text)
    engine = next(e for e in listed if e.key == "sim/engine/")
    runner = next(line for line in engine.lines if line.strip().startswith("runner.py"))
    engine.lines.remove(runner)
    assert any(p.startswith("sim/engine/runner.py is not named") for p in missing_from_doc(listed))
    assert any("under `sim/engine/`" in p for p in missing_from_doc(listed))
    policy = next(e for e in listed if e.key == "sim/policy/")
    policy.lines.append("  runner.py           not here")
    assert any("`sim/policy/` names `runner.py`" in p for p in absent_from_code(listed))
    swapped = [listed[1], listed[0], *listed[2:]]
    assert [e.key for e in layer_order(swapped)] != [e.key for e in swapped]
