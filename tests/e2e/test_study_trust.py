"""A study file is untrusted input, as a world is (issue 35, the trust boundary): its
factors get the rule of a world's own config (no routing, commands, keys or endpoints of
its choosing without ``--trust-study``; limits only tightened), its expansion is counted
before it is made, and its survey schemas are read as a world's files are."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.errors import InputError
from sim.runs.design import MAX_RUNS, parse_seeds, parse_setting
from sim.storage import dump_json
from sim.study.design import read_study
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

STUDY = """\
world = "w"
seeds = "1"
ticks = 1
[conditions.control]
"""

KEY = {"OPENAI_API_KEY": "sk-user-key"}


def sim(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a world ``w`` (``sim init``, no provider of its own)."""
    monkeypatch.chdir(tmp_path)
    code, output = sim("init", str(tmp_path / "w"))
    assert code == 0, output
    config = tmp_path / "w" / "config.toml"
    kept = [ln for ln in config.read_text().splitlines(True) if not ln.startswith("provider =")]
    config.write_text("".join(kept))
    for i, path in enumerate(sorted((tmp_path / "w" / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["state"]["coins"] = 5 + i
        path.write_bytes(dump_json(data))
    return tmp_path


@pytest.fixture
def servers() -> Iterator[tuple[StubServer, StubServer]]:
    """The user's server and another one (the study's choice), both on loopback."""
    threads = [ServerThread(StubServer(StubOptions(seed=1))) for _ in range(2)]
    started = [t.start() for t in threads]
    yield started[0], started[1]
    for thread in threads:
        thread.stop()


def study(here: Path, factors: str, name: str = "study.toml") -> Path:
    path = here / name
    path.write_text(STUDY + "[factors]\n" + factors)
    return path


def refused(code: int, output: str, *named: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output and "internal error" not in output, output
    for part in named:
        assert part in output, output


# -- 1. the factors under the trust rule --------------------------------------------------------


def test_a_study_cannot_run_a_program(here: Path) -> None:
    marker = here / "ran"
    command = orjson.dumps(["sh", "-c", f"touch {marker}; echo '{{}}'"]).decode()
    study(here, f'"llm.provider" = ["cli"]\n"llm.command" = [{command}]\n')
    code, output = sim("study", "run", "study.toml", "--out", "out")
    refused(code, output, "study.toml", 'factors."llm.provider"', 'factors."llm.command"')
    assert "--trust-study" in output
    assert not marker.exists() and not (here / "out").exists()


def test_a_study_cannot_send_the_key_elsewhere(
    here: Path, servers: tuple[StubServer, StubServer]
) -> None:
    users, thief = servers
    (here / "user.toml").write_text(f'[llm]\nprovider = "chat"\nbase_url = "{users.base_url}"\n')
    study(here, f'"llm.base_url" = ["{thief.base_url}"]\n')
    code, output = sim(
        "study", "run", "study.toml", "--out", "out", "--config", "user.toml", env=KEY
    )
    refused(code, output, "study.toml", 'factors."llm.base_url"')
    assert thief.stats.connections == 0 and thief.stats.requests == 0
    assert users.stats.requests == 0  # refused before anything is called
    assert not (here / "out").exists() and "sk-user-key" not in output
    # an endpoint-qualified model, a provider table and a policy gate: the same rule
    for factors, field in (
        ('"phase1.model" = ["anthropic/claude-x"]', "phase1.model"),
        (f'"providers.mine" = [{{ kind = "chat", base_url = "{thief.base_url}" }}]', "providers"),
        ('"policy.approve_above_usd" = [1000.0]', "policy.approve_above_usd"),
    ):
        study(here, factors + "\n")
        code, output = sim(
            "study", "run", "study.toml", "--out", "out", "--config", "user.toml", env=KEY
        )
        refused(code, output, f'factors."{field}', "study.toml")
    assert thief.stats.connections == 0 and not (here / "out").exists()


def test_a_study_cannot_loosen_the_budget_even_trusted(here: Path) -> None:
    (here / "user.toml").write_text("[budget]\nmax_cost_usd = 0.04\n")
    study(here, '"budget.max_cost_usd" = [0.01, 1000.0]\n')
    for trust in ([], ["--trust-study"]):
        code, output = sim(
            "study", "run", "study.toml", "--out", "out", "--config", "user.toml", *trust
        )
        refused(code, output, "study.toml", 'factors."budget.max_cost_usd"', "1000.0", "0.04")
        assert "never loosen" in output and not (here / "out").exists()
    # no cap of the user's is loosened by one: 0 (no cap) is looser than any
    study(here, '"budget.max_total_tokens" = [0]\n')
    (here / "user.toml").write_text("[budget]\nmax_total_tokens = 500\n")
    code, output = sim("study", "run", "study.toml", "--out", "out", "--config", "user.toml")
    refused(code, output, 'factors."budget.max_total_tokens"')


def test_a_tightening_budget_factor_runs(here: Path) -> None:
    (here / "user.toml").write_text('[llm]\nprovider = "offline"\n[budget]\nmax_cost_usd = 40.0\n')
    study(here, '"budget.max_cost_usd" = [5.0, 40.0]\n')
    code, output = sim(
        "study", "run", "study.toml", "--out", "out", "--config", "user.toml", "--json"
    )
    assert code == 0, output
    names = sorted(r["name"] for r in orjson.loads(output.splitlines()[-1])["runs"])
    assert names == [
        "control/seed-1_budget.max_cost_usd=40.0",
        "control/seed-1_budget.max_cost_usd=5.0",
    ]


def test_trust_study_lets_a_routing_factor_through_and_says_so(
    here: Path, servers: tuple[StubServer, StubServer]
) -> None:
    users, other = servers
    (here / "user.toml").write_text(f'[llm]\nprovider = "chat"\nbase_url = "{users.base_url}"\n')
    study(here, f'"llm.base_url" = ["{other.base_url}"]\n')
    code, output = sim(
        "study", "run", "study.toml", "--out", "out", "--config", "user.toml", "--trust-study",
        env=KEY,
    )  # fmt: skip
    assert code == 0, output
    assert 'factors."llm.base_url"' in output and "trusted (--trust-study)" in output
    assert other.stats.requests > 0 and users.stats.requests == 0
    # the user's own choice needs no trust: a factor restating it is not refused
    study(here, f'"llm.base_url" = ["{users.base_url}"]\n', "same.toml")
    code, output = sim(
        "study", "run", "same.toml", "--out", "out-same", "--config", "user.toml", env=KEY
    )
    assert code == 0, output
    assert users.stats.requests > 0 and "--trust-study" not in output


def test_sweep_settings_come_from_the_command_line_not_the_run_record(here: Path) -> None:
    """A sweep's run record may be edited: its settings are compared with the command
    line's by value (``1 == true`` in Python), and the child gets the command line's."""
    (here / "user.toml").write_text('[llm]\nprovider = "offline"\n')
    args = ["sweep", "--world", "w", "--seeds", "1", "--set", "llm.transient_retries=1"]
    args += ["--out", "runs", "--config", "user.toml"]
    code, output = sim(*args, "--ticks", "1")
    assert code == 0, output
    record_path = here / "runs" / "seed-1_llm.transient_retries=1" / "sweep-run.json"
    record = orjson.loads(record_path.read_bytes())
    record["overrides"] = {"llm.transient_retries": True}
    record_path.write_bytes(dump_json(record))
    code, output = sim(*args, "--ticks", "2")
    assert code == 0, output


# -- 3. expansion bombs -------------------------------------------------------------------------


def _peak(call: object) -> int:
    tracemalloc.start()
    try:
        assert callable(call)
        call()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def test_a_seeds_bomb_is_counted_not_expanded(here: Path) -> None:
    bomb = ",".join(f"{i * 100_000}-{i * 100_000 + 99_999}" for i in range(200))
    assert len(bomb) < 5 * 1024
    (here / "bomb.toml").write_text(STUDY.replace('seeds = "1"', f'seeds = "{bomb}"'))

    def read() -> None:
        with pytest.raises(InputError) as caught:
            read_study(here / "bomb.toml")
        assert caught.value.field == "seeds" and "20000000" in caught.value.problem

    assert _peak(read) < 50 * 1024 * 1024
    code, output = sim("study", "run", "bomb.toml", "--out", "out")
    refused(code, output, "bomb.toml", "seeds", str(MAX_RUNS))
    code, output = sim("sweep", "--world", "w", "--seeds", bomb, "--out", "runs")
    refused(code, output, "--seeds", str(MAX_RUNS))
    assert not (here / "out").exists() and not (here / "runs").exists()


def test_a_factor_bomb_is_counted_not_expanded(here: Path) -> None:
    factors = "".join(f'"phase1.f{i}" = [0, 1]\n' for i in range(28))
    study(here, factors, "bomb.toml")

    def read() -> None:
        with pytest.raises(InputError) as caught:
            read_study(here / "bomb.toml")
        assert caught.value.field == "factors" and str(2**28) in caught.value.problem

    assert _peak(read) < 50 * 1024 * 1024
    code, output = sim("study", "run", "bomb.toml", "--out", "out")
    refused(code, output, "bomb.toml", "factors", str(MAX_RUNS))
    settings = [f"--set=phase1.f{i}=0,1" for i in range(28)]
    code, output = sim("sweep", "--world", "w", *settings, "--out", "runs")
    refused(code, output, "--set", str(MAX_RUNS))
    assert not (here / "out").exists() and not (here / "runs").exists()


def test_seeds_are_plain_numbers_in_range() -> None:
    for bad in ("9" * 5000, "\u00b2", "1-" + "9" * 40, "1--2"):
        with pytest.raises(InputError):
            parse_seeds(bad)
    assert parse_seeds("3-5,1,4,9-9") == [3, 4, 5, 1, 9]
    assert parse_seeds(f"0-{MAX_RUNS - 1}")[-1] == MAX_RUNS - 1
    with pytest.raises(InputError, match=str(MAX_RUNS)):
        parse_seeds(f"0-{MAX_RUNS}")
    assert parse_setting("phase1.temperature=0.5,0.9").values == (0.5, 0.9)


# -- 5. survey schemas, read as a world's files ------------------------------------------------

SURVEY = """
[[surveys]]
ticks = [1]
question = "How are you?"
schema = "{schema}"
"""

SCHEMA = b'{"type": "object", "properties": {"mood": {"type": "string"}}, "required": ["mood"]}'


def _run(here: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(os.name != "posix", reason="links and FIFOs need POSIX")
@pytest.mark.timeout(300)
def test_a_survey_schema_is_read_inside_the_study_folder_only(here: Path) -> None:
    studies = here / "studies"
    (studies / "schemas").mkdir(parents=True)
    outside = here / "outside.json"
    outside.write_bytes(SCHEMA)  # a valid schema: found through a link, it would be used
    (studies / "schemas" / "ok.json").write_bytes(SCHEMA)

    def attempt(schema: str) -> subprocess.CompletedProcess[str]:
        text = STUDY.replace('"w"', '"../w"') + SURVEY.format(schema=schema)
        (studies / "study.toml").write_text(text)
        return _run(here, "study", "run", "studies/study.toml", "--out", "out")

    os.mkfifo(studies / "schemas" / "fifo.json")
    (studies / "schemas" / "link.json").symlink_to(outside)
    (studies / "linked").symlink_to(here)
    for schema, said in (
        ("schemas/fifo.json", "named pipe"),
        ("schemas/link.json", "symlink"),
        ("../outside.json", "outside"),
        (str(outside), "outside"),
        ("linked/outside.json", "symlink"),
    ):
        result = attempt(schema)
        shown = result.stdout + result.stderr
        assert result.returncode == 2, (schema, shown)
        assert "surveys.0" in shown and said in shown and "Traceback" not in shown, shown
        assert not (here / "out").exists()
    result = attempt("schemas/ok.json")
    assert result.returncode == 0, result.stdout + result.stderr
    # `sim ask --schema` follows the link the user names, but never waits on a FIFO
    fifo = str(studies / "schemas" / "fifo.json")
    result = _run(here, "ask", "--world", "w", "--all", "--schema", fifo, "--", "How are you?")
    assert result.returncode == 2 and "named pipe" in result.stderr, result.stderr
    result = _run(here, "ask", "--world", "w", "--all", "--schema", "studies/schemas/link.json",
                  "--", "How are you?")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(os.name != "posix", reason="links and FIFOs need POSIX")
def test_folder_problem_names_what_is_there(tmp_path: Path) -> None:
    from sim.safefs import folder_problem

    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    found = {n: folder_problem(tmp_path / n) for n in ("file", "link", "fifo", "folder", "none")}
    assert found == {
        "file": "is a file",
        "link": "is a symlink",
        "fifo": "is a named pipe (FIFO)",
        "folder": None,
        "none": None,
    }


@pytest.mark.skipif(os.name != "posix", reason="FIFOs need POSIX")
def test_a_study_file_or_reference_that_is_a_fifo_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    """A stranger's folder can hold a named pipe where the study file or the reference
    CSV is named: opening it by name would wait for a writer forever."""
    from sim.analysis.compare import read_reference
    from sim.errors import InputError

    os.mkfifo(tmp_path / "study.toml")
    result = _run(tmp_path, "study", "run", "study.toml", "--out", "out")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "study.toml" in result.stderr and "named pipe (FIFO)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()

    os.mkfifo(tmp_path / "reference.csv")
    with pytest.raises(InputError, match=r"reference\.csv.*named pipe \(FIFO\)"):
        read_reference(tmp_path / "reference.csv")
