"""Local servers: structured-output forms and ``auto``, the output cap, single-slot servers
and timeouts. Over real HTTP with the real SDK against the stub server told to behave like
llama-cpp-python's server (rejects ``json_schema``, one slot)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from sim.cli import main
from sim.config import Config, LLMConfig, load_config
from sim.engine.stack import build_stack
from sim.llm.errors import LLMAPIError, LLMTimeoutError
from sim.llm.recovery import RetryPolicy
from sim.llm.types import CallSettings, ModelRequest
from sim.providers.chat import ChatAdapter
from sim.testing.stub_server import ServerThread, StubOptions, StubServer


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["text", "count"],
    "additionalProperties": False,
}


def chat(server: StubServer) -> ChatAdapter:
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=10)
    return ChatAdapter(sdk)


async def call(adapter: Any, **kw: Any) -> Any:
    settings = CallSettings(model="m", timeout_seconds=10, **kw)
    return await adapter.execute(
        ModelRequest("Write a note.", "about fog", Note, settings=settings)
    )


def test_stub_rejects_json_schema_as_llama_cpp_python_does(stub_server: StubServer) -> None:
    stub_server.options.reject_json_schema = True
    with httpx2.Client(base_url=stub_server.base_url) as http:
        base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        rejected = http.post(
            "/chat/completions",
            json={
                **base,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "Note", "schema": SCHEMA},
                },
            },
        )
        assert rejected.status_code == 500
        error = rejected.json()["error"]
        assert error["type"] == "internal_server_error"
        assert "('body', 'response_format', 'type')" in error["message"]
        assert "Input should be 'text' or 'json_object'" in error["message"]
        taken = http.post(
            "/chat/completions",
            json={**base, "response_format": {"type": "json_object", "schema": SCHEMA}},
        )
        assert taken.status_code == 200
        Note.model_validate_json(taken.json()["choices"][0]["message"]["content"])
    assert stub_server.stats.generations == 1  # the rejected request generated nothing


async def test_auto_switches_once_and_remembers_it_for_the_run(stub_server: StubServer) -> None:
    stub_server.options.reject_json_schema = True
    adapter = chat(stub_server)
    first = await call(adapter)
    assert isinstance(first.parsed, Note)
    note = first.notice
    assert "rejected json_schema (HTTP 500 naming response_format)" in note
    assert "using json_object_schema" in note
    second = await call(adapter)
    assert second.notice is None
    assert second.structured_output == "json_object_schema"
    sent = [body["response_format"]["type"] for body in stub_server.log]
    assert sent == ["json_schema", "json_object", "json_object"]  # switched once, remembered


async def test_auto_switches_concurrent_calls_only_once(stub_server: StubServer) -> None:
    stub_server.options.reject_json_schema = True
    adapter = chat(stub_server)
    results = await asyncio.gather(*(call(adapter) for _ in range(6)))
    assert all(isinstance(r.parsed, Note) for r in results)
    assert len(adapter.forms.switches) == 1
    assert sum(r.notice is not None for r in results) == 1


async def test_a_fixed_form_is_not_switched(stub_server: StubServer) -> None:
    stub_server.options.reject_json_schema = True
    with pytest.raises(LLMAPIError) as info:
        await call(chat(stub_server), structured_output="json_schema")
    assert info.value.status_code == 500 and "response_format" in info.value.message


async def test_tool_form_forces_one_call_with_the_schema(stub_server: StubServer) -> None:
    response = await call(chat(stub_server), structured_output="tool")
    assert isinstance(response.parsed, Note)
    body = stub_server.log[-1]
    assert "response_format" not in body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Note"}}
    assert body["tools"][0]["function"]["parameters"]["required"] == ["text", "count"]


async def test_prompt_form_puts_the_schema_in_the_instructions(stub_server: StubServer) -> None:
    # the stub does not read schemas from prose, so it answers in text: a schema error
    # that recovery would feed back
    with pytest.raises(Exception) as info:
        await call(chat(stub_server), structured_output="prompt")
    assert getattr(info.value, "code", "") == "schema_error"
    body = stub_server.log[-1]
    assert "response_format" not in body and "tools" not in body
    assert '"required":["text","count"]' in body["messages"][0]["content"]


async def test_output_cap_is_sent_under_both_names_to_local_servers(
    stub_server: StubServer,
) -> None:
    await call(chat(stub_server), max_output_tokens=123)
    body = stub_server.log[-1]
    assert body["max_tokens"] == 123 and body["max_completion_tokens"] == 123
    hosted = ChatAdapter(
        openai.AsyncOpenAI(base_url="https://api.openai.com/v1", api_key="x", max_retries=0)
    )
    assert hosted.legacy_max_tokens is False  # its reasoning models refuse max_tokens


def test_tick_with_auto_against_a_llama_cpp_like_server_says_so(demo_world: Path) -> None:
    with ServerThread(StubServer(StubOptions(reject_json_schema=True))) as server:
        result = CliRunner().invoke(
            main,
            [
                *("tick", "--world", str(demo_world), "--provider", "chat"),
                *("--base-url", server.base_url, "--model", "gemma"),
            ],
            catch_exceptions=False,
        )
    assert result.exit_code == 0, result.output
    assert "note: structured output:" in result.output
    assert "rejected json_schema" in result.output and "using json_object_schema" in result.output
    assert result.output.count("note: structured output") == 1
    total = next(line for line in result.output.splitlines() if line.startswith("total"))
    assert total.split()[2] == "0"  # no call failed


def test_structured_output_is_configurable_per_phase(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[llm]\nstructured_output = "json_object_schema"\n[phase2b]\nstructured_output = "tool"\n'
    )
    config = load_config(tmp_path / "config.toml")
    assert config.phase1.settings(config.llm).structured_output == "json_object_schema"
    assert config.phase2b.settings(config.llm).structured_output == "tool"
    (tmp_path / "bad.toml").write_text('[llm]\nstructured_output = "xml"\n')
    with pytest.raises(Exception, match="structured_output"):
        load_config(tmp_path / "bad.toml")


@pytest.mark.slow
async def test_eight_requests_queued_behind_a_single_slot_server_all_succeed() -> None:
    """The issue's case: a single-slot server 2 s per answer, 8 calls at once, default
    timeouts and breaker. The last waits ~16 s in the server's queue, and succeeds."""
    defaults = LLMConfig()
    with ServerThread(StubServer(StubOptions(slots=1, latency=2.0))) as server:
        config = Config(
            llm=defaults.model_copy(update={"provider": "chat", "base_url": server.base_url})
        )
        stack = build_stack(config).adapter
        settings = config.phase2a.settings(config.llm)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                stack.execute(ModelRequest("Write a note.", f"note {i}", Note, settings=settings))
                for i in range(8)
            )
        )
        elapsed = time.perf_counter() - started
        assert all(isinstance(r.parsed, Note) for r in results)
        assert server.peak_active == 1  # served one at a time
        assert server.stats.generations == 8  # no call was retried
        assert elapsed >= 16.0
        assert stack.breaker(settings.model).state == "closed"


