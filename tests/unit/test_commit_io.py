"""What a commit writes and flushes, and how much memory it takes beyond the world.

A real world folder under ``tmp_path`` and the real ``Storage``; the only patches observe
(count or copy) the filesystem calls a commit makes, then let them run.
"""

from __future__ import annotations

import os
import shutil
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import DEMO

from sim import safefs
from sim.config import load_config
from sim.engine.runner import Runner
from sim.storage import Storage, dump_json
from sim.storage.journal import (
    JOURNAL_MAGIC,
    CorruptJournal,
    _validate_journal,
    apply_journal,
    write_journal,
)


def demo(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    shutil.copytree(DEMO, root, ignore=shutil.ignore_patterns(".sim"))
    return root


def journal_copy(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[bytes]:
    """Copies of every journal a commit renames into place (its commit point)."""
    copies: list[bytes] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if str(dst).endswith("journal.json"):
            copies.append((root / ".sim" / "journal.tmp").read_bytes())
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return copies


def mutate_every_character(storage: Storage) -> Any:
    world = storage.load()
    for char in world.characters.values():
        char["state"]["mood"] = "changed"
    world.meta["tick"] += 1
    return world


def test_a_commit_writes_each_changed_file_once_in_place_and_once_in_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = demo(tmp_path)
    storage = Storage(root)
    world = mutate_every_character(storage)
    expected = storage.changed_files(world)
    assert len(expected) == len(world.characters) + 1  # and world.json

    writes: Counter[str] = Counter()
    real_write_at = safefs.write_at

    def write_at(dir_fd: int, name: str, shown: Path, data: bytes, **kw: Any) -> None:
        writes[Path(shown).relative_to(root).as_posix()] += 1
        real_write_at(dir_fd, name, shown, data, **kw)

    monkeypatch.setattr(safefs, "write_at", write_at)
    journals = journal_copy(monkeypatch, root)
    assert storage.commit(world) == sorted(expected)

    assert writes == Counter(dict.fromkeys(expected, 1))  # each file once, in place
    (journal,) = journals
    assert journal.startswith(JOURNAL_MAGIC)
    recorded = _validate_journal(root, journal)
    assert recorded == expected  # each file once in the journal, bytes as written
    for rel, data in expected.items():
        assert (root / rel).read_bytes() == data
        assert journal.count(data) == 1


def test_a_commit_flushes_only_the_files_it_wrote_never_the_whole_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sync``/``syncfs`` would also flush every other process's writes on that disk."""
    root = demo(tmp_path)
    storage = Storage(root)
    world = mutate_every_character(storage)
    expected = storage.changed_files(world)

    def refuse(*args: Any) -> None:
        raise AssertionError("the commit flushed the whole filesystem")

    monkeypatch.setattr(os, "sync", refuse)
    flushed: list[str] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    storage.commit(world)
    assert sorted(Path(p).relative_to(root.resolve()).as_posix() for p in flushed) == sorted(
        expected
    )


def test_a_tick_serialises_its_changed_files_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick log's state digest and the commit share one ``changed_files``, which
    hands each new form to the world's originals as it goes (the loaded bytes go then)."""
    root = demo(tmp_path)
    calls: list[tuple[int, bool]] = []
    real = Storage.changed_files

    def counted(
        self: Storage, world: Any, *, adopt: bool = False, given: Any = None
    ) -> dict[str, bytes]:
        calls.append((world.tick, adopt))
        found = real(self, world, adopt=adopt, given=given)
        assert found and all(world.originals[rel] is data for rel, data in found.items())
        return found

    monkeypatch.setattr(Storage, "changed_files", counted)
    Runner(root, load_config(cwd=tmp_path)).run(2)
    assert calls == [(1, True), (2, True)]


def test_a_commit_does_not_build_a_second_copy_of_the_changed_files(tmp_path: Path) -> None:
    """The journal is streamed from the serialised files, not built as one document: the
    memory a commit allocates beyond the files it was given stays well under their size
    (the JSON journal built from decoded text took about twice their size)."""
    root = demo(tmp_path)
    storage = Storage(root)
    world = storage.load()
    template = next(iter(world.characters.values()))
    for i in range(800):  # ~6 MB of character files
        cid = f"extra{i:03d}"
        char: dict[str, Any] = {
            **template,
            "identity": {**template["identity"], "id": cid},
            "state": {**template["state"], "notes": "x" * 6000},
        }
        (root / "characters" / f"{cid}.json").write_bytes(dump_json(char))
    world = mutate_every_character(storage)
    changed = storage.changed_files(world)
    total = sum(len(data) for data in changed.values())
    assert total > 5_000_000

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        storage.commit(world, changed=changed)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < total / 2, (peak, total)
    assert Storage(root).load().characters["extra000"]["state"]["mood"] == "changed"


def test_a_write_failing_among_many_fails_the_commit_and_recovery_writes_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 64 files the writes run on threads: one that fails (a full disk) fails the
    commit with its error, after the journal's rename, and the next recovery writes every
    file of the tick, the failed one included."""
    root = demo(tmp_path)
    storage = Storage(root)
    world = storage.load()
    template = next(iter(world.characters.values()))
    for i in range(150):
        cid = f"extra{i:03d}"
        char: dict[str, Any] = {**template, "identity": {**template["identity"], "id": cid}}
        (root / "characters" / f"{cid}.json").write_bytes(dump_json(char))
    world = mutate_every_character(storage)
    changed = storage.changed_files(world)
    assert len(changed) > 100
    real_write_at = safefs.write_at
    written: list[str] = []

    def write_at(dir_fd: int, name: str, shown: Path, data: bytes, **kwargs: Any) -> None:
        if name == "extra077.json":
            raise OSError(28, "No space left on device")
        real_write_at(dir_fd, name, shown, data, **kwargs)
        written.append(name)

    monkeypatch.setattr(safefs, "write_at", write_at)
    with pytest.raises(OSError, match="No space left"):
        storage.commit(world, changed=changed)
    assert (root / ".sim" / "journal.json").exists()  # committed: the journal stays
    assert len(written) < len(changed)

    monkeypatch.setattr(safefs, "write_at", real_write_at)
    assert Storage(root).recover()
    again = Storage(root).load()
    assert {cid: c["state"]["mood"] for cid, c in again.characters.items()} == {
        cid: "changed" for cid in world.characters
    }
    assert not (root / ".sim" / "journal.json").exists()


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda j: j[:-3], id="truncated end"),
        pytest.param(lambda j: j[: len(j) // 2], id="cut in a file"),
        pytest.param(lambda j: j.replace(b'"size":', b'"size":1', 1), id="wrong size"),
        pytest.param(lambda j: j + b"extra", id="bytes after the end"),
    ],
)
def test_a_damaged_streamed_journal_is_refused_not_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: Any
) -> None:
    root = demo(tmp_path)
    storage = Storage(root)
    world = mutate_every_character(storage)
    before = {p: p.read_bytes() for p in (root / "characters").iterdir()}
    with monkeypatch.context() as m:
        journals = journal_copy(m, root)
        storage.commit(world)
    for path, data in before.items():
        path.write_bytes(data)  # back to tick 0, a damaged journal pending
    (root / ".sim" / "journal.json").write_bytes(cut(journals[0]))
    with pytest.raises(CorruptJournal), storage.lock():
        storage.recover()
    assert {p: p.read_bytes() for p in (root / "characters").iterdir()} == before


def test_a_big_commit_flushes_its_filesystem_once_and_no_file_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From ``SYNCFS_FROM`` files a commit writes them all, then flushes the filesystem
    they are on once (``syncfs``: each fdatasync was a flush request of its own, 7.4-7.5 s
    at 100,000 characters against 3.7-4.4 s); a smaller one flushes each file. Either way
    the files hold the tick's bytes and the journal goes; a flush that fails fails the
    commit, and the journal stays for the next run."""
    from sim.storage import journal as journal_module

    monkeypatch.setattr(journal_module, "SYNCFS_FROM", 3)
    flushed: list[int] = []
    real = journal_module.syncfs()
    assert real is not None  # Linux: the C library has it

    def counting(fd: int) -> int:
        flushed.append(os.fstat(fd).st_dev)
        return real(fd)

    monkeypatch.setattr(journal_module, "syncfs", lambda: counting)
    syncs: list[int] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd) or real_fdatasync(fd))
    root = tmp_path / "w"
    (root / "characters").mkdir(parents=True)
    (root / ".sim").mkdir()
    files: dict[str, bytes | None] = {
        f"characters/c{i}.json": f'{{"n": {i}}}\n'.encode() for i in range(4)
    }
    (root / "characters" / "c0.json").write_bytes(b"longer than what replaces it\n")
    write_journal(root, files)
    apply_journal(root, files)
    assert flushed == [os.stat(root).st_dev]  # one filesystem, once
    assert syncs == []  # no file flushed on its own
    for rel, data in files.items():
        assert (root / rel).read_bytes() == data
    assert not (root / ".sim" / "journal.json").exists()

    flushed.clear()
    few = {"characters/c1.json": b'{"n": 10}\n'}
    write_journal(root, few)
    apply_journal(root, few)
    assert flushed == [] and len(syncs) == 1  # under SYNCFS_FROM: the file itself

    def failing(fd: int) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal_module, "syncfs", lambda: failing)
    write_journal(root, files)
    with pytest.raises(OSError):
        apply_journal(root, files)
    assert (root / ".sim" / "journal.json").exists()  # committed: the next run finishes it
