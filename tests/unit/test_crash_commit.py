"""Crash during save: a commit killed at any filesystem operation leaves tick N or N+1.

A child process loads a copy of ``worlds/demo``, mutates every character, advances
``world.json`` to tick 1 and commits. Inside that child only, a crash injector wraps the
filesystem calls ``sim.storage`` and ``sim.storage.journal`` make and SIGKILLs the process at the
K-th one (a write is torn first: half its bytes reach the file). The test process is never
patched: it recovers each crashed copy under the lock and checks it is wholly at tick 0 or
tick 1.

A counting run (a fresh Python) measures N, the operations of a full commit. The crash
points K = 1..N are spread over one fresh Python per CPU, each of which forks one process
per K (the forked process loads, patches, commits and dies), so ~60 crash points fit in a
few seconds instead of ~60 interpreter start-ups.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import DEMO

from sim.errors import InvalidWorld
from sim.pack import PACK, PACK_TMP
from sim.storage import Storage, forms

REPO = Path(__file__).resolve().parents[2]

INJECTOR = r'''
import builtins
import os
import signal
import sys
from pathlib import Path

import sim.storage.forms as forms
import sim.storage.journal as journal
import sim.storage.store as st

ops = []
crash_at = 0  # set per crash point; 0 never crashes
ROOT = '.'


def step(name, torn=None):
    """Count one filesystem operation; at the K-th, die (after tearing a write)."""
    ops.append(name)
    if len(ops) == crash_at:
        if torn is not None:
            torn()
        os.kill(os.getpid(), signal.SIGKILL)


def short(path):
    return os.path.relpath(os.fspath(path), ROOT) if isinstance(path, (str, Path)) else path


busy = []  # inside a counted operation: the calls it makes itself are not counted again


def wrap(name, real):
    def op(*args, **kwargs):
        if busy:
            return real(*args, **kwargs)
        step(f"{name} {' '.join(str(short(a)) for a in args[:2])}")
        busy.append(name)
        try:
            return real(*args, **kwargs)
        finally:
            busy.pop()
    return op


class TornFile:
    def __init__(self, handle):
        self._handle = handle

    def write(self, data):
        def tear():
            self._handle.write(data[: len(data) // 2])
            self._handle.flush()
        step("write", tear)
        return self._handle.write(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


def torn_write(name, real):
    """``os.write(fd, data)`` / ``os.pwrite(fd, data, offset)``: at the K-th, half lands."""
    def op(fd, data, *rest):
        if busy:
            return real(fd, data, *rest)
        step(f"{name} {fd} {len(data)}", lambda: real(fd, bytes(data)[: len(data) // 2], *rest))
        return real(fd, data, *rest)
    return op


def install():
    for name in ("replace", "rename", "fsync", "fdatasync", "open", "close", "sync", "unlink",
                 "remove", "truncate", "ftruncate", "mkdir", "makedirs"):
        setattr(os, name, wrap(f"os.{name}", getattr(os, name)))
    for name in ("write", "pwrite"):
        setattr(os, name, torn_write(f"os.{name}", getattr(os, name)))

    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        step(f"open {short(file)}")
        return TornFile(real_open(file, *args, **kwargs))

    st.open = journal.open = counting_open  # shadows the builtin inside these two only

    real_write_bytes = Path.write_bytes

    def write_bytes(self, data):
        step(f"Path.write_bytes {short(self)}",
             lambda: real_write_bytes(self, data[: len(data) // 2]))
        return real_write_bytes(self, data)

    Path.write_bytes = write_bytes
    Path.write_text = wrap("Path.write_text", Path.write_text)
    Path.unlink = wrap("Path.unlink", Path.unlink)
    Path.mkdir = wrap("Path.mkdir", Path.mkdir)
    Path.rename = wrap("Path.rename", Path.rename)
    Path.replace = wrap("Path.replace", Path.replace)
'''

ACTIONS = r'''
import shutil
import traceback


def commit_tick1(root):
    """The tick under test: every character changes, world.json goes to tick 1."""
    storage = st.Storage(Path(root))
    world = storage.load()
    for cid, char in world.characters.items():
        char["state"]["mood"] = "tick1"
        char["memory"]["cells"].append({"tick": 1, "text": f"{cid} watched the tide turn."})
    world.meta["tick"] = 1
    install()
    storage.commit(world, whole=True)  # as a tick commits (a pack made from memory)


def recover(root):
    storage = st.Storage(Path(root))
    install()
    with storage.lock():
        storage.recover()


def pack(root):
    install()
    forms.pack(Path(root))


def unpack(root):
    install()
    forms.unpack(Path(root))


def main():
    global ROOT, crash_at
    action = {"commit": commit_tick1, "recover": recover, "pack": pack, "unpack": unpack}[
        sys.argv[1]
    ]
    base, first, last = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if first == 0:  # count only: run once on ``base`` and list the operations
        ROOT, crash_at = base, 0
        action(base)
        step("return")
        sys.stdout.write("\n".join(ops))
        return
    statuses = []
    for k in range(first, last + 1):
        root = f"{base}-k{k:03d}"
        shutil.copytree(base, root)
        pid = os.fork()
        if pid == 0:  # the crashing process: patched here only, killed at op k
            ROOT, crash_at = root, k
            try:
                action(root)
                step("return")
            except BaseException:
                traceback.print_exc()
                os._exit(3)
            os._exit(0)
        statuses.append(f"{k}:{os.waitpid(pid, 0)[1]}")
    sys.stdout.write(" ".join(statuses))


main()
'''

CHILD = INJECTOR + ACTIONS


def run_child(action: str, base: Path, first: int = 0, last: int = 0) -> str:
    """Run a fresh Python: ``first == 0`` counts the operations of one full ``action`` on
    ``base``; otherwise it forks one process per crash point k in ``first..last``, each
    doing ``action`` on its own copy ``<base>-kNNN`` and killed at its k-th operation.
    """
    result = subprocess.run(
        [sys.executable, "-c", CHILD, action, str(base), str(first), str(last)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def count_ops(action: str, base: Path) -> list[str]:
    return run_child(action, base).splitlines()


def crash_at_every_point(action: str, base: Path, points: int) -> dict[int, Path]:
    """Crash ``action`` at op 1..points, spread over one fresh Python per CPU."""
    workers = max(2, os.cpu_count() or 2)
    size = -(-points // workers)
    chunks = [(a, min(a + size - 1, points)) for a in range(1, points + 1, size)]
    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        outputs = list(pool.map(lambda chunk: run_child(action, base, *chunk), chunks))
    roots: dict[int, Path] = {}
    for output in outputs:
        for item in output.split():
            k, status = map(int, item.split(":"))
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, status)
            roots[k] = base.parent / f"{base.name}-k{k:03d}"
    assert sorted(roots) == list(range(1, points + 1))
    return roots


def world_files(root: Path) -> dict[str, bytes]:
    """Every file of the world proper (``.sim/`` excluded) -> its bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != ".sim"
    }


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (``.sim/`` too) -> its bytes, ``None`` for a folder."""
    return {
        p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


def leftovers(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.name in ("journal.json", "journal.tmp", PACK_TMP) or p.name.endswith(".sim-tmp")
    )


def fresh_copy(tmp_path: Path, name: str, form: str = "folders") -> Path:
    """A copy of the demo world, in folders or packed (``sim.pack``)."""
    root = tmp_path / name
    shutil.copytree(DEMO, root, ignore=shutil.ignore_patterns(".sim"))
    if form == "pack":
        forms.pack(root)
    return root


def recover_and_check(
    root: Path, tick0: dict[str, bytes], tick1: dict[str, bytes], label: str
) -> int:
    """Recover under the lock, then return the tick the world is wholly at.

    ``load()`` before recovery (it reads through a pending journal) must already see the
    world exactly as it is after recovery, and must write nothing.
    """
    committed = (root / ".sim" / "journal.json").is_file()
    storage = Storage(root)
    untouched = snapshot(root)
    early = storage.load()
    assert snapshot(root) == untouched, f"{label}: load() wrote to the world"
    with storage.lock():
        replayed = storage.recover()
    assert replayed == committed, label
    world = storage.load()
    assert (early.meta, early.characters, early.locations) == (
        world.meta,
        world.characters,
        world.locations,
    ), f"{label}: load() before recover() saw another world than after it"
    assert leftovers(root) == [], label
    files = world_files(root)
    if files == tick0:
        assert world.tick == 0, label
        assert not committed, f"{label}: a committed journal was not replayed"
        return 0
    mixed = sorted(rel for rel in files if files[rel] != tick1.get(rel))
    assert files == tick1, f"{label}: neither tick 0 nor tick 1; differs from tick 1 in {mixed}"
    assert world.tick == 1, label
    for cid, char in world.characters.items():
        assert char["state"]["mood"] == "tick1", (label, cid)
        assert char["memory"]["cells"][-1]["tick"] == 1, (label, cid)
    return 1


def commit_point(ops: list[str]) -> int:
    """The 1-based number of the op that renames the journal into place."""
    points = [
        i + 1
        for i, op in enumerate(ops)
        if op.startswith("os.replace") and op.endswith("journal.json")
    ]
    assert len(points) == 1, ops
    return points[0]


@pytest.mark.slow
@pytest.mark.parametrize("form", ["folders", "pack"])
def test_a_crash_at_any_point_of_a_commit_leaves_tick_0_or_tick_1(
    tmp_path: Path, form: str
) -> None:
    base = fresh_copy(tmp_path, "base", form)
    tick0 = world_files(base)

    # a counting-only run: the full commit, and the list of its filesystem operations
    full = fresh_copy(tmp_path, "full", form)
    ops = count_ops("commit", full)
    assert len(ops) >= 30 if form == "folders" else 15, ops
    tick1 = world_files(full)
    assert Storage(full).load().tick == 1
    changed = sorted(rel for rel in tick1 if tick1[rel] != tick0[rel])
    if form == "folders":
        characters = [f"characters/{p.name}" for p in (base / "characters").iterdir()]
        assert changed == sorted(["world.json", *characters])
    else:  # every character's file is in the pack: it is replaced whole, after the journal
        assert changed == ["world.json", PACK]
        assert any(op.startswith("os.replace") and op.endswith(PACK) for op in ops), ops
    renamed = commit_point(ops)

    seen = {0: 0, 1: 0}
    for k, root in sorted(crash_at_every_point("commit", base, len(ops)).items()):
        label = f"crash at op {k}/{len(ops)} ({ops[k - 1]})"
        tick = recover_and_check(root, tick0, tick1, label)
        # killed before the journal rename ran: tick 0; after it: tick 1
        assert tick == (1 if k > renamed else 0), label
        seen[tick] += 1
    assert seen[0] > 0 and seen[1] > 0, seen


@pytest.mark.slow
@pytest.mark.parametrize("form", ["folders", "pack"])
def test_a_crash_during_recovery_is_recovered_too(tmp_path: Path, form: str) -> None:
    """A crash while replaying a journal leaves the journal in place for the next recover."""
    base = fresh_copy(tmp_path, "base", form)
    tick0 = world_files(base)
    full = fresh_copy(tmp_path, "full", form)
    ops = count_ops("commit", full)
    tick1 = world_files(full)

    # killed just after the commit point: a committed journal, nothing written in place yet
    k = commit_point(ops) + 1
    pending = crash_at_every_point("commit", base, k)[k]
    assert (pending / ".sim" / "journal.json").is_file()
    assert world_files(pending) == tick0

    probe = tmp_path / "probe"
    shutil.copytree(pending, probe)
    rec_ops = count_ops("recover", probe)
    assert world_files(probe) == tick1
    assert len(rec_ops) >= (20 if form == "folders" else 10), rec_ops

    for j, root in sorted(crash_at_every_point("recover", pending, len(rec_ops)).items()):
        label = f"recover crashed at op {j}/{len(rec_ops)} ({rec_ops[j - 1]})"
        assert recover_and_check(root, tick0, tick1, label) == 1


def test_injector_counts_without_crashing(tmp_path: Path) -> None:
    """The injector itself changes nothing: a counting run commits like a normal one."""
    plain = fresh_copy(tmp_path, "plain")
    counted = fresh_copy(tmp_path, "counted")
    count_ops("commit", counted)
    storage = Storage(plain)
    world = storage.load()
    for cid, char in world.characters.items():
        char["state"]["mood"] = "tick1"
        char["memory"]["cells"].append({"tick": 1, "text": f"{cid} watched the tide turn."})
    world.meta["tick"] = 1
    storage.commit(world)
    assert world_files(plain) == world_files(counted)
    assert json.loads((plain / "world.json").read_text())["tick"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("command", ["pack", "unpack"])
def test_a_pack_or_unpack_killed_at_any_point_loses_nothing_and_finishes_when_run_again(
    tmp_path: Path, command: str
) -> None:
    """``sim pack`` and ``sim unpack`` killed at each filesystem operation: the world either
    loads as it was, or is refused as in both forms until the same command runs again;
    after that run it is in the new form, with every entity file as it was."""
    start = fresh_copy(tmp_path, "base", "folders" if command == "pack" else "pack")
    before = Storage(start).load()
    entities = {rel: data for rel, data in before.originals.items() if rel != "world.json"}
    full = tmp_path / "full"
    shutil.copytree(start, full)
    ops = count_ops(command, full)
    assert (full / PACK).exists() == (command == "pack"), ops
    run = forms.pack if command == "pack" else forms.unpack
    seen = {"as it was": 0, "both forms": 0, "done": 0}
    for k, root in sorted(crash_at_every_point(command, start, len(ops)).items()):
        label = f"{command} killed at op {k}/{len(ops)} ({ops[k - 1]})"
        try:
            world = Storage(root).load()
        except InvalidWorld as exc:  # both forms: named, nothing chosen
            assert "beside its pack" in str(exc), (label, str(exc))
            seen["both forms"] += 1
        else:
            assert world.originals == before.originals, label
            seen["done" if (root / PACK).exists() == (command == "pack") else "as it was"] += 1
        folders = [(root / kind).exists() for kind in ("characters", "locations")]
        if (root / PACK).exists() != (command == "pack") or (command == "pack" and any(folders)):
            run(root)  # again: from the start, or it finishes the interrupted run
        assert (root / PACK).exists() == (command == "pack"), label
        for kind in ("characters", "locations"):
            assert (root / kind).is_dir() == (command == "unpack"), label
        assert leftovers(root) == [], label
        after = Storage(root).load()
        assert {r: d for r, d in after.originals.items() if r != "world.json"} == entities, label
    assert seen["as it was"] > 0 and seen["both forms"] > 0, seen
