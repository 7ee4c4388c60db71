"""A big tick log is compressed by a child process while the commit writes the world.

Real ticks of the demo world, real child processes; the threshold (``CHILD_FROM_BYTES``)
is lowered so the demo's small log takes the path a 10,000-character tick's log takes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import copy_demo

from sim.config import load_config
from sim.engine.runner import Runner
from sim.ticklog import compression
from sim.ticklog.compression import compress_log
from sim.ticklog.format import log_path, packed_path


def run(world: Path, ticks: int, **overrides: object) -> None:
    config = load_config(world_dir=world, overrides=overrides or None, cwd=world)
    Runner(world, config).run(ticks)


@pytest.fixture
def plain(captured: dict[int, bytes], monkeypatch: pytest.MonkeyPatch) -> dict[int, bytes]:
    """``captured``, with every log going to a child (the threshold at 0)."""
    monkeypatch.setattr(compression, "CHILD_FROM_BYTES", 0)
    return captured


def children(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The exit codes of the compression children, as they are waited for."""
    codes: list[int] = []
    real = compression._ChildCompression.finished

    def finished(self: compression._ChildCompression) -> bool:
        done = real(self)
        codes.append(self.process.returncode)
        return done

    monkeypatch.setattr(compression._ChildCompression, "finished", finished)
    return codes


def same_as_compressed_here(world: Path, plain: dict[int, bytes], tmp_path: Path) -> None:
    for tick, data in plain.items():
        again = tmp_path / f"again-{tick}" / log_path(world, tick).name
        again.parent.mkdir()
        again.write_bytes(data)
        assert packed_path(log_path(world, tick)).read_bytes() == compress_log(again).read_bytes()
        assert not log_path(world, tick).exists()


def test_a_big_log_is_compressed_by_a_child_to_the_bytes_one_process_makes(
    tmp_path: Path, plain: dict[int, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    codes = children(monkeypatch)
    world = copy_demo(tmp_path / "w")
    run(world, 2)
    assert codes == [0, 0]  # each tick's log went to a child, which wrote it whole
    assert sorted(plain) == [1, 2]
    same_as_compressed_here(world, plain, tmp_path)
    assert [p.name for p in (world / ".sim" / "log").glob("*.tmp")] == []


@pytest.mark.parametrize(
    "child", ["import sys; sys.exit(1)", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
)
def test_a_child_that_fails_or_dies_leaves_the_log_to_this_process(
    tmp_path: Path, plain: dict[int, bytes], monkeypatch: pytest.MonkeyPatch, child: str
) -> None:
    """A child that cannot compress (killed by the kernel for memory, say, or importing
    another sim than its parent) costs only time: the log is compressed here instead."""
    monkeypatch.setattr(compression, "_CHILD_CODE", child)
    codes = children(monkeypatch)
    world = copy_demo(tmp_path / "w")
    run(world, 1)
    assert codes and all(code != 0 for code in codes)
    same_as_compressed_here(world, plain, tmp_path)


PARENT = """
import sys, time
from pathlib import Path
from sim.ticklog import compression
compression.CHILD_FROM_BYTES = 0
job = compression.LogCompression(Path(sys.argv[1]), 3)
job.end_with([b'{"type":"commit"}'])
print(job._child.process.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_a_child_whose_parent_is_killed_stops_and_removes_its_copy(tmp_path: Path) -> None:
    """``kill -9`` of ``sim tick`` while its log is being compressed: the child does not
    go on writing beside the next run (which compresses the log again from the start)."""
    world = copy_demo(tmp_path / "w")
    run(world, 1, history={"compress_level": 0})
    log = log_path(world, 1)
    lines = log.read_bytes().splitlines(keepends=True)
    with log.open("ab") as out:  # ~20 MB: longer to pack than the child takes to notice
        while log.stat().st_size < 20 << 20:
            out.writelines(lines[1:])
    before = log.read_bytes()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(log)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(child, signal.SIGSTOP)  # held while its parent dies
    parent.kill()
    parent.wait()
    os.kill(child, signal.SIGCONT)
    assert gone(child, 60), "the compression child outlived its parent"
    assert not packed_path(log).with_name(packed_path(log).name + ".tmp").exists()
    assert log.read_bytes() == before


def test_a_tick_that_fails_after_its_commit_ends_its_compression_child(
    tmp_path: Path, plain: dict[int, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick that raises once committed (a response's deletion failing, say) does not
    leave its compression child running: the child is ended and waited for, its copy
    goes, and the next run compresses the plain log, as after a crash there."""
    from sim.engine import deletions

    started: list[compression._ChildCompression] = []
    real_start = compression._ChildCompression.start.__func__  # type: ignore[attr-defined]

    def start(cls: type, *args: object) -> object:
        child = real_start(cls, *args)
        started.append(child)
        return child

    async def broken(*args: object, **kwargs: object) -> None:
        raise OSError("the disk went away after the commit")

    monkeypatch.setattr(compression._ChildCompression, "start", classmethod(start))
    monkeypatch.setattr(deletions, "flush", broken)
    world = copy_demo(tmp_path / "w")
    with pytest.raises(OSError, match="went away"):
        run(world, 1)
    assert len(started) == 1
    assert started[0].process.poll() is not None, "the compression child was left running"
    log = log_path(world, 1)
    assert log.exists() and not packed_path(log).exists()
    assert list((world / ".sim" / "log").glob("*.tmp")) == []
    monkeypatch.undo()
    run(world, 1)  # tick 1 committed: its log is compressed, and tick 2 runs
    assert packed_path(log).exists() and not log.exists()
    assert packed_path(log_path(world, 2)).exists()
