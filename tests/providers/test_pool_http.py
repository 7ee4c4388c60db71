"""A pool over real servers: the openai SDK per server, over loopback http and https.

Each server of ``base_url = [...]`` gets its own provider adapter and so its own
``AsyncOpenAI`` clients pointed at it; over https they share one TLS context (loading the
certificate store once, not per client or per server).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from bench.tls import SelfSigned, self_signed
from sim.config import Config
from sim.engine.stack import Stack, build_stack
from sim.llm.pool import PoolAdapter, Server
from sim.llm.types import CallSettings, ModelRequest
from sim.providers._openai_family import OpenAIFamilyAdapter
from sim.testing.stub_server import ServerThread, StubOptions, StubServer


class Note(BaseModel):
    text: str


REQUEST = ModelRequest(
    "Write a note.", "x", Note, settings=CallSettings(model="stub-model", timeout_seconds=10)
)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> SelfSigned:
    return self_signed(tmp_path_factory.mktemp("tls"))


def serve(count: int, tls: ssl.SSLContext | None = None) -> Iterator[list[StubServer]]:
    threads = [ServerThread(StubServer(StubOptions(latency=0.02)), ssl=tls) for _ in range(count)]
    servers = [thread.start() for thread in threads]
    try:
        yield servers
    finally:
        for thread in threads:
            thread.stop()


def pool_in(stack: Stack) -> PoolAdapter:
    """The pool the stack built for ``[llm]``'s endpoint (it says so: nothing walks it)."""
    assert stack.pool is not None
    return stack.pool


def provider_of(server: Server) -> OpenAIFamilyAdapter:
    adapter: Any = server.adapter
    while not isinstance(adapter, OpenAIFamilyAdapter):
        adapter = adapter.inner
    return adapter


def config_for(servers: list[StubServer], provider: str = "chat") -> Config:
    return Config.model_validate(
        {
            "llm": {
                "provider": provider,
                "base_url": [s.base_url for s in servers],
                "max_concurrency": 32,
            }
        }
    )


@pytest.mark.parametrize("provider", ["chat", "openai"])
async def test_each_server_gets_its_own_connections(provider: str) -> None:
    """Each server's adapter has its own routes, and the rest of its API (the Batch API,
    stored responses) goes on them, to its own server: no SDK client anywhere."""
    for servers in serve(3):
        stack = build_stack(config_for(servers, provider))
        try:
            pool = pool_in(stack)
            routes: list[object] = []
            for server, stub in zip(pool.servers, servers, strict=True):
                adapter = provider_of(server)
                assert adapter.base_url == stub.base_url
                assert len(adapter.connections) and all(adapter.connections.routes), (
                    "no aiohttp route"
                )
                routes.extend(adapter.connections.routes)
                assert adapter.api.connections is adapter.connections
                assert adapter.api.base_url == stub.base_url
            assert len({id(r) for r in routes}) == len(routes)  # none shared between servers
            answers = await asyncio.gather(*(stack.adapter.execute(REQUEST) for _ in range(12)))
        finally:
            await stack.aclose()
        assert {a.endpoint for a in answers} == {s.base_url for s in servers}
        assert [s.stats.generations for s in servers] == [4, 4, 4]


async def test_https_servers_share_one_tls_context(
    certificate: SelfSigned, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate.cert))
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        context = real(*args, **kwargs)
        made.append(context)
        return context

    monkeypatch.setattr(ssl, "create_default_context", counting)
    for servers in serve(2, certificate.server_context()):
        assert all(s.base_url.startswith("https://") for s in servers)
        stack = build_stack(config_for(servers))
        try:
            pool = pool_in(stack)
            # 32 in flight: two connection pools per server, four in all
            assert sum(len(provider_of(s).connections) for s in pool.servers) == 4
            answers = await asyncio.gather(*(stack.adapter.execute(REQUEST) for _ in range(8)))
        finally:
            await stack.aclose()
        assert {a.endpoint for a in answers} == {s.base_url for s in servers}
        assert all(s.stats.generations == 4 for s in servers)
    assert len(made) <= 1, f"{len(made)} TLS contexts for two https servers"


@pytest.mark.parametrize(("fault", "code"), [("server_error", "server_error"), ("hang", "timeout")])
async def test_a_failing_server_is_taken_out_and_its_calls_answered_elsewhere(
    fault: str, code: str
) -> None:
    healthy = ServerThread(StubServer(StubOptions(latency=0.01)))
    failing = ServerThread(
        StubServer(StubOptions(fault_rate=1.0, faults=(fault,), hang_seconds=30, seed=1))
    )
    good, bad = healthy.start(), failing.start()
    config = Config.model_validate(
        {
            "llm": {
                "provider": "chat",
                "base_url": [bad.base_url, good.base_url],
                "breaker_threshold": 2,
                "timeout_seconds": 1,
            }
        }
    )
    request = ModelRequest(
        "Write a note.", "x", Note, settings=CallSettings(model="stub-model", timeout_seconds=1)
    )
    stack = build_stack(config)
    try:
        answers = [await stack.adapter.execute(request) for _ in range(5)]
    finally:
        await stack.aclose()
        healthy.stop()
        failing.stop()
    assert all(a.endpoint == good.base_url for a in answers)
    assert good.stats.generations == 5 and bad.stats.generations == 0
    # two failures took the failing server out: the later calls never went there
    failed = [x for a in answers for x in a.attempts if x.error_code is not None]
    assert [(x.endpoint, x.error_code) for x in failed] == [(bad.base_url, code)] * 2
    assert pool_in(stack).servers[0].breaker.state == "open"
