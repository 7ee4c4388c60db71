"""Untrusted state inside a world folder, round three (issue 24): hard links out of the
world, crafted commit journals, damaged history that `sim check` must name, huge
numbers, bad templates, and forks. Each case is refused by name, exits non-zero, and
leaves the world (and everything outside it) byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import cast

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import copy_demo, tree

import sim.storage.store as storage_module
from sim import safefs
from sim.cli import main
from sim.engine.rewind import rewind
from sim.storage import Storage
from sim.ticklog.writer import LogWriter

ADA = "characters/ada.json"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def clean_exit(result: Result, code: int) -> None:
    """Exited with ``code`` through SystemExit (never an uncaught exception)."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output


@pytest.fixture
def world(tmp_path: Path) -> Path:
    return copy_demo(tmp_path / "w")


def copy_world(world: Path, dest: Path) -> Path:
    shutil.copytree(world, dest, symlinks=True)
    return dest


def everything(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``, logs included: a file's bytes, or what else it is."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            out[rel] = "special"
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = "folder"
    return out


# -- item 3: hard links ------------------------------------------------------------------------


def test_a_hard_linked_entity_file_is_refused_and_the_outside_file_untouched(
    world: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.json"
    outside.write_bytes((world / ADA).read_bytes())
    before = outside.read_bytes()
    (world / ADA).unlink()
    os.link(outside, world / ADA)
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert f"{world / ADA}: is a hard link (2 names share this file" in result.output
    assert outside.read_bytes() == before
    assert not (world / ".sim" / "log").exists()


def test_a_commit_write_breaks_a_hard_link_instead_of_writing_through_it(
    tmp_path: Path,
) -> None:
    world, outside = tmp_path / "w", tmp_path / "outside.json"
    world.mkdir()
    outside.write_bytes(b"precious\n")
    os.link(outside, world / "f.json")
    with safefs.open_dir(world, []) as dir_fd:
        safefs.write_at(dir_fd, "f.json", world / "f.json", b"new\n", sync=True)
    assert outside.read_bytes() == b"precious\n"
    assert (world / "f.json").read_bytes() == b"new\n"
    assert os.stat(world / "f.json").st_nlink == 1
    assert os.stat(outside).st_nlink == 1


def test_an_append_refuses_a_hard_linked_file(tmp_path: Path) -> None:
    world, outside = tmp_path / "w", tmp_path / "outside.jsonl"
    (world / ".sim").mkdir(parents=True)
    outside.write_bytes(b"")
    os.link(outside, world / ".sim" / "a.jsonl")
    with pytest.raises(safefs.UnsafePath, match="hard link"):
        safefs.append_file(world, ".sim/a.jsonl", b"x\n")
    assert outside.read_bytes() == b""


# -- item 10: numbers beyond what a world can hold ----------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("tick", 18446744073709551615, "world.json"),
        ("tick", 1_000_000_000, "world.json"),
        ("seed", 2**64 - 1, "world.json"),
        ("seed", -(2**63) - 1, "world.json"),
    ],
)
def test_a_huge_number_in_world_json_is_refused_by_check_and_tick(
    world: Path, field: str, value: int, where: str
) -> None:
    meta = json.loads((world / "world.json").read_text())
    meta[field] = value
    (world / "world.json").write_text(json.dumps(meta, indent=2))
    before = everything(world)
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert f"{world / where}: field '{field}': " in result.output
    assert everything(world) == before


def test_a_world_at_the_last_tick_number_runs_no_tick_and_leaves_no_temp_file(
    world: Path,
) -> None:
    meta = (world / "world.json").read_text()
    (world / "world.json").write_text(meta.replace('"tick": 0', '"tick": 999999999'))
    assert '"tick": 999999999' in (world / "world.json").read_text()
    before = everything(world)
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 2)
    assert "the last a world may reach (999999999)" in result.output
    assert everything(world) == before


def test_a_huge_memory_tick_is_refused_by_name(world: Path) -> None:
    text = (world / ADA).read_text()
    assert '"cells": [' in text
    (world / ADA).write_text(
        text.replace('"cells": [', '"cells": [{"tick": 18446744073709551615, "text": "x"},', 1)
    )
    result = invoke("check", "--world", str(world))
    clean_exit(result, 2)
    assert f"{world / ADA}: field 'memory.cells.0.tick'" in result.output


# -- item 11: a template that fails to render writes nothing -----------------------------------


def test_a_template_error_found_by_tick_leaves_the_world_tree_as_it_was(world: Path) -> None:
    (world / "prompts").mkdir()
    (world / "prompts" / "intentions.md").write_text("Hello {{ character.nope.deeper }}\n")
    before = everything(world)
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 2)
    assert "intentions.md:1: undefined name" in result.output
    assert everything(world) == before
    assert not (world / ".sim").exists()


