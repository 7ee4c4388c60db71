"""A provider kind's name appears, as a string in code, only in its own modules and the
registry: everything else asks the kind's profile (``sim.providers.profile``).

A new built-in kind is then added in three places (its adapter module, its profile in
``sim/providers/profiles.py``, its line in the registry), and a package's provider can
declare every fact sim needs of it. Docstrings and comments may name kinds; code may not.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from sim.providers import builtin_kinds, profile, selectable_kinds

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "sim"

#: the registry: the kinds by name, and the built-ins' profiles
REGISTRY = ("sim/providers/__init__.py", "sim/providers/profiles.py")

#: each kind's own modules (a path ending in "/" is a package)
OWN: dict[str, tuple[str, ...]] = {
    # the OpenAI wire family: the Responses API adapter, and the family's shared modules
    # (``"openai"`` there is also the SDK's module name)
    "openai": ("sim/providers/openai.py", "sim/providers/_openai_errors.py"),
    "chat": ("sim/providers/chat.py",),
    "gemini": ("sim/providers/gemini.py",),
    "anthropic": ("sim/providers/anthropic.py",),
    "cli": ("sim/providers/cli.py",),
    "offline": ("sim/offline/",),
}

#: the loopback stub servers, one per vendor's API, which they emulate (test doubles), and
#: ``sim stub-server``, whose ``--api`` names the API it serves
STUBS = ("sim/testing/", "sim/cli/stub.py")

#: (module, name): a string that equals a kind's name but means something else
NOT_A_KIND = {
    # the offline model's name, CallSettings' default model (a model, not a kind)
    ("sim/llm/types.py", "offline"),
}

#: the kinds checked. ``replay`` is left out: it is also the ``sim replay`` command and a
#: call's ``served_from`` value, and no config can choose it (``selectable``).
KINDS = tuple(OWN)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that stand alone as statements (docstrings)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def kind_names_in(source: str, kinds: tuple[str, ...] = KINDS) -> list[tuple[int, str]]:
    """(line, kind) of every string constant in code (not a docstring) equal to a kind."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in kinds
        and id(node) not in docs
    )


def _owns(path: str, kind: str) -> bool:
    return path in REGISTRY or any(
        path.startswith(own) if own.endswith("/") else path == own for own in OWN[kind]
    )


def test_no_module_names_a_provider_kind_but_its_own_and_the_registry() -> None:
    found = []
    for path in sorted(SIM.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(STUBS):
            continue
        for line, kind in kind_names_in(path.read_text()):
            if not _owns(rel, kind) and (rel, kind) not in NOT_A_KIND:
                found.append(f"{rel}:{line}: {kind!r}")
    assert not found, (
        "these modules name a provider kind; ask its profile instead "
        "(sim.providers.profile(kind)):\n  " + "\n  ".join(found)
    )


def test_the_check_sees_a_kind_in_code_and_not_in_a_docstring() -> None:
    """The control: a kind compared in code is found; the same word in a docstring, a
    comment or a longer string is not."""
    source = (
        '"""Talks to "gemini" (docstring)."""\n'
        "def f(kind):\n"
        '    """When kind is "anthropic"."""\n'
        '    # kind == "chat"\n'
        '    message = f"provider {kind!r} is not gemini"\n'
        '    return kind in ("gemini", "cli")\n'
    )
    assert kind_names_in(source) == [(6, "cli"), (6, "gemini")]


def test_every_builtin_kind_has_a_profile_of_its_name() -> None:
    for kind in builtin_kinds():
        assert profile(kind).kind == kind
    assert set(KINDS) <= set(selectable_kinds())
    assert set(OWN) == set(selectable_kinds()), "a selectable kind without its own modules"


def test_a_profile_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile("chat").key_env = "X"  # type: ignore[misc]
