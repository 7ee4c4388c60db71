"""A local server used well (issue 25): the structured-output form settled once per
endpoint, for ``chat`` and ``openai`` alike. Over real HTTP with the real SDK against the
stub server told to behave like llama-cpp-python (or a Responses bridge in front of it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from sim.cli import main
from sim.config import Config, LLMConfig
from sim.engine.stack import build_stack
from sim.llm.backpressure import Endpoint
from sim.llm.capacity import ServerCapacity
from sim.llm.errors import LLMAPIError, LLMError, LLMTimeoutError
from sim.llm.types import CallSettings, ModelRequest
from sim.providers.chat import ChatAdapter
from sim.providers.openai import OpenAIAdapter
from sim.testing.stub_server import ServerThread, StubOptions, StubServer


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


def sdk(server: StubServer, timeout: float = 10.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=timeout)


async def call(adapter: Any, timeout: float = 10.0, **kw: Any) -> Any:
    settings = CallSettings(model="m", timeout_seconds=timeout, **kw)
    return await adapter.execute(
        ModelRequest("Write a note.", "about fog", Note, settings=settings)
    )


def chat_forms(server: StubServer) -> list[str]:
    return [body["response_format"]["type"] for body in server.log]


def responses_forms(server: StubServer) -> list[str]:
    return [body["text"]["format"]["type"] for body in server.log]


async def test_auto_sends_one_rejected_request_however_many_calls_start_at_once(
    stub_server: StubServer,
) -> None:
    stub_server.options.reject_json_schema = True
    stub_server.options.latency = 0.05  # the probe is still out when the others start
    adapter = ChatAdapter(sdk(stub_server))
    results = await asyncio.gather(*(call(adapter) for _ in range(10)))
    assert all(isinstance(r.parsed, Note) for r in results)
    sent = chat_forms(stub_server)
    assert sent.count("json_schema") == 1  # one probe refused, not ten
    assert sent.count("json_object") == 10
    assert sum(r.notice is not None for r in results) == 1
    assert adapter.forms.settled


async def test_a_server_that_takes_json_schema_settles_on_the_first_answer(
    stub_server: StubServer,
) -> None:
    adapter = ChatAdapter(sdk(stub_server))
    results = await asyncio.gather(*(call(adapter) for _ in range(5)))
    assert {r.structured_output for r in results} == {"json_schema"}
    assert chat_forms(stub_server) == ["json_schema"] * 5
    assert adapter.forms.switches == []


async def test_a_probe_that_times_out_settles_nothing_and_the_next_call_probes(
    stub_server: StubServer,
) -> None:
    stub_server.options.reject_json_schema = True
    stub_server.options.hang_seconds = 5.0
    adapter = ChatAdapter(sdk(stub_server, timeout=0.5))
    # the refused json_schema is answered before the fault script is read: the hang is
    # the json_object_schema request's
    stub_server.enqueue("hang")
    with pytest.raises(LLMTimeoutError):
        await call(adapter, timeout=0.5)
    assert not adapter.forms.settled
    response = await call(adapter, timeout=0.5)
    assert response.structured_output == "json_object_schema"
    assert adapter.forms.settled
    assert chat_forms(stub_server) == ["json_schema", "json_object", "json_object"]


async def test_openai_provider_falls_back_from_json_schema_once_behind_a_bridge(
    stub_server: StubServer,
) -> None:
    stub_server.options.reject_json_schema = True  # refuses text.format json_schema too
    stub_server.options.latency = 0.05
    adapter = OpenAIAdapter(sdk(stub_server))
    results = await asyncio.gather(*(call(adapter) for _ in range(10)))
    assert all(isinstance(r.parsed, Note) for r in results)
    sent = responses_forms(stub_server)
    assert sent.count("json_schema") == 1 and sent.count("json_object") == 10
    body = stub_server.log[-1]
    assert body["text"]["format"]["schema"]["required"] == ["text", "count"]
    notes = [r.notice for r in results if r.notice is not None]
    assert len(notes) == 1 and "rejected json_schema (HTTP 500 naming format)" in notes[0]


async def test_openai_provider_leaves_a_form_whose_schema_the_bridge_drops(
    stub_server: StubServer,
) -> None:
    # llama-stack 0.7.3 in front of llama-cpp-python: json_schema refused (HTTP 500), a
    # json_object's schema dropped (the answer comes back in any shape): auto settles on
    # the forced function call, after one answer in the dropped form, and deletes it
    stub_server.options.reject_json_schema = True
    stub_server.options.drop_json_object_schema = True
    stub_server.options.latency = 0.05
    adapter = OpenAIAdapter(sdk(stub_server), store=True)
    results = await asyncio.gather(*(call(adapter) for _ in range(4)))
    assert all(isinstance(r.parsed, Note) for r in results)
    assert {r.structured_output for r in results} == {"tool"}
    assert adapter.forms.settled
    sent = [
        body["text"]["format"]["type"] if "text" in body else "tool" for body in stub_server.log
    ]
    assert sent == ["json_schema", "json_object", "tool", "tool", "tool", "tool"]
    notes = [r.notice for r in results if r.notice is not None]
    assert len(notes) == 1
    assert (
        "rejected json_object_schema (answered outside the schema: the server dropped it)"
        in (notes[0])
    )
    assert "using tool for the rest of the run" in notes[0]
    # the dropped form's stored answer is deleted; the four used ones are kept
    assert len(stub_server.responses) == 4


async def test_openai_provider_takes_the_tool_and_prompt_forms(stub_server: StubServer) -> None:
    adapter = OpenAIAdapter(sdk(stub_server))
    response = await call(adapter, structured_output="tool")
    assert isinstance(response.parsed, Note) and response.structured_output == "tool"
    body = stub_server.log[-1]
    assert "text" not in body
    assert body["tool_choice"] == {"type": "function", "name": "Note"}
    assert body["tools"][0]["parameters"]["required"] == ["text", "count"]
    # the stub reads no schema from prose: it answers in text, a schema error recovery
    # would feed back; what matters here is what was sent
    with pytest.raises(Exception) as info:
        await call(adapter, structured_output="prompt")
    assert getattr(info.value, "code", "") == "schema_error"
    body = stub_server.log[-1]
    assert "text" not in body and "tools" not in body
    assert '"required":["text","count"]' in body["instructions"]


async def test_a_switch_made_by_a_call_that_then_failed_is_said_by_the_next_answer(
    stub_server: StubServer,
) -> None:
    # found behind llama-stack: the probing call switched forms, then its answer failed
    # validation, and the note went down with the error
    stub_server.options.reject_json_schema = True
    adapter = ChatAdapter(sdk(stub_server))
    stub_server.enqueue("malformed")  # the json_object_schema answer, after the refusal
    with pytest.raises(LLMError) as info:
        await call(adapter)
    assert info.value.code == "schema_error"
    # the note goes with the error (the tick summary shows a failed call's notes too)
    assert info.value.notice is not None
    assert "rejected json_schema (HTTP 500 naming response_format)" in info.value.notice
    assert (await call(adapter)).notice is None  # said once


async def test_openai_provider_with_a_fixed_form_is_not_switched(stub_server: StubServer) -> None:
    stub_server.options.reject_json_schema = True
    adapter = OpenAIAdapter(sdk(stub_server))
    with pytest.raises(LLMAPIError) as info:
        await call(adapter, structured_output="json_schema")
    assert getattr(info.value, "status_code", None) == 500
    response = await call(adapter, structured_output="json_object_schema")
    assert isinstance(response.parsed, Note)
    assert responses_forms(stub_server) == ["json_schema", "json_object"]


# -- concurrency that fits the server ----------------------------------------------------


def local_stack(server: StubServer, **llm: Any) -> Any:
    config = Config(
        llm=LLMConfig(provider="chat", base_url=server.base_url, max_concurrency=16, **llm)
    )
    return config, build_stack(config)


async def gather_calls(server: StubServer, n: int, **llm: Any) -> tuple[Any, list[Any]]:
    config, stack = local_stack(server, **llm)
    settings = config.phase2a.settings(config.llm)
    results = await asyncio.gather(
        *(
            stack.adapter.execute(
                ModelRequest("Write a note.", f"note {i}", Note, settings=settings)
            )
            for i in range(n)
        ),
        return_exceptions=True,
    )
    return stack, results


@pytest.mark.parametrize("report", ["props", "slots", "llama-cpp-python"])
async def test_a_one_slot_server_gets_one_request_at_a_time_and_no_call_times_out(
    report: str,
) -> None:
    """6 calls at once to a one-slot server answering in 0.4 s, with a 1 s timeout: sent
    all at once, the last ones would wait 2 s in the server's queue and time out. Fitted
    to the reported capacity, they wait on the client's side, where no timeout runs."""
    options = StubOptions(slots=1, latency=0.4, capacity_report=report)
    with ServerThread(StubServer(options)) as server:
        stack, results = await gather_calls(server, 6, timeout_seconds=1.0)
        assert [type(r).__name__ for r in results] == ["AdapterResponse"] * 6
        assert server.peak_active == 1
        assert server.stats.generations == 6  # nothing timed out and was sent again
        endpoint = stack.endpoint  # the one the stack built
        assert endpoint is not None and endpoint.limit == 1
        assert endpoint.capacity is not None and endpoint.capacity.slots == 1
        notes = [r.notice for r in results if r.notice]
        assert len(notes) == 1 and "serves 1 request(s) at once" in notes[0]
        assert server.stats.requests == 6  # the capacity questions are not billed requests


