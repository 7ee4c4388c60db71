"""``sim sweep`` and ``sim sweep report`` through the CLI: runs as forks with their seed and
settings, parallel processes, resume after a worker is killed, the whole-sweep budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import tree

from sim.analysis.sweepreport import Distribution, RunRow, SweepReport, report_html
from sim.cli import main
from sim.config import load_config
from sim.errors import InputError, LogError
from sim.runs.design import make_plan, parse_seeds, parse_setting, run_name
from sim.runs.fork import RUN_FILE, config_toml
from sim.runs.ledger import spend
from sim.runs.process import OUTPUT_FILE
from sim.storage import Storage, dump_json
from sim.testing.stub_server import ServerThread, StubOptions, StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log, read_logs

KEY = {"OPENAI_API_KEY": "sk-test"}


def make_world(tmp_path: Path) -> Path:
    """``sim init``'s world, with custom state fields (a number and a category)."""
    world = tmp_path / "w"
    result = CliRunner().invoke(main, ["init", str(world)])
    assert result.exit_code == 0, result.output
    for i, path in enumerate(sorted((world / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["state"]["health"] = 10 - i
        data["state"]["faction"] = "river" if i % 2 else "town"
        path.write_bytes(dump_json(data))
    return world


def sweep(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["sweep", *args], env=env)
    return result.exit_code, result.output


# -- parsing and naming ------------------------------------------------------------------------


def test_seeds_and_settings_parse() -> None:
    assert parse_seeds("1-3,7,2") == [1, 2, 3, 7]
    for bad in ("", "a", "3-1", "1-", "-2"):
        with pytest.raises(InputError, match="--seeds"):
            parse_seeds(bad)
    setting = parse_setting("phase1.temperature=0.5,0.9")
    assert setting.key == "phase1.temperature" and setting.values == (0.5, 0.9)
    assert parse_setting("phase1.model=gpt-4.1,gpt-4.1-mini").values == ("gpt-4.1", "gpt-4.1-mini")
    for bad in ("temperature=1", "phase1.temperature", "phase1.temperature="):
        with pytest.raises(InputError, match="--set"):
            parse_setting(bad)


def test_run_names_are_deterministic_and_safe() -> None:
    assert run_name(3, {"phase1.temperature": 0.5}) == "seed-3_phase1.temperature=0.5"
    odd = run_name(1, {"llm.base_url": "http://h/v1"})
    assert "/" not in odd and odd == run_name(1, {"llm.base_url": "http://h/v1"})
    assert odd != run_name(1, {"llm.base_url": "http:/h/v1/"})


def test_a_run_config_reads_back_the_same(tmp_path: Path) -> None:
    config = load_config(overrides={"phase1": {"temperature": 0.25, "fallback_models": ["a"]}})
    (tmp_path / "config.toml").write_text(config_toml(config))
    assert load_config(world_dir=tmp_path, cwd=tmp_path) == config


def test_a_bad_setting_names_the_value(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    with pytest.raises(InputError, match=r"--set.*phase1.temperature=9"):
        make_plan(world, tmp_path / "runs", [1], [parse_setting("phase1.temperature=0.5,9")], 1)
    code, output = sweep(
        "--world", str(world), "--out", str(tmp_path / "runs"), "--set", "phase1.nope=1"
    )
    assert code == 2 and "unknown key" in output and not (tmp_path / "runs").exists()
    code, output = sweep("--world", str(world), "--out", str(world / "runs"))
    assert code == 2 and "outside the world" in output and not (world / "runs").exists()


# -- running -----------------------------------------------------------------------------------


def test_three_runs_two_jobs_then_report(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    before = tree(world, logs=True)
    runs = tmp_path / "runs"
    args = ["--world", str(world), "--seeds", "1-3", "--ticks", "2", "--out", str(runs)]
    code, output = sweep(*args, "--set", "phase1.temperature=0.4", "--jobs", "2", "--json")
    assert code == 0, output
    document = orjson.loads(output.splitlines()[-1])
    assert document["ok"] and [r["status"] for r in document["runs"]] == ["done"] * 3
    assert tree(world, logs=True) == before  # the source world is only read
    for seed in (1, 2, 3):
        run = runs / f"seed-{seed}_phase1.temperature=0.4"
        meta = orjson.loads((run / "world.json").read_bytes())
        assert (meta["seed"], meta["tick"]) == (seed, 2)
        record = orjson.loads((run / RUN_FILE).read_bytes())
        assert record["overrides"] == {"phase1.temperature": 0.4}
        assert record["start_tick"] == 0
        assert load_config(world_dir=run, cwd=run).phase1.temperature == 0.4
        logs, problems = read_logs(run)
        assert not problems and [log.tick for log in logs] == [1, 2]
        assert all(log.committed and log.header.seed == seed for log in logs)
        assert all(log.header.config["phase1"]["temperature"] == 0.4 for log in logs)
    # seeds matter: the offline model's answers differ between runs
    narratives = {
        seed: read_log(log_path(runs / f"seed-{seed}_phase1.temperature=0.4", 2)).phase_results(
            "narrative"
        )
        for seed in (1, 2, 3)
    }
    assert len({orjson.dumps(n, option=orjson.OPT_SORT_KEYS) for n in narratives.values()}) > 1

    result = CliRunner().invoke(main, ["sweep", "report", "--runs", str(runs), "--json"])
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.output)
    assert [row["seed"] for row in report["runs"]] == [1, 2, 3]
    assert set(report["fields"]) == {"health", "faction"}
    for row in report["runs"]:
        spent = spend(runs / row["name"])
        assert row["tokens"] == spent.tokens > 0 and row["calls"] == spent.calls > 0
        assert row["ticks_run"] == 2 and row["last_tick"] == 2 and row["cost_usd"] == 0.0
        health = row["fields"]["health"]
        assert health["n"] == 3 and health["min"] <= health["mean"] <= health["max"]
        assert sum(row["fields"]["faction"]["counts"].values()) == 3
    page = tmp_path / "sweep.html"
    text = CliRunner().invoke(main, ["sweep", "report", "--runs", str(runs), "--html", str(page)])
    assert text.exit_code == 0 and "faction" in text.output.splitlines()[0]
    assert "town:" in text.output
    html = page.read_text()
    assert "<th>faction</th>" in html and "<script" not in html
    assert all(row["name"] in html for row in report["runs"])


def test_the_html_page_escapes_what_runs_hold() -> None:
    dist = Distribution()
    dist.add("<script>alert(1)</script>")
    row = RunRow("seed-1", 1, {}, 0, 1, 1, 7, 0, 100, None, {"note": dist})
    page = report_html(SweepReport([row], ["note"], ["<b>odd</b>"]), "<runs>")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "&lt;b&gt;odd" in page and "&lt;runs&gt;" in page and "unknown" in page


def test_a_run_is_reproducible(tmp_path: Path) -> None:
    """The same seed and settings, offline, in another sweep: the same world files."""
    world = make_world(tmp_path)
    trees = []
    for out in ("a", "b"):
        code, output = sweep(
            "--world", str(world), "--seeds", "5", "--set", "phase2b.temperature=0.1",
            "--ticks", "2", "--out", str(tmp_path / out),
        )  # fmt: skip
        assert code == 0, output
        files = tree(tmp_path / out / "seed-5_phase2b.temperature=0.1")
        files.pop(".sim/sweep-output.log")  # wall times
        trees.append(files)
    assert trees[0] == trees[1] and "config.toml" in trees[0]


def test_budget_caps_the_whole_sweep(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    runs = tmp_path / "runs"
    args = ["--world", str(world), "--seeds", "1-3", "--ticks", "1", "--out", str(runs)]
    code, output = sweep(*args, "--seeds", "1", "--json")
    assert code == 0, output
    one = spend(runs / "seed-1").tokens
    # room for the finished run and about one more: the third cannot be fully paid for
    code, output = sweep(*args, "--budget-tokens", str(int(one * 2.5)), "--json")
    document = orjson.loads(output.splitlines()[-1])
    assert code == 1 and not document["ok"]
    statuses = [r["status"] for r in document["runs"]]
    assert statuses[0] == "finished" and "done" not in statuses[2:]
    assert document["spent_tokens"] <= int(one * 2.5)
    total = sum(spend(runs / f"seed-{s}").tokens for s in (1, 2, 3))
    assert total == document["spent_tokens"] <= int(one * 2.5)
    # each run is given what is left when it starts (one job: all of it)
    granted = [r["granted_tokens"] for r in document["runs"][1:]]
    cap = int(one * 2.5)
    assert granted == [cap - one, cap - one - spend(runs / "seed-2").tokens]
    assert document["runs"][2]["status"] == "failed" and "budget" in document["runs"][2]["message"]


# -- killed and resumed ------------------------------------------------------------------------


@pytest.fixture
def held_server() -> Iterator[StubServer]:
    """A stub server whose requests a test can hold (``hold_mid_tick``); released at the end."""
    thread = ServerThread(StubServer(StubOptions(seed=1)))
    server = thread.start()
    yield server
    server.release()
    thread.stop()


def chat_config(tmp_path: Path, world: Path, server: StubServer) -> Path:
    """A ``--config`` whose runs call ``server`` with the chat provider (which sends each
    run's seed with its requests).

    ``sim init``'s world names the offline provider in its own ``config.toml``, which wins
    over ``--config``: that line is taken out so the sweep's config decides. The timeout is
    far longer than a held call waits for its kill, so a held call is never retried.
    """
    world_config = world / "config.toml"
    lines = world_config.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("provider =")]
    assert len(kept) == len(lines) - 1, "sim init's world config names its provider"
    world_config.write_text("".join(kept))
    config = tmp_path / "sweep.toml"
    config.write_text(
        f'[llm]\nprovider = "chat"\nbase_url = "{server.base_url}"\ntimeout_seconds = 300\n'
    )
    return config


def hold_mid_tick(server: StubServer, run: Path, tick: int, seed: int) -> None:
    """Hold the calls of the run with ``seed`` once its ``tick`` has logged a call.

    The run then waits mid-tick, calls logged and nothing committed, until the test has
    killed it: the window to kill in stays open however slowly the test gets to it.
    """
    partial = log_path(run, tick)

    def mid_tick(request: dict[str, object]) -> bool:
        if request.get("seed") != seed:
            return False
        try:
            return b'"call"' in partial.read_bytes()
        except OSError:
            return False

    server.hold(mid_tick)


def _tick_pid(run: Path) -> int | None:
    """The pid of the ``sim tick`` running ``run`` (Linux /proc): by its command line, or,
    a warm step (the default: a fork of a ``python -m sim`` worker), by its
    stdout, the run's output file."""
    want = str(run.resolve()).encode()
    output = str((run / OUTPUT_FILE).resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"tick" in argv and want in argv:
                return int(entry.name)
            if argv[1:3] == [b"-m", b"sim"] and os.readlink(entry / "fd" / "1") == output:
                return int(entry.name)
        except OSError:
            continue
    return None


def kill_mid_tick(server: StubServer, run: Path, tick: int, running: Callable[[], bool]) -> bool:
    """SIGKILL the ``sim tick`` of ``run`` while it waits in a held call of ``tick``.

    ``hold_mid_tick`` must have been set: once a call is held, the process is stopped
    (SIGSTOP) and its state checked (the state it dies in: ``tick`` under way with calls
    logged, nothing committed or journalled) before the kill. The hold is released after.
    """
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and running():
            if server.stats.held:
                break
            time.sleep(0.01)
        else:
            return False
        while time.monotonic() < deadline and running():
            pid = _tick_pid(run)
            if pid is None:  # not seen in /proc yet: look again
                time.sleep(0.01)
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            partial = log_path(run, tick)
            try:
                committed = read_log(partial).committed
            except LogError:  # stopped in the middle of writing a line: look again
                committed = True
            called = b'"call"' in partial.read_bytes()
            at = orjson.loads((run / "world.json").read_bytes())["tick"]
            if at == tick - 1 and called and not committed and not Storage(run).pending_journal():
                os.kill(pid, signal.SIGKILL)
                return True
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.01)
        return False
    finally:
        server.release()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
def test_a_killed_run_resumes_and_finished_runs_are_untouched(
    tmp_path: Path, held_server: StubServer
) -> None:
    world = make_world(tmp_path)
    config = chat_config(tmp_path, world, held_server)
    runs = tmp_path / "runs"
    args = ["sweep", "--world", str(world), "--seeds", "1-3", "--ticks", "3", "--out", str(runs)]
    args += ["--config", str(config), "--jobs", "2"]
    env = {**os.environ, **KEY}
    victim = runs / "seed-2"
    hold_mid_tick(held_server, victim, 2, seed=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        killed = kill_mid_tick(held_server, victim, 2, lambda: proc.poll() is None)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed, "the run never reached its second tick"
    document = orjson.loads(out.decode().splitlines()[-1])
    assert proc.returncode == 1 and not document["ok"]
    by_name = {r["name"]: r for r in document["runs"]}
    assert by_name["seed-2"]["status"] == "failed"
    assert "signal 9" in by_name["seed-2"]["message"]
    assert by_name["seed-1"]["status"] == by_name["seed-3"]["status"] == "done"
    assert not read_log(log_path(victim, 2)).committed
    untouched = {name: tree(runs / name, logs=True) for name in ("seed-1", "seed-3")}

    code, output = sweep(*args[1:], "--json", env=KEY)
    assert code == 0, output
    document = orjson.loads(output.splitlines()[-1])
    statuses = {r["name"]: r["status"] for r in document["runs"]}
    assert statuses == {"seed-1": "finished", "seed-2": "done", "seed-3": "finished"}
    for name, files in untouched.items():
        assert tree(runs / name, logs=True) == files  # byte-identical, nothing written
    resumed = read_log(log_path(victim, 2))
    assert resumed.committed and resumed.resumes >= 1
    assert orjson.loads((victim / "world.json").read_bytes())["tick"] == 3


# -- Ray ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[object]:
    """A local Ray instance with two CPUs, for the module."""
    ray = pytest.importorskip("ray", reason="Ray cannot be installed here (pip install ray)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
def test_a_ray_sweep_finishes_and_resumes_a_killed_run(
    tmp_path: Path, held_server: StubServer, ray_local: object
) -> None:
    import threading

    from sim.runs.process import SweepResult, ray_executor
    from sim.runs.sweep import run_sweep

    world = make_world(tmp_path)
    config = chat_config(tmp_path, world, held_server)
    runs = tmp_path / "runs"
    plan = make_plan(world, runs, [1, 2, 3], [], 3, config)
    results: list[SweepResult] = []
    victim = runs / "seed-2"
    hold_mid_tick(held_server, victim, 2, seed=2)
    thread = threading.Thread(
        target=lambda: results.append(run_sweep(plan, 2, executor=ray_executor()))
    )
    thread.start()
    killed = kill_mid_tick(held_server, victim, 2, thread.is_alive)
    thread.join(timeout=300)
    assert killed and results, "the run never reached its second tick"
    statuses = {o.name: o.status for o in results[0].runs}
    assert statuses == {"seed-1": "done", "seed-2": "failed", "seed-3": "done"}
    assert not read_log(log_path(victim, 2)).committed
    untouched = {name: tree(runs / name, logs=True) for name in ("seed-1", "seed-3")}

    args = ["--world", str(world), "--seeds", "1-3", "--ticks", "3", "--out", str(runs)]
    code, output = sweep(*args, "--config", str(config), "--executor", "ray", "--json")
    assert code == 0, output
    document = orjson.loads(output.splitlines()[-1])
    statuses = {r["name"]: r["status"] for r in document["runs"]}
    assert statuses == {"seed-1": "finished", "seed-2": "done", "seed-3": "finished"}
    for name, files in untouched.items():
        assert tree(runs / name, logs=True) == files
    resumed = read_log(log_path(victim, 2))
    assert resumed.committed and resumed.resumes >= 1


def test_ray_address_needs_the_ray_executor(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    code, output = sweep(
        "--world", str(world), "--out", str(tmp_path / "runs"), "--ray-address", "auto"
    )
    assert code == 2 and "--executor ray" in output