async def test_timeouts_fail_the_call_not_the_endpoint(stub_server: StubServer) -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    config = Config(
        llm=LLMConfig(
            provider="chat",
            base_url=stub_server.base_url,
            timeout_seconds=0.3,
            breaker_threshold=2,
        )
    )
    stack = build_stack(config, sleep=sleep).adapter
    stack.policy = RetryPolicy(transient_retries=2)
    settings = config.phase1.settings(config.llm)
    stub_server.enqueue("hang", "hang", "hang")
    with pytest.raises(LLMTimeoutError):
        await stack.execute(ModelRequest("Write.", "x", Note, settings=settings))
    assert stack.breaker(settings.model).state == "closed"  # 3 timeouts, still closed
    response = await stack.execute(ModelRequest("Write.", "x", Note, settings=settings))
    assert isinstance(response.parsed, Note)
    stub_server.enqueue("server_error", "server_error")
    stack.policy = RetryPolicy(transient_retries=1)
    with pytest.raises(LLMAPIError):
        await stack.execute(ModelRequest("Write.", "x", Note, settings=settings))
    assert stack.breaker(settings.model).state == "open"  # 5xx still open it


def test_cli_stub_server_acts_as_a_single_slot_llama_cpp_python() -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "sim", "stub-server", "--port", "0"),
            *("--reject-json-schema", "--slots", "1", "--latency", "0.3"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        base = proc.stderr.readline().split(" on ", 1)[1].split()[0]
        sdk = openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0)

        async def both() -> list[Any]:
            adapter = ChatAdapter(sdk)
            return await asyncio.gather(call(adapter), call(adapter))

        started = time.perf_counter()
        first, second = asyncio.run(both())
        assert time.perf_counter() - started >= 0.6  # one slot: served one after the other
        assert {first.structured_output, second.structured_output} == {"json_object_schema"}
        stats = httpx2.get(base.removesuffix("/v1") + "/stub/stats").json()
        assert stats["generations"] == 2  # the refused json_schema requests generated nothing
    finally:
        proc.terminate()
        proc.wait(10)
