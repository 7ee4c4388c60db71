"""Closing a built stack closes every connection it opened, and only through what the
builder made (``Stack.clients``): a run that ends leaves no aiohttp session open (each
one left open holds its sockets until exit and warns "Unclosed client session")."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict

from sim.config import Config, LLMConfig
from sim.engine.stack import Stack, build_stack
from sim.llm.pool import PoolAdapter
from sim.llm.types import ModelRequest
from sim.providers.chat import ChatAdapter
from sim.providers.http import Route
from sim.testing.stub_server import ServerThread, StubOptions, StubServer


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


def routes(stack: Stack) -> list[Route]:
    """The HTTP routes under each client the stack's builder made."""
    adapters = []
    for client in stack.clients:
        if isinstance(client, PoolAdapter):
            adapters += [server.provider for server in client.servers]
        else:
            adapters.append(client)
    return [r for a in adapters if isinstance(a, ChatAdapter) for r in a.connections.routes if r]


async def test_a_stack_closes_the_connections_of_each_endpoint_and_pool_server(
    stub_server: StubServer,
) -> None:
    with ServerThread(StubServer(StubOptions())) as second:
        urls = [stub_server.base_url, second.base_url]
        pooled = build_stack(Config(llm=LLMConfig(provider="chat", base_url=urls)))
        single = build_stack(Config(llm=LLMConfig(provider="chat", base_url=urls[0])))
        assert isinstance(pooled.clients[0], PoolAdapter)
        assert isinstance(single.clients[0], ChatAdapter)
        settings = Config().phase2b.settings(LLMConfig(provider="chat"))
        for stack in (pooled, single):  # at once: connections opened to every server
            requests = [
                ModelRequest("Note.", f"note {i}", Note, settings=settings) for i in range(4)
            ]
            answers = await asyncio.gather(*map(stack.adapter.execute, requests))
            assert all(isinstance(answer.parsed, Note) for answer in answers)
        assert stub_server.stats.generations + second.stats.generations == 8
        assert second.stats.generations > 0  # the pool used both servers
        opened = routes(pooled) + routes(single)
        assert len(opened) == 3 and all(route.open for route in opened)
        await pooled.aclose()
        await single.aclose()
        assert not any(route.open for route in opened)
