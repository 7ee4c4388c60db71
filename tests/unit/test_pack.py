"""A packed world (``sim.pack``, ``sim.storage.forms``): the same world as its folders,
loaded and committed through one file; a pack is untrusted input like any world file.
Real files in real folders."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from conftest import copy_demo, tree

from sim.bundle import bundle_chunks
from sim.errors import InputError, InvalidWorld
from sim.pack import PACK, PACK_MAGIC, PACK_TMP, read_pack
from sim.safefs import UnsafePath
from sim.storage import Storage
from sim.storage.forms import UNPACKING, pack, unpack


def _packed(tmp_path: Path) -> Path:
    world = copy_demo(tmp_path / "world")
    pack(world)
    return world


def _write(world: Path, files: dict[str, bytes | None]) -> None:
    (world / PACK).write_bytes(b"".join(bundle_chunks(PACK_MAGIC, files)))


def test_a_packed_world_loads_as_its_folders_and_unpacks_to_the_same_files(
    tmp_path: Path,
) -> None:
    folders = copy_demo(tmp_path / "folders")
    before = tree(folders)
    world = _packed(tmp_path)
    assert sorted(os.listdir(world)) == ["world.json", PACK]
    assert Storage(world).load().originals == Storage(folders).load().originals
    moved = unpack(world)
    assert (moved.files, moved.finished) == (len(before) - 1, False)
    assert tree(world) == before


@pytest.mark.parametrize("whole", [False, True])
def test_a_commit_replaces_the_pack_whole_and_never_writes_through_a_planted_link(
    tmp_path: Path, whole: bool
) -> None:
    """Made from the pack read again, or from a whole world's files in memory (a tick's):
    the same pack."""
    world = _packed(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me")
    os.symlink(outside, world / PACK_TMP)  # the next pack's scratch name, planted
    storage = Storage(world)
    loaded = storage.load()
    for character in loaded.characters.values():
        character["state"]["mood"] = "packed"
    loaded.meta["tick"] = 1
    written = storage.commit(loaded, whole=whole)
    assert outside.read_bytes() == b"keep me"
    assert sorted(os.listdir(world)) == [".sim", "world.json", PACK]  # no folder, no scratch
    assert any(rel.startswith("characters/") for rel in written)
    again = Storage(world).load()
    assert again.tick == 1
    assert {c["state"]["mood"] for c in again.characters.values()} == {"packed"}
    assert again.originals == loaded.originals
    other = _packed(tmp_path / "other")
    storage = Storage(other)
    second = storage.load()
    for character in second.characters.values():
        character["state"]["mood"] = "packed"
    second.meta["tick"] = 1
    storage.commit(second, whole=not whole)
    assert (other / PACK).read_bytes() == (world / PACK).read_bytes()


@pytest.mark.parametrize(
    ("files", "field", "problem"),
    [
        ({"../outside.json": b"{}"}, "../outside.json", "expected only entity files"),
        ({".sim/journal.json": b"{}"}, ".sim/journal.json", "expected only entity files"),
        ({"characters/ada.json": None}, "characters/ada.json", "not deletions"),
        (
            {"characters/ada.json": b" " * 2048},
            "characters/ada.json",
            "over the limit of 1024 ([limits] max_entity_bytes)",
        ),
    ],
)
def test_a_pack_holding_what_no_pack_holds_is_refused_by_name(
    tmp_path: Path, files: dict[str, bytes | None], field: str, problem: str
) -> None:
    world = _packed(tmp_path)
    _write(world, files)
    with pytest.raises(InvalidWorld) as caught:
        Storage(world, max_entity_bytes=1024).load()
    (error,) = [p for p in caught.value.problems if p.path == world / PACK]
    assert (error.field, problem in error.problem) == (field, True), error


@pytest.mark.parametrize(
    ("cut", "problem"),
    [
        (lambda raw: raw[:-10], "truncated"),
        (lambda raw: b"sim-journal 2\n" + raw[len(PACK_MAGIC) :], "does not start with"),
        (lambda raw: raw.replace(b'"size":', b'"size":-', 1), "expected a size"),
    ],
)
def test_a_pack_that_is_not_one_is_refused_naming_it(
    tmp_path: Path, cut: object, problem: str
) -> None:
    world = _packed(tmp_path)
    raw = (world / PACK).read_bytes()
    (world / PACK).write_bytes(cut(raw))  # type: ignore[operator]
    with pytest.raises(InvalidWorld) as caught:
        Storage(world).load()
    assert str(world / PACK) in str(caught.value)
    assert problem in str(caught.value)


def test_an_entity_problem_inside_a_pack_names_the_pack_the_file_and_the_field(
    tmp_path: Path,
) -> None:
    world = _packed(tmp_path)
    files = read_pack(world, None)
    ada = orjson.loads(files["characters/ada.json"])
    ada["state"]["location"] = "atlantis"
    files["characters/ada.json"] = orjson.dumps(ada)
    _write(world, dict(files))
    with pytest.raises(InvalidWorld) as caught:
        Storage(world).load()
    (error,) = caught.value.problems
    assert error.path == world / PACK / "characters" / "ada.json"
    assert error.field == "state.location"
    assert "unknown location 'atlantis'" in error.problem


def test_a_linked_pack_is_refused_and_nothing_outside_is_read(tmp_path: Path) -> None:
    world = _packed(tmp_path)
    outside = tmp_path / "elsewhere.pack"
    (world / PACK).rename(outside)
    os.symlink(outside, world / PACK)
    with pytest.raises(InvalidWorld) as caught:
        Storage(world).load()
    assert isinstance(caught.value.problems[-1], UnsafePath)
    os.unlink(world / PACK)
    os.link(outside, world / PACK)  # a hard link: a file with another name
    with pytest.raises(InvalidWorld, match="link"):
        Storage(world).load()


def test_both_forms_are_refused_and_a_file_not_the_packs_is_never_removed(
    tmp_path: Path,
) -> None:
    world = _packed(tmp_path)
    (world / "characters").mkdir()
    edited = world / "characters" / "ada.json"
    edited.write_bytes(b'{"edited": "by hand"}\n')
    with pytest.raises(InvalidWorld, match="beside its pack"):
        Storage(world).load()
    before = tree(world)
    for command in (pack, unpack):
        with pytest.raises(InputError) as caught:
            command(world)
        assert caught.value.path == edited
        assert "holds otherwise" in caught.value.problem
        assert tree(world) == before  # nothing written, nothing removed
    edited.unlink()  # a file the pack holds, byte for byte, is one an interrupted run left
    (world / "characters" / "ada.json").write_bytes(read_pack(world, None)["characters/ada.json"])
    assert pack(world).finished
    assert sorted(os.listdir(world)) == ["world.json", PACK]


def test_an_unpack_marked_as_running_writes_its_own_cut_files_again(tmp_path: Path) -> None:
    world = _packed(tmp_path)
    files = read_pack(world, None)
    (world / ".sim").mkdir()
    (world / UNPACKING).write_bytes(b"sim unpack\n")
    (world / "characters").mkdir()
    (world / "characters" / "ada.json").write_bytes(files["characters/ada.json"][:20])
    moved = unpack(world)
    assert moved.finished
    assert not (world / UNPACKING).exists() and not (world / PACK).exists()
    assert (world / "characters" / "ada.json").read_bytes() == files["characters/ada.json"]
    Storage(world).load()


def test_pack_refuses_a_folder_holding_anything_but_entity_files(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "world")
    notes = world / "characters" / "notes.txt"
    notes.write_text("mine")
    before = tree(world)
    with pytest.raises(InputError) as caught:
        pack(world)
    assert caught.value.path == notes
    assert tree(world) == before
    with pytest.raises(InputError, match="packed already"):
        notes.unlink()
        pack(world)
        pack(world)
    with pytest.raises(InputError, match="not packed"):
        unpack(world)
        unpack(world)
