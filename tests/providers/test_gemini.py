"""The gemini adapter over real HTTP (Google's real SDK) against the loopback Gemini stub:
the same provider matrix as ``test_adapters_http`` for openai and chat."""

from __future__ import annotations

import sys

import pytest
from pydantic import BaseModel, ConfigDict

from sim.llm.budget import Budget, BudgetAdapter, estimate_usage
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
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.tools import ToolCalls
from sim.llm.types import CallSettings, Exchange, ModelRequest, Usage
from sim.phases.intention_tools import TOOLS
from sim.providers import create_adapter
from sim.providers.gemini import GeminiAdapter, _usage
from sim.testing.gemini_stub import GeminiStubServer

KEY = "gemini-test-not-a-real-key"
SETTINGS = CallSettings(model="gemini-2.5-flash", timeout_seconds=5)
DATA = (
    '{"tick":1,"character":{"id":"ada","name":"Ada","mood":"restless"},'
    '"location":{"id":"quay","objects":["net"]},'
    '"exits":[{"id":"market","name":"Market"}],"present":[]}'
)


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


@pytest.fixture
def adapter(gemini_stub: GeminiStubServer, monkeypatch: pytest.MonkeyPatch) -> GeminiAdapter:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    return GeminiAdapter(base_url=gemini_stub.base_url, timeout_seconds=5)


def note(text: str = "about fog", **kwargs: object) -> ModelRequest:
    return ModelRequest("Write a note.", text, Note, settings=SETTINGS, **kwargs)  # type: ignore[arg-type]


async def test_structured_answer_and_usage(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    first = await adapter.execute(note("about fog"))
    second = await adapter.execute(note("about tides"))

    assert isinstance(first.parsed, Note) and isinstance(second.parsed, Note)
    assert first.raw == first.parsed.model_dump_json()
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    # the instructions prefix is "cached" the second time, reported as cachedContentTokenCount
    assert first.usage.cached_input_tokens == 0
    assert second.usage.cached_input_tokens > 0
    assert first.provider == "gemini" and first.served_from == "live"
    assert first.model == "gemini-2.5-flash" and first.response_id
    assert gemini_stub.stats.input_tokens == first.usage.input_tokens + second.usage.input_tokens
    assert gemini_stub.stats.output_tokens == first.usage.output_tokens + second.usage.output_tokens
    assert gemini_stub.stats.by_route == {"POST /v1beta/models/gemini-2.5-flash:generateContent": 2}
    await adapter.aclose()


async def test_window_is_sent_as_contents(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    history = (Exchange("r1", "in one", '{"text":"a","count":1}'), Exchange("r2", "in two", "o2"))
    await adapter.execute(note("in three", history=history))
    body = gemini_stub.log[-1]
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "in one"}]},
        {"role": "model", "parts": [{"text": '{"text":"a","count":1}'}]},
        {"role": "user", "parts": [{"text": "in two"}]},
        {"role": "model", "parts": [{"text": "o2"}]},
        {"role": "user", "parts": [{"text": "in three"}]},
    ]
    assert body["systemInstruction"]["parts"] == [{"text": "Write a note."}]
    config = body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == Note.model_json_schema()
    assert config["temperature"] == SETTINGS.temperature
    assert config["maxOutputTokens"] == SETTINGS.max_output_tokens
    assert "tools" not in body


FAULT_ERRORS: list[tuple[str, type[LLMError], str]] = [
    ("rate_limit", LLMRateLimitError, "rate_limit"),
    ("insufficient_quota", LLMRateLimitError, "rate_limit"),
    ("server_error", LLMAPIError, "server_error"),
    ("malformed", LLMSchemaError, "schema_error"),
    ("refusal", LLMRefusalError, "refusal"),
    ("blocked", LLMRefusalError, "refusal"),
    ("incomplete", LLMIncompleteError, "incomplete"),
    ("auth", LLMConfigurationError, "configuration_error"),
    ("context_length", LLMContextLengthError, "context_length"),
]


@pytest.mark.parametrize(("fault", "error", "code"), FAULT_ERRORS)
async def test_faults_map_to_llm_errors(
    adapter: GeminiAdapter,
    gemini_stub: GeminiStubServer,
    fault: str,
    error: type[LLMError],
    code: str,
) -> None:
    gemini_stub.enqueue(fault)
    with pytest.raises(error) as info:
        await adapter.execute(note())
    assert info.value.code == code
    answer_faults = ("malformed", "refusal", "blocked", "incomplete")
    assert isinstance(info.value.cause, Exception) or fault in answer_faults
    if fault == "rate_limit":  # the delay of the error's RetryInfo
        assert info.value.retry_after == pytest.approx(gemini_stub.options.retry_after)
        assert info.value.status_code == 429  # type: ignore[attr-defined]
    if fault == "insufficient_quota":  # no RetryInfo: recovery backs off on its own
        assert info.value.retry_after is None
    if fault == "server_error":
        assert info.value.status_code == 500  # type: ignore[attr-defined]
    if fault == "auth":  # Gemini answers a bad key with 400 API_KEY_INVALID
        assert "GEMINI_API_KEY" in str(info.value) and KEY not in str(info.value)
    if fault in answer_faults:  # the attempt was paid for
        usage = info.value.usage
        assert isinstance(usage, Usage) and usage.input_tokens > 0
    if fault == "incomplete":
        assert info.value.reason == "max_output_tokens"  # type: ignore[attr-defined]


