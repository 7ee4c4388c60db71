"""Idempotency keys: the same attempt sent twice is answered once and billed once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from sim.cli import main
from sim.llm.calls import CallIdentity, idempotency_key
from sim.llm.streaming import CallText
from sim.llm.types import CallSettings, ModelRequest
from sim.providers.chat import ChatAdapter
from sim.providers.openai import OpenAIAdapter
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

KEY_ENV = "SIM_TEST_IDEMPOTENCY_KEY"
SETTINGS = CallSettings(model="stub-model", timeout_seconds=5)


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str


def identity(request_id: str = "3:intentions:intention:ada:0", scope: str = "s1") -> CallIdentity:
    return CallIdentity(
        request_id, "intentions", "intention:ada", 0, "i", "x", "Note", "d", scope=scope
    )


def test_the_key_depends_on_scope_request_and_exact_body() -> None:
    assert idempotency_key(None, b"{}") is None  # an anonymous call: no key
    key = idempotency_key(identity(), b'{"a":1}')
    assert key is not None and key.startswith("sim-")
    assert idempotency_key(identity(), b'{"a":1}') == key
    assert idempotency_key(identity(), b'{"a":2}') != key  # a retry with feedback asks afresh
    for other in (identity(scope="s2"), identity(request_id="3:intentions:intention:bo:0")):
        assert idempotency_key(other, b'{"a":1}') != key


def sdk_path(server: StubServer) -> OpenAIAdapter | ChatAdapter:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    return OpenAIAdapter(client)


def direct_path(server: StubServer) -> OpenAIAdapter | ChatAdapter:
    return ChatAdapter(base_url=server.base_url, api_key_env=KEY_ENV)


@pytest.mark.parametrize("make", [sdk_path, direct_path], ids=["sdk-path", "direct-path"])
async def test_a_resent_attempt_is_answered_from_the_cache_not_billed(
    stub_server: StubServer,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[StubServer], OpenAIAdapter | ChatAdapter],
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    adapter = make(stub_server)
    named = ModelRequest("Write a note.", "about fog", Note, settings=SETTINGS, call=identity())
    first = await adapter.execute(named)
    again = await adapter.execute(replace(named, call=identity()))  # the same call, re-sent
    assert again.response_id == first.response_id and again.parsed == first.parsed
    assert stub_server.stats.generations == 1 and stub_server.stats.replayed == 1
    # an anonymous call (no tick log) is not keyed: two calls, two answers
    await adapter.execute(ModelRequest("Write a note.", "about fog", Note, settings=SETTINGS))
    assert stub_server.stats.generations == 2


def test_a_seen_failure_changes_the_key_an_unseen_outcome_keeps_it() -> None:
    """Reuse a key only for an attempt whose outcome was never seen (a timeout, a dropped
    connection, a crash); after an error the client saw, the next attempt asks afresh."""
    ident = identity()
    first = idempotency_key(ident, b"{}")
    # the server may still be generating it (timeout, dropped connection), or it was never
    # sent (circuit open): the next attempt asks with the same key
    unseen = ident.after(["timeout", "connection_error", "circuit_open"])
    assert unseen is ident and idempotency_key(unseen, b"{}") == first
    after = ident.after(["incomplete"])
    second = idempotency_key(after, b"{}")
    assert second != first and after.failures_seen == 1 and ident.failures_seen == 0
    assert idempotency_key(after.after(["server_error"]), b"{}") not in (first, second)
    resumed = replace(identity(), failures_seen=1)  # seeded from the log by the recorder
    assert idempotency_key(resumed, b"{}") == second


def test_a_resumed_tick_does_not_get_the_cached_failure_again(
    demo_world: Path, stub_server: StubServer
) -> None:
    """The first answer is ``incomplete`` and the server caches it under the request's key;
    the tick aborts. Resuming sends that call again with a fresh key, so it is generated
    anew and the tick commits (it used to get the cached ``incomplete`` on every resume)."""
    # an incomplete answer is a content failure, which never aborts a tick on its own: the
    # second request's rejected key (a configuration error) aborts this one
    stub_server.enqueue("incomplete", "auth")
    args = ["tick", "--world", str(demo_world), "--provider", "chat"]
    args += ["--base-url", stub_server.base_url]
    env = {"OPENAI_API_KEY": "sk-test"}
    first = CliRunner().invoke(main, args, env=env)
    assert first.exit_code == 2 and "rejected the API key" in first.output
    partial = read_log(log_path(demo_world, 1))
    assert any(c.error_code == "incomplete" for c in partial.call_records)
    replayed = stub_server.stats.replayed
    again = CliRunner().invoke(main, args, env=env)
    assert again.exit_code == 0, again.output
    assert stub_server.stats.replayed == replayed  # nothing answered from the cache
    log = read_log(log_path(demo_world, 1))
    assert log.committed and not any(c.failed for c in log.calls.values())
    failed = sorted(str(c.error_code) for c in log.call_records if c.failed)
    assert failed == ["configuration_error", "incomplete"]


def adapters() -> list[tuple[str, Callable[[StubServer], OpenAIAdapter | ChatAdapter]]]:
    def sdk(kind: type[OpenAIAdapter | ChatAdapter]) -> Callable[[StubServer], Any]:
        return lambda server: kind(
            openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        )

    def direct(kind: type[OpenAIAdapter | ChatAdapter]) -> Callable[[StubServer], Any]:
        return lambda server: kind(base_url=server.base_url, api_key_env=KEY_ENV)

    return [
        (f"{path}-{kind.__name__}", make(kind))
        for path, make in (("sdk", sdk), ("direct", direct))
        for kind in (ChatAdapter, OpenAIAdapter)
    ]


@pytest.mark.parametrize(("name", "make"), adapters(), ids=[n for n, _ in adapters()])
async def test_a_streamed_attempt_replayed_as_json_is_read_whole(
    stub_server: StubServer,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    make: Callable[[StubServer], OpenAIAdapter | ChatAdapter],
) -> None:
    """A provider replays a cached answer as one JSON body, even to a request asking for
    server-sent events (the stub does): the reply's ``Content-Type`` says so, and the body
    is read as the whole answer, not as an empty stream cut short (``stream_cut``, every
    resume of a killed streamed tick failed on it)."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    adapter = make(stub_server)
    streamed = replace(SETTINGS, stream=True)
    named = ModelRequest("Write a note.", "about fog", Note, settings=streamed, call=identity())
    first = await adapter.execute(named)
    text = CallText("intentions", "intention:ada")
    again = await adapter.execute(replace(named, call=identity(), stream_to=text))
    assert stub_server.stats.generations == 1 and stub_server.stats.replayed == 1
    assert again.parsed == first.parsed and again.raw == first.raw
    assert again.usage.output_tokens == first.usage.output_tokens > 0
    assert text.text == first.raw  # the replayed text still reaches the stream's reader
    await adapter.aclose()
