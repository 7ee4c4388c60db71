"""The anthropic adapter over real HTTP (the real ``anthropic`` SDK) against the Messages
API stub: the same matrix as the openai and chat adapters (test_adapters_http.py)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import anthropic
import pytest
from pydantic import BaseModel, ConfigDict

from sim.config import DEFAULT_PRICES, load_config
from sim.engine.stack import provider_options
from sim.llm.budget import Budget, BudgetAdapter, Price, cost_usd, find_price
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMConfigurationError,
    LLMContextLengthError,
    LLMError,
    LLMIncompleteError,
    LLMRateLimitError,
    LLMRefusalError,
    LLMSchemaError,
    LLMTimeoutError,
)
from sim.llm.recovery import RecoveryAdapter, RetryPolicy, classify
from sim.llm.tools import ToolCalls
from sim.llm.types import CallSettings, Exchange, ModelRequest, Usage
from sim.phases.intention_tools import TOOLS
from sim.providers import create_adapter
from sim.providers.anthropic import AnthropicAdapter, usage_of
from sim.testing.anthropic_stub import AnthropicStubServer

KEY = "sk-ant-test-not-a-real-key"
SETTINGS = CallSettings(model="claude-haiku-4-5", timeout_seconds=5)


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


def adapter(server: AnthropicStubServer, timeout: float = 5.0) -> AnthropicAdapter:
    client = anthropic.AsyncAnthropic(
        base_url=server.base_url, api_key=KEY, max_retries=0, timeout=timeout
    )
    return AnthropicAdapter(client)


def note(
    input_text: str = "about fog",
    history: tuple[Exchange, ...] = (),
    previous_response_id: str | None = None,
) -> ModelRequest:
    return ModelRequest(
        "Write a note.",
        input_text,
        Note,
        history=history,
        previous_response_id=previous_response_id,
        settings=SETTINGS,
    )


async def test_structured_answer_is_a_forced_tool_and_usage_counts_the_cache(
    anthropic_stub: AnthropicStubServer,
) -> None:
    llm = adapter(anthropic_stub)
    first = await llm.execute(note("about fog"))
    second = await llm.execute(note("about tides"))

    assert isinstance(first.parsed, Note) and isinstance(second.parsed, Note)
    assert first.raw == first.parsed.model_dump_json()
    assert first.provider == "anthropic" and first.served_from == "live"
    assert first.response_id.startswith("msg_") and first.model == "claude-haiku-4-5"
    body = anthropic_stub.log[-1]
    assert body["tool_choice"] == {"type": "tool", "name": "Note"}
    assert body["tools"][0]["input_schema"] == Note.model_json_schema()
    assert body["system"] == "Write a note."
    assert body["max_tokens"] == SETTINGS.max_output_tokens
    assert "temperature" not in body  # the Messages API of SDK 2.x takes none
    # the instructions prefix is cached the second time: Anthropic reports it apart from
    # input_tokens, sim counts it in the input and as cached
    assert first.usage.cached_input_tokens == 0
    assert second.usage.cached_input_tokens > 0
    assert second.usage.input_tokens > second.usage.cached_input_tokens
    assert anthropic_stub.stats.input_tokens == first.usage.input_tokens + second.usage.input_tokens
    assert anthropic_stub.stats.output_tokens == first.usage.output_tokens + (
        second.usage.output_tokens
    )


async def test_window_is_sent_as_user_and_assistant_turns(
    anthropic_stub: AnthropicStubServer,
) -> None:
    history = (
        Exchange("msg_1", "in one", '{"text":"a","count":1}'),
        Exchange("msg_2", "in two", '{"text":"b","count":2}'),
    )
    without = await adapter(anthropic_stub).execute(note("in three"))
    response = await adapter(anthropic_stub).execute(note("in three", history=history))
    assert anthropic_stub.log[-1]["messages"] == [
        {"role": "user", "content": "in one"},
        {"role": "assistant", "content": '{"text":"a","count":1}'},
        {"role": "user", "content": "in two"},
        {"role": "assistant", "content": '{"text":"b","count":2}'},
        {"role": "user", "content": "in three"},
    ]
    # the model saw the window: more input than the same call without it
    assert response.usage.input_tokens > without.usage.input_tokens


FAULT_ERRORS: list[tuple[str, type[LLMError], str]] = [
    ("rate_limit", LLMRateLimitError, "rate_limit"),
    ("overloaded", LLMAPIError, "overloaded"),
    ("server_error", LLMAPIError, "server_error"),
    ("malformed", LLMSchemaError, "schema_error"),
    ("refusal", LLMRefusalError, "refusal"),
    ("incomplete", LLMIncompleteError, "incomplete"),
    ("insufficient_quota", LLMBudgetExceededError, "insufficient_quota"),
    ("auth", LLMConfigurationError, "configuration_error"),
    ("permission", LLMConfigurationError, "configuration_error"),
    ("bad_request", LLMAPIError, "api_error"),
    ("context_length", LLMContextLengthError, "context_length"),
]


@pytest.mark.parametrize(("fault", "error", "code"), FAULT_ERRORS)
async def test_faults_map_to_llm_errors(
    anthropic_stub: AnthropicStubServer, fault: str, error: type[LLMError], code: str
) -> None:
    anthropic_stub.enqueue(fault)
    with pytest.raises(error) as info:
        await adapter(anthropic_stub).execute(note())
    exc = info.value
    assert exc.code == code
    assert exc.model == SETTINGS.model
    answered = fault in ("malformed", "refusal", "incomplete")
    assert isinstance(exc.cause, anthropic.AnthropicError) or answered
    if fault == "rate_limit":
        assert exc.retry_after == pytest.approx(anthropic_stub.options.retry_after)
        assert classify(exc) == "rate_limit"
    if fault in ("overloaded", "server_error"):  # retried with backoff, like any 5xx
        assert classify(exc) == "transient"
        assert isinstance(exc, LLMAPIError)
        assert exc.status_code == (529 if fault == "overloaded" else 500)
    if fault in ("auth", "permission"):
        assert "ANTHROPIC_API_KEY" in str(exc) and KEY not in str(exc)
    if fault == "bad_request":  # a request the API rejects is not sent again
        assert isinstance(exc, LLMAPIError) and exc.status_code == 400
        assert classify(exc) == "fatal"
    if fault == "refusal":
        assert isinstance(exc, LLMRefusalError) and exc.refusal_message
    if fault == "incomplete":
        assert isinstance(exc, LLMIncompleteError) and exc.reason == "max_output_tokens"
    if answered:  # the attempt was paid for
        assert isinstance(exc.usage, Usage) and exc.usage.input_tokens > 0
    else:
        assert classify(exc) != "schema"


async def test_hang_past_the_timeout_is_a_timeout(anthropic_stub: AnthropicStubServer) -> None:
    anthropic_stub.enqueue("hang")
    request = note()
    request = replace(request, settings=replace(SETTINGS, timeout_seconds=0.3))
    with pytest.raises(LLMTimeoutError):
        await adapter(anthropic_stub).execute(request)


async def test_connection_refused_is_a_transient_api_error() -> None:
    dead = anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key=KEY, max_retries=0)
    with pytest.raises(LLMAPIError) as info:
        await AnthropicAdapter(dead).execute(note())
    assert info.value.code == "connection_error" and info.value.status_code is None
    assert classify(info.value) == "transient"


async def test_unknown_model_is_a_configuration_error(
    anthropic_stub: AnthropicStubServer,
) -> None:
    # a route the stub does not serve answers 404 not_found_error, as an unknown model does
    client = anthropic.AsyncAnthropic(
        base_url=anthropic_stub.base_url + "/nowhere", api_key=KEY, max_retries=0
    )
    with pytest.raises(LLMConfigurationError) as info:
        await AnthropicAdapter(client).execute(note())
    assert "unknown Anthropic model" in str(info.value)


async def test_schema_error_is_retried_with_the_error_fed_back(
    anthropic_stub: AnthropicStubServer,
) -> None:
    anthropic_stub.enqueue("malformed")
    recovery = RecoveryAdapter(adapter(anthropic_stub), sleep=_no_wait)
    response = await recovery.execute(note())
    assert isinstance(response.parsed, Note)
    assert [a.error_code for a in response.attempts] == ["schema_error", None]
    first, second = list(anthropic_stub.log)[-2:]
    assert "rejected" not in first["system"]
    assert "Your previous answer was rejected" in second["system"]
    assert "count" in second["system"]  # the validation error names the missing field


async def test_overloaded_and_rate_limit_are_retried(anthropic_stub: AnthropicStubServer) -> None:
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    anthropic_stub.enqueue("overloaded", "rate_limit", "server_error")
    recovery = RecoveryAdapter(
        adapter(anthropic_stub), RetryPolicy(transient_retries=2), sleep=wait, rng=lambda: 0.5
    )
    response = await recovery.execute(note())
    assert isinstance(response.parsed, Note)
    codes = [a.error_code for a in response.attempts]
    assert codes == ["overloaded", "rate_limit", "server_error", None]
    # the 429 waited what retry-after said; the 529 and 500 backed off
    assert waits[1] == pytest.approx(anthropic_stub.options.retry_after)
    assert len(waits) == 3


async def test_a_refusal_is_not_retried(anthropic_stub: AnthropicStubServer) -> None:
    anthropic_stub.enqueue("refusal")
    with pytest.raises(LLMRefusalError) as info:
        await RecoveryAdapter(adapter(anthropic_stub), sleep=_no_wait).execute(note())
    assert len(info.value.attempts) == 1
    assert anthropic_stub.stats.generations == 1


async def test_tool_calls(anthropic_stub: AnthropicStubServer) -> None:
    data = (
        '{"tick":1,"character":{"id":"ada","name":"Ada","mood":"restless"},'
        '"location":{"id":"quay","objects":["net"]},'
        '"exits":[{"id":"market","name":"Market"}],"present":[]}'
    )
    response = await adapter(anthropic_stub).execute(
        ModelRequest("Decide.", data, tools=TOOLS, settings=SETTINGS)
    )
    assert isinstance(response.parsed, ToolCalls)
    calls = response.parsed.calls
    assert len(calls) == 1 and calls[0].name in {t.name for t in TOOLS}
    assert calls[0].call_id.startswith("toolu_") and isinstance(calls[0].arguments, dict)
    assert response.finish_reason == "tool_calls"
    assert response.raw == response.parsed.dump()
    body = anthropic_stub.log[-1]
    assert body["tool_choice"] == {"type": "any"}
    assert [t["name"] for t in body["tools"]] == [t.name for t in TOOLS]
    assert body["tools"][0]["input_schema"] == TOOLS[0].parameters


async def test_budget_refuses_a_call_that_would_cross_the_cap(
    anthropic_stub: AnthropicStubServer,
) -> None:
    prices = {"claude-haiku-4-5": Price(1.0, 0.1, 5.0)}
    budget = Budget(max_total_tokens=None, max_cost_usd=0.01, prices=prices)
    llm = BudgetAdapter(adapter(anthropic_stub), budget)
    response = await llm.execute(note())
    assert budget.spent_usd == pytest.approx(cost_usd(response.usage, prices["claude-haiku-4-5"]))
    tight = Budget(max_total_tokens=50, max_cost_usd=None, prices=prices)
    sent = anthropic_stub.stats.generations
    with pytest.raises(LLMBudgetExceededError):
        await BudgetAdapter(adapter(anthropic_stub), tight).execute(
            replace(note(), settings=replace(SETTINGS, max_output_tokens=400))
        )
    assert anthropic_stub.stats.generations == sent  # refused before sending


async def test_server_chains_are_refused(anthropic_stub: AnthropicStubServer) -> None:
    with pytest.raises(LLMConfigurationError, match="chain_mode"):
        await adapter(anthropic_stub).execute(note(previous_response_id="msg_1"))
    assert anthropic_stub.stats.generations == 0


def test_usage_counts_cache_reads_and_writes_as_input() -> None:
    message = anthropic.types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5",
            "content": [],
            "stop_reason": "end_turn",
            "usage": {
                "input_tokens": 10,
                "output_tokens": 7,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 50,
            },
        }
    )
    usage = usage_of(message)
    assert usage == Usage(input_tokens=160, output_tokens=7, cached_input_tokens=100)
    # priced: 60 uncached (10 + 50 written) at input, 100 at the cache-read price, 7 at output
    price = Price(1.0, 0.1, 5.0)
    assert cost_usd(usage, price) == pytest.approx((60 * 1.0 + 100 * 0.1 + 7 * 5.0) / 1e6)


def test_claude_prices_and_dated_snapshots() -> None:
    for model in ("claude-opus-4-1", "claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5"):
        assert model in DEFAULT_PRICES
    haiku = find_price(DEFAULT_PRICES, "claude-haiku-4-5-20251001")
    assert haiku == Price(1.0, 0.1, 5.0)
    assert find_price(DEFAULT_PRICES, "claude-haiku-4-5-2025") is None


def test_missing_key_names_the_variable_never_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(LLMConfigurationError) as info:
        create_adapter("anthropic")
    assert "ANTHROPIC_API_KEY" in str(info.value)
    monkeypatch.setenv("SIM_TEST_KEY", "secret-value")
    built = create_adapter("anthropic", api_key_env="SIM_TEST_KEY", timeout_seconds=7)
    assert isinstance(built, AnthropicAdapter)
    assert built.client.max_retries == 0
    assert built.client.api_key == "secret-value"
    assert "secret-value" not in repr(built.client.timeout)
    with pytest.raises(LLMConfigurationError, match="store"):
        create_adapter("anthropic", api_key_env="SIM_TEST_KEY", store=True)


def test_the_key_defaults_to_anthropic_api_key(tmp_path: Path) -> None:
    config = load_config(overrides={"llm": {"provider": "anthropic"}}, cwd=tmp_path)
    assert provider_options(config, 0)["api_key_env"] == "ANTHROPIC_API_KEY"
    own = load_config(
        overrides={"llm": {"provider": "anthropic", "api_key_env": "MY_KEY"}}, cwd=tmp_path
    )
    assert provider_options(own, 0)["api_key_env"] == "MY_KEY"


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic -> ImportError
    monkeypatch.setenv("ANTHROPIC_API_KEY", "x")
    with pytest.raises(LLMConfigurationError) as info:
        create_adapter("anthropic")
    assert "pip install 'sim[anthropic]'" in str(info.value)


async def _no_wait(seconds: float) -> None:
    return None