async def test_hang_past_the_timeout_is_a_timeout(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    gemini_stub.enqueue("hang")
    settings = CallSettings(model="gemini-2.5-flash", timeout_seconds=0.3)
    with pytest.raises(LLMTimeoutError):
        await adapter.execute(ModelRequest("Write.", "x", Note, settings=settings))


async def test_connection_refused_is_a_transient_api_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    dead = GeminiAdapter(base_url="http://127.0.0.1:9")
    with pytest.raises(LLMAPIError) as info:
        await dead.execute(note())
    assert info.value.code == "connection_error" and info.value.status_code is None


async def test_tool_calls(adapter: GeminiAdapter, gemini_stub: GeminiStubServer) -> None:
    response = await adapter.execute(ModelRequest("Decide.", DATA, tools=TOOLS, settings=SETTINGS))
    assert isinstance(response.parsed, ToolCalls)
    calls = response.parsed.calls
    assert len(calls) == 1 and calls[0].name in {t.name for t in TOOLS}
    assert response.finish_reason == "tool_calls"
    assert response.raw == response.parsed.dump()
    body = gemini_stub.log[-1]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    declarations = body["tools"][0]["functionDeclarations"]
    assert [d["name"] for d in declarations] == [t.name for t in TOOLS]
    # nested fields go in their proto names, which Google's servers accept as well
    assert declarations[0]["parameters_json_schema"] == TOOLS[0].parameters
    assert "responseJsonSchema" not in body.get("generationConfig", {})
    # a tool the model made up comes back as called: the phase decides what to do with it
    gemini_stub.enqueue("unknown_tool")
    response = await adapter.execute(ModelRequest("Decide.", DATA, tools=TOOLS, settings=SETTINGS))
    assert response.parsed.calls[0].name == "teleport"  # type: ignore[attr-defined]


async def test_server_chains_are_refused(adapter: GeminiAdapter) -> None:
    with pytest.raises(LLMConfigurationError, match="chain_mode"):
        await adapter.execute(note(previous_response_id="resp_1"))


async def test_a_raw_line_break_inside_a_string_is_read_as_meant(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    gemini_stub.enqueue("raw_newline")
    response = await adapter.execute(note())
    assert isinstance(response.parsed, Note)
    assert "\n" in response.parsed.text
    assert "\n" in response.raw and response.raw != response.parsed.model_dump_json()


async def test_schema_feedback_retry(adapter: GeminiAdapter, gemini_stub: GeminiStubServer) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    recovery = RecoveryAdapter(adapter, RetryPolicy(), sleep=sleep)
    gemini_stub.enqueue("malformed")
    response = await recovery.execute(note())
    assert isinstance(response.parsed, Note)
    assert [a.error_code for a in response.attempts] == ["schema_error", None]
    first, second = list(gemini_stub.log)[-2:]
    assert "rejected" not in first["systemInstruction"]["parts"][0]["text"]
    assert "Your previous answer was rejected" in second["systemInstruction"]["parts"][0]["text"]
    assert waits == []


async def test_rate_limit_waits_the_retry_delay(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    gemini_stub.options.retry_after = 7.5
    recovery = RecoveryAdapter(adapter, RetryPolicy(), sleep=sleep)
    gemini_stub.enqueue("rate_limit", "server_error")
    response = await recovery.execute(note())
    assert isinstance(response.parsed, Note)
    assert [a.error_code for a in response.attempts] == ["rate_limit", "server_error", None]
    assert waits[0] == 7.5  # the RetryInfo delay, not a backoff
    assert len(waits) == 2 and waits[1] <= RetryPolicy().backoff_base_seconds * 2


async def test_budget_counts_and_stops(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    # room for one call's worst case, not for a second one after what the first used
    budget = Budget(max_total_tokens=estimate_usage(note()).total_tokens + 1)
    wrapped = BudgetAdapter(adapter, budget)
    response = await wrapped.execute(note())
    assert budget.spent_tokens == response.usage.total_tokens > 0
    with pytest.raises(LLMBudgetExceededError):
        await wrapped.execute(note())
    assert gemini_stub.stats.generations == 1  # the second call was never sent


def test_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIM_GEMINI_TEST_KEY", raising=False)
    with pytest.raises(LLMConfigurationError) as info:
        create_adapter("gemini", api_key_env="SIM_GEMINI_TEST_KEY")
    assert "SIM_GEMINI_TEST_KEY" in str(info.value)
    monkeypatch.setenv("SIM_GEMINI_TEST_KEY", "secret-value")
    adapter = create_adapter("gemini", api_key_env="SIM_GEMINI_TEST_KEY")
    assert adapter.name == "gemini"


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.setitem(sys.modules, "google.genai", None)  # import google.genai now fails
    with pytest.raises(LLMConfigurationError, match=r"pip install 'sim\[gemini\]'"):
        create_adapter("gemini")


def test_unknown_option_is_refused() -> None:
    with pytest.raises(LLMConfigurationError, match="store"):
        create_adapter("gemini", store=True)


def test_thinking_tokens_are_billed_as_output() -> None:
    from google.genai import types as gt

    response = gt.GenerateContentResponse(
        usage_metadata=gt.GenerateContentResponseUsageMetadata(
            prompt_token_count=100,
            cached_content_token_count=40,
            candidates_token_count=10,
            thoughts_token_count=25,
        )
    )
    assert _usage(response) == Usage(input_tokens=100, output_tokens=35, cached_input_tokens=40)
