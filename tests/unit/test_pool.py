"""The pool of model servers (``sim.llm.pool``): least-loaded selection, a breaker per
server, failed attempts moved to the others, servers probed back in, keys kept.

Fakes here (``MockAdapter`` per server, a fake clock); the same pool over real stub
servers and the real openai SDK is in ``tests/providers/test_pool_http.py`` and
``tests/e2e/test_tick_pool.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import BaseModel

from sim.config import Config, InvalidConfig, load_config
from sim.engine.stack import build_stack
from sim.llm.backpressure import Endpoint, EndpointDownError
from sim.llm.budget import BudgetAdapter
from sim.llm.calls import CallIdentity, idempotency_key
from sim.llm.errors import (
    LLMAPIError,
    LLMError,
    LLMRateLimitError,
    LLMRefusalError,
    LLMTimeoutError,
)
from sim.llm.pool import PoolAdapter, Server
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.types import AdapterResponse, CallSettings, ModelRequest
from sim.testing.adapters import MockAdapter


class Note(BaseModel):
    text: str = "ok"


REQUEST = ModelRequest("Write a note.", "x", Note, settings=CallSettings(model="m"))


def refused() -> LLMAPIError:
    return LLMAPIError("connection refused", code="connection_error")


def server_error() -> LLMAPIError:
    return LLMAPIError("boom", status_code=500)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pool_of(
    *adapters: MockAdapter,
    limits: tuple[int, ...] | None = None,
    threshold: int = 2,
    cooldown: float = 30.0,
    clock: Clock | None = None,
) -> PoolAdapter:
    servers = [
        Server(
            f"http://10.0.0.{i + 1}:8000/v1",
            adapter,
            Endpoint(f"http://10.0.0.{i + 1}:8000/v1", limits[i]) if limits else None,
        )
        for i, adapter in enumerate(adapters)
    ]
    return PoolAdapter(
        servers, breaker_threshold=threshold, breaker_cooldown=cooldown, clock=clock or Clock()
    )


async def test_calls_go_to_the_server_with_the_fewest_in_flight() -> None:
    a, b, c = (MockAdapter(delay=0.05) for _ in range(3))
    pool = pool_of(a, b, c)
    await asyncio.gather(*(pool.execute(REQUEST) for _ in range(6)))
    assert [s.call_count for s in (a, b, c)] == [2, 2, 2]
    assert [s.max_in_flight for s in (a, b, c)] == [2, 2, 2]
    # once idle, ties go to the first server
    await pool.execute(REQUEST)
    assert a.call_count == 3


async def test_load_is_counted_against_each_servers_concurrency_limit() -> None:
    small, big = MockAdapter(delay=0.05), MockAdapter(delay=0.05)
    pool = pool_of(small, big, limits=(1, 3))
    await asyncio.gather(*(pool.execute(REQUEST) for _ in range(4)))
    assert (small.call_count, big.call_count) == (1, 3)


async def test_a_failed_attempt_moves_to_another_server_and_is_recorded() -> None:
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(refused())
    pool = pool_of(a, b)
    response = await pool.execute(REQUEST)
    assert (a.call_count, b.call_count) == (1, 1)
    assert response.endpoint == pool.servers[1].url
    [moved] = response.moved
    assert (moved.endpoint, moved.error_code, moved.model) == (
        pool.servers[0].url,
        "connection_error",
        "m",
    )
    assert pool.servers[0].stats.moved_away == 1
    assert pool.servers[1].stats.answered == 1


async def test_recovery_lists_moved_attempts_without_spending_its_retries() -> None:
    a, b, c = MockAdapter(), MockAdapter(), MockAdapter()
    a.enqueue(LLMTimeoutError("slow"))
    b.enqueue(server_error())
    recovery = RecoveryAdapter(pool_of(a, b, c), RetryPolicy(transient_retries=0))
    response = await recovery.execute(REQUEST)
    servers = [s.url for s in recovery.inner.servers]  # type: ignore[attr-defined]
    assert [(x.attempt, x.endpoint, x.error_code) for x in response.attempts] == [
        (1, servers[0], "timeout"),
        (2, servers[1], "api_error"),
        (3, servers[2], None),
    ]


@pytest.mark.parametrize(
    "error", [LLMRefusalError("no"), LLMAPIError("bad request", status_code=400)]
)
async def test_an_answer_from_the_server_is_not_moved(error: LLMError) -> None:
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(error)
    pool = pool_of(a, b)
    with pytest.raises(type(error)) as raised:
        await pool.execute(REQUEST)
    assert b.call_count == 0
    assert raised.value.endpoint == pool.servers[0].url
    assert pool.servers[0].breaker.state == "closed"


async def test_a_rate_limited_attempt_moves_but_does_not_count_against_health() -> None:
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(LLMRateLimitError("slow down"), LLMRateLimitError("slow down"))
    pool = pool_of(a, b, threshold=1)
    await pool.execute(REQUEST)
    assert b.call_count == 1
    assert pool.servers[0].breaker.state == "closed"


async def test_each_server_has_its_own_breaker() -> None:
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(refused(), server_error(), refused())
    pool = pool_of(a, b, threshold=2)
    for _ in range(6):
        await pool.execute(REQUEST)
    # two failures in a row took A out: it got no more attempts; B took them all
    assert a.call_count == 2
    assert b.call_count == 6
    assert pool.servers[0].breaker.state == "open"
    assert pool.servers[0].stats.opened == 1
    assert pool.servers[1].breaker.state == "closed"


async def test_a_server_that_recovers_is_probed_back_in() -> None:
    clock = Clock()
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(refused(), refused())
    pool = pool_of(a, b, threshold=2, cooldown=30, clock=clock)
    await pool.execute(REQUEST)
    await pool.execute(REQUEST)
    assert pool.servers[0].breaker.state == "open"
    clock.now = 10
    await pool.execute(REQUEST)
    assert a.call_count == 2  # still cooling down
    clock.now = 31
    response = await pool.execute(REQUEST)  # the probe: A answers
    assert response.endpoint == pool.servers[0].url
    assert pool.servers[0].breaker.state == "closed"
    # back in the pool: concurrent calls are shared again
    before = a.call_count
    a.delay = b.delay = 0.02
    await asyncio.gather(*(pool.execute(REQUEST) for _ in range(4)))
    assert a.call_count - before == 2


async def test_a_failed_probe_takes_the_server_out_again() -> None:
    clock = Clock()
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(refused(), refused(), refused())
    pool = pool_of(a, b, threshold=2, cooldown=30, clock=clock)
    await pool.execute(REQUEST)
    await pool.execute(REQUEST)
    clock.now = 31
    response = await pool.execute(REQUEST)  # the probe fails and moves to B
    assert response.endpoint == pool.servers[1].url
    assert a.call_count == 3
    assert pool.servers[0].breaker.state == "open"
    await pool.execute(REQUEST)
    assert a.call_count == 3


async def test_every_server_out_is_a_connection_error_naming_them() -> None:
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(refused())
    b.enqueue(refused())
    pool = pool_of(a, b, threshold=1)
    with pytest.raises(LLMAPIError) as first:
        await pool.execute(REQUEST)
    assert first.value.endpoint == pool.servers[1].url
    assert [m.endpoint for m in first.value.moved] == [pool.servers[0].url]
    with pytest.raises(EndpointDownError) as down:
        await pool.execute(REQUEST)
    assert down.value.code == "connection_error"
    assert pool.servers[0].url in str(down.value) and pool.servers[1].url in str(down.value)
    assert (a.call_count, b.call_count) == (1, 1)


class KeyRecorder(MockAdapter):
    """Notes the idempotency key each attempt would carry (``sim.llm.calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str | None] = []

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.keys.append(idempotency_key(request.call, b"the same body"))
        return await super().execute(request)


