"""Unit tests for ``sim.storage``: load/validate, commit, recover, lock.

Fakes, not mocks: every test builds a real world folder under ``tmp_path`` and drives the
real ``Storage``; a second process, where one is needed, is a real child Python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import DEMO

from sim.errors import InputError, InvalidWorld, SimError, WorldLockedError
from sim.storage import Storage
from sim.storage.journal import CorruptJournal

REPO = Path(__file__).resolve().parents[2]
ID_PATTERN = "^[a-z0-9][a-z0-9_-]*$"


# -- helpers --------------------------------------------------------------------------------


def text(data: Any) -> str:
    """The world-file format: 2-space pretty JSON, UTF-8, trailing newline."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text(data), encoding="utf-8")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def character(cid: str, location: str, **state: Any) -> dict[str, Any]:
    return {
        "identity": {
            "id": cid,
            "name": cid.title(),
            "description": "",
            "personality": "",
            "goals": [],
        },
        "state": {"location": location, "mood": "calm", "inventory": [], **state},
        "memory": {"capacity": 5, "cells": [{"tick": 0, "text": "I woke up."}], "summary": ""},
    }


def location(lid: str, *connections: str) -> dict[str, Any]:
    return {
        "identity": {"id": lid, "name": lid.title(), "description": ""},
        "state": {"connections": list(connections), "objects": [], "atmosphere": ""},
    }


def make_world(root: Path) -> Path:
    """A small valid, already-normalised world, with some engine state in ``.sim/``."""
    write_json(root / "world.json", {"name": "Test", "description": "", "tick": 0, "seed": 1})
    write_json(root / "locations" / "quay.json", location("quay", "market"))
    write_json(root / "locations" / "market.json", location("market", "quay"))
    write_json(root / "characters" / "ada.json", character("ada", "quay"))
    write_json(root / "characters" / "bob.json", character("bob", "market"))
    write_json(root / ".sim" / "responses" / "intention" / "ada.json", {"exchanges": []})
    return root


