"""Every row of the recovery table, the breaker, fallback models, the budget and the rate
limiter: over real HTTP against the stub server, with the real SDK (no patching)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from pydantic import BaseModel, ConfigDict

from sim.config import Config
from sim.engine.stack import build_stack
from sim.llm.budget import Budget, BudgetAdapter, Price, cost_usd
from sim.llm.client import LLMClient, LLMRequest
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMCircuitOpenError,
    LLMConfigurationError,
    LLMContextLengthError,
    LLMError,
    LLMFallbackExhausted,
    LLMIncompleteError,
    LLMRateLimitError,
    LLMRefusalError,
    LLMSchemaError,
    LLMTimeoutError,
)
from sim.llm.events import LLMEvent
from sim.llm.ratelimit import RateLimitedAdapter, TokenBucket
from sim.llm.recovery import CircuitBreaker, RecoveryAdapter, RetryPolicy
from sim.llm.types import CallSettings, ModelRequest, Usage
from sim.providers.chat import ChatAdapter
from sim.providers.openai import OpenAIAdapter
from sim.testing.stub_server import StubServer


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", title="Note")

    text: str
    count: int


class Sleeps:
    """A fast ``sleep`` that records what it was asked to wait."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settings(**kw: Any) -> CallSettings:
    return CallSettings(**{"model": "primary", "timeout_seconds": 2.0, **kw})


def provider(server: StubServer, kind: str = "openai", timeout: float = 5.0) -> Any:
    sdk = openai.AsyncOpenAI(
        base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=timeout
    )
    return OpenAIAdapter(sdk) if kind == "openai" else ChatAdapter(sdk)


def stack(
    server: StubServer,
    sleeps: Sleeps,
    kind: str = "openai",
    budget: Budget | None = None,
    **kw: Any,
) -> RecoveryAdapter:
    inner = BudgetAdapter(provider(server, kind), budget or Budget())
    return RecoveryAdapter(inner, kw.pop("policy", RetryPolicy()), sleep=sleeps, **kw)


async def run(adapter: RecoveryAdapter, s: CallSettings | None = None) -> Any:
    return await adapter.execute(
        ModelRequest("Write a note.", "about fog", Note, settings=s or settings())
    )


# ------------------------------------------------------------------ the table, row by row


@pytest.mark.parametrize("kind", ["openai", "chat"])
async def test_schema_error_retried_with_feedback_then_succeeds(
    stub_server: StubServer, kind: str
) -> None:
    sleeps = Sleeps()
    stub_server.enqueue("malformed", "malformed")
    response = await run(stack(stub_server, sleeps, kind))
    assert isinstance(response.parsed, Note)
    attempts = response.attempts
    assert [a.error_code for a in attempts] == ["schema_error", "schema_error", None]
    # the validation error is fed back in the next request's instructions
    bodies = list(stub_server.log)
    first = bodies[0].get("instructions") or bodies[0]["messages"][0]["content"]
    second = bodies[1].get("instructions") or bodies[1]["messages"][0]["content"]
    assert "rejected" not in first and "Your previous answer was rejected" in second
    assert sleeps.calls == []  # a schema retry does not wait
    # every attempt's usage is counted, and matches what the server served
    assert sum(a.usage.total_tokens for a in attempts) == (
        stub_server.stats.input_tokens + stub_server.stats.output_tokens
    )


async def test_a_failed_attempts_notice_goes_with_the_calls_outcome(
    stub_server: StubServer,
) -> None:
    # the probing attempt switched forms (json_schema refused) and its answer failed
    # validation; the retry's answer says so, and so does a call that fails for good
    stub_server.options.reject_json_schema = True
    stub_server.enqueue("malformed")
    response = await run(stack(stub_server, Sleeps(), "chat"), settings(structured_output="auto"))
    assert [a.error_code for a in response.attempts] == ["schema_error", None]
    assert response.notice is not None and "rejected json_schema" in response.notice
    stub_server.reset()
    stub_server.options.reject_json_schema = True
    stub_server.enqueue("malformed", "malformed", "malformed")
    with pytest.raises(LLMSchemaError) as info:
        await run(stack(stub_server, Sleeps(), "chat"), settings(structured_output="auto"))
    assert info.value.notice is not None and "rejected json_schema" in info.value.notice