def test_a_template_error_after_a_tick_keeps_the_history_and_writes_nothing_new(
    world: Path,
) -> None:
    clean_exit(invoke("tick", "--world", str(world)), 0)
    (world / "prompts").mkdir()
    (world / "prompts" / "intentions.md").write_text("Hello {{ character.nope.deeper }}\n")
    before = everything(world)
    clean_exit(invoke("tick", "--world", str(world)), 2)
    assert everything(world) == before


def test_a_log_that_cannot_be_written_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / ".sim" / "log" / "tick-000001.jsonl"
    with pytest.raises(TypeError):
        LogWriter.create(path, [[b"{", cast(bytes, object())]])
    assert list(path.parent.iterdir()) == []


# -- items 12 and 21: sim fork --------------------------------------------------------------------


def test_a_fork_inside_its_own_world_is_refused(world: Path) -> None:
    clean_exit(invoke("tick", "--world", str(world)), 0)
    before = everything(world)
    for dest in (world / "branch", world / "characters" / "deep" / "er", world):
        result = invoke("fork", "--world", str(world), "--tick", "1", "--to", str(dest))
        clean_exit(result, 2)
        assert "the fork's folder is inside the world it forks" in result.output
    assert everything(world) == before


def test_a_fork_whose_folder_holds_the_world_is_refused(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "outer" / "w")
    result = invoke("fork", "--world", str(world), "--tick", "1", "--to", str(tmp_path))
    clean_exit(result, 2)
    assert "is inside the fork's folder" in result.output


def test_the_readme_rewind_then_fork_sequence(world: Path, tmp_path: Path) -> None:
    clean_exit(invoke("tick", "--world", str(world), "--ticks", "3"), 0)
    clean_exit(invoke("replay", "--world", str(world), "--tick", "1", "--to", "3"), 0)
    clean_exit(invoke("rewind", "--world", str(world), "--tick", "2"), 0)
    branch = tmp_path / "branch"
    result = invoke("fork", "--world", str(world), "--tick", "2", "--to", str(branch))
    clean_exit(result, 0)
    assert "is at tick 1, ready to run tick 2" in result.output
    assert tree(branch / "characters") == tree(world / "characters")
    assert sorted(p.name for p in (branch / ".sim" / "log").iterdir()) == [
        "tick-000001.jsonl.zst",
        "tick-000001.summary.jsonl.gz",
    ]
    # both go on alike: the fork is the world as it stood
    clean_exit(invoke("tick", "--world", str(world)), 0)
    clean_exit(invoke("tick", "--world", str(branch)), 0)
    assert tree(branch) == tree(world)


def test_a_fork_at_the_current_tick_copies_the_world_as_it_is(world: Path, tmp_path: Path) -> None:
    clean_exit(invoke("tick", "--world", str(world), "--ticks", "2"), 0)
    clean_exit(invoke("inject", "--world", str(world), "--at", "quay", "A ship arrives"), 0)
    before = everything(world)
    now = tmp_path / "now"
    result = invoke("fork", "--world", str(world), "--tick", "3", "--to", str(now))
    clean_exit(result, 0)
    assert everything(world) == before
    assert tree(now) == tree(world)  # state, response store, pending interventions
    assert (now / ".sim" / "interventions.json").is_file()
    late = invoke("fork", "--world", str(world), "--tick", "4", "--to", str(tmp_path / "x"))
    clean_exit(late, 2)
    assert "expected 1..3 for a world at tick 2 (got 4" in late.output


# -- item 4: a crafted journal is refused whole, before any of it is applied -------------------


def write_journal_v1(world: Path, files: dict[str, str | None]) -> Path:
    (world / ".sim").mkdir(exist_ok=True)
    path = world / ".sim" / "journal.json"
    path.write_bytes(orjson.dumps({"version": 1, "files": files}))
    return path


def _bad_character() -> str:
    return '{"identity": {"id": "zed"}, "state": {}}\n'