async def test_the_capacity_note_is_told_when_the_first_answer_fails() -> None:
    """The first call's answer is cut at its token cap (a small local model does this now
    and then): the note of the server's capacity goes with that failure, not lost with it
    (it was, and the tick summary then never said how many requests the server serves)."""
    options = StubOptions(
        slots=1, capacity_report="llama-cpp-python", fault_rate=1.0, faults=("incomplete",)
    )
    with ServerThread(StubServer(options)) as server:
        _, results = await gather_calls(server, 3)
    assert all(isinstance(r, LLMError) for r in results), results
    notes = [r.notice for r in results if isinstance(r, LLMError) and r.notice]
    assert len(notes) == 1 and "serves 1 request(s) at once (llama-cpp-python" in notes[0]


async def test_a_reported_capacity_caps_the_limit_but_never_raises_it() -> None:
    with ServerThread(StubServer(StubOptions(slots=4, capacity_report="props"))) as server:
        stack, results = await gather_calls(server, 8)
        assert all(not isinstance(r, BaseException) for r in results)
        endpoint = stack.endpoint  # the one the stack built
        assert endpoint is not None and endpoint.max_limit == 4 and endpoint.limit <= 4
        assert server.stats.probes == 1  # asked once: /props answered
    config = Config(llm=LLMConfig(provider="chat", base_url="http://x/v1", max_concurrency=2))
    endpoint = Endpoint("http://x/v1", config.llm.max_concurrency)
    endpoint.fit(ServerCapacity(8, "test"))
    assert endpoint.limit == 2


