"""Unit tests for the LLM client (spec 002), run against the offline ``MockAdapter``.

Fakes, not mocks: every test drives the real ``LLMClient`` / ``ResponseChainManager``
with ``sim.testing`` adapters and inspects what they recorded.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import logging
from typing import Any

import pytest
from pydantic import BaseModel

from sim.llm.client import LLMClient, LLMRequest, ResponseChainManager
from sim.llm.errors import (
    LLMConfigurationError,
    LLMError,
    LLMIncompleteError,
    LLMRateLimitError,
    LLMRefusalError,
    LLMSchemaError,
    LLMTimeoutError,
)
from sim.llm.events import LLMEvent
from sim.llm.recovery import RecoveryAdapter
from sim.llm.store import ResponseStore
from sim.llm.tools import ToolDeclaration, schema_of
from sim.llm.types import Adapter, AdapterResponse, CallSettings, Exchange, ModelRequest, Usage
from sim.llm.wrapper import AdapterWrapper
from sim.offline.adapter import OfflineAdapter
from sim.providers import create_adapter
from sim.providers.openai import OpenAIAdapter
from sim.testing import ErrorAdapter, MockAdapter, MockCall, default_instance

PROMPT = "You are a character."


class Intention(BaseModel):
    intention: str
    target: str | None = None


class Summary(BaseModel):
    new_summary: str
    importance: int


async def no_sleep(seconds: float) -> None:
    """Recovery's wait, skipped."""


def entity(entity_id: str, **extra: Any) -> dict[str, Any]:
    return {"identity": {"id": entity_id}, "state": {}, **extra}


def echo(schema: type[BaseModel], input_data: str) -> dict[str, Any]:
    """Default answer that names its request, so results can be told apart."""
    return {"intention": input_data}


def expected_usage(instructions: str, input_data: str, answer: BaseModel) -> Usage:
    """MockAdapter's documented token formula (no history)."""
    return Usage(
        input_tokens=len(instructions + input_data) // 4 + 1,
        output_tokens=len(answer.model_dump_json()) // 4 + 1,
    )


def chain(ent: dict[str, Any], name: str = "intention") -> list[str]:
    chain_ids: list[str] = ent["_openai"][f"{name}_chain"]
    return chain_ids


def req(key: str | None, input_data: str = "ctx", **kwargs: Any) -> LLMRequest:
    return LLMRequest(PROMPT, input_data, Intention, entity_key=key, **kwargs)


def calls_for(adapter: MockAdapter, prefix: str) -> list[MockCall]:
    return [call for call in adapter.calls if call.input.startswith(prefix)]


@pytest.fixture
def bob() -> dict[str, Any]:
    return entity("bob")


@pytest.fixture
def eve() -> dict[str, Any]:
    return entity("eve")


@pytest.fixture
def adapter() -> MockAdapter:
    return MockAdapter(default=echo)


# --------------------------------------------------------------------------------------
# LLMClient initialization