@pytest.fixture
def world(tmp_path: Path) -> Path:
    return make_world(tmp_path / "world")


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones too) -> its bytes, ``None`` for a folder."""
    return {
        p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


def stats(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Inode, mtime and bytes of every file under ``root`` except ``.sim/``."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and rel.parts[0] != ".sim":
            st = p.stat()
            out[rel.as_posix()] = (st.st_ino, st.st_mtime_ns, p.read_bytes())
    return out


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = read_json(path)
    change(data)
    write_json(path, data)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


# -- bad input: each case names the file, the field and what was expected; writes nothing ---


def _drop(*keys: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return change


def _set(value: Any, *keys: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return change


def _malformed(root: Path) -> None:
    (root / "characters" / "ada.json").write_bytes(b'{"identity": {"id": "ada",\n')


def _not_an_object(root: Path) -> None:
    (root / "characters" / "ada.json").write_bytes(b"[1, 2]\n")


def _file_named_bob(root: Path) -> None:
    (root / "characters" / "ada.json").unlink()
    write_json(root / "characters" / "Bob.json", character("Bob", "quay"))


def _duplicate_id(root: Path) -> None:
    write_json(root / "characters" / "quay.json", character("quay", "market"))


def _no_world_json(root: Path) -> None:
    (root / "world.json").unlink()


def _no_locations(root: Path) -> None:
    for kind in ("locations", "characters"):  # empty folders: a missing one is its own error
        shutil.rmtree(root / kind)
        (root / kind).mkdir()


def _edit(rel: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda root: edit(root / rel, change)


ADA = "characters/ada.json"
QUAY = "locations/quay.json"

# (test id, how to break the world, file at fault, field at fault, what was expected)
BAD_CASES: list[tuple[str, Callable[[Path], None], str, str | None, str]] = [
    ("malformed-json", _malformed, ADA, None, "malformed JSON: unexpected end of data: line 2"),
    ("top-level-not-object", _not_an_object, ADA, None, "expected a JSON object at the top level"),
    (
        "missing-identity",
        _edit(ADA, _drop("identity")),
        ADA,
        "identity",
        "required field is missing",
    ),
    (
        "missing-identity.name",
        _edit(ADA, _drop("identity", "name")),
        ADA,
        "identity.name",
        "required field is missing",
    ),
    (
        "missing-state.location",
        _edit(ADA, _drop("state", "location")),
        ADA,
        "state.location",
        "required field is missing",
    ),
    (
        "missing-state.connections",
        _edit(QUAY, _drop("state", "connections")),
        QUAY,
        "state.connections",
        "required field is missing",
    ),
    (
        "missing-world-name",
        _edit("world.json", _drop("name")),
        "world.json",
        "name",
        "required field is missing",
    ),
    (
        "missing-cell-text",
        _edit(ADA, _set([{"tick": 0}], "memory", "cells")),
        ADA,
        "memory.cells.0.text",
        "required field is missing",
    ),
    (
        "tick-string",
        _edit("world.json", _set("3", "tick")),
        "world.json",
        "tick",
        "expected a valid integer (got '3')",
    ),
    (
        "tick-bool",
        _edit("world.json", _set(True, "tick")),
        "world.json",
        "tick",
        "expected a valid integer (got True)",
    ),
    (
        "tick-negative",
        _edit("world.json", _set(-1, "tick")),
        "world.json",
        "tick",
        "expected greater than or equal to 0 (got -1)",
    ),
    (
        "goals-string",
        _edit(ADA, _set("x", "identity", "goals")),
        ADA,
        "identity.goals",
        "expected a valid list (got 'x')",
    ),
    (
        "capacity-0",
        _edit(ADA, _set(0, "memory", "capacity")),
        ADA,
        "memory.capacity",
        "expected greater than or equal to 1 (got 0)",
    ),
    (
        "capacity-float",
        _edit(ADA, _set(5.0, "memory", "capacity")),
        ADA,
        "memory.capacity",
        "expected a valid integer (got 5.0)",
    ),
    (
        "empty-name",
        _edit(ADA, _set("", "identity", "name")),
        ADA,
        "identity.name",
        "expected string should have at least 1 character (got '')",
    ),
    (
        "id-dotdot",
        _edit(ADA, _set("../x", "identity", "id")),
        ADA,
        "identity.id",
        f"expected an id matching {ID_PATTERN} (got '../x')",
    ),
    (
        "id-uppercase",
        _file_named_bob,
        "characters/Bob.json",
        "identity.id",
        f"expected an id matching {ID_PATTERN} (got 'Bob')",
    ),
    (
        "id-space",
        _edit(ADA, _set("a b", "identity", "id")),
        ADA,
        "identity.id",
        f"expected an id matching {ID_PATTERN} (got 'a b')",
    ),
    (
        "location-dotdot",
        _edit(ADA, _set("../x", "state", "location")),
        ADA,
        "state.location",
        f"expected an id matching {ID_PATTERN} (got '../x')",
    ),
    (
        "connection-space",
        _edit(QUAY, _set(["market", "a b"], "state", "connections")),
        QUAY,
        "state.connections.1",
        f"expected an id matching {ID_PATTERN} (got 'a b')",
    ),
    (
        "id-not-file-name",
        _edit(ADA, _set("bobby", "identity", "id")),
        ADA,
        "identity.id",
        "id 'bobby' must equal the file name 'ada'",
    ),
    (
        "duplicate-id",
        _duplicate_id,
        QUAY,
        "identity.id",
        "duplicate id 'quay': also used by characters/quay.json",
    ),
    (
        "unknown-location",
        _edit(ADA, _set("moon", "state", "location")),
        ADA,
        "state.location",
        "unknown location 'moon'; expected one of the ids in locations/",
    ),
    (
        "missing-connection",
        _edit(QUAY, _set(["market", "moon"], "state", "connections")),
        QUAY,
        "state.connections.1",
        "connection to missing location 'moon'",
    ),
    ("world-json-missing", _no_world_json, "world.json", None, "world.json is missing"),
    ("no-locations", _no_locations, "locations", None, "a world needs at least one location"),
]


@pytest.mark.parametrize(
    ("breaker", "rel", "field", "expected"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_bad_input_is_reported_and_nothing_is_written(
    world: Path,
    breaker: Callable[[Path], None],
    rel: str,
    field: str | None,
    expected: str,
) -> None:
    breaker(world)
    before = snapshot(world)
    with pytest.raises(InvalidWorld) as info:
        Storage(world).load()
    assert snapshot(world) == before
    err = info.value
    assert isinstance(err, SimError)
    message = str(err)
    where = f"{world / rel}: field '{field}': " if field else f"{world / rel}: "
    assert where + expected in message, message
    problem = err.problems[0]
    assert isinstance(problem, InputError)
    assert problem.path == world / rel
    assert problem.field == field


def test_world_folder_missing(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    before = snapshot(tmp_path)
    with pytest.raises(InputError) as info:
        Storage(root).load()
    assert isinstance(info.value, SimError)
    assert str(info.value) == f"{root}: world folder not found"
    assert info.value.path == root
    assert snapshot(tmp_path) == before


def test_several_problems_are_all_reported(world: Path) -> None:
    _malformed(world)
    edit(world / "characters" / "bob.json", _drop("identity", "name"))
    edit(world / "characters" / "bob.json", _set("3", "memory", "capacity"))
    edit(world / QUAY, _set(["market", "moon"], "state", "connections"))
    edit(world / "world.json", _set("x", "tick"))
    before = snapshot(world)
    with pytest.raises(InvalidWorld) as info:
        Storage(world).load()
    assert snapshot(world) == before
    message = str(info.value)
    assert message.startswith("world is invalid (5 problems):\n"), message
    for needle in (
        f"{world / ADA}: malformed JSON",
        f"{world}/characters/bob.json: field 'identity.name': required field is missing",
        f"{world}/characters/bob.json: field 'memory.capacity': expected a valid integer",
        f"{world / QUAY}: field 'state.connections.1': connection to missing location 'moon'",
        f"{world}/world.json: field 'tick': expected a valid integer (got 'x')",
    ):
        assert needle in message, message
    assert len(info.value.problems) == 5


def test_problems_are_reported_even_when_world_json_is_missing(world: Path) -> None:
    """docs/world-format.md: "sim reports every problem in a world at once".

    Regression: ``load()`` used to raise as soon as ``world.json`` was missing, hiding every
    other problem.
    """
    _no_world_json(world)
    _malformed(world)
    with pytest.raises(InvalidWorld) as info:
        Storage(world).load()
    message = str(info.value)
    assert f"{world}/world.json: world.json is missing" in message
    assert f"{world / ADA}: malformed JSON" in message


@pytest.mark.parametrize(
    ("breaker", "rel", "field"),
    [
        (_edit(QUAY, _drop("state", "connections")), QUAY, "state.connections"),
        (_edit(QUAY, _set(["market", "a b"], "state", "connections")), QUAY, "state.connections.1"),
        (_edit(QUAY, _set("", "identity", "name")), QUAY, "identity.name"),
    ],
    ids=["missing-connections", "bad-connection-id", "empty-name"],
)
def test_an_invalid_location_is_not_also_reported_as_unknown(
    world: Path, breaker: Callable[[Path], None], rel: str, field: str
) -> None:
    """One mistake, one problem.

    Regression: a location file that exists but failed validation was left out of
    ``locations``, so every reference to it was also reported, falsely, as "unknown location
    'quay'; expected one of the ids in locations/" / "connection to missing location 'quay'".
    """
    breaker(world)
    with pytest.raises(InvalidWorld) as info:
        Storage(world).load()
    message = str(info.value)
    assert [(p.path, p.field) for p in info.value.problems] == [(world / rel, field)], message


# -- unknown fields, normalisation, minimal rewrites ----------------------------------------


def test_unknown_fields_survive_a_commit(world: Path) -> None:
    def add_unknowns(data: dict[str, Any]) -> None:
        data["identity"]["nickname"] = "Ady"
        data["state"]["hp"] = {"now": 7, "max": 10}
        data["memory"]["style"] = "terse"
        data["memory"]["cells"][0]["weight"] = 0.25
        data["memory"]["cells"][0]["tags"] = ["dawn", None, True]
        data["zeta"] = [1, {"x": None}]
        data["alpha"] = "last but one"
        data["_openai"] = {"resolution_chain": ["resp_a1"], "usage": {"total_requests": 2}}

    edit(world / ADA, add_unknowns)
    edit(world / "world.json", _set({"k": "v", "n": [1, 2]}, "custom"))
    edit(world / QUAY, _set("old", "lore"))
    ada_before = read_json(world / ADA)
    quay_bytes = (world / QUAY).read_bytes()
    meta_bytes = (world / "world.json").read_bytes()

    storage = Storage(world)
    loaded = storage.load()
    loaded.characters["ada"]["state"]["mood"] = "happy"
    assert storage.commit(loaded) == [ADA]
    assert (world / QUAY).read_bytes() == quay_bytes
    assert (world / "world.json").read_bytes() == meta_bytes

    reloaded = Storage(world).load()
    ada = reloaded.characters["ada"]
    expected = json.loads(json.dumps(ada_before))
    expected["state"]["mood"] = "happy"
    assert ada == expected
    # unknown keys keep their original order, after the known ones
    assert list(ada) == ["identity", "state", "memory", "zeta", "alpha", "_openai"]
    assert list(ada["identity"])[-1] == "nickname"
    assert list(ada["memory"]["cells"][0]) == ["tick", "text", "weight", "tags"]
    assert read_json(world / ADA) == expected
    assert reloaded.meta["custom"] == {"k": "v", "n": [1, 2]}
    assert reloaded.locations["quay"]["lore"] == "old"

    # the unknown field of world.json survives a commit of world.json too
    reloaded.meta["tick"] = 1
    assert Storage(world).commit(reloaded) == ["world.json"]
    assert read_json(world / "world.json") == {
        "name": "Test",
        "description": "",
        "tick": 1,
        "seed": 1,
        "custom": {"k": "v", "n": [1, 2]},
    }


def test_unknown_big_integer_is_not_silently_changed(world: Path) -> None:
    """docs/world-format.md: unknown fields survive every save unchanged.

    Regression: orjson parses integers beyond 64 bits as floats, so an unknown
    ``"big": 123456789012345678901234567890`` was saved back as ``1.2345678901234568e+29``.
    Keeping it exactly, or rejecting the file with an ``InvalidWorld`` naming the file and
    the field, are both acceptable.
    """
    big = "123456789012345678901234567890"
    path = world / ADA
    path.write_text(path.read_text()[:-2] + f',\n  "big": {big}\n}}\n')
    storage = Storage(world)
    try:
        loaded = storage.load()
    except InvalidWorld as exc:
        assert f"{path}: field 'big'" in str(exc)
        return
    loaded.characters["ada"]["state"]["mood"] = "happy"
    storage.commit(loaded)
    assert f'"big": {big}' in path.read_text()


def test_commit_without_change_writes_no_world_file(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    shutil.copytree(DEMO, root)
    shutil.rmtree(root / ".sim", ignore_errors=True)
    before = stats(root)
    storage = Storage(root)
    loaded = storage.load()
    assert storage.changed_files(loaded) == {}
    assert storage.commit(loaded) == []
    assert stats(root) == before
    assert not storage.pending_journal()
    assert list((root / ".sim").glob("*")) == []  # no journal left behind


def test_commit_writes_only_what_changed(world: Path) -> None:
    storage = Storage(world)
    loaded = storage.load()
    before = stats(world)
    loaded.characters["bob"]["memory"]["cells"].append({"tick": 1, "text": "Saw Ada."})
    assert storage.commit(loaded) == ["characters/bob.json"]
    after = stats(world)
    assert {rel for rel in before if before[rel] != after[rel]} == {"characters/bob.json"}
    # the world now remembers what it wrote: committing again writes nothing
    assert storage.commit(loaded) == []
    assert stats(world) == after


def test_normalisation_fills_defaults_and_orders_keys(world: Path) -> None:
    path = world / "characters" / "cleo.json"
    path.write_text(
        '{"mystery": {"z": 1, "a": 2}, "state": {"extra": true, "location": "quay"},\n'
        '"identity": {"name": "Cleo", "hobby": "knots", "id": "cleo"}}',
        encoding="utf-8",
    )
    storage = Storage(world)
    loaded = storage.load()
    cleo = loaded.characters["cleo"]
    assert cleo == {
        "identity": {
            "id": "cleo",
            "name": "Cleo",
            "description": "",
            "personality": "",
            "goals": [],
            "hobby": "knots",
        },
        "state": {"location": "quay", "mood": "", "inventory": [], "extra": True},
        "memory": {"capacity": 5, "cells": [], "summary": ""},
        "mystery": {"z": 1, "a": 2},
    }
    assert list(cleo) == ["identity", "state", "memory", "mystery"]
    assert list(cleo["identity"]) == ["id", "name", "description", "personality", "goals", "hobby"]
    assert list(cleo["state"]) == ["location", "mood", "inventory", "extra"]
    assert list(cleo["mystery"]) == ["z", "a"]

    # an unnormalised file is rewritten on the next commit, in the one format
    assert storage.commit(loaded) == ["characters/cleo.json"]
    assert path.read_text(encoding="utf-8") == (
        "{\n"
        '  "identity": {\n'
        '    "id": "cleo",\n'
        '    "name": "Cleo",\n'
        '    "description": "",\n'
        '    "personality": "",\n'
        '    "goals": [],\n'
        '    "hobby": "knots"\n'
        "  },\n"
        '  "state": {\n'
        '    "location": "quay",\n'
        '    "mood": "",\n'
        '    "inventory": [],\n'
        '    "extra": true\n'
        "  },\n"
        '  "memory": {\n'
        '    "capacity": 5,\n'
        '    "cells": [],\n'
        '    "summary": ""\n'
        "  },\n"
        '  "mystery": {\n'
        '    "z": 1,\n'
        '    "a": 2\n'
        "  }\n"
        "}\n"
    )
    assert Storage(world).load().characters["cleo"] == cleo


def test_committed_files_are_utf8_not_escaped(world: Path) -> None:
    storage = Storage(world)
    loaded = storage.load()
    loaded.characters["ada"]["state"]["mood"] = "wary — “watchful”"
    storage.commit(loaded)
    raw = (world / ADA).read_bytes()
    assert "wary — “watchful”".encode() in raw
    assert raw.endswith(b"}\n") and not raw.endswith(b"\n\n")


# -- commit: extra files --------------------------------------------------------------------


def test_commit_writes_and_deletes_extra_files(world: Path) -> None:
    storage = Storage(world)
    loaded = storage.load()
    loaded.characters["ada"]["state"]["mood"] = "busy"
    written = storage.commit(
        loaded,
        {
            ".sim/responses/memory/ada.json": b'{"exchanges": [1]}\n',
            ".sim/log/rewound-1/tick-000001.jsonl": "tick 1 — done\n".encode(),
        },
    )
    assert written == [
        ".sim/log/rewound-1/tick-000001.jsonl",
        ".sim/responses/memory/ada.json",
        ADA,
    ]
    assert (world / ".sim/responses/memory/ada.json").read_bytes() == b'{"exchanges": [1]}\n'
    log = world / ".sim/log/rewound-1/tick-000001.jsonl"
    assert log.read_text(encoding="utf-8") == "tick 1 — done\n"
    assert read_json(world / ADA)["state"]["mood"] == "busy"

    removed = storage.commit(
        loaded,
        {
            ".sim/log/rewound-1/tick-000001.jsonl": None,
            ".sim/responses/intention/ada.json": None,
            ".sim/responses/never/existed.json": None,
        },
    )
    assert removed == [
        ".sim/log/rewound-1/tick-000001.jsonl",
        ".sim/responses/intention/ada.json",
        ".sim/responses/never/existed.json",
    ]
    assert not log.exists()
    assert not (world / ".sim/responses/intention/ada.json").exists()
    assert (world / ".sim/responses/memory/ada.json").is_file()
    leftovers = [p for p in world.rglob("*") if p.name.endswith((".sim-tmp", ".tmp"))]
    assert leftovers == []
    assert not storage.pending_journal()


@pytest.mark.parametrize("rel", ["../x", "notes/../../x", "/tmp/sim-escape-test", "/etc/passwd"])
def test_commit_refuses_paths_outside_the_world(tmp_path: Path, rel: str) -> None:
    root = make_world(tmp_path / "world")
    shutil.rmtree(root / ".sim")  # commit must not even create .sim/
    storage = Storage(root)
    loaded = storage.load()
    loaded.characters["ada"]["state"]["mood"] = "escaping"
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="refusing to write outside the world folder"):
        storage.commit(loaded, {".sim/responses/memory/ada.json": b"{}", rel: b"evil"})
    assert snapshot(tmp_path) == before
    assert not Path("/tmp/sim-escape-test").exists()


@pytest.mark.parametrize(
    "rel",
    ["", ".", "characters", "world.json/x", ".sim/journal.json", ".sim/journal.tmp"],
)
def test_commit_refuses_unwritable_or_reserved_paths(tmp_path: Path, rel: str) -> None:
    """A path the journal can never apply must be refused before the commit point.

    Regression: ``_check_rel`` used to refuse only absolute paths and ``..``. ``""``/``"."``
    made ``_apply`` write ``<world>.sim-tmp`` *outside* the world folder; ``""``, ``"."``,
    ``"characters"`` (a folder) and ``"world.json/x"`` (under a file) were committed to the
    journal and then failed in ``_apply`` — and again in every ``recover()``, so the world
    could never run again. ``.sim/journal.json`` / ``.sim/journal.tmp`` overwrote the
    journal itself.
    """
    root = make_world(tmp_path / "world")
    storage = Storage(root)
    loaded = storage.load()
    loaded.characters["ada"]["state"]["mood"] = "stuck"
    before = snapshot(tmp_path)
    with pytest.raises(ValueError):
        storage.commit(loaded, {rel: b"{}"})
    assert snapshot(tmp_path) == before
    assert storage.recover() is False


# -- recover --------------------------------------------------------------------------------


#: a response-store file as the store writes one (a journal may hold nothing else there)
STORE_FILE = '{\n  "resp_1": {\n    "input": "hi",\n    "output": "hello"\n  }\n}\n'


def test_recover_replays_a_committed_journal(world: Path) -> None:
    ada = read_json(world / ADA)
    ada["state"]["mood"] = "recovered"
    ada["memory"]["cells"].append({"tick": 1, "text": "A crash, then morning."})
    meta = read_json(world / "world.json")
    meta["tick"] = 1
    journal = {
        "version": 1,
        "files": {
            ADA: text(ada),
            "world.json": text(meta),
            ".sim/responses/memory/ada.json": STORE_FILE,
            ".sim/responses/intention/ada.json": None,
        },
    }
    (world / ".sim" / "journal.json").write_bytes(json.dumps(journal).encode())
    bob_bytes = (world / "characters" / "bob.json").read_bytes()

    storage = Storage(world)
    assert storage.pending_journal()
    with storage.lock():
        assert storage.recover() is True
    assert not storage.pending_journal()
    assert not (world / ".sim" / "journal.json").exists()
    assert (world / ADA).read_text(encoding="utf-8") == text(ada)
    assert (world / "world.json").read_text(encoding="utf-8") == text(meta)
    assert (world / ".sim/responses/memory/ada.json").read_text() == STORE_FILE
    assert not (world / ".sim/responses/intention/ada.json").exists()
    assert (world / "characters" / "bob.json").read_bytes() == bob_bytes
    loaded = storage.load()
    assert loaded.tick == 1
    assert loaded.characters["ada"]["state"]["mood"] == "recovered"
    # recovering twice is harmless
    assert storage.recover() is False


def _pending_journal(world: Path) -> dict[str, Any]:
    """Leave a committed, unapplied tick 1 (as a crash after the commit point does)."""
    ada = read_json(world / ADA)
    ada["state"]["mood"] = "from the journal"
    meta = read_json(world / "world.json")
    meta["tick"] = 1
    journal = {"version": 1, "files": {ADA: text(ada), "world.json": text(meta)}}
    (world / ".sim" / "journal.json").write_bytes(json.dumps(journal).encode())
    return journal


def test_load_reads_through_a_pending_journal_and_writes_nothing(world: Path) -> None:
    _pending_journal(world)
    before = snapshot(world)
    loaded = Storage(world).load()
    assert snapshot(world) == before
    assert loaded.tick == 1
    assert loaded.characters["ada"]["state"]["mood"] == "from the journal"
    assert loaded.characters["bob"]["state"]["mood"] == "calm"


def test_commit_over_a_pending_journal_keeps_its_files(world: Path) -> None:
    """A commit made without ``recover()`` first must not drop the pending tick's files.

    ``load()`` reads through a pending journal, so ``ada.json`` and ``world.json`` look
    unchanged to ``changed_files``; if the new journal leaves them out and replaces the old
    one, the pending tick-1 files are lost and the disk ends up a mix of ticks. Refusing
    the commit before writing anything would also be acceptable.
    """
    _pending_journal(world)
    storage = Storage(world)
    loaded = storage.load()
    loaded.characters["bob"]["state"]["mood"] = "tick 2"
    loaded.meta["tick"] = 2
    before = snapshot(world)
    try:
        storage.commit(loaded)
    except SimError:
        assert snapshot(world) == before
        return
    assert not storage.pending_journal()
    on_disk = {rel: read_json(world / rel) for rel in (ADA, "characters/bob.json", "world.json")}
    assert on_disk[ADA]["state"]["mood"] == "from the journal"
    assert on_disk["characters/bob.json"]["state"]["mood"] == "tick 2"
    assert on_disk["world.json"]["tick"] == 2


def test_recover_discards_an_uncommitted_journal(world: Path) -> None:
    ada = read_json(world / ADA)
    ada["state"]["mood"] = "never happened"
    half = json.dumps({"version": 1, "files": {ADA: text(ada)}}).encode()
    (world / ".sim" / "journal.tmp").write_bytes(half[: len(half) // 2])
    before = snapshot(world)
    storage = Storage(world)
    assert not storage.pending_journal()
    assert storage.recover() is False
    after = snapshot(world)
    assert ".sim/journal.tmp" not in after
    del before[".sim/journal.tmp"]
    assert after == before
    assert storage.load().characters["ada"]["state"]["mood"] == "calm"


def test_recover_with_nothing_to_do_writes_nothing(tmp_path: Path) -> None:
    root = make_world(tmp_path / "world")
    shutil.rmtree(root / ".sim")
    before = snapshot(tmp_path)
    assert Storage(root).recover() is False
    assert snapshot(tmp_path) == before


def test_recover_refuses_a_journal_escaping_the_world(tmp_path: Path) -> None:
    root = make_world(tmp_path / "world")
    journal = {"version": 1, "files": {"../evil.txt": "x", ADA: "{}"}}
    (root / ".sim" / "journal.json").write_text(json.dumps(journal))
    before = snapshot(tmp_path)
    with pytest.raises(CorruptJournal, match="outside the world folder"):
        Storage(root).recover()
    assert snapshot(tmp_path) == before


# -- lock -----------------------------------------------------------------------------------

LOCKED = "another sim process is running this world"


def test_lock_in_process(world: Path) -> None:
    with Storage(world).lock():
        with pytest.raises(WorldLockedError) as info, Storage(world).lock():
            pass
        assert isinstance(info.value, SimError)
        assert f"{world}: {LOCKED}" in str(info.value)
    with Storage(world).lock():
        pass


def test_lock_is_released_when_the_body_raises(world: Path) -> None:
    with pytest.raises(RuntimeError), Storage(world).lock():
        raise RuntimeError("boom")
    with Storage(world).lock():
        pass


def test_lock_on_a_missing_world_folder(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(SimError, match="world folder not found"), Storage(root).lock():
        pass
    assert not root.exists()


HOLD_LOCK = """
import sys
from pathlib import Path
from sim.storage import Storage