async def test_an_unreported_capacity_is_asked_once_and_adapts_to_latency(
    stub_server: StubServer,
) -> None:
    stack, results = await gather_calls(stub_server, 5)
    assert all(not isinstance(r, BaseException) for r in results)
    endpoint = stack.endpoint  # the one the stack built
    assert endpoint is not None and endpoint.capacity is not None
    assert endpoint.capacity.slots is None and endpoint.adapt_to_latency
    assert stub_server.stats.probes == 3  # /props, /slots, /openapi.json: each once
    assert all(r.notice is None for r in results)


def test_openais_own_api_is_not_asked() -> None:
    adapter = OpenAIAdapter(
        openai.AsyncOpenAI(base_url="https://api.openai.com/v1", api_key="x", max_retries=0)
    )
    assert asyncio.run(adapter.server_capacity()) is None  # would need the network


def answered(endpoint: Endpoint, clock: list[float], latencies: list[float], work: float) -> None:
    """One window of attempts sent together, each answered after its latency."""
    sent = [endpoint.clock() for _ in latencies]
    for _ in latencies:
        endpoint.in_flight += 1
    for at, seconds in zip(sent, latencies, strict=True):
        clock[0] = at + seconds
        endpoint.release(at, None, work=work)
        clock[0] = at


def test_a_window_of_queued_answers_halves_the_limit_and_a_quick_one_does_not() -> None:
    clock = [0.0]
    endpoint = Endpoint("http://x/v1", 16, clock=lambda: clock[0])
    endpoint.fit(ServerCapacity(None))

    def window(latencies: list[float]) -> None:
        answered(endpoint, clock, latencies, 100.0)

    window([1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 1.0, 0.95, 1.05, 1.1, 1.0, 1.2, 1.0, 1.1, 1.0, 1.0])
    assert endpoint.limit == 16 and endpoint.stats.slow_windows == 0
    window([1.0 * k for k in range(1, 17)])  # one slot: each waits for those before it
    assert endpoint.limit == 8 and endpoint.stats.slow_windows == 1
    # a server that reported its capacity is not second-guessed by latency
    fitted = Endpoint("http://y/v1", 16, clock=lambda: clock[0])
    fitted.fit(ServerCapacity(16, "test"))
    assert not fitted.adapt_to_latency