@pytest.mark.parametrize(
    ("error", "same_key"),
    [(refused(), True), (LLMTimeoutError("slow"), True), (server_error(), False)],
)
async def test_a_moved_attempt_keeps_its_key_unless_its_failure_was_seen(
    error: LLMError, same_key: bool
) -> None:
    a, b = KeyRecorder(), KeyRecorder()
    a.enqueue(error)
    call = CallIdentity("1:intentions:x:0", "intentions", "x", 0, "", "", "", "")
    await pool_of(a, b).execute(replace(REQUEST, call=call))
    assert a.keys[0] is not None
    assert (a.keys[0] == b.keys[0]) is same_key


@pytest.mark.parametrize(
    ("error", "failures_seen"),
    [(LLMTimeoutError("slow"), [0, 0]), (server_error(), [0, 1])],
)
async def test_recovery_re_asks_with_the_next_attempts_identity(
    error: LLMError, failures_seen: list[int]
) -> None:
    """Each attempt's identity travels in its own request: a retry after a failure the
    client saw asks with a new identity (one more failure seen: a fresh key), one after an
    unseen outcome with the same; the request recovery was handed is left as it was."""
    inner = KeyRecorder()
    inner.enqueue(error)
    seen: list[CallIdentity | None] = []
    original = inner.execute

    async def execute(request: ModelRequest) -> AdapterResponse:
        seen.append(request.call)
        return await original(request)

    inner.execute = execute  # type: ignore[method-assign]

    async def no_sleep(seconds: float) -> None:
        return None

    call = CallIdentity("1:intentions:x:0", "intentions", "x", 0, "", "", "", "")
    asked = replace(REQUEST, call=call)
    await RecoveryAdapter(inner, RetryPolicy(), sleep=no_sleep).execute(asked)
    assert [c.failures_seen if c else None for c in seen] == failures_seen
    assert all(c is not None and c.request_id == call.request_id for c in seen)
    assert (inner.keys[0] == inner.keys[1]) is (failures_seen[1] == 0)
    assert asked.call is call and call.failures_seen == 0


