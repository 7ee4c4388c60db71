"""Issue 37, many runs on one machine: a sweep's or study's steps run in forks of warm
workers (the default; ``SIM_WARM_STEPS=0`` opts out; ``sim.runs.warm``) give what a new
process per step gives, and a step or a worker that dies is that step's failure, never the
sweep's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.runs.process import OUTPUT_FILE, LocalExecutor, _WarmWorker
from sim.runs.warm import enabled
from sim.testing.logs import comparable

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"),
    reason="warm steps need Linux pidfds",
)

STUDY = """\
world = "w"
seeds = "1-3"
ticks = 3
[conditions.control]
[conditions.news]
inject = [{ tick = 2, at = "square", text = "The lord will pay half the mill." }]
"""


def _sim(here: Path, *args: str, warm: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SIM_WARM_STEPS": warm}
    return subprocess.run(
        [sys.executable, "-m", "sim", *args], cwd=here, env=env, capture_output=True, text=True
    )


def _files(root: Path) -> dict[str, bytes]:
    """Every file, logs and summaries decompressed with what differs between two runs of
    a tick blanked (``comparable``: timings and the run's nonce), the children's output
    (timings) left out."""
    out: dict[str, bytes] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.endswith(OUTPUT_FILE):
            continue
        out[rel] = comparable(path) if "/.sim/log/" in rel else path.read_bytes()
    return out


def test_a_warm_study_gives_what_a_cold_one_gives(tmp_path: Path) -> None:
    assert _sim(tmp_path, "init", "w", warm="0").returncode == 0
    (tmp_path / "study.toml").write_text(STUDY)
    got = {}
    for warm in ("0", "1"):
        done = _sim(
            tmp_path, "study", "run", "study.toml", "--out", "out", "--jobs", "2", warm=warm
        )
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        got[warm] = _files(tmp_path / "out")
        os.rename(tmp_path / "out", tmp_path / f"out-{warm}")
    assert got["0"] == got["1"]
    assert any("/.sim/log/" in rel for rel in got["1"])  # the logs were compared too
    # the world files byte for byte, raw
    for rel in got["0"]:
        if "/.sim/" not in rel:
            assert (tmp_path / "out-0" / rel).read_bytes() == (
                tmp_path / "out-1" / rel
            ).read_bytes()


def test_warm_steps_are_the_default_and_zero_opts_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIM_WARM_STEPS", raising=False)
    assert enabled() and LocalExecutor().warm
    monkeypatch.setenv("SIM_WARM_STEPS", "0")
    assert not enabled() and not LocalExecutor().warm
    monkeypatch.setenv("SIM_WARM_STEPS", "1")
    assert enabled() and LocalExecutor().warm


def _world(tmp_path: Path) -> Path:
    assert _sim(tmp_path, "init", "w", warm="0").returncode == 0
    return tmp_path / "w"


def _tick(world: Path, ticks: int) -> list[str]:
    return [sys.executable, "-m", "sim", "tick", "--world", str(world), "--ticks", str(ticks)]


def _busy_step(executor: LocalExecutor) -> tuple[_WarmWorker, int]:
    """The worker of the one step in flight and its step's pid, once told."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        busy = list(executor._busy)
        if busy and busy[0].step_pid is not None:
            return busy[0], busy[0].step_pid
        time.sleep(0.01)
    raise AssertionError("no step in flight")


class _Step(threading.Thread):
    """One step of ``executor`` run in a thread (as ``run_tasks`` runs them)."""

    def __init__(self, executor: LocalExecutor, world: Path, ticks: int) -> None:
        super().__init__()
        self.run_step = lambda: executor(world, _tick(world, ticks), world.parent)
        self.codes: list[int] = []
        self.start()

    def run(self) -> None:
        self.codes.append(self.run_step())

    def code(self) -> int:
        self.join(timeout=120)
        assert self.codes, "the step never ended"
        return self.codes[0]


def _children(pid: int) -> set[int]:
    """Every child of ``pid``, whichever of its threads started it."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            continue
    return found


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_a_crashed_step_fails_alone_and_a_dead_worker_is_replaced(tmp_path: Path) -> None:
    world = _world(tmp_path)
    executor = LocalExecutor(warm_steps=True)
    try:
        # a step that segfaults: its failure (as a killed child's), the worker lives on
        running = _Step(executor, world, 200)
        worker, step = _busy_step(executor)
        os.kill(step, signal.SIGSEGV)
        assert running.code() == -signal.SIGSEGV
        assert worker.process.poll() is None and executor._idle == [worker]
        # the next step runs in the same worker, to its end, and goes on from where it was
        assert executor(world, _tick(world, 1), tmp_path) == 0
        assert executor._idle == [worker]
        # the worker killed under a step: the step fails with a note, and dies with it
        running = _Step(executor, world, 200)
        worker, step = _busy_step(executor)
        os.kill(worker.process.pid, signal.SIGKILL)
        assert running.code() == -signal.SIGKILL
        assert _gone(step), "the step outlived its worker"
        assert "the warm worker running this step ended" in (world / OUTPUT_FILE).read_text()
        assert executor._idle == []
        # a new worker for the next step
        assert executor(world, _tick(world, 1), tmp_path) == 0
        assert len(executor._idle) == 1 and executor._idle[0] is not worker
        last = executor._idle[0]
    finally:
        executor.close()
    assert _gone(last.process.pid)


def test_kill_ends_a_warm_step_at_once_and_its_worker(tmp_path: Path) -> None:
    """A second Ctrl-C (``kill``): the step in flight is killed, the workers end, and no
    step starts after it."""
    world = _world(tmp_path)
    executor = LocalExecutor(warm_steps=True)
    running = _Step(executor, world, 500)
    worker, step = _busy_step(executor)
    executor.kill()
    assert running.code() == -signal.SIGKILL
    assert _gone(step) and _gone(worker.process.pid)
    assert executor(world, _tick(world, 1), tmp_path) == 128 + signal.SIGINT  # not started


def test_a_killed_sweep_ends_its_workers_and_their_steps(tmp_path: Path) -> None:
    """kill -9 of the sweep: each worker sees its socket close, stops its step as Ctrl-C
    does (SIGTERM) and exits."""
    world = _world(tmp_path)
    args = ["sweep", "--world", str(world), "--seeds", "1-2", "--ticks", "400", "--out", "runs"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", *args, "--jobs", "2"],
        cwd=tmp_path,
        env={**os.environ, "SIM_WARM_STEPS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        steps: set[int] = set()
        while time.monotonic() < deadline and len(steps) < 2:
            workers = _children(proc.pid)
            steps = set().union(*(_children(worker) for worker in workers))
            time.sleep(0.05)
        assert len(steps) == 2, "the two steps never started"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert all(_gone(pid) for pid in steps | workers), "a step or worker outlived its sweep"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
