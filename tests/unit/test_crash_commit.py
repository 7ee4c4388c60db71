"""Crash during save: a commit killed at any filesystem operation leaves tick N or N+1.

Each crash runs in a fresh child Python that loads a copy of ``worlds/demo``, mutates every
character, advances ``world.json`` to tick 1 and commits. Inside the child only, a crash
injector wraps the filesystem calls ``sim.storage`` makes and SIGKILLs the process at the
K-th one (a write is torn first: half its bytes reach the file). The parent then recovers
the world under the lock and checks it is wholly at tick 0 or wholly at tick 1.
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

from sim.storage import Storage

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "worlds" / "demo"

INJECTOR = r'''
import builtins
import os
import signal
import sys
from pathlib import Path

import sim.storage as st

ops = []
crash_at = int(sys.argv[2])


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


def install():
    for name in ("replace", "rename", "fsync", "open", "close", "sync", "unlink", "remove"):
        setattr(os, name, wrap(f"os.{name}", getattr(os, name)))
    if st._libc_syncfs is not None:
        st._libc_syncfs = wrap("syncfs", st._libc_syncfs)

    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        step(f"open {short(file)}")
        return TornFile(real_open(file, *args, **kwargs))

    st.open = counting_open  # shadows the builtin inside sim.storage only

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

COMMIT = (
    INJECTOR
    + r"""
ROOT = sys.argv[1]
storage = st.Storage(Path(ROOT))
world = storage.load()
for cid, char in world.characters.items():
    char["state"]["mood"] = "tick1"
    char["memory"]["cells"].append({"tick": 1, "text": f"{cid} watched the tide turn."})
world.meta["tick"] = 1
install()
storage.commit(world)
step("after commit")
sys.stdout.write("\n".join(ops))
"""
)

RECOVER = (
    INJECTOR
    + r"""
ROOT = sys.argv[1]
storage = st.Storage(Path(ROOT))
install()
with storage.lock():
    storage.recover()
step("after recover")
sys.stdout.write("\n".join(ops))
"""
)

# One fresh Python forks a child per crash point (cheaper than a fresh Python each): child
# k recovers its own copy ``<base>-kNNN`` of the world and is killed at its k-th operation.
RECOVER_EACH_POINT = (
    INJECTOR
    + r"""
import shutil

base, points = sys.argv[1], int(sys.argv[2])
statuses = []
for k in range(1, points + 1):
    ROOT = f"{base}-k{k:03d}"
    shutil.copytree(base, ROOT)
    pid = os.fork()
    if pid == 0:
        crash_at = k
        storage = st.Storage(Path(ROOT))
        install()
        with storage.lock():
            storage.recover()
        step("after recover")
        os._exit(0)
    statuses.append(os.waitpid(pid, 0)[1])
sys.stdout.write(" ".join(map(str, statuses)))
"""
)


def run_child(code: str, root: Path, crash_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, str(root), str(crash_at)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )


def world_files(root: Path) -> dict[str, bytes]:
    """Every file of the world proper (``.sim/`` excluded) -> its bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != ".sim"
    }


def leftovers(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.name in ("journal.json", "journal.tmp") or p.name.endswith(".sim-tmp")
    )


def fresh_copy(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(DEMO, root, ignore=shutil.ignore_patterns(".sim"))
    return root


def recover_and_check(
    root: Path, tick0: dict[str, bytes], tick1: dict[str, bytes], label: str
) -> int:
    """Recover under the lock, then return the tick the world is wholly at."""
    committed = (root / ".sim" / "journal.json").is_file()
    storage = Storage(root)
    with storage.lock():
        replayed = storage.recover()
    assert replayed == committed, label
    world = storage.load()
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


def run_crashes(
    tmp_path: Path, code: str, prepare: str, points: range
) -> list[tuple[int, Path, subprocess.CompletedProcess[str]]]:
    """Run the child once per crash point, each on its own copy of ``prepare``."""

    def one(k: int) -> tuple[int, Path, subprocess.CompletedProcess[str]]:
        root = tmp_path / f"k{k:03d}"
        shutil.copytree(tmp_path / prepare, root)
        return k, root, run_child(code, root, k)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(one, points))


