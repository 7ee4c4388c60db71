"""What the API tests of ``sim serve`` share: the app served on 127.0.0.1 to aiohttp's test
client, and the next server-sent event of a kind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from sim.cli.common import build_config
from sim.serve.app import CACHE, Settings, make_app


async def served(
    world: Path, token: str, *, read_only: bool = False, preview_from: int | None = None
) -> TestClient[Any, Any]:
    """A started test client of ``world``'s app; ``preview_from``: the entity files from
    which its world gets a first look (``None``: the server's own threshold)."""
    app = make_app(Settings(world, build_config(None, world), token, read_only=read_only))
    if preview_from is not None:
        app[CACHE].preview_from = preview_from
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


async def next_event(events: ClientResponse, kind: str) -> dict[str, Any]:
    """The data of the next ``kind`` event on the stream."""
    name = ""
    while True:
        line = (await asyncio.wait_for(events.content.readline(), 60)).decode()
        if line.startswith("event: "):
            name = line[7:].strip()
        elif line.startswith("data: ") and name == kind:
            data: dict[str, Any] = orjson.loads(line[6:])
            return data
