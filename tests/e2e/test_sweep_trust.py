"""A sweep's run folders are untrusted input (issue 24 items 1 and 13, issue 27): a tampered
run's config sends nothing to a host the user did not choose, the run folders continue as
they are, a killed sweep leaves no child running, and a folder of another world's or
design's runs is refused by name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import tree

from sim.cli import main
from sim.runs.fork import RUN_FILE
from sim.storage import dump_json
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

KEY = {"OPENAI_API_KEY": "sk-user-key", "OTHER_SECRET": "other-secret-value"}


def make_world(root: Path, name: str = "w", offline: bool = True) -> Path:
    world = root / name
    result = CliRunner().invoke(main, ["init", str(world)])
    assert result.exit_code == 0, result.output
    for i, path in enumerate(sorted((world / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["state"]["coins"] = 5 + i
        path.write_bytes(dump_json(data))
    if not offline:  # the user's --config decides the endpoint
        text = (world / "config.toml").read_text()
        kept = [line for line in text.splitlines(True) if not line.startswith("provider =")]
        (world / "config.toml").write_text("".join(kept))
    return world


def sim(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


@pytest.fixture
def servers() -> Iterator[tuple[StubServer, StubServer]]:
    """The user's server and another one (the thief's), both on loopback."""
    threads = [ServerThread(StubServer(StubOptions(seed=1))) for _ in range(2)]
    started = [t.start() for t in threads]
    yield started[0], started[1]
    for server in started:
        server.release()
    for thread in threads:
        thread.stop()


def test_a_tampered_run_config_sends_nothing_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: tuple[StubServer, StubServer]
) -> None:
    """issue 24 item 1's reproduction: the edited run's config redirects nothing."""
    monkeypatch.chdir(tmp_path)
    users, thief = servers
    world = make_world(tmp_path, offline=False)
    user_toml = tmp_path / "user.toml"
    user_toml.write_text(f'[llm]\nprovider = "chat"\nbase_url = "{users.base_url}"\n')
    runs = tmp_path / "runs"
    args = ["sweep", "--world", str(world), "--seeds", "1-2", "--out", str(runs)]
    args += ["--config", str(user_toml), "--json"]
    code, output = sim(*args, "--ticks", "1", env=KEY)
    assert code == 0, output
    assert users.stats.requests > 0
    config = runs / "seed-1" / "config.toml"
    assert users.base_url not in config.read_text()  # the user's endpoint is not copied
    assert "providers" not in config.read_text()
    with config.open("a") as handle:
        handle.write(f'\n[phase1]\nbase_url = "{thief.base_url}"\napi_key_env = "OTHER_SECRET"\n')
    code, output = sim(*args, "--ticks", "3", env=KEY)
    document = orjson.loads(output.splitlines()[-1])
    statuses = {r["name"]: r for r in document["runs"]}
    assert code == 1 and statuses["seed-2"]["status"] == "done"
    assert statuses["seed-1"]["status"] == "failed"
    assert "config.toml" in statuses["seed-1"]["message"]
    assert thief.stats.connections == 0 and thief.stats.requests == 0
    assert "other-secret-value" not in output and "sk-user-key" not in output
    # so does a config.toml planted beside the runs, or in the folder's own cwd
    (runs / "config.toml").write_text(f'[llm]\nbase_url = "{thief.base_url}"\n')
    code, output = sim(*args, "--ticks", "4", env=KEY)
    assert code == 1 and thief.stats.connections == 0


def test_run_folders_continue_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 27: sim tick, check, ask, report and fork accept a sweep's run folder."""
    monkeypatch.chdir(tmp_path)
    world = make_world(tmp_path)
    runs = tmp_path / "runs"
    code, output = sim(
        "sweep", "--world", str(world), "--seeds", "1", "--set", "phase1.temperature=0.4",
        "--ticks", "2", "--out", str(runs),
    )  # fmt: skip
    assert code == 0, output
    run = runs / "seed-1_phase1.temperature=0.4"
    assert "temperature = 0.4" in (run / "config.toml").read_text()
    for args in (
        ["check", "--world", str(run)],
        ["tick", "--world", str(run)],
        ["ask", "--world", str(run), "--all", "How are you?"],
        ["report", "--world", str(run), "--out", str(tmp_path / "r.html")],
        ["fork", "--world", str(run), "--tick", "2", "--to", str(tmp_path / "forked")],
    ):
        code, output = sim(*args)
        assert code == 0, (args, output)
    assert orjson.loads((run / "world.json").read_bytes())["tick"] == 3


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_killed_sweep_leaves_no_child_running(
    tmp_path: Path, servers: tuple[StubServer, StubServer]
) -> None:
    """issue 24 item 13: kill -9 of the sweep; its sim tick children die with it."""
    users, _ = servers
    world = make_world(tmp_path, offline=False)
    user_toml = tmp_path / "user.toml"
    user_toml.write_text(
        f'[llm]\nprovider = "chat"\nbase_url = "{users.base_url}"\ntimeout_seconds = 300\n'
    )
    users.hold(lambda request: True)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "sweep", "--world", str(world), "--seeds", "1-2",
         "--out", str(runs), "--config", str(user_toml), "--jobs", "2"],
        cwd=tmp_path, env={**os.environ, **KEY},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and users.stats.held < 2:
            time.sleep(0.05)
        assert users.stats.held >= 2, "the runs never reached the server"
        children = _children(proc.pid)
        assert len(children) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(c) for c in children):
            time.sleep(0.05)
        assert not any(_alive(c) for c in children), "a sim tick outlived its sweep"
    finally:
        if proc.poll() is None:
            proc.kill()
        for child in _children(proc.pid):
            os.kill(child, signal.SIGKILL)
        users.release()
    # nothing was committed, and the next sweep resumes both runs
    users.release()
    code, output = sim(
        "sweep", "--world", str(world), "--seeds", "1-2", "--out", str(runs),
        "--config", str(user_toml), env=KEY,
    )  # fmt: skip
    assert code == 0, output