@pytest.fixture
def ticked(world: Path) -> Path:
    clean_exit(invoke("tick", "--world", str(world)), 0)
    return world


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({ADA: "{garbage"}, "would write an invalid world (characters/ada.json: malformed JSON"),
        ({"world.json": None}, "world.json: a commit never deletes world.json"),
        (
            {"characters/zed.json": _bad_character()},
            "would write an invalid world (characters/zed.json: field 'identity.name': "
            "required field is missing",
        ),
        (
            {".sim/log/tick-000001.jsonl.zst": "junk\n"},
            ".sim/log/tick-000001.jsonl.zst: a commit never writes a committed tick log",
        ),
        (
            {".sim/log/tick-000001.jsonl.zst": None},
            "removes a committed tick log without moving it aside",
        ),
        (
            {".sim/log/tick-000002.commit.json": "junk\n"},
            ".sim/log/tick-000002.commit.json: not a commit marker",
        ),
        (
            {".sim/responses/memory/ada.json": "[1]\n"},
            ".sim/responses/memory/ada.json: expected an object of exchanges",
        ),
        (
            {".sim/interventions.json": '{"version": 1, "interventions": [{"kind": "x"}]}'},
            ".sim/interventions.json: not a pending interventions file",
        ),
        (
            {
                ".sim/log/tick-000001.jsonl.zst": None,
                ".sim/log/rewound-1/tick-000001.jsonl": "junk\n",
            },
            ".sim/log/rewound-1/tick-000001.jsonl: is not the log it moves aside",
        ),
    ],
)
def test_a_crafted_journal_is_refused_whole_and_nothing_is_applied(
    ticked: Path, files: dict[str, str | None], expected: str
) -> None:
    world = ticked
    # a valid change beside the bad one: it must not be applied either
    good = (world / "characters" / "bram.json").read_text().replace('"mood": "', '"mood": "X', 1)
    path = write_journal_v1(world, {"characters/bram.json": good, **files})
    before = everything(world)
    for args in (("check",), ("tick",), ("rewind", "--tick", "1")):
        result = invoke(*args, "--world", str(world))
        clean_exit(result, 2)
        assert f"{path}: " in result.output, result.output
        assert expected in result.output, result.output
        assert "it was not applied and nothing was written" in result.output
        assert everything(world) == before
    path.unlink()  # the fix it names works
    clean_exit(invoke("tick", "--world", str(world)), 0)


def _crash_rewind_after_commit_point(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run `sim rewind --tick 2` and stop it right after its journal's commit point."""

    def crash(root: Path, files: object, entities: object = None) -> None:
        raise OSError(5, "simulated crash after the commit point")

    with monkeypatch.context() as patch:
        patch.setattr(storage_module, "apply_journal", crash)
        with pytest.raises(OSError, match="simulated crash"):
            rewind(world, 2)
    assert (world / ".sim" / "journal.json").exists()


@pytest.mark.parametrize("log_already_removed", [False, True])
def test_a_real_rewind_journal_is_recovered(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_already_removed: bool
) -> None:
    clean_exit(invoke("tick", "--world", str(world), "--ticks", "3"), 0)
    clean = copy_world(world, tmp_path / "clean")
    rewind(clean, 2)
    _crash_rewind_after_commit_point(world, monkeypatch)
    if log_already_removed:  # the crash came after the log was removed, before its copy
        (world / ".sim" / "log" / "tick-000003.jsonl.zst").unlink()
    clean_exit(invoke("check", "--world", str(world)), 0)
    with Storage(world).lock():
        assert Storage(world).recover() is True

    # the later ticks' summaries a crash leaves are derived data, rebuilt when next needed
    def kept(root: Path) -> dict[str, bytes]:
        return {rel: data for rel, data in tree(root, logs=True).items() if ".summary." not in rel}

    assert kept(world) == kept(clean)


# -- item 9: damaged state `sim check` must name ------------------------------------------------


@pytest.fixture
def two_ticks(world: Path) -> Path:
    clean_exit(invoke("tick", "--world", str(world), "--ticks", "2"), 0)
    return world


def test_pending_interventions_at_an_unknown_location_are_refused(two_ticks: Path) -> None:
    world = two_ticks
    clean_exit(invoke("inject", "--world", str(world), "--at", "quay", "A ship arrives"), 0)
    pending = world / ".sim" / "interventions.json"
    pending.write_text(pending.read_text().replace('"quay"', '"atlantis"'))
    before = everything(world)
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert (
            f"{pending}: field 'interventions.0.location': unknown location 'atlantis'"
            in result.output
        )
    assert everything(world) == before


def test_pending_set_of_a_missing_entity_is_refused(two_ticks: Path) -> None:
    world = two_ticks
    clean_exit(invoke("set", "--world", str(world), 'ada.state.mood="calm"'), 0)
    pending = world / ".sim" / "interventions.json"
    pending.write_text(pending.read_text().replace('"characters/ada"', '"characters/nobody"'))
    result = invoke("check", "--world", str(world))
    clean_exit(result, 2)
    assert f"{pending}: field 'interventions.0.target'" in result.output


def test_check_names_a_truncated_committed_log(two_ticks: Path) -> None:
    log = two_ticks / ".sim" / "log" / "tick-000002.jsonl.zst"
    log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    result = invoke("check", "--world", str(two_ticks))
    assert f"warning: unreadable log: {log}: truncated or damaged" in result.output
    log.write_bytes(b"")
    assert f"{log}: empty" in invoke("check", "--world", str(two_ticks)).output


def test_check_names_bytes_after_a_committed_log(two_ticks: Path) -> None:
    log = two_ticks / ".sim" / "log" / "tick-000001.jsonl.zst"
    log.write_bytes(log.read_bytes() + b"junk")
    result = invoke("check", "--world", str(two_ticks))
    assert f"warning: unreadable log: {log}: truncated or damaged" in result.output


def test_check_names_a_garbage_commit_marker_before_the_tick_sets_it_aside(
    two_ticks: Path,
) -> None:
    marker = two_ticks / ".sim" / "log" / "tick-000003.commit.json"
    marker.write_text("garbage{\n")
    result = invoke("check", "--world", str(two_ticks))
    assert f"warning: unreadable log: {marker}: not a commit marker" in result.output
    assert "the next tick sets it aside as tick-000003.commit.json.bad" in result.output
    clean_exit(invoke("tick", "--world", str(two_ticks)), 0)
    assert (marker.parent / "tick-000003.commit.json.bad").read_text() == "garbage{\n"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder"])
def test_something_not_a_file_where_the_next_log_goes_is_refused(
    two_ticks: Path, tmp_path: Path, kind: str
) -> None:
    slot = two_ticks / ".sim" / "log" / "tick-000003.jsonl"
    if kind == "fifo":
        os.mkfifo(slot)
    elif kind == "symlink":
        (tmp_path / "outside.jsonl").write_bytes(b"")
        slot.symlink_to(tmp_path / "outside.jsonl")
    else:
        slot.mkdir()
    before = everything(two_ticks)
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(two_ticks))
        clean_exit(result, 2)
        assert f"{slot}: is a " in result.output
        assert f"refused; remove it (`rm {slot}`)" in result.output
    assert everything(two_ticks) == before


