"""Fallback across providers, end to end: ``sim tick`` whose primary ``openai`` endpoint is a
dead port falls back to a named ``chat`` endpoint (``[providers.local]``, the stub server on
loopback); the tick commits, the fallback is named in the summary and in ``sim log``, the
log records which endpoint each attempt went to, and ``sim replay`` reproduces the tick."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import orjson
from click.testing import CliRunner, Result

from sim.cli import main
from sim.storage import Storage
from sim.testing.anthropic_stub import AnthropicStubServer
from sim.testing.stub_server import ServerThread, StubOptions, StubServer
from sim.ticklog.reader import read_logs

PHASES = ("phase1", "phase2a", "phase2b", "phase4")


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def user_config(tmp_path: Path, stub: StubServer, fallback: str = "local/stub-model") -> Path:
    fallbacks = "".join(f'\n[{s}]\nfallback_models = ["{fallback}"]\n' for s in PHASES)
    path = tmp_path / "user.toml"
    path.write_text(
        f"""
[llm]
provider = "openai"
base_url = "http://127.0.0.1:{dead_port()}/v1"
connect_timeout_seconds = 2
timeout_seconds = 5
backoff_base_seconds = 0.01
backoff_cap_seconds = 0.02

[providers.local]
kind = "chat"
base_url = "{stub.base_url}"
api_key_env = "LOCAL_KEY"
structured_output = "json_schema"
{fallbacks}"""
    )
    return path


def run(*args: str) -> Result:
    return CliRunner().invoke(
        main,
        list(args),
        env={"OPENAI_API_KEY": "sk-primary", "LOCAL_KEY": "sk-local"},
        catch_exceptions=False,
    )


def test_dead_openai_primary_falls_back_to_a_named_chat_endpoint(
    demo_world: Path, stub_server: StubServer, tmp_path: Path
) -> None:
    config = user_config(tmp_path, stub_server)
    result = run("tick", "--world", str(demo_world), "--config", str(config))

    assert result.exit_code == 0, result.output
    assert Storage(demo_world).load().tick == 1  # committed
    lines = [line for line in result.output.splitlines() if line.startswith("fallback model:")]
    calls = stub_server.stats.models["stub-model"]
    assert calls >= 10 and len(lines) == calls  # every call went to the chat endpoint
    assert all(line.endswith("openai/gpt-4.1-mini -> local/stub-model") for line in lines)
    assert "fallback model: intentions intention:ada: openai/gpt-4.1-mini -> local/stub-model" in (
        result.output
    )
    # once the primary is known to be down, a call moves on at once: one unsent attempt on
    # the primary, no retries against it (the columns: calls, failed, retries)
    row = next(line for line in result.output.splitlines() if line.startswith("resolution "))
    assert row.split()[1:4] == ["6", "0", "6"]
    # the stub (the only live server) saw the chat wire format only
    assert stub_server.stats.by_route["POST /v1/chat/completions"] == calls
    assert stub_server.stats.by_route["POST /v1/responses"] == 0

    log = run("log", "--world", str(demo_world), "--tick", "1")
    assert log.exit_code == 0, log.output
    logged = [line for line in log.output.splitlines() if line.startswith("fallback model:")]
    assert sorted(logged) == sorted(lines)

    # each attempt is logged with the endpoint it went to: the dead primary, then local
    [tick_log], _ = read_logs(demo_world)
    call = next(iter(tick_log.calls.values()))
    providers = [attempt.provider for attempt in call.attempts]
    assert providers[0] == "openai" and providers[-1] == "local"
    assert call.attempts[-1].model == "stub-model" and call.error_code is None


def test_replay_uses_the_logged_config_with_qualified_names(
    demo_world: Path, stub_server: StubServer, tmp_path: Path
) -> None:
    config = user_config(tmp_path, stub_server)
    assert run("tick", "--world", str(demo_world), "--config", str(config)).exit_code == 0
    sent = stub_server.stats.requests

    replayed = run("replay", "--world", str(demo_world), "--tick", "1", "--json")
    assert replayed.exit_code == 0, replayed.output
    document = json.loads(replayed.output)
    assert document["identical"] is True
    assert stub_server.stats.requests == sent  # served from the log


def test_candidates_are_deduplicated_by_provider_and_normalised_model(
    demo_world: Path, stub_server: StubServer, tmp_path: Path
) -> None:
    # " Stub-Model " on local is the same candidate as "local/stub-model": asked once
    config = user_config(tmp_path, stub_server)
    text = config.read_text().replace(
        '["local/stub-model"]', '["local/stub-model", "local/ Stub-Model ", "LOCAL-X/y"]', 1
    )
    config.write_text(text)
    stub_server.model_faults["stub-model"] = "server_error"
    result = run("tick", "--world", str(demo_world), "--config", str(config))
    # intentions all fail (every candidate is down) but nothing is asked twice of local:
    # each call asks stub-model once plus its retries, never "Stub-Model" again
    per_call = 1 + 2  # the attempt and transient_retries
    assert stub_server.stats.models.get("Stub-Model", 0) == 0
    # "LOCAL-X/y" is not a provider name (names are lower case): a bare model on openai
    assert "LOCAL-X/y" not in stub_server.stats.models
    assert stub_server.stats.models["stub-model"] <= 6 * per_call
    assert result.exit_code == 1  # the phase lost every call: not committed
    assert Storage(demo_world).load().tick == 0


def test_sim_check_lists_the_named_endpoint(
    demo_world: Path, stub_server: StubServer, tmp_path: Path
) -> None:
    config = user_config(tmp_path, stub_server)
    result = run("check", "--world", str(demo_world), "--config", str(config), "--json")
    assert result.exit_code == 0, result.output
    document = orjson.loads(result.output)
    assert document["endpoints"] == {
        "local": {"endpoint": stub_server.base_url, "api_key_env": "LOCAL_KEY"}
    }


def test_dead_openai_primary_falls_back_to_a_named_anthropic_endpoint(
    demo_world: Path, anthropic_stub: AnthropicStubServer, tmp_path: Path
) -> None:
    config = tmp_path / "user.toml"
    fallbacks = "".join(f'\n[{s}]\nfallback_models = ["claude/claude-haiku-4-5"]\n' for s in PHASES)
    config.write_text(
        f"""