async def test_schema_error_three_times_fails(stub_server: StubServer) -> None:
    stub_server.enqueue("malformed", "malformed", "malformed", None)
    with pytest.raises(LLMSchemaError) as info:
        await run(stack(stub_server, Sleeps()))
    assert len(info.value.attempts) == 3
    assert stub_server.stats.generations == 3


async def test_rate_limit_waits_retry_after_twice_then_fails(stub_server: StubServer) -> None:
    sleeps = Sleeps()
    stub_server.options.retry_after = 0.25
    stub_server.enqueue("rate_limit", "rate_limit", "rate_limit", None)
    with pytest.raises(LLMRateLimitError):
        await run(stack(stub_server, sleeps))
    assert sleeps.calls == [0.25, 0.25]  # Retry-After honoured, twice
    assert stub_server.stats.requests == 3


async def test_rate_limit_without_retry_after_backs_off_with_full_jitter(
    stub_server: StubServer,
) -> None:
    sleeps = Sleeps()
    adapter = stack(
        stub_server,
        sleeps,
        rng=lambda: 0.5,
        policy=RetryPolicy(backoff_base_seconds=1.0, backoff_cap_seconds=1.5),
    )
    stub_server.options.retry_after = None
    stub_server.enqueue("rate_limit", "rate_limit")
    response = await run(adapter)
    assert isinstance(response.parsed, Note)
    # jitter * min(cap, base * 2^(n-1)): 0.5 * 1.0, then 0.5 * 1.5 (capped)
    assert sleeps.calls == [0.5, 0.75]


@pytest.mark.parametrize(
    ("fault", "error"), [("server_error", LLMAPIError), ("hang", LLMTimeoutError)]
)
async def test_transient_errors_retry_with_backoff(
    stub_server: StubServer, fault: str, error: type[LLMError]
) -> None:
    sleeps = Sleeps()
    adapter = stack(stub_server, sleeps, policy=RetryPolicy(transient_retries=1))
    s = settings(timeout_seconds=0.3)
    stub_server.enqueue(fault)
    response = await run(adapter, s)  # one retry is enough
    assert isinstance(response.parsed, Note)
    assert len(sleeps.calls) == 1
    stub_server.enqueue(fault, fault, None)
    with pytest.raises(error):
        await run(adapter, s)  # the retry count is configurable: 1 here


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("auth", LLMConfigurationError),
        ("context_length", LLMContextLengthError),
        ("refusal", LLMRefusalError),
        ("incomplete", LLMIncompleteError),
        ("insufficient_quota", LLMBudgetExceededError),
    ],
)
async def test_fail_at_once(stub_server: StubServer, fault: str, error: type[LLMError]) -> None:
    sleeps = Sleeps()
    stub_server.enqueue(fault, None)
    with pytest.raises(error) as info:
        await run(stack(stub_server, sleeps), settings(fallback_models=("backup",)))
    assert len(info.value.attempts) == 1  # no retry, no fallback model
    assert stub_server.stats.requests == 1 and sleeps.calls == []


# ------------------------------------------------------------------ breaker and fallbacks


async def test_breaker_opens_fails_fast_and_half_opens(stub_server: StubServer) -> None:
    clock = Clock()
    adapter = stack(stub_server, Sleeps(), breaker_threshold=3, breaker_cooldown=10.0, clock=clock)
    stub_server.model_faults["primary"] = "server_error"
    with pytest.raises(LLMAPIError):
        await run(adapter)  # 1 + 2 retries = 3 consecutive 5xx: the breaker opens
    assert adapter.breaker("primary").state == "open"
    served = stub_server.stats.requests
    with pytest.raises(LLMCircuitOpenError):
        await run(adapter)
    assert stub_server.stats.requests == served  # failed fast: nothing sent
    clock.now += 10.0
    assert adapter.breaker("primary").state == "half_open"
    del stub_server.model_faults["primary"]
    response = await run(adapter)  # the probe succeeds and closes the breaker
    assert isinstance(response.parsed, Note)
    assert adapter.breaker("primary").state == "closed"


def test_breaker_ignores_schema_errors_and_refusals() -> None:
    breaker = CircuitBreaker(threshold=2)
    breaker.neutral()
    breaker.neutral()
    assert breaker.state == "closed"
    breaker.failure()
    breaker.failure()
    assert breaker.state == "open"