async def test_a_cancelled_probe_leaves_the_server_probeable() -> None:
    clock = Clock()
    a, b = MockAdapter(), MockAdapter()
    a.enqueue(refused(), refused())
    pool = pool_of(a, b, threshold=2, cooldown=30, clock=clock)
    await pool.execute(REQUEST)
    await pool.execute(REQUEST)
    clock.now = 31
    a.delay = 10
    task = asyncio.ensure_future(pool.execute(REQUEST))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.servers[0].in_flight == 0
    a.delay = 0
    response = await pool.execute(REQUEST)
    assert response.endpoint == pool.servers[0].url


def test_base_url_takes_a_list_in_llm_and_in_a_phase(tmp_path: Path) -> None:
    config = Config.model_validate(
        {
            "llm": {"provider": "chat", "base_url": ["http://a:1/v1", "http://b:1/v1"]},
            "phase2a": {"base_url": ["http://c:1/v1", "http://d:1/v1"]},
        }
    )
    assert config.llm.base_url == ("http://a:1/v1", "http://b:1/v1")
    assert config.phase("phase2a").endpoint(config.llm)[1] == ("http://c:1/v1", "http://d:1/v1")
    # round trip through the JSON a tick log's header keeps
    assert Config.model_validate(config.model_dump(mode="json")) == config


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("[]", "at least one url"),
        ('["http://a/v1", "http://a/v1"]', "listed twice"),
        ('["http://a/v1", ""]', "non-empty"),
    ],
)
def test_a_bad_list_of_servers_is_named(tmp_path: Path, value: str, problem: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'[llm]\nprovider = "chat"\nbase_url = {value}\n')
    with pytest.raises(InvalidConfig) as raised:
        load_config(path)
    assert "llm.base_url" in str(raised.value) and problem in str(raised.value)


@pytest.mark.parametrize(
    ("setting", "problem"),
    [('chain_mode = "server"', "server-side chains"), ("batch = true", "Batch API upload")],
)
def test_server_chains_and_batches_are_refused_with_a_list_of_servers(
    tmp_path: Path, setting: str, problem: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[llm]\nprovider = "openai"\n{setting}\nbase_url = ["http://a/v1", "http://b/v1"]\n'
    )
    with pytest.raises(InvalidConfig, match=problem):
        load_config(path)


def test_a_worlds_config_may_not_list_servers_unless_trusted(tmp_path: Path) -> None:
    world, elsewhere = tmp_path / "world", tmp_path / "cwd"
    world.mkdir()
    elsewhere.mkdir()
    (world / "config.toml").write_text('[llm]\nbase_url = ["http://evil/v1", "http://x/v1"]\n')
    with pytest.raises(InvalidConfig, match=r"llm\.base_url"):
        load_config(world_dir=world, cwd=elsewhere)
    trusted = load_config(world_dir=world, cwd=elsewhere, trust_world_config=True)
    assert trusted.llm.base_url == ("http://evil/v1", "http://x/v1")


def test_build_stack_makes_one_provider_per_server_sharing_one_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    urls = ("http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1", "http://127.0.0.1:11/v1")
    config = Config.model_validate({"llm": {"provider": "chat", "base_url": list(urls)}})
    stack = build_stack(config)
    pool = stack.pool  # the stack says which pool it built: nothing walks its layers
    assert pool is not None and stack.pools == {"chat": pool} and stack.endpoint is None
    assert [s.url for s in pool.servers] == list(urls)
    budgets = {id(s.adapter.budget) for s in pool.servers if isinstance(s.adapter, BudgetAdapter)}
    assert budgets == {id(stack.budget)}
    assert len({id(s.endpoint) for s in pool.servers}) == 3


def test_servers_are_shown_without_credentials_written_into_their_url() -> None:
    from sim.analysis.logview import server_name
    from sim.llm.redact import redact_url

    assert redact_url("http://user:secret@gpu1:8000/v1") == "http://***@gpu1:8000/v1"
    assert server_name("http://user:secret@gpu1:8000/v1") == "gpu1:8000"
    assert redact_url("https://api.openai.com/v1") == "https://api.openai.com/v1"


def test_a_named_endpoint_may_list_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.llm.router import Router

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    urls = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    config = Config.model_validate(
        {
            "providers": {"gpus": {"kind": "chat", "base_url": urls}},
            "phase2a": {"model": "gpus/qwen"},
        }
    )
    stack = build_stack(config)
    router = stack.adapter.inner  # type: ignore[attr-defined]
    assert isinstance(router, Router) and "gpus" in router.routes
    pool = stack.pools["gpus"]
    assert stack.pool is None  # [llm]'s own endpoint is not a pool
    assert [s.url for s in pool.servers] == urls


def test_a_named_pool_is_refused_with_batches(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "[llm]\nbatch = true\n\n[providers.gpus]\n"
        'kind = "chat"\nbase_url = ["http://a/v1", "http://b/v1"]\n'
    )
    with pytest.raises(InvalidConfig, match=r"providers\.gpus\.base_url"):
        load_config(path)
