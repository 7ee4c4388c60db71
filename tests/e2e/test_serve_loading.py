"""``sim serve`` on a world that takes a while to load, or does not load: the address and
the API answer first, ``/api/world`` says "loading" (503) until the world is read and
validated, then answers; a world that fails validation is shown as its problems, each
naming its file and field (422, the terminal too), and loaded again once fixed. And a big
world's answer stays bounded. Real servers on 127.0.0.1: aiohttp's test client, and the
command in a process of its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from sim.cli.common import build_config
from sim.serve import loading, views
from sim.serve.app import Settings, make_app
from tests.conftest import copy_demo
from tests.e2e.serve_client import held_load, next_event, served

TOKEN = "t0ken-for-loading-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def world(tmp_path: Path) -> Path:
    return copy_demo(tmp_path / "demo")


async def _client(world: Path) -> TestClient[Any, Any]:
    return await served(world, TOKEN)


def _break(world: Path) -> Path:
    """Ada's file names a place that does not exist (the rest of the world is fine)."""
    path = world / "characters" / "ada.json"
    data = orjson.loads(path.read_bytes())
    data["state"]["location"] = "atlantis"
    path.write_bytes(orjson.dumps(data))
    return path


async def test_the_api_says_loading_until_the_world_is_loaded_then_answers(
    world: Path, monkeypatch: pytest.MonkeyPatch
):
    """While the load runs, what needs the world answers 503 (``loading``, with
    ``Retry-After``), changes included, and writes nothing; the token is still needed;
    the events say ``loading`` on connecting and ``loaded`` when it ends; then 200."""
    go = threading.Event()
    real = loading.Storage

    class Held(real):  # type: ignore[misc, valid-type]
        def load(self, *args: Any, **kwargs: Any) -> Any:
            assert go.wait(60), "the test never let the load go"
            return super().load(*args, **kwargs)

    monkeypatch.setattr(loading, "Storage", Held)
    monkeypatch.setattr(loading, "WAIT", 0.05)
    client = await _client(world)
    try:
        answer = await client.get("/api/world", headers=BEARER)
        assert answer.status == 503, await answer.text()
        assert answer.headers["Retry-After"] == "1"
        body = await answer.json()
        assert body["load"]["state"] == "loading" and "loading" in body["error"]
        files = len([*world.glob("characters/*.json"), *world.glob("locations/*.json")])
        assert (body["load"]["files"], body["load"]["checked"]) == (files, 0)
        assert body["load"]["name"] == "Saltglass Isle: The Lantern Tide"
        assert body["load"]["tick"] == 0
        for path in ("/api/network", "/api/characters/ada", "/api/history", "/api/ticks/1"):
            assert (await client.get(path, headers=BEARER)).status == 503, path
        inject = {"everywhere": True, "text": "A bell rings."}
        refused = await client.post("/api/inject", json=inject, headers=BEARER)
        assert refused.status == 503
        assert not (world / ".sim" / "interventions.json").exists()
        assert (await client.get("/api/world")).status == 401  # the token, even now
        assert (await client.get("/api/run", headers=BEARER)).status == 200
        async with client.get("/api/events", headers=BEARER) as events:
            hello = await next_event(events, "hello")
            assert hello["load"]["state"] == "loading"
            go.set()
            done = await next_event(events, "loaded")
        assert done["state"] == "ready" and done["problems"] == []
        assert done["characters"] == 10 and done["locations"] == len(
            list((world / "locations").glob("*.json"))
        )
        answer = await client.get("/api/world", headers=BEARER)
        assert answer.status == 200
        assert (await answer.json())["total_characters"] == 10
    finally:
        go.set()
        await client.close()