def test_a_crash_at_any_point_of_a_commit_leaves_tick_0_or_tick_1(tmp_path: Path) -> None:
    base = fresh_copy(tmp_path, "base")
    tick0 = world_files(base)

    # a counting-only run: the full commit, and the list of its filesystem operations
    full = fresh_copy(tmp_path, "full")
    done = run_child(COMMIT, full, 0)
    assert done.returncode == 0, done.stderr
    ops = done.stdout.splitlines()
    assert len(ops) >= 30, ops
    tick1 = world_files(full)
    assert Storage(full).load().tick == 1
    assert sorted(rel for rel in tick1 if tick1[rel] != tick0[rel]) == sorted(
        ["world.json"] + [f"characters/{p.name}" for p in (base / "characters").iterdir()]
    )
    commit_points = [
        i + 1
        for i, op in enumerate(ops)
        if op.startswith("os.replace") and op.endswith(".sim/journal.json")
    ]
    assert len(commit_points) == 1, ops
    (commit_point,) = commit_points

    seen = {0: 0, 1: 0}
    for k, root, result in run_crashes(tmp_path, COMMIT, "base", range(1, len(ops) + 1)):
        label = f"crash at op {k}/{len(ops)} ({ops[k - 1]})"
        assert result.returncode == -signal.SIGKILL, (label, result.stderr)
        tick = recover_and_check(root, tick0, tick1, label)
        # killed before the journal rename ran: tick 0; after it: tick 1
        assert tick == (1 if k > commit_point else 0), label
        seen[tick] += 1
    assert seen[0] > 0 and seen[1] > 0, seen


def test_a_crash_during_recovery_is_recovered_too(tmp_path: Path) -> None:
    """A crash while replaying a journal leaves the journal in place for the next recover."""
    base = fresh_copy(tmp_path, "base")
    tick0 = world_files(base)
    full = fresh_copy(tmp_path, "full")
    done = run_child(COMMIT, full, 0)
    assert done.returncode == 0, done.stderr
    tick1 = world_files(full)
    ops = done.stdout.splitlines()
    (commit_point,) = [
        i + 1
        for i, op in enumerate(ops)
        if op.startswith("os.replace") and op.endswith(".sim/journal.json")
    ]

    # killed just after the commit point: a committed journal, nothing written in place
    pending = fresh_copy(tmp_path, "pending")
    result = run_child(COMMIT, pending, commit_point + 1)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert (pending / ".sim" / "journal.json").is_file()
    assert world_files(pending) == tick0

    probe = tmp_path / "probe"
    shutil.copytree(pending, probe)
    counted = run_child(RECOVER, probe, 0)
    assert counted.returncode == 0, counted.stderr
    rec_ops = counted.stdout.splitlines()
    assert world_files(probe) == tick1

    driver = run_child(RECOVER_EACH_POINT, pending, len(rec_ops))
    assert driver.returncode == 0, driver.stderr
    statuses = [int(x) for x in driver.stdout.split()]
    assert len(statuses) == len(rec_ops)
    for k, status in enumerate(statuses, start=1):
        label = f"recover crashed at op {k}/{len(rec_ops)} ({rec_ops[k - 1]})"
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, label
        root = tmp_path / f"pending-k{k:03d}"
        assert recover_and_check(root, tick0, tick1, label) == 1


def test_injector_counts_without_crashing(tmp_path: Path) -> None:
    """The injector itself changes nothing: a counting run commits like a normal one."""
    plain = fresh_copy(tmp_path, "plain")
    counted = fresh_copy(tmp_path, "counted")
    assert run_child(COMMIT, counted, 0).returncode == 0
    storage = Storage(plain)
    world = storage.load()
    for cid, char in world.characters.items():
        char["state"]["mood"] = "tick1"
        char["memory"]["cells"].append({"tick": 1, "text": f"{cid} watched the tide turn."})
    world.meta["tick"] = 1
    storage.commit(world)
    assert world_files(plain) == world_files(counted)
    assert json.loads((plain / "world.json").read_text())["tick"] == 1