def test_client_init_creates_chain_manager(
    adapter: MockAdapter, bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    client = LLMClient(adapter, [bob, eve])

    assert isinstance(client.chain_manager, ResponseChainManager)
    assert set(client.chain_manager.entities) == {"bob", "eve"}
    # the manager holds the caller's dicts, not copies
    assert client.chain_manager.entities["bob"] is bob
    assert client.chain_manager.entities["eve"] is eve
    assert client.adapter is adapter


def test_client_init_stores_default_depth(adapter: MockAdapter) -> None:
    assert LLMClient(adapter, [], default_depth=3).default_depth == 3
    assert LLMClient(adapter, []).default_depth == 0
    with pytest.raises(ValueError):
        LLMClient(adapter, [], default_depth=-1)


async def test_client_init_empty_entities(adapter: MockAdapter) -> None:
    client = LLMClient(adapter, [], default_depth=2)

    assert client.chain_manager.entities == {}
    # a keyed request for an entity the client does not know still answers
    result = await client.create_response(PROMPT, "hi", Intention, entity_key="intention:bob")
    assert result == Intention(intention="hi")
    assert client.pending_deletions == []


# --------------------------------------------------------------------------------------
# Single request (create_response)


async def test_create_response_success(adapter: MockAdapter) -> None:
    expected = Intention(intention="go to the tavern", target="tavern")
    adapter.enqueue(expected)
    client = LLMClient(adapter, [])

    result = await client.create_response(PROMPT, "Bob is thirsty", Intention)

    assert isinstance(result, Intention)
    assert result == expected
    assert adapter.call_count == 1
    assert adapter.last_request is not None
    assert adapter.last_request.instructions == PROMPT
    assert adapter.last_request.input == "Bob is thirsty"
    assert adapter.last_request.schema is Intention
    assert adapter.last_request.settings == client.settings


async def test_create_response_with_entity_key(adapter: MockAdapter, bob: dict[str, Any]) -> None:
    client = LLMClient(adapter, [bob], default_depth=2)

    first = await client.create_response(PROMPT, "one", Intention, entity_key="intention:bob")
    await client.create_response(PROMPT, "two", Intention, entity_key="intention:bob")

    assert chain(bob) == ["mock_1", "mock_2"]
    # the second call saw the first exchange (window mode)
    assert adapter.calls[1].history == (Exchange("mock_1", "one", first.model_dump_json()),)
    usage = bob["_openai"]["usage"]
    assert usage["total_requests"] == 2
    assert usage["total_input_tokens"] > 0
    assert usage["total_output_tokens"] > 0


async def test_create_response_without_entity_key(
    adapter: MockAdapter, bob: dict[str, Any]
) -> None:
    before = copy.deepcopy(bob)
    client = LLMClient(adapter, [bob], default_depth=2)

    await client.create_response(PROMPT, "one", Intention)
    await client.create_response(PROMPT, "two", Intention)

    assert bob == before  # no chain, no usage
    assert all(call.history == () for call in adapter.calls)
    assert all(call.previous_response_id is None for call in adapter.calls)
    assert client.pending_deletions == []
    assert client.store.changes() == {}


@pytest.mark.parametrize(
    "error",
    [
        LLMRefusalError("refused", refusal_message="I can't help with that"),
        LLMIncompleteError("truncated", reason="max_output_tokens"),
        LLMRateLimitError("429", status_code=429),
        LLMTimeoutError("timed out"),
        LLMError("other"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_create_response_propagates_errors(error: LLMError, bob: dict[str, Any]) -> None:
    before = copy.deepcopy(bob)
    client = LLMClient(ErrorAdapter(error), [bob], default_depth=2)

    with pytest.raises(type(error)) as info:
        await client.create_response(PROMPT, "x", Intention, entity_key="intention:bob")

    assert info.value is error
    assert bob == before  # a failed call neither chains nor counts


# --------------------------------------------------------------------------------------
# Batch execution (create_batch)


async def test_batch_all_success(
    adapter: MockAdapter, bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    client = LLMClient(adapter, [bob, eve], default_depth=1)

    results = await client.create_batch(
        [req("intention:bob", "bob"), req("intention:eve", "eve"), req(None, "free")]
    )

    assert results == [
        Intention(intention="bob"),
        Intention(intention="eve"),
        Intention(intention="free"),
    ]
    assert all(isinstance(r, Intention) for r in results)
    assert adapter.call_count == 3


async def test_batch_partial_failure(bob: dict[str, Any], eve: dict[str, Any]) -> None:
    adapter = MockAdapter(default=echo)
    adapter.enqueue(Intention(intention="ok"), LLMRateLimitError("429"))
    client = LLMClient(adapter, [bob, eve], default_depth=2, max_concurrency=1)

    results = await client.create_batch([req("intention:bob"), req("intention:eve")])

    assert results[0] == Intention(intention="ok")
    assert isinstance(results[1], LLMRateLimitError)
    # the failure did not stop the success from chaining and counting
    assert chain(bob) == ["mock_1"]
    assert bob["_openai"]["usage"]["total_requests"] == 1
    assert "_openai" not in eve


async def test_batch_all_failure(bob: dict[str, Any], eve: dict[str, Any]) -> None:
    error = LLMTimeoutError("timed out")
    adapter = ErrorAdapter(error)
    client = LLMClient(adapter, [bob, eve], default_depth=2)

    results = await client.create_batch([req("intention:bob"), req("intention:eve"), req(None)])

    assert len(results) == 3
    assert all(isinstance(r, LLMTimeoutError) for r in results)
    assert adapter.call_count == 3
    assert "_openai" not in bob
    assert "_openai" not in eve


async def test_batch_empty_requests(adapter: MockAdapter) -> None:
    client = LLMClient(adapter, [])

    assert await client.create_batch([]) == []
    assert adapter.call_count == 0


class ReverseDelayAdapter(MockAdapter):
    """Answers request ``"<n>"`` only once request ``n + 1`` has been answered, so the
    last request finishes first (an ordering, not a timing: it holds on a loaded machine)."""

    def __init__(self, *args: Any, count: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answered = [asyncio.Event() for _ in range(count + 1)]
        self.answered[count].set()

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        n = int(request.input)
        await self.answered[n + 1].wait()
        try:
            return await super().execute(request)
        finally:
            self.answered[n].set()


async def test_batch_preserves_order() -> None:
    adapter = ReverseDelayAdapter(default=echo)
    entities = [entity(f"e{n}") for n in range(10)]
    client = LLMClient(adapter, entities, default_depth=1)

    results = await client.create_batch([req(f"intention:e{n}", str(n)) for n in range(10)])

    assert [r.intention for r in results] == [str(n) for n in range(10)]
    # they did complete out of order: the last request got the first response id
    assert chain(entities[9]) == ["mock_1"]


# --------------------------------------------------------------------------------------
# Chain integration


async def test_batch_uses_previous_response_id(bob: dict[str, Any]) -> None:
    bob["_openai"] = {"intention_chain": ["resp_old_1", "resp_old_2"]}
    adapter = MockAdapter(default=echo)
    client = LLMClient(adapter, [bob], default_depth=2, chain_mode="server")

    await client.create_batch([req("intention:bob")])

    assert adapter.calls[0].previous_response_id == "resp_old_2"
    assert adapter.calls[0].history == ()

    # window mode: no provider-side id, the stored exchanges instead
    store = ResponseStore()
    store.put("intention:eve", Exchange("resp_a", "in a", "out a"))
    store.put("intention:eve", Exchange("resp_b", "in b", "out b"))
    store.put("memory:eve", Exchange("resp_m", "in m", "out m"))
    eve = entity("eve", _openai={"intention_chain": ["resp_a", "resp_b"]})
    window_adapter = MockAdapter(default=echo)
    window = LLMClient(window_adapter, [eve], default_depth=2, store=store)

    await window.create_batch([req("intention:eve")])

    assert window_adapter.calls[0].previous_response_id is None
    assert window_adapter.calls[0].history == (
        Exchange("resp_a", "in a", "out a"),
        Exchange("resp_b", "in b", "out b"),
    )


async def test_batch_auto_confirm(
    adapter: MockAdapter, bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    client = LLMClient(adapter, [bob, eve], default_depth=2)

    for _ in range(3):
        await client.create_batch([req("intention:bob"), req("intention:eve")])

    # depth 2: each chain keeps its last two ids, in order
    assert len(chain(bob)) == 2
    assert len(chain(eve)) == 2
    ids = sorted(chain(bob) + chain(eve), key=lambda rid: int(rid.split("_")[1]))
    assert ids == ["mock_3", "mock_4", "mock_5", "mock_6"]
    assert int(chain(bob)[0].split("_")[1]) < int(chain(bob)[1].split("_")[1])

    # depth 0 (the default) confirms nothing
    carol = entity("carol")
    independent = LLMClient(MockAdapter(), [carol])
    await independent.create_batch([req("intention:carol")])
    assert "intention_chain" not in carol["_openai"]


async def test_batch_depth_override(
    adapter: MockAdapter, bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    client = LLMClient(adapter, [bob, eve], default_depth=1)

    for _ in range(3):
        await client.create_batch([req("intention:bob", depth_override=3), req("intention:eve")])

    assert len(chain(bob)) == 3  # override
    assert len(chain(eve)) == 1  # default
    # depth_override=0 makes a request independent even with a default depth
    dave = entity("dave")
    client2 = LLMClient(MockAdapter(), [dave], default_depth=2)
    await client2.create_batch([req("intention:dave", depth_override=0)])
    assert "intention_chain" not in dave["_openai"]


async def test_batch_eviction_triggers_delete(adapter: MockAdapter, bob: dict[str, Any]) -> None:
    client = LLMClient(adapter, [bob], default_depth=1)

    await client.create_batch([req("intention:bob")])
    await client.create_batch([req("intention:bob")])

    assert chain(bob) == ["mock_2"]
    assert client.pending_deletions == [("intention:bob", "mock_1")]

    failed = await client.flush_deletions()

    assert failed == []
    assert adapter.deleted == ["mock_1"]


# --------------------------------------------------------------------------------------
# Usage accumulation


async def test_usage_accumulated_per_entity(
    adapter: MockAdapter, bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    client = LLMClient(adapter, [bob, eve])

    await client.create_batch([req("intention:bob", "bob input"), req("intention:eve", "eve")])

    bob_usage = expected_usage(PROMPT, "bob input", Intention(intention="bob input"))
    eve_usage = expected_usage(PROMPT, "eve", Intention(intention="eve"))
    assert bob["_openai"]["usage"] == {
        "total_input_tokens": bob_usage.input_tokens,
        "total_output_tokens": bob_usage.output_tokens,
        "total_requests": 1,
    }
    assert eve["_openai"]["usage"] == {
        "total_input_tokens": eve_usage.input_tokens,
        "total_output_tokens": eve_usage.output_tokens,
        "total_requests": 1,
    }


async def test_usage_creates_openai_section(adapter: MockAdapter) -> None:
    bare: dict[str, Any] = {"identity": {"id": "bob"}}
    client = LLMClient(adapter, [bare])

    await client.create_response(PROMPT, "x", Intention, entity_key="intention:bob")

    assert set(bare["_openai"]["usage"]) == {
        "total_input_tokens",
        "total_output_tokens",
        "total_requests",
    }
    # an existing section keeps its other keys
    kept = entity("eve", _openai={"memory_chain": ["resp_1"]})
    client2 = LLMClient(adapter, [kept])
    await client2.create_response(PROMPT, "x", Intention, entity_key="intention:eve")
    assert kept["_openai"]["memory_chain"] == ["resp_1"]
    assert kept["_openai"]["usage"]["total_requests"] == 1


async def test_usage_multiple_requests(adapter: MockAdapter, bob: dict[str, Any]) -> None:
    bob["_openai"] = {
        "usage": {"total_input_tokens": 100, "total_output_tokens": 10, "total_requests": 4}
    }
    client = LLMClient(adapter, [bob])
    inputs = ["a", "bb" * 10, "ccc" * 30]

    await client.create_batch([req("intention:bob", text) for text in inputs])
    await client.create_response(PROMPT, "last", Intention, entity_key="memory:bob")

    total = Usage()
    for text in [*inputs, "last"]:
        total = total + expected_usage(PROMPT, text, Intention(intention=text))
    assert bob["_openai"]["usage"] == {
        "total_input_tokens": 100 + total.input_tokens,
        "total_output_tokens": 10 + total.output_tokens,
        "total_requests": 8,
    }


async def test_usage_accumulates_cached_tokens(bob: dict[str, Any], eve: dict[str, Any]) -> None:
    client = LLMClient(MockAdapter(default=echo, cached_input_tokens=3), [bob, eve])

    await client.create_batch([req("intention:bob"), req("intention:bob")])

    assert bob["_openai"]["usage"]["total_cached_input_tokens"] == 6

    # without cached tokens the key is not added
    plain = LLMClient(MockAdapter(default=echo), [eve])
    await plain.create_batch([req("intention:eve")])
    assert "total_cached_input_tokens" not in eve["_openai"]["usage"]


# --------------------------------------------------------------------------------------
# ResponseChainManager


def test_chain_manager_init_indexes_entities(bob: dict[str, Any], eve: dict[str, Any]) -> None:
    manager = ResponseChainManager([bob, eve])

    assert manager.entities == {"bob": bob, "eve": eve}
    assert manager.entities["bob"] is bob


def test_chain_manager_init_skips_invalid(bob: dict[str, Any]) -> None:
    invalid: list[dict[str, Any]] = [
        {"name": "no identity"},
        {"identity": {}},
        {"identity": None},
        {"identity": {"id": ""}},
        {"identity": {"id": 7}},
    ]

    manager = ResponseChainManager([*invalid, bob])

    assert manager.entities == {"bob": bob}


def test_get_previous_empty_chain(bob: dict[str, Any]) -> None:
    bob["_openai"] = {"intention_chain": []}
    manager = ResponseChainManager([bob, entity("eve")])

    assert manager.get_previous("intention:bob") is None
    assert manager.get_previous("intention:eve") is None  # no _openai at all
    assert manager.get_previous("memory:bob") is None  # other chain absent


def test_get_previous_with_chain(bob: dict[str, Any]) -> None:
    bob["_openai"] = {"intention_chain": ["resp_1", "resp_2"], "memory_chain": ["resp_9"]}
    manager = ResponseChainManager([bob])

    assert manager.get_previous("intention:bob") == "resp_2"
    assert manager.get_previous("memory:bob") == "resp_9"


def test_get_previous_unknown_entity(bob: dict[str, Any]) -> None:
    bob["_openai"] = {"intention_chain": ["resp_1"]}
    manager = ResponseChainManager([bob])

    assert manager.get_previous("intention:nobody") is None


def test_confirm_depth_zero(bob: dict[str, Any]) -> None:
    bob["_openai"] = {"intention_chain": ["resp_1"]}
    before = copy.deepcopy(bob)
    manager = ResponseChainManager([bob])

    assert manager.confirm("intention:bob", "resp_2", depth=0) is None
    assert manager.confirm("memory:bob", "resp_3", depth=0) is None
    assert bob == before
    assert manager.evicted == []


def test_confirm_adds_to_chain(bob: dict[str, Any]) -> None:
    manager = ResponseChainManager([bob])

    assert manager.confirm("intention:bob", "resp_1", depth=3) is None
    assert manager.confirm("intention:bob", "resp_2", depth=3) is None

    assert chain(bob) == ["resp_1", "resp_2"]
    assert manager.get_previous("intention:bob") == "resp_2"
    assert "memory_chain" not in bob["_openai"]


def test_confirm_sliding_window(bob: dict[str, Any]) -> None:
    manager = ResponseChainManager([bob])
    manager.confirm("intention:bob", "resp_1", depth=2)
    manager.confirm("intention:bob", "resp_2", depth=2)

    assert manager.confirm("intention:bob", "resp_3", depth=2) == "resp_1"
    assert chain(bob) == ["resp_2", "resp_3"]
    assert manager.confirm("intention:bob", "resp_4", depth=2) == "resp_2"
    assert chain(bob) == ["resp_3", "resp_4"]
    assert manager.evicted == [("intention:bob", "resp_1"), ("intention:bob", "resp_2")]


def test_confirm_lowered_depth_trims_chain(bob: dict[str, Any]) -> None:
    bob["_openai"] = {"intention_chain": ["resp_1", "resp_2", "resp_3"]}
    manager = ResponseChainManager([bob])

    assert manager.confirm("intention:bob", "resp_4", depth=1) == "resp_1"

    assert chain(bob) == ["resp_4"]
    assert manager.evicted == [
        ("intention:bob", "resp_1"),
        ("intention:bob", "resp_2"),
        ("intention:bob", "resp_3"),
    ]


def test_confirm_creates_openai_section() -> None:
    bare: dict[str, Any] = {"identity": {"id": "bob"}}
    manager = ResponseChainManager([bare])

    manager.confirm("memory:bob", "resp_1", depth=1)

    assert bare["_openai"] == {"memory_chain": ["resp_1"]}


def test_confirm_unknown_entity(bob: dict[str, Any]) -> None:
    before = copy.deepcopy(bob)
    manager = ResponseChainManager([bob])

    assert manager.confirm("intention:nobody", "resp_1", depth=2) is None
    assert bob == before
    assert manager.evicted == []


def test_parse_key_intention() -> None:
    assert ResponseChainManager._parse_key("intention:bob") == ("bob", "intention")


def test_parse_key_memory() -> None:
    assert ResponseChainManager._parse_key("memory:elvira") == ("elvira", "memory")


def test_parse_key_resolution() -> None:
    assert ResponseChainManager._parse_key("resolution:tavern") == ("tavern", "resolution")
    # only the first colon separates: ids may contain colons
    assert ResponseChainManager._parse_key("narrative:zone:north") == ("zone:north", "narrative")


# --------------------------------------------------------------------------------------
# LLMRequest


def test_request_defaults() -> None:
    request = LLMRequest(PROMPT, "ctx", Intention)

    assert request.entity_key is None
    assert request.depth_override is None
    assert request.schema is Intention


def test_request_with_override() -> None:
    request = LLMRequest(PROMPT, "ctx", Intention, entity_key="intention:bob", depth_override=5)

    assert request.entity_key == "intention:bob"
    assert request.depth_override == 5


# --------------------------------------------------------------------------------------
# Beyond the spec: same-entity ordering, concurrency, window mode, deletions, store


async def test_batch_same_entity_sequential_window_mode(
    bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    adapter = MockAdapter(default=echo, delay=0.005)
    client = LLMClient(adapter, [bob, eve], default_depth=3)
    requests = [
        req("intention:bob", "bob 1"),
        req("intention:eve", "eve 1"),
        req("intention:bob", "bob 2"),
        req("intention:eve", "eve 2"),
        req("intention:bob", "bob 3"),
    ]

    results = await client.create_batch(requests)

    assert [r.intention for r in results] == [r.input_data for r in requests]
    bob_calls = calls_for(adapter, "bob")
    assert [c.input for c in bob_calls] == ["bob 1", "bob 2", "bob 3"]
    first, second, _ = chain(bob)
    raw = {n: Intention(intention=f"bob {n}").model_dump_json() for n in (1, 2)}
    assert bob_calls[0].history == ()
    assert bob_calls[1].history == (Exchange(first, "bob 1", raw[1]),)
    assert bob_calls[2].history == (
        Exchange(first, "bob 1", raw[1]),
        Exchange(second, "bob 2", raw[2]),
    )
    assert all(c.previous_response_id is None for c in adapter.calls)
    eve_calls = calls_for(adapter, "eve")
    assert [e.response_id for e in eve_calls[1].history] == chain(eve)[:1]


async def test_batch_same_entity_sequential_server_mode(
    bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    adapter = MockAdapter(default=echo, delay=0.005)
    client = LLMClient(adapter, [bob, eve], default_depth=3, chain_mode="server")

    await client.create_batch(
        [
            req("intention:bob", "bob 1"),
            req("intention:eve", "eve 1"),
            req("intention:bob", "bob 2"),
            req("intention:bob", "bob 3"),
        ]
    )

    bob_calls = calls_for(adapter, "bob")
    assert [c.input for c in bob_calls] == ["bob 1", "bob 2", "bob 3"]
    first, second, _ = chain(bob)
    assert [c.previous_response_id for c in bob_calls] == [None, first, second]
    assert all(c.history == () for c in adapter.calls)
    assert client.store.changes() == {}  # server mode keeps nothing locally


async def test_batch_different_keys_run_concurrently() -> None:
    adapter = MockAdapter(default=echo, delay=0.02)
    entities = [entity(f"e{n}") for n in range(4)]
    client = LLMClient(adapter, entities, default_depth=1)

    await client.create_batch(
        [req(f"intention:e{n}", str(n)) for n in range(4)] + [req(None), req(None)]
    )

    assert adapter.max_in_flight == 6
    assert adapter.in_flight == 0


async def test_batch_respects_max_concurrency() -> None:
    adapter = MockAdapter(default=echo, delay=0.005)
    entities = [entity(f"e{n}") for n in range(8)]
    client = LLMClient(adapter, entities, default_depth=1, max_concurrency=3)

    results = await client.create_batch(
        [req(f"intention:e{n}", str(n)) for n in range(8)] + [req(None, "x")] * 4
    )

    assert adapter.max_in_flight == 3
    assert adapter.call_count == 12
    assert [r.intention for r in results] == [str(n) for n in range(8)] + ["x"] * 4


async def test_batch_same_entity_never_concurrent(bob: dict[str, Any]) -> None:
    adapter = MockAdapter(default=echo, delay=0.005)
    client = LLMClient(adapter, [bob], default_depth=1)

    await client.create_batch([req("intention:bob", str(n)) for n in range(5)])

    assert adapter.max_in_flight == 1
    assert [c.input for c in adapter.calls] == [str(n) for n in range(5)]


async def test_window_mode_sends_last_depth_exchanges(
    adapter: MockAdapter, bob: dict[str, Any]
) -> None:
    client = LLMClient(adapter, [bob], default_depth=2)

    for n in range(1, 5):
        await client.create_response(PROMPT, f"turn {n}", Intention, entity_key="intention:bob")

    raw = {n: Intention(intention=f"turn {n}").model_dump_json() for n in range(1, 5)}
    # 3rd call: exactly the two exchanges before it
    assert adapter.calls[2].history == (
        Exchange("mock_1", "turn 1", raw[1]),
        Exchange("mock_2", "turn 2", raw[2]),
    )
    # 4th call: the window slid by one
    assert adapter.calls[3].history == (
        Exchange("mock_2", "turn 2", raw[2]),
        Exchange("mock_3", "turn 3", raw[3]),
    )
    assert chain(bob) == ["mock_3", "mock_4"]


async def test_lowering_depth_trims_chain(adapter: MockAdapter, bob: dict[str, Any]) -> None:
    client = LLMClient(adapter, [bob], default_depth=3)
    for n in range(1, 4):
        await client.create_response(PROMPT, f"turn {n}", Intention, entity_key="intention:bob")
    assert chain(bob) == ["mock_1", "mock_2", "mock_3"]

    await client.create_batch([req("intention:bob", "turn 4", depth_override=1)])

    # the lowered depth limits what is sent, and the chain shrinks to it
    assert [e.response_id for e in adapter.calls[3].history] == ["mock_3"]
    assert chain(bob) == ["mock_4"]
    assert [rid for _, rid in client.pending_deletions] == ["mock_1", "mock_2", "mock_3"]
    assert adapter.deleted == []


async def test_flush_deletions_only_after_called(
    adapter: MockAdapter, bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    client = LLMClient(adapter, [bob, eve], default_depth=1)

    for _ in range(3):
        await client.create_batch([req("intention:bob"), req("intention:eve")])

    # evicted at the chain, but nothing deleted at the provider yet
    assert adapter.deleted == []
    pending = list(client.pending_deletions)
    assert len(pending) == 4
    assert {key for key, _ in pending} == {"intention:bob", "intention:eve"}
    assert not {rid for _, rid in pending} & set(chain(bob) + chain(eve))

    assert await client.flush_deletions() == []

    assert adapter.deleted == [rid for _, rid in pending]
    assert client.pending_deletions == []
    # a second flush has nothing left to delete
    assert await client.flush_deletions() == []
    assert len(adapter.deleted) == 4


class FailingDeleteAdapter(MockAdapter):
    """Deletion of ``mock_1`` fails with an LLMError; other deletions succeed."""

    async def delete_response(self, response_id: str) -> None:
        if response_id == "mock_1":
            raise LLMError("cannot delete", code="not_found")
        await super().delete_response(response_id)


async def test_flush_deletions_returns_failures(bob: dict[str, Any]) -> None:
    adapter = FailingDeleteAdapter(default=echo)
    client = LLMClient(adapter, [bob], default_depth=1)
    for _ in range(3):
        await client.create_response(PROMPT, "x", Intention, entity_key="intention:bob")

    failed = await client.flush_deletions()

    assert [(key, rid) for key, rid, _ in failed] == [("intention:bob", "mock_1")]
    assert failed[0][2].code == "not_found"
    assert adapter.deleted == ["mock_2"]
    assert client.pending_deletions == []


async def test_store_drops_evicted_exchanges(adapter: MockAdapter, bob: dict[str, Any]) -> None:
    store = ResponseStore(folder=".sim/responses")
    client = LLMClient(adapter, [bob], default_depth=2, store=store)

    for n in range(1, 4):
        await client.create_response(PROMPT, f"turn {n}", Intention, entity_key="intention:bob")

    changes = store.changes()
    assert list(changes) == [".sim/responses/intention/bob.json"]
    data = changes[".sim/responses/intention/bob.json"]
    assert data is not None
    entries = json.loads(data)
    assert list(entries) == ["mock_2", "mock_3"] == chain(bob)
    assert entries["mock_3"] == {
        "input": "turn 3",
        "output": Intention(intention="turn 3").model_dump_json(),
    }
    assert store.get("intention:bob", "mock_1") is None

    # once every exchange of a file is evicted, the file is to be deleted
    store.mark_committed()
    for rid in chain(bob):
        store.evict("intention:bob", rid)
    assert store.changes() == {".sim/responses/intention/bob.json": None}


async def test_window_mode_resumes_from_saved_store(tmp_path: Any, bob: dict[str, Any]) -> None:
    first = LLMClient(
        MockAdapter(default=echo), [bob], default_depth=2, store=ResponseStore(folder="memory")
    )
    await first.create_response(PROMPT, "turn 1", Intention, entity_key="intention:bob")
    for relpath, data in first.store.changes().items():
        assert data is not None
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_bytes(data)

    adapter = MockAdapter(default=echo)
    resumed = LLMClient(adapter, [bob], default_depth=2, store=ResponseStore(tmp_path, "memory"))
    await resumed.create_response(PROMPT, "turn 2", Intention, entity_key="intention:bob")

    assert adapter.calls[0].history == (
        Exchange("mock_1", "turn 1", Intention(intention="turn 1").model_dump_json()),
    )


async def test_cancelled_error_propagates_single_key(bob: dict[str, Any]) -> None:
    adapter = MockAdapter(default=echo)
    adapter.enqueue(asyncio.CancelledError())
    client = LLMClient(adapter, [bob], default_depth=1)

    with pytest.raises(asyncio.CancelledError):
        await client.create_batch([req("intention:bob"), req("intention:bob")])

    assert adapter.call_count == 1  # the batch stopped
    assert "_openai" not in bob


async def test_cancelled_error_propagates_from_batch(
    bob: dict[str, Any], eve: dict[str, Any]
) -> None:
    adapter = MockAdapter(default=echo, delay=0.005)
    adapter.enqueue(asyncio.CancelledError())
    client = LLMClient(adapter, [bob, eve], default_depth=1)

    outcome: object
    try:
        outcome = await client.create_batch(
            [req("intention:bob"), req("intention:eve"), req("intention:bob")]
        )
    except asyncio.CancelledError:
        outcome = "cancelled"

    assert outcome == "cancelled", f"create_batch returned {outcome!r}"


async def test_cancelling_batch_task_propagates(bob: dict[str, Any], eve: dict[str, Any]) -> None:
    adapter = MockAdapter(default=echo, delay=10)
    client = LLMClient(adapter, [bob, eve], default_depth=1)
    task = asyncio.create_task(client.create_batch([req("intention:bob"), req("intention:eve")]))
    while adapter.in_flight < 2:
        await asyncio.sleep(0)

    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert adapter.in_flight == 0
    assert "_openai" not in bob


async def test_unexpected_exception_becomes_llm_error(
    bob: dict[str, Any], eve: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    boom = RuntimeError("adapter bug")
    adapter = MockAdapter(default=echo)
    adapter.enqueue(boom)
    client = LLMClient(adapter, [bob, eve], default_depth=1, max_concurrency=1)

    with caplog.at_level(logging.ERROR, logger="sim.llm.client"):
        results = await client.create_batch([req("intention:bob"), req("intention:eve", "ok")])

    assert isinstance(results[0], LLMError)
    assert results[0].cause is boom
    assert "adapter bug" in str(results[0])
    assert results[1] == Intention(intention="ok")
    assert "_openai" not in bob
    assert any(record.levelno == logging.ERROR for record in caplog.records)


async def test_batch_logs_rate_limit_hits(
    bob: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    adapter = MockAdapter(default=echo)
    adapter.enqueue(LLMRateLimitError("429"), LLMRateLimitError("429"))
    client = LLMClient(adapter, [bob], phase="phase1")

    with caplog.at_level(logging.WARNING, logger="sim.llm.client"):
        results = await client.create_batch([req("intention:bob")] * 3)

    assert [type(r) for r in results] == [LLMRateLimitError, LLMRateLimitError, Intention]
    assert client.rate_limit_hits == 2
    assert any("2 rate limit hits" in record.getMessage() for record in caplog.records)


async def test_events_emitted_per_call(bob: dict[str, Any]) -> None:
    events: list[LLMEvent] = []
    adapter = MockAdapter(default=echo)
    adapter.enqueue(Intention(intention="a"), LLMTimeoutError("slow"))
    client = LLMClient(adapter, [bob], default_depth=1, events=events.append, phase="p1")

    await client.create_batch([req("intention:bob"), req("intention:bob")])

    assert [e.kind for e in events] == ["llm_called", "llm_completed", "llm_called", "llm_failed"]
    assert all(e.phase == "p1" and e.entity_key == "intention:bob" for e in events)
    assert events[1].response is not None and events[1].response.response_id == "mock_1"
    assert events[3].error_code == "timeout"
    assert [e.response_id for e in events[2].history] == ["mock_1"]


# --------------------------------------------------------------------------------------
# The test doubles themselves (sim.testing)


def test_mock_adapter_satisfies_protocol() -> None:
    assert isinstance(MockAdapter(), Adapter)
    assert isinstance(ErrorAdapter(LLMError("x")), Adapter)
    assert MockAdapter.name == "mock"


async def test_mock_adapter_default_instance() -> None:
    adapter = MockAdapter()

    response = await adapter.execute(ModelRequest(PROMPT, "x", Summary))

    assert response.parsed == Summary(new_summary="mock", importance=0)
    assert response.response_id == "mock_1"
    assert response.raw == response.parsed.model_dump_json()
    assert response.model == CallSettings().model  # the model asked for
    assert default_instance(Intention) == Intention(intention="mock", target=None)


async def test_mock_adapter_queue_then_default() -> None:
    adapter = MockAdapter()
    adapter.enqueue({"new_summary": "from dict", "importance": 3}, LLMTimeoutError("t"))

    first = await adapter.execute(ModelRequest(PROMPT, "x", Summary))
    with pytest.raises(LLMTimeoutError):
        await adapter.execute(ModelRequest(PROMPT, "x", Summary))
    third = await adapter.execute(ModelRequest(PROMPT, "x", Summary))

    assert first.parsed == Summary(new_summary="from dict", importance=3)
    assert third.parsed == Summary(new_summary="mock", importance=0)
    assert [first.response_id, third.response_id] == ["mock_1", "mock_2"]
    assert adapter.call_count == 3


async def test_mock_adapter_invalid_dict_is_schema_error() -> None:
    adapter = MockAdapter()
    adapter.enqueue({"importance": "not a number"})

    with pytest.raises(LLMSchemaError):
        await adapter.execute(ModelRequest(PROMPT, "x", Summary))


async def test_mock_adapter_records_calls_and_usage() -> None:
    adapter = MockAdapter()
    history = (Exchange("mock_0", "earlier in", "earlier out"),)
    settings = CallSettings(model="gpt-test")

    request = ModelRequest(
        PROMPT,
        "input",
        Intention,
        history=history,
        previous_response_id="prev",
        settings=settings,
    )
    response = await adapter.execute(request)

    assert adapter.last_request == request
    assert adapter.last_request == MockCall(
        PROMPT, "input", Intention, None, history, "prev", settings
    )
    assert response.usage == Usage(
        input_tokens=len(PROMPT + "input" + "earlier in" + "earlier out") // 4 + 1,
        output_tokens=len(response.raw) // 4 + 1,
    )
    assert response.model == "gpt-test"


async def test_mock_adapter_reset() -> None:
    adapter = MockAdapter(delay=0.001)
    adapter.enqueue(Intention(intention="first"), Intention(intention="queued"))
    await adapter.execute(ModelRequest(PROMPT, "x", Intention))
    await adapter.delete_response("mock_1")
    assert adapter.pending == 1

    adapter.reset()

    assert adapter.call_count == 0
    assert adapter.calls == []
    assert adapter.last_request is None
    assert adapter.deleted == []
    assert adapter.pending == 0
    assert adapter.max_in_flight == 0
    response = await adapter.execute(ModelRequest(PROMPT, "x", Intention))
    assert response.response_id == "mock_1"
    assert response.parsed == Intention(intention="mock")


async def test_error_adapter_raises_every_time() -> None:
    error = LLMRefusalError("no", refusal_message="refused")
    adapter = ErrorAdapter(error)

    for _ in range(3):
        with pytest.raises(LLMRefusalError) as info:
            await adapter.execute(ModelRequest(PROMPT, "x", Intention))
        assert info.value is error
    await adapter.delete_response("resp_1")

    assert adapter.call_count == 3


# --------------------------------------------------------------------------------------
# The request object, the wrapper hook and the typed fields


class Seen(AdapterWrapper):
    """A wrapper overriding the one hook, noting every request it is handed."""

    def __init__(self, inner: Adapter) -> None:
        super().__init__(inner)
        self.requests: list[ModelRequest] = []

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.requests.append(request)
        return await self.inner.execute(request)


async def test_a_wrapper_overriding_the_hook_sees_the_request_object(
    bob: dict[str, Any],
) -> None:
    mock = MockAdapter(default=echo)
    seen = Seen(mock)
    settings = CallSettings(model="m1", temperature=0.2)
    client = LLMClient(seen, [bob], default_depth=2, settings=settings)

    await client.create_response(PROMPT, "one", Intention, entity_key="intention:bob")
    await client.create_response(PROMPT, "two", Intention, entity_key="intention:bob")

    first, second = seen.requests
    assert isinstance(second, ModelRequest)
    assert (second.instructions, second.input, second.schema) == (PROMPT, "two", Intention)
    assert second.tools is None and second.settings == settings
    assert second.history == (Exchange("mock_1", "one", '{"intention":"one","target":null}'),)
    assert first.history == ()
    # the wrapper passes the very object on: what it saw is what the adapter was sent
    assert mock.calls == seen.requests
    await seen.delete_response("mock_1")
    assert mock.deleted == ["mock_1"]


async def test_schema_feedback_is_a_replace_of_the_request() -> None:
    mock = MockAdapter(default=echo)
    mock.enqueue(LLMSchemaError("field 'intention' missing", usage=Usage(5, 2)))
    adapter = RecoveryAdapter(mock, sleep=no_sleep)
    history = (Exchange("r0", "before", "after"),)
    request = ModelRequest(
        PROMPT, "go", Intention, history=history, settings=CallSettings(model="m")
    )

    response = await adapter.execute(request)

    first, retried = mock.calls
    assert first == request  # the caller's request, sent as it was
    assert retried != first
    # the retry differs in its instructions only: the original plus the error fed back
    assert dataclasses.replace(retried, instructions=first.instructions) == first
    assert retried.instructions.startswith(PROMPT)
    assert "field 'intention' missing" in retried.instructions[len(PROMPT) :]
    assert [a.error_code for a in response.attempts] == ["schema_error", None]
    assert response.attempts[0].usage == Usage(5, 2)  # the failed attempt was paid for


async def test_failed_call_carries_typed_attempts_and_usage() -> None:
    mock = MockAdapter()
    mock.enqueue(
        LLMSchemaError("bad", usage=Usage(3, 1)),
        LLMSchemaError("bad", usage=Usage(4, 1)),
        LLMSchemaError("bad", usage=Usage(5, 1)),
    )
    adapter = RecoveryAdapter(mock, sleep=no_sleep)

    with pytest.raises(LLMSchemaError) as info:
        await adapter.execute(ModelRequest(PROMPT, "x", Intention))

    error = info.value
    assert [a.attempt for a in error.attempts] == [1, 2, 3]
    assert error.usage == Usage(5, 1)  # the attempt that raised it
    assert error.total_usage == Usage(12, 3)  # every attempt together
    assert error.served_from == "live"


async def test_fallback_is_typed_on_the_response() -> None:
    mock = MockAdapter()
    mock.enqueue(LLMRefusalError("no"))  # fatal for this model: no retry, no fallback
    adapter = RecoveryAdapter(mock, sleep=no_sleep)
    with pytest.raises(LLMRefusalError):
        await adapter.execute(
            ModelRequest(PROMPT, "x", Intention, settings=CallSettings(fallback_models=("b",)))
        )

    mock.enqueue(LLMTimeoutError("slow"), LLMTimeoutError("slow"), LLMTimeoutError("slow"))
    settings = CallSettings(model="a", fallback_models=("b",))
    response = await adapter.execute(ModelRequest(PROMPT, "x", Intention, settings=settings))
    assert (response.fallback_from, response.fallback_to) == ("a", "b")
    assert [c.settings.model for c in mock.calls[1:]] == ["a", "a", "a", "b"]
    assert response.provider == "mock" and response.served_from == "live"


def test_a_request_has_a_schema_or_tools() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ModelRequest(PROMPT, "x")
    tool = ToolDeclaration(name="wait", description="Wait.", parameters={"type": "object"})
    with pytest.raises(ValueError, match="exactly one"):
        ModelRequest(PROMPT, "x", Intention, tools=(tool,))


async def test_an_adapter_without_tool_calling_fails_loudly_naming_its_class() -> None:
    class SchemaOnly:
        name = "schema-only"

        async def execute(self, request: ModelRequest) -> AdapterResponse:
            schema_of(self, request)
            raise AssertionError("not reached")

        async def delete_response(self, response_id: str) -> None: ...

    tool = ToolDeclaration(name="wait", description="Wait.", parameters={"type": "object"})
    client = LLMClient(Seen(SchemaOnly()), [])
    (result,) = await client.create_batch([LLMRequest(PROMPT, "x", Intention, tools=(tool,))])
    assert isinstance(result, LLMConfigurationError)
    assert "SchemaOnly does not support tool calling" in str(result)


def test_unknown_adapter_option_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LLMConfigurationError, match="'sed'") as info:
        create_adapter("offline", sed=1)  # misspelt seed
    assert "seed" in str(info.value)
    monkeypatch.setenv("SIM_TEST_KEY", "k")
    with pytest.raises(LLMConfigurationError, match="'store'"):
        create_adapter("chat", api_key_env="SIM_TEST_KEY", store=True)  # chat keeps nothing
    # the options an adapter passes on to its base class count as its own, misspelt or not
    with pytest.raises(LLMConfigurationError, match=r"'max_concurency'.*max_concurrency"):
        create_adapter("openai", api_key_env="SIM_TEST_KEY", max_concurency=4)
    adapter = create_adapter("openai", api_key_env="SIM_TEST_KEY", max_concurrency=40, store=True)
    assert isinstance(adapter, OpenAIAdapter) and adapter.store
    assert len(adapter.connections) == 3  # 40 calls in flight over pools of 16
    with pytest.raises(TypeError):
        OfflineAdapter(seed=1, sede=2)  # type: ignore[call-arg]


# --------------------------------------------------------------------------------------
# Chain: the ids in the entity and the exchanges in the store, as one


def test_chain_confirm_and_evict_change_ids_and_exchanges_together(
    bob: dict[str, Any],
) -> None:
    store = ResponseStore()
    manager = ResponseChainManager([bob], store)
    chain = manager.chain("intention:bob")
    assert chain is not None and manager.chain("intention:nobody") is None

    for n in range(3):
        chain.confirm(f"r{n}", Exchange(f"r{n}", f"in {n}", f"out {n}"), depth=2)

    assert bob["_openai"]["intention_chain"] == ["r1", "r2"]
    assert chain.window(2) == (Exchange("r1", "in 1", "out 1"), Exchange("r2", "in 2", "out 2"))
    assert chain.window(1) == (Exchange("r2", "in 2", "out 2"),)
    assert store.get("intention:bob", "r0") is None  # evicted with its id
    assert manager.evicted == [("intention:bob", "r0")]
    # a depth decrease trims several at once, both halves
    assert chain.confirm("r3", Exchange("r3", "in 3", "out 3"), depth=1) == ["r1", "r2"]
    assert chain.ids == ["r3"] and chain.previous == "r3"
    assert [e.response_id for e in chain.window(5)] == ["r3"]
    assert store.get("intention:bob", "r2") is None
    # the spec-002 facade is the same chain
    assert manager.get_chain("intention:bob") == ["r3"]
    assert manager.get_previous("intention:bob") == "r3"
    assert manager.reset("intention:bob") == ["r3"] and chain.ids == []


def test_chain_without_a_store_keeps_ids_only(bob: dict[str, Any]) -> None:
    chain = ResponseChainManager([bob]).chain("memory:bob")
    assert chain is not None
    assert chain.confirm("r1", Exchange("r1", "in", "out"), depth=2) == []
    assert chain.ids == ["r1"] and chain.window(2) == ()
    assert chain.confirm("r2", None, depth=0) == [] and chain.ids == ["r1"]  # unchained


def test_offline_seed_from_a_kept_prefix_is_the_full_hash() -> None:
    """The offline model keeps the hash state after each instructions text; every seed is
    still the hash of seed, instructions and input, also once more texts than it keeps
    have been seen (the kept states are dropped, not mixed up)."""

    def full(seed: int, instructions: str, input_data: str) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for part in (f"{seed}\x00", instructions, "\x00", input_data):
            digest.update(part.encode())
        return digest.hexdigest()

    adapter = OfflineAdapter(seed=5)
    texts = [f"instructions {i}" for i in range(150)]
    for round_ in range(2):
        for i, text in enumerate(texts):
            got = adapter._seed(text, f"input {i} {round_}", ())
            assert got == full(5, text, f"input {i} {round_}")
    assert OfflineAdapter(seed=6)._seed("a", "b", ()) == full(6, "a", "b")


def test_recovery_breaker_is_one_per_model_whatever_the_spelling() -> None:
    """Breakers are found by the spelling a request uses once it has been seen; each
    spelling of one model on one endpoint still reaches the same breaker."""
    adapter = RecoveryAdapter(OfflineAdapter())
    first = adapter.breaker("Primary ")
    assert adapter.breaker("primary") is first
    assert adapter.breaker("Primary ") is first
    assert adapter.breaker("primary", "other") is not first
    assert adapter.breaker("PRIMARY", "other") is adapter.breaker("primary", "other")