async def test_a_world_that_does_not_validate_is_shown_as_its_problems_then_reloaded(
    world: Path, monkeypatch: pytest.MonkeyPatch
):
    """A bad entity file: ``/api/world`` and the other views answer 422 naming the file
    and field, never a traceback; fixing the file in place loads the world again (the
    ``loaded`` event says so) and the views answer."""
    monkeypatch.setattr(loading, "WAIT", 5.0)
    path = _break(world)
    client = await _client(world)
    try:
        async with client.get("/api/events", headers=BEARER) as events:
            answer = await client.get("/api/world", headers=BEARER)
            assert answer.status == 422
            body = await answer.json()
            assert body["load"]["state"] == "invalid"
            assert body["load"]["problems"] == [
                {
                    "file": "characters/ada.json",
                    "field": "state.location",
                    "problem": "unknown location 'atlantis'; expected one of the ids in locations/",
                }
            ]
            assert "characters/ada.json" in body["error"] and "Traceback" not in body["error"]
            for view in ("/api/network", "/api/characters/bram"):
                assert (await client.get(view, headers=BEARER)).status == 422, view
            data = orjson.loads(path.read_bytes())
            data["state"]["location"] = "quay"
            path.write_bytes(orjson.dumps(data))  # in place: no folder's mtime changes
            fixed = await next_event(events, "loaded")  # the server notices it by itself
            while fixed["state"] == "invalid":  # the first load's, if it ended after
                fixed = await next_event(events, "loaded")
        assert fixed["state"] == "ready"
        answer = await client.get("/api/world", headers=BEARER)
        assert answer.status == 200
        ada = await client.get("/api/characters/ada", headers=BEARER)
        assert (await ada.json())["entity"]["state"]["location"] == "quay"
    finally:
        await client.close()


async def test_a_loaded_world_broken_while_served_is_shown_as_its_problems(world: Path):
    """A loaded world whose files change into an invalid world: the next request is a 422
    naming the file, the ``loaded`` event says ``invalid``; fixed, it is loaded again."""
    client = await _client(world)
    path = world / "characters" / "ada.json"
    good = path.read_bytes()

    def replace_with(data: bytes) -> None:  # as an editor saves: a new file renamed over
        spare = world / "characters" / "ada.json.new"
        spare.write_bytes(data)
        os.replace(spare, path)

    try:
        assert (await client.get("/api/world", headers=BEARER)).status == 200
        async with client.get("/api/events", headers=BEARER) as events:
            assert (await next_event(events, "hello"))["load"]["state"] == "ready"
            broken = orjson.loads(good)
            broken["state"]["location"] = "atlantis"
            replace_with(orjson.dumps(broken))
            answer = await client.get("/api/world", headers=BEARER)
            assert answer.status == 422
            problems = (await answer.json())["load"]["problems"]
            assert [(p["file"], p["field"]) for p in problems] == [
                ("characters/ada.json", "state.location")
            ]
            assert (await next_event(events, "loaded"))["state"] == "invalid"
            replace_with(good)
            assert (await next_event(events, "loaded"))["state"] == "ready"
        assert (await client.get("/api/world", headers=BEARER)).status == 200
    finally:
        await client.close()