def test_another_worlds_runs_are_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 27: a second world swept into the first world's folder is refused; nothing is
    overwritten or reported done; the same sweep again resumes."""
    monkeypatch.chdir(tmp_path)
    first, second = make_world(tmp_path, "a"), make_world(tmp_path, "b")
    runs = tmp_path / "runs"
    args = ["--seeds", "1-2", "--ticks", "2", "--out", str(runs)]
    code, output = sim("sweep", "--world", str(first), *args)
    assert code == 0, output
    before = tree(runs, logs=True)
    code, output = sim("sweep", "--world", str(second), *args)
    assert code == 2, output
    assert f"seed-1/{RUN_FILE}" in output and "another output folder" in output
    assert "finished" not in output and "done" not in output
    assert tree(runs, logs=True) == before
    # another design (other settings' keys) is refused too
    code, output = sim("sweep", "--world", str(first), *args, "--set", "phase1.temperature=0.5")
    assert code == 2 and "another design" in output and tree(runs, logs=True) == before
    # the same sweep again: finished runs reported as such, a longer one runs on
    code, output = sim("sweep", "--world", str(first), *args)
    assert code == 0 and output.count("finished    seed") == 2, output
    code, output = sim("sweep", "--world", str(first), "--seeds", "1-2", "--ticks", "3",
                       "--out", str(runs))  # fmt: skip
    assert code == 0 and output.count("done        seed") == 2, output


def test_a_report_of_a_folder_of_folders_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 27: sweep report on a folder holding control/ and treat/ is not an empty table."""
    monkeypatch.chdir(tmp_path)
    world = make_world(tmp_path)
    for arm in ("control", "treat"):
        code, output = sim("sweep", "--world", str(world), "--out", str(tmp_path / "runs" / arm))
        assert code == 0, output
    code, output = sim("sweep", "report", "--runs", str(tmp_path / "runs"))
    assert code == 2 and "holds no sweep run" in output
    assert "control" in output and "treat" in output and "report each (--runs " in output
    code, output = sim("sweep", "verify", str(tmp_path / "runs"))
    assert code == 2 and "holds no sweep run" in output and "control, treat" in output
    assert f"verify each (sim sweep verify {tmp_path / 'runs' / 'control'})" in output, output
    code, output = sim("sweep", "report", "--runs", str(tmp_path / "runs" / "treat"))
    assert code == 0 and "seed-0" in output


def test_tick_and_ask_take_set_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--set SECTION.KEY=VALUE``: what each child of a sweep is given its settings by."""
    monkeypatch.chdir(tmp_path)
    world = make_world(tmp_path)
    code, output = sim("tick", "--world", str(world), "--set", "phase1.temperature=0.25")
    assert code == 0, output
    from sim.ticklog.format import log_file
    from sim.ticklog.reader import read_log

    assert read_log(log_file(world, 1)).header.config["phase1"]["temperature"] == 0.25
    for bad in ("nope", "phase1=1", "phase1.nope=1", "phase1.temperature=9"):
        code, output = sim("tick", "--world", str(world), "--set", bad)
        assert code == 2 and ("--set" in output or "phase1" in output), (bad, output)
        code, output = sim("ask", "--world", str(world), "--all", "Q?", "--set", bad)
        assert code == 2, (bad, output)
    assert orjson.loads((world / "world.json").read_bytes())["tick"] == 1


def test_runs_of_an_earlier_state_of_the_world_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The world ticked on since the runs were forked: new runs would start elsewhere."""
    monkeypatch.chdir(tmp_path)
    world = make_world(tmp_path)
    runs = tmp_path / "runs"
    assert sim("sweep", "--world", str(world), "--seeds", "1", "--out", str(runs))[0] == 0
    before = tree(runs, logs=True)
    assert sim("tick", "--world", str(world))[0] == 0
    code, output = sim("sweep", "--world", str(world), "--seeds", "1-2", "--out", str(runs))
    assert code == 2 and "start_tick" in output and "now at tick 1" in output, output
    assert tree(runs, logs=True) == before
