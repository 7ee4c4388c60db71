"""What the API tests of ``sim serve`` share: the app served on 127.0.0.1 to aiohttp's test
client, and the next server-sent event of a kind."""

from __future__ import annotations

import asyncio
import sys
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


def held_load(gate: Path, *, first_look: bool = False) -> list[str]:
    """The command line of a ``sim`` whose world's load waits for ``gate`` to exist (what
    a big world's seconds of loading look like, without a big world); with ``first_look``
    every world gets a first look before it. ``sim``'s arguments follow."""
    code = (
        "import pathlib, time\n"
        "from sim.serve import loading\n"
        "from sim.storage import store\n"
        f"{'loading.PREVIEW_FROM = 0' if first_look else 'pass'}\n"
        "real = store.Storage.load\n"
        "def held(self, *args, **kwargs):\n"
        f"    gate = pathlib.Path({str(gate)!r})\n"
        "    deadline = time.monotonic() + 120\n"
        "    while not gate.exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
        "    return real(self, *args, **kwargs)\n"
        "store.Storage.load = held\n"
        "from sim.cli import main\n"
        "main(prog_name='sim')\n"
    )
    return [sys.executable, "-c", code]
