"""safefs: appends and reads inside a world never go through a link out of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import safefs
from sim.interview import INTERVIEWS, read_interviews


def test_append_creates_folders_and_appends(tmp_path: Path) -> None:
    safefs.append_file(tmp_path, ".sim/a.jsonl", b"one\n")
    safefs.append_file(tmp_path, ".sim/a.jsonl", b"two\n")
    assert (tmp_path / ".sim" / "a.jsonl").read_bytes() == b"one\ntwo\n"


def test_append_refuses_a_linked_folder_on_the_way(tmp_path: Path) -> None:
    world, outside = tmp_path / "world", tmp_path / "outside"
    world.mkdir()
    outside.mkdir()
    (world / ".sim").symlink_to(outside)
    with pytest.raises(safefs.UnsafePath, match="symlink"):
        safefs.append_file(world, ".sim/a.jsonl", b"x\n")
    assert list(outside.iterdir()) == []


def test_append_refuses_a_linked_file(tmp_path: Path) -> None:
    world, outside = tmp_path / "world", tmp_path / "outside.jsonl"
    (world / ".sim").mkdir(parents=True)
    outside.write_bytes(b"")
    (world / ".sim" / "a.jsonl").symlink_to(outside)
    with pytest.raises(safefs.UnsafePath, match="symlink"):
        safefs.append_file(world, ".sim/a.jsonl", b"x\n")
    assert outside.read_bytes() == b""


def test_interviews_are_not_read_through_a_linked_folder(tmp_path: Path) -> None:
    world, outside = tmp_path / "world", tmp_path / "outside"
    world.mkdir()
    outside.mkdir()
    (outside / "interviews.jsonl").write_bytes(b"not an interview\n")
    (world / ".sim").symlink_to(outside)
    assert read_interviews(world) == []
    assert INTERVIEWS == ".sim/interviews.jsonl"