async def test_fallback_model_after_retries(stub_server: StubServer) -> None:
    stub_server.model_faults["primary"] = "server_error"
    response = await run(stack(stub_server, Sleeps()), settings(fallback_models=("backup",)))
    assert response.model == "backup"
    assert response.fallback_from == "primary" and response.fallback_to == "backup"
    assert stub_server.stats.models == {"primary": 3, "backup": 1}
    assert [a.model for a in response.attempts] == ["primary"] * 3 + ["backup"]


async def test_fallback_model_when_breaker_open(stub_server: StubServer) -> None:
    adapter = stack(stub_server, Sleeps(), breaker_threshold=1)
    stub_server.model_faults["primary"] = "server_error"
    s = settings(fallback_models=("backup", "last"))
    await run(adapter, s)
    assert adapter.breaker("primary").state == "open"
    response = await run(adapter, s)
    assert response.model == "backup"
    assert stub_server.stats.models["primary"] == 1  # never sent again while open


async def test_all_models_fail_keeps_every_models_error(stub_server: StubServer) -> None:
    stub_server.model_faults.update(primary="server_error", backup="rate_limit")
    with pytest.raises(LLMFallbackExhausted) as info:
        await run(stack(stub_server, Sleeps()), settings(fallback_models=("backup",)))
    group = info.value
    assert len(group.attempts) == 6
    first, second = group.exceptions
    assert type(first) is LLMAPIError and first.status_code == 500
    assert isinstance(second, LLMRateLimitError)
    assert group.model_errors == group.exceptions
    assert group.code == "rate_limit"  # the last model's: what ended the call
    assert "primary" in str(group) and "backup" in str(group)


# ------------------------------------------------------------------ budget


async def test_budget_reservation_holds_under_a_parallel_batch(stub_server: StubServer) -> None:
    stub_server.options.latency = 0.05  # calls overlap
    cap = 3000
    budget = Budget(max_total_tokens=cap)
    adapter = stack(stub_server, Sleeps(), budget=budget)
    client = LLMClient(
        adapter, [], settings=CallSettings(model="m", max_output_tokens=200), max_concurrency=32
    )
    results = await client.create_batch(
        [LLMRequest("Write a note.", f"topic {i}", Note) for i in range(40)]
    )
    stopped = [r for r in results if isinstance(r, LLMBudgetExceededError)]
    done = [r for r in results if isinstance(r, Note)]
    assert stopped and done and len(stopped) + len(done) == 40
    # never overshot, and what the budget counted is what the server served
    served = stub_server.stats.input_tokens + stub_server.stats.output_tokens
    assert budget.spent_tokens == served <= cap
    assert budget.reserved_tokens == 0
    assert "spent" in str(stopped[0])


def test_cost_is_computed_in_one_place() -> None:
    price = Price(input=2.0, cached_input=0.5, output=8.0)
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000, cached_input_tokens=400_000)
    assert cost_usd(usage, price) == pytest.approx(0.6 * 2.0 + 0.4 * 0.5 + 0.5 * 8.0)
    budget = Budget(max_cost_usd=1.0)
    with pytest.raises(LLMConfigurationError, match="prices"):
        budget.reserve("unpriced-model", usage)


async def test_cost_cap_stops_calls(stub_server: StubServer) -> None:
    budget = Budget(max_cost_usd=0.001, prices={"primary": Price(input=10.0, output=10.0)})
    adapter = stack(stub_server, Sleeps(), budget=budget)
    with pytest.raises(LLMBudgetExceededError):
        for _ in range(50):
            await run(adapter, settings(max_output_tokens=20))
    assert budget.spent_usd <= 0.001


# ------------------------------------------------------------------ rate limiter


async def test_token_bucket_paces_without_polling() -> None:
    clock, sleeps = Clock(), Sleeps()

    async def sleep(seconds: float) -> None:
        sleeps.calls.append(seconds)
        clock.now += seconds

    bucket = TokenBucket(60, clock=clock, sleep=sleep)  # 1 per second, burst 60
    for _ in range(70):
        await bucket.take()
    assert len(sleeps.calls) == 10  # one exact sleep per request over the burst
    assert sum(sleeps.calls) == pytest.approx(10.0)


