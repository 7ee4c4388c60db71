"""safefs: appends and reads inside a world never go through a link out of it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize("before", [b"", b"short", b"a much longer file than what replaces it\n"])
def test_an_in_place_write_leaves_exactly_the_new_bytes(tmp_path: Path, before: bytes) -> None:
    (tmp_path / "f.json").write_bytes(before)
    with safefs.open_dir(tmp_path, []) as dir_fd:
        safefs.write_at(dir_fd, "f.json", tmp_path / "f.json", b"the new text\n", sync=True)
        safefs.write_at(dir_fd, "new.json", tmp_path / "new.json", b"made\n")
    assert (tmp_path / "f.json").read_bytes() == b"the new text\n"
    assert (tmp_path / "new.json").read_bytes() == b"made\n"


def test_an_in_place_write_of_a_growing_file_makes_one_stat_and_no_truncate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit writes every changed file this way on 16 threads, and each system call
    hands the interpreter lock to another thread and back: a tick's files mostly grow,
    and for them the file's one ``fstat`` says no truncate is needed."""
    (tmp_path / "f.json").write_bytes(b"old\n")
    calls: list[str] = []

    def counted(name: str) -> Any:
        real = getattr(os, name)

        def call(*args: Any) -> Any:
            calls.append(name)
            return real(*args)

        return call

    for name in ("fstat", "ftruncate"):
        monkeypatch.setattr(os, name, counted(name))
    with safefs.open_dir(tmp_path, []) as dir_fd:
        safefs.write_at(dir_fd, "f.json", tmp_path / "f.json", b"old and more\n", sync=True)
    assert calls == ["fstat"]
    assert (tmp_path / "f.json").read_bytes() == b"old and more\n"


def test_an_in_place_write_opens_an_existing_file_without_o_creat_and_makes_a_new_one_exclusively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening with ``O_CREAT`` takes the folder's lock exclusively even when the file is
    there (Linux 6.18): a commit's 16 threads, overwriting a folder of characters, spun on
    it in the kernel. An existing file is opened without it; only a new one is made, with
    ``O_EXCL``, so a name that appears meanwhile (a planted link) is refused, never
    followed."""
    (tmp_path / "f.json").write_bytes(b"old\n")
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def recording(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    with safefs.open_dir(tmp_path, []) as dir_fd:
        opened.clear()
        safefs.write_at(dir_fd, "f.json", tmp_path / "f.json", b"new\n")
        safefs.write_at(dir_fd, "made.json", tmp_path / "made.json", b"made\n")
    assert [(name, bool(flags & os.O_CREAT)) for name, flags in opened] == [
        ("f.json", False),
        ("made.json", False),
        ("made.json", True),
    ]
    assert opened[-1][1] & os.O_EXCL
    assert (tmp_path / "f.json").read_bytes() == b"new\n"
    assert (tmp_path / "made.json").read_bytes() == b"made\n"

    def planted(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "late.json" and not flags & os.O_CREAT:  # then a link appears before the create
            (tmp_path / "late.json").symlink_to(tmp_path / "f.json")
            raise FileNotFoundError(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", planted)
    with safefs.open_dir(tmp_path, []) as dir_fd, pytest.raises(FileExistsError):
        safefs.write_at(dir_fd, "late.json", tmp_path / "late.json", b"through the link\n")
    assert (tmp_path / "f.json").read_bytes() == b"new\n"
