"""Issue 39: Ctrl-C stops ``sim study run`` and ``sim sweep``. Before, every arm was queued
up front and shutdown waited for the queue: the first Ctrl-C killed the steps in flight
(the terminal's signal reached them too), then the study started the next arms."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import interruptible_children, tree

from sim.cli import main
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")

STUDY = """\
world = "w"
seeds = "1-3"
ticks = 2
[conditions.control]
"""
KEY = {"OPENAI_API_KEY": "sk-test"}


@pytest.fixture
def server() -> Iterator[StubServer]:
    thread = ServerThread(StubServer(StubOptions(seed=1)))
    server = thread.start()
    yield server
    server.release()
    thread.stop()


@pytest.fixture
def here(tmp_path: Path, server: StubServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A world whose calls go to ``server`` (through the user's config) and a study of it."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init", "w"])
    assert result.exit_code == 0, result.output
    world_config = tmp_path / "w" / "config.toml"
    lines = world_config.read_text().splitlines(True)
    world_config.write_text("".join(ln for ln in lines if not ln.startswith("provider =")))
    (tmp_path / "config.toml").write_text(
        f'[llm]\nprovider = "chat"\nbase_url = "{server.base_url}"\ntimeout_seconds = 300\n'
    )
    (tmp_path / "study.toml").write_text(STUDY)
    return tmp_path


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


_SERVER_ID = re.compile(rb"chatcmpl-[0-9a-f]{32}")
_CACHED = re.compile(rb'"total_cached_input_tokens": [0-9]+')


def _results(out: Path) -> dict[str, bytes]:
    """A study's or sweep's folder less what records times (logs, the children's output)
    and what the stub server makes up per request: its response ids (random) and its
    cached-token counts (what it saw before, the held calls of the interrupted run too)."""
    return {
        rel: _CACHED.sub(b"", _SERVER_ID.sub(b"ID", data))
        for rel, data in tree(out).items()
        if "/.sim/log/" not in rel
        and not rel.endswith(".sim/sweep-output.log")
        and "/.sim/responses/" not in rel
    }


def _interrupt(here: Path, server: StubServer, args: list[str], first: Path) -> set[int]:
    """Start ``sim ARGS`` with every call held, Ctrl-C it (SIGINT to it alone, as a
    terminal's Ctrl-C reaches it when its children have sessions of their own) once its
    first step waits in a call, and return the pids of its children then."""
    server.hold(lambda request: True)
    with interruptible_children():
        proc = subprocess.Popen(
            [sys.executable, "-m", "sim", *args],
            cwd=here,
            env={**os.environ, **KEY},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while not server.stats.held and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.stats.held, "no call was ever made"
        children = _children(proc.pid)
        assert children, "no child step running"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.release()
    text = output.decode()
    assert proc.returncode == 130, text
    assert "interrupted" in text and "Traceback" not in text, text
    assert first.is_dir(), text
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children), "a step outlived the command"
    return children


@pytest.mark.parametrize("warm", ["0", "1"], ids=["cold", "warm"])
def test_ctrl_c_stops_a_study_which_resumes_to_the_same_result(
    here: Path, server: StubServer, warm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIM_WARM_STEPS", warm)  # each step a new process, or a warm fork
    _interrupt(here, server, ["study", "run", "study.toml", "--out", "out"], here / "out")
    # the step in flight was stopped, and no other arm was begun
    assert sorted(p.name for p in (here / "out" / "control").iterdir()) == ["seed-1"]
    runner = CliRunner()
    result = runner.invoke(main, ["study", "run", "study.toml", "--out", "out"], env=KEY)
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["study", "run", "study.toml", "--out", "clean"], env=KEY)
    assert result.exit_code == 0, result.output
    resumed, clean = _results(here / "out"), _results(here / "clean")
    assert resumed.pop("study.json") != b"" and clean.pop("study.json") != b""
    assert resumed == clean


@pytest.mark.parametrize("warm", ["0", "1"], ids=["cold", "warm"])
def test_ctrl_c_stops_a_sweep_which_resumes_to_the_same_result(
    here: Path, server: StubServer, warm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIM_WARM_STEPS", warm)  # each step a new process, or a warm fork
    args = ["sweep", "--world", "w", "--seeds", "1-3", "--ticks", "2"]
    _interrupt(here, server, [*args, "--out", "runs"], here / "runs" / "seed-1")
    assert sorted(p.name for p in (here / "runs").iterdir()) == ["seed-1"]
    runner = CliRunner()
    assert runner.invoke(main, [*args, "--out", "runs"], env=KEY).exit_code == 0
    assert runner.invoke(main, [*args, "--out", "clean"], env=KEY).exit_code == 0
    assert _results(here / "runs") == _results(here / "clean")


SECOND_CTRL_C = """\
import os, signal, sys, threading, time
from pathlib import Path
from sim.runs.process import LocalExecutor, run_tasks

run_dir = Path(sys.argv[1])
executor = LocalExecutor()
# a step that ignores the first Ctrl-C: only the second can end it
step = [sys.executable, "-c", "import os, signal, time; signal.signal(signal.SIGINT, "
        "signal.SIG_IGN); print(os.getpid(), flush=True); time.sleep(300)"]

def ctrl_c_twice():
    log = run_dir / ".sim" / "sweep-output.log"
    while not (log.is_file() and log.read_text().strip()):  # the step ignores SIGINT now
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=ctrl_c_twice, daemon=True).start()
try:
    run_tasks(1, [lambda: executor(run_dir, step, run_dir)] * 3, executor, threading.Event())
    print("returned")
except KeyboardInterrupt:
    print("ended at once")
"""


def test_a_second_ctrl_c_ends_the_steps_at_once(tmp_path: Path) -> None:
    """The first Ctrl-C waits for the steps in flight to stop; the second kills them and
    ends the command, and the steps not begun never start."""
    with interruptible_children():
        done = subprocess.run(
            [sys.executable, "-c", SECOND_CTRL_C, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.stdout.strip() == "ended at once", done.stdout + done.stderr
    pids = (tmp_path / ".sim" / "sweep-output.log").read_text().split()
    assert len(pids) == 1  # one step began; the two after it never did
    deadline = time.monotonic() + 10
    while _alive(int(pids[0])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(int(pids[0]))