async def test_rate_limited_stack_paces_real_calls(stub_server: StubServer) -> None:
    # 600 requests/minute with a burst of 2: 6 calls need about 0.4 s
    requests = TokenBucket(600, burst=2)
    adapter = RateLimitedAdapter(provider(stub_server), requests=requests)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(
        *(
            adapter.execute(ModelRequest("Write.", f"n{i}", Note, settings=settings()))
            for i in range(6)
        )
    )
    assert loop.time() - started >= 0.35
    # never more than the deficit; less when a loaded machine oversleeps a wait, because
    # the oversleep refills the bucket for the next caller
    assert 0.0 < requests.waited <= 0.45


# ------------------------------------------------------------------ the configured stack


async def test_stack_from_config_and_attempt_events(stub_server: StubServer) -> None:
    config = Config.model_validate({"llm": {"provider": "openai", "transient_retries": 1}})
    sleeps = Sleeps()
    adapter = build_stack(config, provider=provider(stub_server), sleep=sleeps).adapter
    events: list[LLMEvent] = []
    bob: dict[str, Any] = {"identity": {"id": "bob"}}
    client = LLMClient(adapter, [bob], settings=settings(), events=events.append)
    stub_server.enqueue("server_error", "malformed")
    await client.create_response("Write a note.", "x", Note, entity_key="intention:bob")
    kinds = [(e.kind, e.attempt, e.final, e.error_code) for e in events]
    assert kinds == [
        ("llm_called", 1, True, None),
        ("llm_failed", 1, False, "server_error"),
        ("llm_failed", 2, False, "schema_error"),
        ("llm_completed", 3, True, None),
    ]
    billed = sum(e.usage.total_tokens for e in events)
    assert billed == stub_server.stats.input_tokens + stub_server.stats.output_tokens
    stats = bob["_openai"]["usage"]
    assert stats["total_input_tokens"] == stub_server.stats.input_tokens
    assert stats["total_requests"] == 1


async def test_lost_server_chain_is_reset_and_resent(stub_server: StubServer) -> None:
    sdk = openai.AsyncOpenAI(base_url=stub_server.base_url, api_key="sk-test", max_retries=0)
    adapter = RecoveryAdapter(OpenAIAdapter(sdk, store=True), sleep=Sleeps())
    bob: dict[str, Any] = {"identity": {"id": "bob"}}
    events: list[LLMEvent] = []
    client = LLMClient(
        adapter, [bob], 2, chain_mode="server", settings=settings(), events=events.append
    )
    await client.create_response("Write.", "one", Note, entity_key="intention:bob")
    lost = bob["_openai"]["intention_chain"][-1]
    stub_server.responses.clear()  # the provider forgot the chain (expiry, deletion)
    result = await client.create_response("Write.", "two", Note, entity_key="intention:bob")
    assert isinstance(result, Note)
    chain = bob["_openai"]["intention_chain"]
    assert lost not in chain and len(chain) == 1
    assert [b.get("previous_response_id") for b in stub_server.log] == [None, lost, None]
    codes = [(e.kind, e.final, e.error_code) for e in events if e.kind != "llm_called"]
    assert codes[1:] == [
        ("llm_failed", False, "previous_response_not_found"),
        ("llm_completed", True, None),
    ]
    assert client.pending_deletions == []  # nothing to delete: the provider lost it


@pytest.mark.parametrize("retries", [0, 1, 4])
async def test_json_max_retries_sets_the_schema_feedback_retries(
    stub_server: StubServer, retries: int
) -> None:
    """``[llm] json_max_retries`` replaces the fixed two schema-feedback retries."""
    config = Config.model_validate({"llm": {"provider": "openai", "json_max_retries": retries}})
    adapter = build_stack(config, provider=provider(stub_server), sleep=Sleeps()).adapter
    stub_server.enqueue(*["malformed"] * (retries + 1))
    with pytest.raises(LLMSchemaError) as info:
        await run(adapter)
    assert [a.error_code for a in info.value.attempts] == ["schema_error"] * (retries + 1)
    assert stub_server.stats.generations == retries + 1
    # one more answer that fits is taken when the retries allow it
    stub_server.enqueue(*["malformed"] * retries, None)
    response = await run(adapter)
    assert len(response.attempts) == retries + 1