def test_answers_that_waited_for_a_busy_client_are_not_taken_for_a_server_queue() -> None:
    """At 0.1 s latency and 200 in flight the bench's client spent most of each window on
    its own CPU: answers waited for its event loop, the latency signal read that as a
    queue at the server, and the limit halved (the tick took about 10% longer). A window
    in which the process was busy at least half the time is not judged by latency; the
    same window with the process idle still is."""
    clock = [0.0]
    queued = [0.1 * k for k in range(1, 17)]  # as a one-slot queue would answer
    for busy, limit in ((0.9, 16), (0.5, 16), (0.1, 8)):
        endpoint = Endpoint("http://x/v1", 16, clock=lambda: clock[0], cpu_clock=lambda: 0.0)
        endpoint.fit(ServerCapacity(None))
        answered(endpoint, clock, [0.1] * 16, 100.0)  # the fastest: no queue
        start = clock[0]

        def cpu_clock(busy: float = busy, start: float = start) -> float:
            return (clock[0] - start) * busy  # this share of the wall time on the CPU

        endpoint.cpu_clock = cpu_clock
        answered(endpoint, clock, queued, 100.0)
        assert endpoint.limit == limit, busy
        assert endpoint.stats.slow_windows == (limit < 16)
        assert endpoint.stats.decreases == (limit < 16)


def test_short_answers_from_a_fixed_latency_server_are_not_taken_for_a_queue() -> None:
    """A server whose latency is mostly fixed (a hosted gateway; the bench's stub at 1 s)
    answers a 40-token memory summary in the time of a 600-token resolution. Per unit of
    work the summary looks 15 times slower; compared with the fastest of any size, every
    window of the memory phase was "queued" and the limit halved down to 1 (the bench's
    1,000-character tick then took 600 s instead of 17). Compared with answers of the same
    size, nothing is slow."""
    clock = [0.0]
    endpoint = Endpoint("http://x/v1", 200, clock=lambda: clock[0])
    endpoint.fit(ServerCapacity(None))
    for _ in range(2):  # a phase of long answers, then one of short ones, each at 1 s
        answered(endpoint, clock, [1.0] * 200, 600.0)
        for _ in range(5):
            answered(endpoint, clock, [1.0, 1.1, 0.95, 1.05] * 50, 40.0)
    assert endpoint.stats.slow_windows == 0 and endpoint.limit == 200
    # short answers that do wait in a queue are still found
    answered(endpoint, clock, [1.0 * k for k in range(1, 201)], 40.0)
    assert endpoint.stats.slow_windows == 1 and endpoint.limit == 100


def test_a_tick_on_a_llama_cpp_python_like_server_notes_form_and_capacity(
    demo_world: Path,
) -> None:
    options = StubOptions(reject_json_schema=True, slots=1, capacity_report="llama-cpp-python")
    with ServerThread(StubServer(options)) as server:
        result = CliRunner().invoke(
            main,
            [
                *("tick", "--world", str(demo_world), "--provider", "chat"),
                *("--base-url", server.base_url, "--model", "gemma"),
            ],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        assert server.peak_active == 1
        refused = [b for b in server.log if b["response_format"]["type"] == "json_schema"]
        assert len(refused) == 1
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 2, notes  # one note a line, each once
    assert notes[0].startswith("note: structured output:")
    assert notes[1].startswith("note: concurrency:") and "serves 1 request(s)" in notes[1]
