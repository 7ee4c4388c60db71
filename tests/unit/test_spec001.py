"""Spec 001 (``../shared/spec/001_*.txt``), its own test list: the ``LLMAdapter``
invariants, the failure-mode table, ``RunConfig``'s and ``LLMResponse``'s fields and
invariants, the error hierarchy, and the mock adapters; one test per listed case.

The configured adapter runs on real providers: ``offline``, the ``chat`` provider against
the loopback stub server, and the ``cli`` provider on Python scripts in ``tmp_path``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError, model_validator

from sim.connect import (
    ConfiguredAdapter,
    ErrorLLMAdapter,
    LLMAdapter,
    LLMResponse,
    MockLLMAdapter,
    RunConfig,
    configured,
)
from sim.llm.budget import Budget
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMConfigurationError,
    LLMError,
    LLMRateLimitError,
    LLMSubprocessError,
    LLMTimeoutError,
)
from sim.testing.stub_server import StubServer

PROMPT = "Name a harbour town."


@pytest.fixture
def offline() -> Iterator[ConfiguredAdapter]:
    adapter = configured(provider="offline")
    assert isinstance(adapter, ConfiguredAdapter)
    yield adapter
    adapter.close()


@pytest.fixture
def chat(stub_server: StubServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMAdapter]:
    monkeypatch.setenv("STUB_KEY", "sk-test")
    adapter = configured(
        provider="chat",
        base_url=stub_server.base_url,
        api_key_env="STUB_KEY",
        model="stub-model",
        backoff_base_seconds=0.0,
        backoff_cap_seconds=0.0,
    )
    yield adapter
    assert isinstance(adapter, ConfiguredAdapter)
    adapter.close()


def cli(tmp_path: Path, body: str, **overrides: Any) -> ConfiguredAdapter:
    script = tmp_path / "model.py"
    script.write_text(body)
    adapter = configured(
        provider="cli", command=[sys.executable, str(script)], model="tiny", **overrides
    )
    assert isinstance(adapter, ConfiguredAdapter)
    return adapter


# -- LLMAdapter invariants ------------------------------------------------------------------


def test_invariant_1_success_is_a_response_with_content(offline: ConfiguredAdapter) -> None:
    response = offline.execute_prompt(PROMPT, RunConfig())
    assert isinstance(response, LLMResponse) and response.content.strip()


def test_invariant_2_any_failure_is_an_llm_error(
    offline: ConfiguredAdapter, tmp_path: Path
) -> None:
    class Exploding(BaseModel):
        text: str

        @model_validator(mode="after")
        def explode(self) -> Exploding:
            raise RuntimeError("a bug in the caller's schema")

    with pytest.raises(LLMError) as info:  # a bare RuntimeError inside is converted
        offline.execute_prompt(PROMPT, RunConfig(model_params={"schema": Exploding}))
    assert isinstance(info.value.cause, RuntimeError) and info.value.code == "unexpected"
    with pytest.raises(LLMError):
        offline.execute_prompt(123, RunConfig())  # type: ignore[arg-type]


def test_invariant_3_validate_config_is_side_effect_free(offline: ConfiguredAdapter) -> None:
    config = RunConfig(model_params={"instructions": "Be brief."})
    before = config.model_dump()
    for candidate in (config, RunConfig(model_params={"top_k": 3})):
        result = offline.validate_config(candidate)
        assert type(result) is bool
    assert offline.validate_config(config) is True
    assert offline.validate_config(RunConfig(model_params={"top_k": 3})) is False
    assert offline.validate_config(RunConfig(model_name="openai/gpt-4.1")) is False
    assert config.model_dump() == before
    assert offline.books.calls == 0 and offline.budget.spent_tokens == 0  # nothing sent


def test_invariant_4_validate_config_false_is_only_advice(offline: ConfiguredAdapter) -> None:
    config = RunConfig(model_params={"top_k": 3})
    assert offline.validate_config(config) is False
    response = offline.execute_prompt(PROMPT, config)
    assert response.content and response.metadata["unused_model_params"] == ["top_k"]


def test_invariant_5_the_config_is_not_mutated(offline: ConfiguredAdapter) -> None:
    params: dict[str, Any] = {"instructions": "Be brief.", "fallback_models": ["other"]}
    config = RunConfig(model_name="offline/x", temperature=0.2, model_params=params)
    before = config.model_dump()
    offline.execute_prompt(PROMPT, config)
    MockLLMAdapter().execute_prompt(PROMPT, config)
    assert config.model_dump() == before
    assert params == {"instructions": "Be brief.", "fallback_models": ["other"]}


def test_invariant_6_timeout_seconds_is_respected(tmp_path: Path) -> None:
    adapter = cli(tmp_path, "import time\ntime.sleep(60)\n")
    with adapter:
        started = time.monotonic()
        with pytest.raises(LLMTimeoutError):
            adapter.execute_prompt(PROMPT, RunConfig(timeout_seconds=1))
        assert time.monotonic() - started < 5  # retries included: one deadline for the call


# -- failure modes --------------------------------------------------------------------------


def test_missing_api_key_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIM_NO_SUCH_KEY", raising=False)
    with pytest.raises(LLMConfigurationError, match="SIM_NO_SUCH_KEY"):
        configured(provider="chat", api_key_env="SIM_NO_SUCH_KEY")


def test_invalid_api_key_is_a_configuration_error(
    chat: LLMAdapter, stub_server: StubServer
) -> None:
    stub_server.model_faults["stub-model"] = "auth"
    with pytest.raises(LLMConfigurationError, match="STUB_KEY") as info:
        chat.execute_prompt(PROMPT, RunConfig())
    assert "sk-test" not in str(info.value)  # the variable is named, never the key


def test_unknown_provider_is_a_configuration_error() -> None:
    with pytest.raises(LLMConfigurationError, match="unknown provider"):
        configured(provider="carrier-pigeon")


def test_http_4xx_is_an_api_error_with_its_status(
    chat: LLMAdapter, stub_server: StubServer
) -> None:
    stub_server.model_faults["stub-model"] = "bad_request"
    with pytest.raises(LLMAPIError) as info:
        chat.execute_prompt(PROMPT, RunConfig())
    assert info.value.status_code == 400 and "temperature" in str(info.value.response_body)
    assert not isinstance(info.value, LLMRateLimitError)


def test_http_429_is_a_rate_limit_error(chat: LLMAdapter, stub_server: StubServer) -> None:
    stub_server.model_faults["stub-model"] = "rate_limit"
    with pytest.raises(LLMRateLimitError) as info:
        chat.execute_prompt(PROMPT, RunConfig())
    assert info.value.status_code == 429


def test_request_timeout_is_a_timeout_error(chat: LLMAdapter, stub_server: StubServer) -> None:
    stub_server.model_faults["stub-model"] = "hang"
    with pytest.raises(LLMTimeoutError):
        chat.execute_prompt(PROMPT, RunConfig(timeout_seconds=1))


def test_cli_subprocess_failure_is_a_subprocess_error(tmp_path: Path) -> None:
    body = "import sys\nsys.stderr.write('no model named tiny')\nsys.exit(2)\n"
    with cli(tmp_path, body) as adapter, pytest.raises(LLMSubprocessError) as info:
        adapter.execute_prompt(PROMPT, RunConfig())
    assert info.value.return_code == 2 and info.value.stderr == "no model named tiny"


def test_token_budget_exceeded_is_a_budget_error(offline: ConfiguredAdapter) -> None:
    tracker = Budget(max_total_tokens=100)
    with pytest.raises(LLMBudgetExceededError):
        offline.execute_prompt(PROMPT, RunConfig(max_tokens=500, budget_tracker=tracker))
    response = offline.execute_prompt(PROMPT, RunConfig(max_tokens=50, budget_tracker=tracker))
    assert tracker.spent_tokens == response.usage["total_tokens"] > 0
    assert offline.budget.spent_tokens == 0  # the call was counted in the tracker it named


# -- compatibility: any code that accepts an LLMAdapter works with the mock ------------------


def summarise(adapter: LLMAdapter, text: str) -> str:
    config = RunConfig(max_tokens=100)
    if not adapter.validate_config(config):
        raise AssertionError("config refused")
    return adapter.execute_prompt(f"Summarise: {text}", config).content


def test_code_that_takes_an_adapter_works_with_the_mock(offline: ConfiguredAdapter) -> None:
    assert summarise(MockLLMAdapter("short"), "a long text") == "short"
    assert summarise(offline, "a long text")


def test_async_execute_prompt_runs_in_a_thread(offline: ConfiguredAdapter) -> None:
    async def both() -> list[LLMResponse]:
        config = RunConfig()
        return list(
            await asyncio.gather(
                offline.async_execute_prompt(PROMPT, config),
                MockLLMAdapter().async_execute_prompt(PROMPT, config),
            )
        )

    first, second = asyncio.run(both())  # from inside a running loop: no nested-loop error
    assert first.content and second.content == "This is a mock response."


# -- RunConfig ------------------------------------------------------------------------------


def test_run_config_defaults() -> None:
    config = RunConfig()
    assert config.model_name == "gpt-4" and config.temperature == 0.7
    assert config.max_tokens == 2000 and config.model_params == {}
    assert config.max_depth == 3 and config.skip_if_exists is True
    assert config.timeout_seconds == 300 and config.budget_tracker is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_name", ""),
        ("temperature", -0.1),
        ("temperature", 2.01),
        ("temperature", float("nan")),
        ("max_tokens", 0),
        ("max_depth", -1),
        ("timeout_seconds", 0),
    ],
)
def test_run_config_invariants(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        RunConfig(**{field: value})
    config = RunConfig()
    with pytest.raises(ValidationError):  # on assignment too
        setattr(config, field, value)


def test_run_config_bounds_are_inclusive() -> None:
    assert RunConfig(temperature=0.0).temperature == 0.0
    assert RunConfig(temperature=2.0).temperature == 2.0
    assert RunConfig(max_tokens=1, timeout_seconds=1, max_depth=0).max_depth == 0


def test_model_params_pass_through_without_invariants() -> None:
    params = {"anything": [1, {"nested": None}], "schema": None}
    assert RunConfig(model_params=params).model_params == params


# -- LLMResponse ----------------------------------------------------------------------------


def check_response(response: LLMResponse) -> None:
    assert response.content and response.model
    assert set(response.usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert all(isinstance(v, int) and v >= 0 for v in response.usage.values())
    usage = response.usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert response.finish_reason == "stop"
    assert response.metadata["provider"]


def test_llm_response_fields_on_every_adapter(
    offline: ConfiguredAdapter, chat: LLMAdapter, tmp_path: Path
) -> None:
    answers = {
        "offline": offline.execute_prompt(PROMPT, RunConfig()),
        "chat": chat.execute_prompt(PROMPT, RunConfig()),
        "mock": MockLLMAdapter().execute_prompt(PROMPT, RunConfig()),
    }
    body = 'import sys\nsys.stdin.read()\nprint(\'{"text": "Port Mira"}\')\n'
    with cli(tmp_path, body) as adapter:
        answers["cli"] = adapter.execute_prompt(PROMPT, RunConfig())
    for provider, response in answers.items():
        check_response(response)
        assert response.metadata["provider"] == provider
    assert answers["cli"].content == "Port Mira" and answers["cli"].model == "tiny"
    assert answers["chat"].usage["prompt_tokens"] > 0


def test_the_model_actually_used_is_named(chat: LLMAdapter, stub_server: StubServer) -> None:
    stub_server.model_faults["stub-model"] = "server_error"
    config = RunConfig(model_params={"fallback_models": ["backup"]})
    response = chat.execute_prompt(PROMPT, config)
    assert response.model == "backup"  # not the model asked for
    assert response.metadata["fallback_to"].endswith("backup")
    assert response.metadata["attempts"] == 4  # 3 on stub-model, 1 on backup


def test_a_schema_answer_is_its_json(offline: ConfiguredAdapter) -> None:
    class Town(BaseModel):
        name: str
        population: int

    response = offline.execute_prompt(PROMPT, RunConfig(model_params={"schema": Town}))
    parsed = response.metadata["parsed"]
    assert isinstance(parsed, Town) and Town.model_validate(json.loads(response.content)) == parsed


# -- the error hierarchy --------------------------------------------------------------------


def test_the_hierarchy() -> None:
    assert issubclass(LLMRateLimitError, LLMAPIError)
    for kind in (
        LLMConfigurationError,
        LLMAPIError,
        LLMTimeoutError,
        LLMSubprocessError,
        LLMBudgetExceededError,
    ):
        assert issubclass(kind, LLMError) and issubclass(kind, Exception)


@pytest.mark.parametrize(
    "error",
    [
        LLMError("x"),
        LLMConfigurationError("x"),
        LLMAPIError("x", status_code=400, response_body={"error": "bad"}),
        LLMRateLimitError("x", status_code=429),
        LLMTimeoutError("x"),
        LLMSubprocessError("x", return_code=1, stderr="boom"),
        LLMBudgetExceededError("x"),
    ],
)
def test_every_error_carries_cause_and_context(error: LLMError) -> None:
    assert error.cause is None and error.context == {}
    root = OSError("underneath")
    made = type(error)("y", cause=root, context={"attempt": 2})
    assert made.cause is root and made.context == {"attempt": 2}
    try:
        raise type(error)("z") from root
    except LLMError as chained:  # a chained exception is its cause
        assert chained.cause is root


def test_api_and_subprocess_errors_keep_their_fields() -> None:
    api = LLMAPIError("x", status_code=404, response_body="not found")
    assert api.status_code == 404 and api.response_body == "not found"
    failed = LLMSubprocessError("x", return_code=-9, stderr="killed")
    assert failed.return_code == -9 and failed.stderr == "killed"


# -- the mock adapters ----------------------------------------------------------------------


def test_the_mock_is_deterministic_and_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the mock touched the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    first = MockLLMAdapter(responses=["a"]).execute_prompt(PROMPT, RunConfig())
    second = MockLLMAdapter(responses=["a"]).execute_prompt(PROMPT, RunConfig())
    assert first == second and first.content == "a"


def test_the_mock_counts_calls() -> None:
    mock = MockLLMAdapter(responses=["one", "two"])
    contents = [mock.execute_prompt(PROMPT, RunConfig()).content for _ in range(3)]
    assert contents == ["one", "two", "This is a mock response."] and mock.call_count == 3


def test_the_mock_records_the_last_prompt_and_config() -> None:
    mock = MockLLMAdapter()
    assert mock.last_prompt is None and mock.last_config is None
    config = RunConfig(temperature=0.1)
    mock.execute_prompt("first", RunConfig())
    mock.execute_prompt("second", config)
    assert mock.last_prompt == "second" and mock.last_config is config


def test_reset_clears_counters_and_recorded_state() -> None:
    mock = MockLLMAdapter(responses=["one"])
    mock.execute_prompt(PROMPT, RunConfig())
    mock.reset()
    assert mock.call_count == 0 and mock.last_prompt is None and mock.last_config is None
    assert mock.execute_prompt(PROMPT, RunConfig()).content == "one"
    failing = ErrorLLMAdapter()
    with pytest.raises(LLMError):
        failing.execute_prompt(PROMPT, RunConfig())
    failing.reset()
    assert failing.call_count == 0 and failing.last_prompt is None


def test_the_error_adapter_raises_its_error_every_time() -> None:
    error = LLMRateLimitError("slow down", status_code=429)
    failing = ErrorLLMAdapter(error)
    for n in (1, 2):
        with pytest.raises(LLMRateLimitError) as info:
            failing.execute_prompt(PROMPT, RunConfig())
        assert info.value is error and failing.call_count == n
    assert failing.last_prompt == PROMPT and failing.validate_config(RunConfig())
    with pytest.raises(LLMAPIError):  # the default: an HTTP 500
        ErrorLLMAdapter().execute_prompt(PROMPT, RunConfig())


def test_one_face_over_the_pipelines_contract() -> None:
    """Spec 001's call is a face over ``sim.llm.types.Adapter``: any pipeline adapter
    answers it (here the offline model's, and the pipeline's own mock), and the spec's
    mocks are that face over the pipeline's test doubles: one set of mocks."""
    from sim.connect import PipelineAdapter
    from sim.llm.types import ModelRequest
    from sim.offline.adapter import OfflineAdapter
    from sim.testing.adapters import ErrorAdapter, MockAdapter

    class Town(BaseModel):
        name: str

    with PipelineAdapter(OfflineAdapter(seed=1)) as offline:
        plain = offline.execute_prompt(PROMPT, RunConfig(model_name="offline"))
        typed = offline.execute_prompt(PROMPT, RunConfig(model_params={"schema": Town}))
    assert plain.content and plain.metadata["provider"] == "offline"
    assert isinstance(typed.metadata["parsed"], Town)
    assert json.loads(typed.content) == typed.metadata["parsed"].model_dump()

    mock = MockLLMAdapter(responses=["one"])
    assert isinstance(mock.adapter, MockAdapter)
    assert mock.execute_prompt("Name a town.", RunConfig(temperature=0.2)).content == "one"
    sent = mock.adapter.calls[-1]
    assert isinstance(sent, ModelRequest) and sent.input == "Name a town."
    assert sent.settings.temperature == 0.2 and sent.settings.model == "gpt-4"
    failing = ErrorLLMAdapter()
    assert isinstance(failing.adapter, ErrorAdapter)
    with pytest.raises(LLMError):
        failing.execute_prompt(PROMPT, RunConfig())
    assert failing.adapter.call_count == failing.call_count == 1
    mock.close()
    failing.close()