def _held_serve(world: Path, gate: Path) -> tuple[subprocess.Popen[str], str]:
    """``sim serve`` in a process of its own whose world's load waits for ``gate``."""
    process = subprocess.Popen(
        [*held_load(gate), "serve", "--world", str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


async def test_the_command_prints_its_address_before_the_world_has_loaded(
    world: Path, tmp_path: Path
):
    gate = tmp_path / "gate"
    process, url = _held_serve(world, gate)
    try:
        # the load has not ended (it waits for the gate): the address is already out
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url, url
        base, _, token = url.partition("/?token=")
        headers = {"Authorization": f"Bearer {token}"}
        async with ClientSession() as session:
            async with session.get(f"{base}/api/world", headers=headers) as answer:
                assert answer.status == 503
                assert (await answer.json())["load"]["state"] == "loading"
            gate.touch()
            deadline = time.monotonic() + 60
            while True:
                async with session.get(f"{base}/api/world", headers=headers) as answer:
                    if answer.status == 200:
                        assert (await answer.json())["total_characters"] == 10
                        break
                    assert answer.status == 503
                assert time.monotonic() < deadline, "the world never loaded"
                await asyncio.sleep(0.1)
    finally:
        gate.touch()
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "loaded 10 characters and" in err and "Traceback" not in err


async def test_the_command_on_a_bad_entity_file_says_which_and_exits_2(world: Path):
    """The address first (the entities are validated after); then the terminal names the
    file and field, and the API the same; stopped, the command exits 2."""
    _break(world)
    process = subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", "--world", str(world)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        url = process.stdout.readline().strip()
        base, _, token = url.partition("/?token=")
        lines = []
        while not any("the page shows these problems" in line for line in lines):
            line = process.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        told = "".join(lines)
        assert "error: world is invalid" in told
        assert "ada.json: field 'state.location': unknown location 'atlantis'" in told
        async with (
            ClientSession() as session,
            session.get(
                f"{base}/api/world", headers={"Authorization": f"Bearer {token}"}
            ) as answer,
        ):
            assert answer.status == 422
            problem = (await answer.json())["load"]["problems"][0]
            assert (problem["file"], problem["field"]) == ("characters/ada.json", "state.location")
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 2, err
    assert "Traceback" not in told + err


async def test_a_big_worlds_answer_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A generated world of 2,000 characters at 200 places, with the places' threshold
    lowered to 40: ``/api/world`` lists one page of characters and the 40 busiest places
    (not every place, nor a node per character), counts them all, and the network is drawn
    by place, among those 40."""
    from bench.make_world import make_world

    world = tmp_path / "big"
    make_world(world, 2000, 200, seed=3)
    monkeypatch.setattr(views, "MAP_PLACES", 40)
    client = await _client(world)
    try:
        answer = await client.get("/api/world", headers=BEARER)
        raw = await answer.read()
        net = await (await client.get("/api/network", headers=BEARER)).json()
    finally:
        await client.close()
    view = orjson.loads(raw)
    assert view["total_characters"] == 2000 and len(view["characters"]) == views.PAGE
    assert view["total_locations"] == 200 and view["locations_shown"] == "busiest"
    assert len(view["locations"]) == 40
    where: dict[str, int] = {}
    for path in (world / "characters").glob("*.json"):
        place = orjson.loads(path.read_bytes())["state"]["location"]
        where[place] = where.get(place, 0) + 1
    busiest = sorted(where, key=lambda p: (-where[p], p))[:40]
    assert [loc["id"] for loc in view["locations"]] == sorted(busiest)
    assert all(loc["count"] == where[loc["id"]] for loc in view["locations"])
    assert len(raw) < 60_000, len(raw)
    # a character at a place not listed still shows where it is, by name
    listed = {loc["id"] for loc in view["locations"]}
    elsewhere = [c for c in view["characters"] if c["location"] not in listed]
    assert elsewhere
    for c in elsewhere:
        place = orjson.loads((world / "locations" / f"{c['location']}.json").read_bytes())
        assert c["location_name"] == place["identity"]["name"]
    assert net["by"] == "place" and len(net["nodes"]) <= 40
    drawn = {n["id"] for n in net["nodes"]}
    assert all(e["a"] in drawn and e["b"] in drawn for e in net["edges"])
    assert len(net["edges"]) <= views.NETWORK_TIES


async def test_the_servers_loads_keep_the_users_entity_size_limit(world: Path):
    """``[limits] max_entity_bytes`` holds for the server's own loads too (they once read
    the world with the default limit): a file over it is named, and nothing of it shown."""
    big = world / "characters" / "ada.json"
    files = [*world.glob("characters/*.json"), *world.glob("locations/*.json")]
    limit = max(1024, *(f.stat().st_size for f in files))
    data = orjson.loads(big.read_bytes())
    data["identity"]["description"] = "x" * limit
    big.write_bytes(orjson.dumps(data))
    config = build_config(None, world)
    limits = config.limits.model_copy(update={"max_entity_bytes": limit})
    config = config.model_copy(update={"limits": limits})
    app = make_app(Settings(world, config, TOKEN))
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        answer = await client.get("/api/world", headers=BEARER)
        assert answer.status == 422
        problems = (await answer.json())["load"]["problems"]
    finally:
        await client.close()
    assert [p["file"] for p in problems] == ["characters/ada.json"]
    assert "max_entity_bytes" in problems[0]["problem"]


async def test_the_command_stopped_while_loading_stops_at_once(world: Path, tmp_path: Path):
    """SIGTERM while the world loads: the server stops without waiting for the load (it
    writes nothing), exits 0, and prints no traceback."""
    process, url = _held_serve(world, tmp_path / "never")
    base, _, token = url.partition("/?token=")
    async with (
        ClientSession() as session,
        session.get(f"{base}/api/run", headers={"Authorization": f"Bearer {token}"}) as run,
    ):
        assert run.status == 200  # serving, the load held
    process.terminate()
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "stopping" in err and "Traceback" not in err and "loaded" not in err
