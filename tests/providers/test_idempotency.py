"""Idempotency keys: the same attempt sent twice is answered once and billed once."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.adapters.chat import ChatAdapter
from sim.llm.adapters.openai import OpenAIAdapter
from sim.llm.calls import CallIdentity, current_call, idempotency_key
from sim.llm.types import CallSettings, ModelRequest
from sim.testing.stub_server import StubServer

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
    assert idempotency_key(b"{}") is None  # no current call: no key
    token = current_call.set(identity())
    try:
        key = idempotency_key(b'{"a":1}')
        assert key is not None and key.startswith("sim-")
        assert idempotency_key(b'{"a":1}') == key
        assert idempotency_key(b'{"a":2}') != key  # a retry with feedback asks afresh
    finally:
        current_call.reset(token)
    for other in (identity(scope="s2"), identity(request_id="3:intentions:intention:bo:0")):
        token = current_call.set(other)
        try:
            assert idempotency_key(b'{"a":1}') != key
        finally:
            current_call.reset(token)


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
    token = current_call.set(identity())
    try:
        first = await adapter.execute(
            ModelRequest("Write a note.", "about fog", Note, settings=SETTINGS)
        )
        again = await adapter.execute(
            ModelRequest("Write a note.", "about fog", Note, settings=SETTINGS)
        )
    finally:
        current_call.reset(token)
    assert again.response_id == first.response_id and again.parsed == first.parsed
    assert stub_server.stats.generations == 1 and stub_server.stats.replayed == 1
    # without a current call (no tick log) nothing is keyed: two calls, two answers
    await adapter.execute(ModelRequest("Write a note.", "about fog", Note, settings=SETTINGS))
    assert stub_server.stats.generations == 2