with Storage(Path(sys.argv[1])).lock():
    print("locked", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def test_lock_held_by_another_process(world: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(world)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "locked"
        for _ in range(2):  # a refused attempt leaves the holder's lock in place
            with pytest.raises(WorldLockedError) as info, Storage(world).lock():
                pass
            assert f"{world}: {LOCKED}" in str(info.value)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "released"
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with Storage(world).lock():
        pass


def test_lock_of_a_killed_process_is_released(world: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(world)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(WorldLockedError), Storage(world).lock():
            pass
    finally:
        child.kill()
        child.wait()
    with Storage(world).lock():
        pass


@pytest.mark.parametrize(
    "name", ["ada.json", ".json", "..json", "a.b.json", "x.json.json", "odd", ".hidden", "a.txt"]
)
def test_stem_of_an_entity_file_is_paths_stem(name: str) -> None:
    from sim.storage.store import _stem

    assert _stem(f"characters/{name}") == Path(name).stem


def test_keys_the_engine_appended_are_put_in_order_on_load(world: Path) -> None:
    """A file laid out as a tick leaves it (a memory's archive after its plan, an inbox
    after a field of the world's own, an integral trust) loads in normal form, as the
    model's dump gives it, and is rewritten so on the next commit."""
    path = world / "characters" / "cleo.json"
    cleo = character("cleo", "quay")
    cleo["memory"]["plan"] = {"date": "2026-11-29", "items": []}
    cleo["memory"]["archive"] = [{"tick": 0, "text": "Long ago.", "importance": 3}]
    cleo["relationships"] = {"ada": {"kind": "friend", "trust": 1}}
    cleo["_notes"] = "mine"
    cleo["inbox"] = [{"tick": 1, "from": "ada", "text": "Hello."}]
    write_json(path, cleo)
    storage = Storage(world)
    loaded = storage.load()
    got = loaded.characters["cleo"]
    assert list(got) == ["identity", "state", "memory", "relationships", "inbox", "_notes"]
    assert list(got["memory"]) == ["capacity", "cells", "summary", "archive", "plan"]
    assert got["relationships"]["ada"]["trust"] == 1.0
    assert isinstance(got["relationships"]["ada"]["trust"], float)
    assert storage.commit(loaded) == ["characters/cleo.json"]
    assert Storage(world).load().characters["cleo"] == got


def test_keys_a_tick_appends_are_committed_in_order(world: Path) -> None:
    """What a phase appends to an entity it holds (a memory's ``unreflected`` after its
    plan, its archive after both, relationships and an inbox after a field of the
    world's own, an integral trust) is written in normal form, in the world too, so the
    next load keeps the file as parsed and finds nothing to write."""
    storage = Storage(world)
    loaded = storage.load()
    ada = loaded.characters["ada"]
    ada["_openai"] = {"usage": {}}
    ada["memory"]["plan"] = {"date": "2026-11-29", "items": []}
    ada["memory"]["unreflected"] = 4
    ada["memory"]["archive"] = [{"tick": 0, "text": "Long ago.", "importance": 3}]
    ada["relationships"] = {"bob": {"trust": 1, "kind": "friend"}}
    ada["inbox"] = [{"tick": 1, "from": "bob", "text": "Hello."}]
    changed = storage.changed_files(loaded)
    assert list(changed) == ["characters/ada.json"]
    assert loaded.characters["ada"] is ada  # put in order in place
    assert list(ada) == ["identity", "state", "memory", "relationships", "inbox", "_openai"]
    assert list(ada["memory"]) == ["capacity", "cells", "summary", "archive", "unreflected", "plan"]
    assert list(ada["relationships"]["bob"]) == ["kind", "trust"]
    assert type(ada["relationships"]["bob"]["trust"]) is float
    storage.commit(loaded, changed=changed)
    again = Storage(world)
    reloaded = again.load()
    assert reloaded.originals["characters/ada.json"] == changed["characters/ada.json"]
    assert again.changed_files(reloaded) == {}
    assert reloaded.characters["ada"] == ada


def test_an_entity_only_reordered_is_not_rewritten(world: Path) -> None:
    """A key popped and put back (an inbox read, then a message in it again) changes the
    dict's order, not its file: nothing is written."""
    storage = Storage(world)
    loaded = storage.load()
    bob = loaded.characters["bob"]
    bob["memory"] = bob.pop("memory")  # now after a field it comes before
    bob["state"]["location"] = bob["state"].pop("location")
    assert storage.changed_files(loaded) == {}
    assert list(bob) == ["identity", "state", "memory"]
    assert list(bob["state"]) == ["location", "mood", "inventory"]


def test_normal_bytes_is_the_file_a_commit_writes_once_loaded(world: Path) -> None:
    """Two layouts of one state have the same normal bytes; another state, a file that
    does not load or one that is not an entity's have none to compare."""
    from sim.storage import dump_json, normal_bytes

    raw = (world / "characters" / "ada.json").read_bytes()
    assert normal_bytes("characters/ada.json", raw) == raw
    ada = read_json(world / "characters" / "ada.json")
    shuffled = {"memory": ada["memory"], **ada, "relationships": {"bob": {"trust": 1, "kind": "x"}}}
    want = {**ada, "relationships": {"bob": {"kind": "x", "trust": 1.0}}}
    assert normal_bytes("characters/ada.json", text(shuffled).encode()) == dump_json(want)
    assert normal_bytes("locations/quay.json", raw) is None  # not a location
    assert normal_bytes("characters/ada.json", b"{") is None
    assert normal_bytes("characters/ada.json", b"[1]") is None
    deep = {**ada, "deep": json.loads("[" * 300 + "]" * 300)}
    assert normal_bytes("characters/ada.json", json.dumps(deep).encode()) is None
    assert normal_bytes(".sim/responses/intention/ada.json", raw) is None
    assert normal_bytes("world.json", (world / "world.json").read_bytes()) is not None