def test_an_interrupted_log_that_is_a_hard_link_is_refused_not_appended_to(
    two_ticks: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"precious": true}\n')
    slot = two_ticks / ".sim" / "log" / "tick-000003.jsonl"
    os.link(outside, slot)
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(two_ticks))
        clean_exit(result, 2)
        assert f"{slot}: is a hard link (2 names share this file" in result.output
    assert outside.read_bytes() == b'{"precious": true}\n'


def test_completing_a_committed_log_never_appends_through_a_hard_link(
    two_ticks: Path, tmp_path: Path
) -> None:
    """A commit marker makes recovery append the commit record to its tick's log in
    place: a log that is a hard link to a file outside the world is refused instead."""
    log_dir = two_ticks / ".sim" / "log"
    marker = {"type": "commit", "tick": 2, "state_after": "x", "calls": 0, "committed_at": 0}
    (log_dir / "tick-000002.commit.json").write_bytes(orjson.dumps(marker))
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b'{"precious": true}\n{"cut": "me')
    os.link(outside, log_dir / "tick-000002.jsonl")
    result = invoke("tick", "--world", str(two_ticks))
    clean_exit(result, 2)
    assert f"{log_dir / 'tick-000002.jsonl'}: is a hard link" in result.output
    assert outside.read_bytes() == b'{"precious": true}\n{"cut": "me'


def test_a_real_tick_journal_passes_every_check_and_is_recovered(
    two_ticks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a tick's commit really writes (entities, world.json, store files, the
    interventions removed, its commit marker) is what the journal checks accept."""
    world = two_ticks
    clean_exit(invoke("inject", "--world", str(world), "--at", "quay", "A ship arrives"), 0)
    clean = copy_world(world, tmp_path / "clean")
    clean_exit(invoke("tick", "--world", str(clean)), 0)

    def crash(root: Path, files: object, entities: object = None) -> None:
        raise OSError(5, "simulated crash after the commit point")

    with monkeypatch.context() as patch:
        patch.setattr(storage_module, "apply_journal", crash)
        assert invoke("tick", "--world", str(world)).exit_code == 1
    journal = (world / ".sim" / "journal.json").read_bytes()
    for rel in (
        "world.json",
        ".sim/interventions.json",
        ".sim/pending_deletions.json",
        ".sim/log/tick-000003.commit.json",
    ):
        assert f'"path":"{rel}"'.encode() in journal
    assert b'"path":".sim/responses/' in journal
    check = invoke("check", "--world", str(world))
    clean_exit(check, 0)
    assert "an interrupted commit is pending" in check.output
    with Storage(world).lock():
        assert Storage(world).recover() is True
    # the evicted responses the crash kept from being deleted wait for the next tick
    assert (world / ".sim" / "pending_deletions.json").is_file()
    (world / ".sim" / "pending_deletions.json").unlink()
    assert tree(world) == tree(clean)