[llm]
provider = "openai"
base_url = "http://127.0.0.1:{dead_port()}/v1"
backoff_base_seconds = 0.01
backoff_cap_seconds = 0.02

[providers.claude]
kind = "anthropic"
base_url = "{anthropic_stub.base_url}"
api_key_env = "CLAUDE_KEY"
{fallbacks}"""
    )
    result = CliRunner().invoke(
        main,
        ["tick", "--world", str(demo_world), "--config", str(config)],
        env={"OPENAI_API_KEY": "sk-primary", "CLAUDE_KEY": "sk-ant-test"},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "openai/gpt-4.1-mini -> claude/claude-haiku-4-5" in result.output
    assert anthropic_stub.stats.models["claude-haiku-4-5"] >= 10
    [tick_log], _ = read_logs(demo_world)
    # priced as claude-haiku-4-5 (a built-in price): the tick's cost is known
    assert all(call.cost_usd is not None for call in tick_log.calls.values())


def test_a_failed_tick_resumes_with_qualified_names(
    demo_world: Path, stub_server: StubServer, tmp_path: Path
) -> None:
    config = user_config(tmp_path, stub_server)
    text = config.read_text().replace(
        '[phase2b]\nfallback_models = ["local/stub-model"]',
        '[phase2b]\nfallback_models = ["local/narrator"]',
    )
    config.write_text(text)
    stub_server.model_faults["narrator"] = "server_error"
    first = run("tick", "--world", str(demo_world), "--config", str(config))
    assert first.exit_code == 1, first.output  # narrative lost every call: not committed
    assert Storage(demo_world).load().tick == 0
    answered = stub_server.stats.models["stub-model"]
    assert answered == 16  # intentions and resolution, on local

    stub_server.model_faults.clear()
    second = run("tick", "--world", str(demo_world), "--config", str(config))
    assert second.exit_code == 0, second.output
    assert "resumed: 16 calls" in second.output
    assert stub_server.stats.models["stub-model"] == answered  # none sent again
    assert "narrative narrative:quay: openai/gpt-4.1-mini -> local/narrator" in second.output


def test_batched_phase_falls_back_to_a_named_endpoint_in_its_own_batch(
    demo_world: Path, tmp_path: Path
) -> None:
    # one stub plays both endpoints: OpenAI's Responses API (batched) and a chat server
    thread = ServerThread(StubServer(StubOptions(batch_delay=0.05)))
    stub = thread.start()
    try:
        config = tmp_path / "user.toml"
        fallbacks = "".join(f'\n[{s}]\nfallback_models = ["local/stub-model"]\n' for s in PHASES)
        config.write_text(
            f"""
[llm]
provider = "openai"
base_url = "{stub.base_url}"
batch = true
batch_poll_seconds = 0.05
backoff_base_seconds = 0.01
backoff_cap_seconds = 0.02

[providers.local]
kind = "chat"
base_url = "{stub.base_url}"
{fallbacks}"""
        )
        stub.model_faults["gpt-4.1-mini"] = "server_error"
        result = run("tick", "--world", str(demo_world), "--config", str(config))
        assert result.exit_code == 0, result.output
        assert "openai/gpt-4.1-mini -> local/stub-model" in result.output
        endpoints = {batch["endpoint"] for batch in stub.batches.batches.values()}
        # the primary's lines went in Responses batches, the fallbacks' in chat batches
        assert endpoints == {"/v1/responses", "/v1/chat/completions"}
        assert stub.stats.by_route["POST /v1/chat/completions"] == 0  # none sent live
    finally:
        thread.stop()


def test_usage_by_model_counts_each_attempt_where_it_ran(
    demo_world: Path, stub_server: StubServer, tmp_path: Path
) -> None:
    config = user_config(tmp_path, stub_server)
    assert run("tick", "--world", str(demo_world), "--config", str(config)).exit_code == 0
    shown = run("usage", "--world", str(demo_world), "--config", str(config), "--by", "model")
    assert shown.exit_code == 0, shown.output
    document = orjson.loads(
        run(
            "usage", "--world", str(demo_world), "--config", str(config), "--by", "model", "--json"
        ).output
    )
    rows = {row["key"]: row for row in document["rows"]}
    assert set(rows) == {"openai/gpt-4.1-mini", "local/stub-model"}
    # every request was answered on local; the dead primary only failed, spending nothing
    assert rows["local/stub-model"]["requests"] == document["total"]["requests"] == 22
    assert rows["openai/gpt-4.1-mini"]["requests"] == 0
    assert rows["openai/gpt-4.1-mini"]["total_tokens"] == 0
    assert rows["local/stub-model"]["total_tokens"] == document["total"]["total_tokens"] > 0
    assert "local/stub-model" in shown.output
