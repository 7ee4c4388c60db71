"""The stub server itself: routes, control endpoints, keep-alive, the CLI command."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2
import pytest

from sim.config import Config
from sim.engine.runner import Runner
from sim.errors import RunFailed
from sim.llm.errors import LLMConfigurationError, LLMRefusalError, LLMTimeoutError
from sim.llm.tools import schema_of
from sim.llm.types import AdapterResponse, ModelRequest
from sim.testing import ErrorAdapter, MockAdapter
from sim.testing.stub_server import StubServer


def test_routes_and_control_endpoints(stub_server: StubServer) -> None:
    with httpx2.Client(base_url=stub_server.base_url.removesuffix("/v1")) as http:
        body = {
            "model": "m",
            "input": "hi",
            "instructions": "be brief",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "X",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "title": "X",
                        "properties": {"a": {"type": "string"}},
                        "required": ["a"],
                        "additionalProperties": False,
                    },
                }
            },
        }
        created = http.post("/v1/responses", json=body).json()
        rid = created["id"]
        assert created["status"] == "completed"
        assert http.get(f"/v1/responses/{rid}").json()["id"] == rid
        assert http.delete(f"/v1/responses/{rid}").json()["deleted"] is True
        assert http.get(f"/v1/responses/{rid}").status_code == 404
        assert http.delete(f"/v1/responses/{rid}").status_code == 404
        unstored = http.post("/v1/responses", json={**body, "store": False}).json()
        assert http.get(f"/v1/responses/{unstored['id']}").status_code == 404
        # control: script faults, read counters, reset
        assert http.post("/stub/faults", json={"script": ["server_error"]}).status_code == 200
        assert http.post("/v1/responses", json=body).status_code == 500
        stats = http.get("/stub/stats").json()
        assert stats["generations"] == 2 and stats["faults"] == {"server_error": 1}
        assert stats["input_tokens"] > 0
        assert stats["connections"] == 1  # HTTP/1.1 keep-alive: one connection for all
        http.post("/stub/reset")
        assert http.get("/stub/stats").json()["generations"] == 0
        assert http.get("/nope").status_code == 404


def test_a_hold_keeps_the_requests_it_picks_until_released(stub_server: StubServer) -> None:
    """Only the picked requests wait (others are answered meanwhile), then go on normally."""
    from openai import OpenAI

    client = OpenAI(base_url=stub_server.base_url, api_key="x", max_retries=0, timeout=60)

    def ask(seed: int) -> str | None:
        answer = client.chat.completions.create(
            model="m", seed=seed, messages=[{"role": "user", "content": "Hello"}]
        )
        return answer.choices[0].message.content

    stub_server.hold(lambda request: request.get("seed") == 2)
    answers: list[str | None] = []
    held = threading.Thread(target=lambda: answers.append(ask(2)))
    held.start()
    deadline = time.monotonic() + 30
    while stub_server.stats.held == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stub_server.stats.held == 1 and stub_server.stats.in_flight == 1
    assert ask(1) == "Understood."  # not picked: answered while the other waits
    held.join(timeout=0.5)
    assert held.is_alive() and not answers and stub_server.stats.generations == 1
    stub_server.release()
    held.join(timeout=30)
    assert answers == ["Understood."] and stub_server.stats.held == 0
    assert stub_server.stats.generations == 2
    assert ask(2) == "Understood."  # released: no longer held


def _streamed_chat(field: str) -> dict[str, object]:
    schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
    return {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "X", "schema": schema}},
    }


def test_slow_stream_field_slows_only_the_streams_asking_for_it(stub_server: StubServer) -> None:
    """With ``slow_stream_field``, an answer whose schema lacks the field streams at full
    speed; one whose schema has it waits ``stream_chunk_delay`` between events (here 30 s:
    the client's 5 s read timeout ends it after its first event)."""
    stub_server.options.stream_chunk_delay = 30.0
    stub_server.options.slow_stream_field = "narrative"
    with httpx2.Client(base_url=stub_server.base_url, timeout=5.0) as http:
        fast = http.post("/chat/completions", json=_streamed_chat("intention"))
        assert fast.status_code == 200
        assert fast.text.rstrip().endswith("data: [DONE]")
        with http.stream("POST", "/chat/completions", json=_streamed_chat("narrative")) as slow:
            events = slow.iter_lines()
            assert next(events).startswith("data: ")
            with pytest.raises(httpx2.ReadTimeout):
                list(events)


def test_unknown_fault_is_refused(stub_server: StubServer) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        stub_server.enqueue("meteor")


def test_cli_stub_server_serves_until_stopped() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "stub-server", "--port", "0", "--latency", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "stub server on http://127.0.0.1:" in line
        base = line.split(" on ", 1)[1].split()[0]
        stats = httpx2.get(base.removesuffix("/v1") + "/stub/stats").json()
        assert stats["requests"] == 1
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_stub_server_rejects_unknown_faults() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sim", "stub-server", "--faults", "meteor"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "meteor" in result.stderr


def test_tools_mode_needs_the_capability(demo_world: Path) -> None:
    class SchemaOnly(MockAdapter):
        """A provider without tool calling (MockAdapter itself answers tool calls)."""

        async def execute(self, request: ModelRequest) -> AdapterResponse:
            schema_of(self, request)
            return await super().execute(request)

    config = Config.model_validate({"phase1": {"mode": "tools"}})
    with pytest.raises(LLMConfigurationError, match="SchemaOnly does not support tool"):
        Runner(demo_world, config, adapter=SchemaOnly()).run()


def test_failed_fraction_check_raises_run_failed(demo_world: Path) -> None:
    with pytest.raises(RunFailed, match="max_failed_fraction"):
        Runner(demo_world, Config(), adapter=ErrorAdapter(LLMTimeoutError("slow"))).run()


def test_content_failures_abort_only_past_their_own_share(demo_world: Path) -> None:
    """Refusals fall back for their entity, but a phase made of them is not committed: the
    endpoint is not answering in the expected form."""
    with pytest.raises(RunFailed, match="not answering in the expected form"):
        Runner(demo_world, Config(), adapter=ErrorAdapter(LLMRefusalError("no"))).run()
    lenient = Config.model_validate({"llm": {"max_content_failed_fraction": 1.0}})
    (result,) = Runner(demo_world, lenient, adapter=ErrorAdapter(LLMRefusalError("no"))).run()
    assert result.failures == result.calls > 0
