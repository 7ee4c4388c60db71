"""The Messages API stub itself: Anthropic's shapes over HTTP, and ``sim stub-server --api
anthropic``."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anthropic
import httpx2
import pytest

from sim.testing.anthropic_stub import AnthropicStubServer

NOTE: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["text", "count"],
}


def test_a_forced_tool_is_answered_with_valid_input(
    anthropic_stub: AnthropicStubServer,
) -> None:
    client = anthropic.Anthropic(base_url=anthropic_stub.base_url, api_key="x", max_retries=0)
    message = client.messages.create(
        model="claude-haiku-4-5",
        max_tokens=100,
        system="Write a note.",
        messages=[{"role": "user", "content": "about fog"}],
        tools=[{"name": "Note", "description": "the answer", "input_schema": NOTE}],
        tool_choice={"type": "tool", "name": "Note"},
    )
    assert message.stop_reason == "tool_use"
    block = message.content[0]
    assert block.type == "tool_use" and block.name == "Note"
    assert isinstance(block.input["text"], str) and isinstance(block.input["count"], int)
    assert message.usage.input_tokens > 0 and message.usage.cache_read_input_tokens == 0
    # a plain request (no tools) gets text
    plain = client.messages.create(
        model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    )
    assert plain.content[0].type == "text" and plain.stop_reason == "end_turn"


def test_errors_have_anthropics_shape(anthropic_stub: AnthropicStubServer) -> None:
    http = httpx2.Client(base_url=anthropic_stub.base_url)
    anthropic_stub.enqueue("overloaded")
    answer = http.post("/v1/messages", json={"model": "m", "max_tokens": 1, "messages": []})
    assert answer.status_code == 529
    assert answer.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    anthropic_stub.enqueue("rate_limit")
    answer = http.post("/v1/messages", json={"model": "m", "max_tokens": 1, "messages": []})
    assert answer.status_code == 429 and answer.headers["retry-after"] == "0.01"
    assert answer.json()["error"]["type"] == "rate_limit_error"
    missing = http.post("/v1/nope", json={})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert http.get("/stub/stats").json()["faults"] == {"overloaded": 1, "rate_limit": 1}


def test_unknown_fault_is_refused(anthropic_stub: AnthropicStubServer) -> None:
    anthropic_stub.enqueue("overloaded")  # an Anthropic fault
    with pytest.raises(ValueError, match="unknown fault"):
        anthropic_stub.enqueue("meteor")


def test_cli_serves_the_messages_api() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "stub-server", "--port", "0", "--api", "anthropic"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "stub server on http://127.0.0.1:" in line and "anthropic API" in line
        base = line.split(" on ", 1)[1].split()[0]
        client = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
        message = client.messages.create(
            model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
        )
        assert message.content[0].type == "text"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(("api", "code"), [("anthropic", 0), ("openai", 2)])
def test_cli_overloaded_is_an_anthropic_fault(api: str, code: int) -> None:
    args = ["--api", api, "--faults", "overloaded", "--port", "0"]
    if code == 0:  # accepted: the server starts (stopped at once)
        proc = subprocess.Popen(
            [sys.executable, "-m", "sim", "stub-server", *args], stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stderr is not None
            assert "stub server on" in proc.stderr.readline()
        finally:
            proc.terminate()
            proc.wait(10)
        return
    result = subprocess.run(
        [sys.executable, "-m", "sim", "stub-server", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "overloaded" in result.stderr
