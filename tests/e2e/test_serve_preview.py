"""``sim serve`` on a big world: its first look (``sim.serve.preview``) answers the
aggregated views (``/api/world?preview=1``, ``/api/network?preview=1``) while the validated
load still runs, and nothing else; the load's end replaces it, with the world or its
problems (a 422). The look keeps only what passes its checks, read under the load's rules.
Real servers on 127.0.0.1 (aiohttp's test client), real files."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from sim.safefs import UnsafePath
from sim.serve import loading, preview
from sim.serve.app import CACHE
from sim.storage.journal import write_journal
from tests.conftest import copy_demo
from tests.e2e.serve_client import next_event, served

TOKEN = "t0ken-for-preview-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
MARKUP = "<img src=x onerror=alert(1)><script>alert(2)</script>"


@pytest.fixture
def world(tmp_path: Path) -> Path:
    return copy_demo(tmp_path / "demo")


def _edit(path: Path, **change: Any) -> None:
    """Set fields of an entity file: ``where="state.location"``-style keys use ``__``."""
    data = orjson.loads(path.read_bytes())
    for key, value in change.items():
        *parents, last = key.split("__")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    path.write_bytes(orjson.dumps(data))


class Gates:
    """Holds the first look and the load in the background until the test lets each go."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.look = threading.Event()
        self.load = threading.Event()
        real_scan, real = loading.scan, loading.Storage
        gates = self

        def held_scan(*args: Any, **kwargs: Any) -> preview.Preview:
            assert gates.look.wait(60), "the test never let the look go"
            return real_scan(*args, **kwargs)

        class Held(real):  # type: ignore[misc, valid-type]
            def load(self, *args: Any, **kwargs: Any) -> Any:
                assert gates.load.wait(60), "the test never let the load go"
                return super().load(*args, **kwargs)

        monkeypatch.setattr(loading, "scan", held_scan)
        monkeypatch.setattr(loading, "Storage", Held)
        monkeypatch.setattr(loading, "WAIT", 0.05)
        monkeypatch.setattr(loading, "LOOK_WAIT", 0.05)

    def release(self) -> None:
        self.look.set()
        self.load.set()


async def _client(world: Path, preview_from: int | None = 0) -> TestClient[Any, Any]:
    """A server whose world gets a first look from ``preview_from`` entity files."""
    return await served(world, TOKEN, preview_from=preview_from)


async def test_the_views_are_answered_from_the_first_look_before_the_load_ends(
    world: Path, monkeypatch: pytest.MonkeyPatch
):
    """While the load is held: before the look, ``?preview=1`` is a 503 too (once it has
    waited ``LOOK_WAIT``); one that waits while the look is taken is answered when it
    comes, as the ``preview`` event says; the world's and the network's views answer
    from it (``"preview": true``, with the load's status), names shown as the
    files give them (as JSON text, never markup), while the world itself (without
    ``preview``, a character, a change) still answers 503 and writes nothing. The load's
    end replaces the look: ``"preview": false`` and the inspector answers."""
    _edit(world / "characters" / "ada.json", identity__name=MARKUP)
    gates = Gates(monkeypatch)
    client = await _client(world)
    try:
        early = await client.get("/api/world?preview=1", headers=BEARER)
        assert early.status == 503 and (await early.json())["load"]["preview"] is False
        async with client.get("/api/events", headers=BEARER) as events:
            hello = await next_event(events, "hello")
            assert hello["load"]["state"] == "loading" and not hello["load"]["preview"]
            monkeypatch.setattr(loading, "LOOK_WAIT", 60.0)
            waiting = asyncio.create_task(client.get("/api/world?preview=1", headers=BEARER))
            await asyncio.sleep(0.3)  # past WAIT: it waits on, for the look being taken
            assert not waiting.done()
            gates.look.set()
            looked = await next_event(events, "preview")
            assert looked["state"] == "loading" and looked["preview"] is True
            answer = await asyncio.wait_for(waiting, 60)
            assert answer.status == 200, await answer.text()
            view = await answer.json()
            assert view["preview"] is True and view["load"]["state"] == "loading"
            assert view["load"]["skipped"] == 0
            assert view["total_characters"] == 10
            assert view["total_locations"] == 9
            files = {p.stem: orjson.loads(p.read_bytes()) for p in world.glob("characters/*.json")}
            assert {c["id"]: c["name"] for c in view["characters"]} == {
                cid: data["identity"]["name"] for cid, data in files.items()
            }
            assert next(c for c in view["characters"] if c["id"] == "ada")["name"] == MARKUP
            counts: dict[str, int] = {}
            for data in files.values():
                where = data["state"]["location"]
                counts[where] = counts.get(where, 0) + 1
            assert {loc["id"]: loc["count"] for loc in view["locations"]} == {
                p.stem: counts.get(p.stem, 0) for p in world.glob("locations/*.json")
            }
            net = await client.get("/api/network?preview=1", headers=BEARER)
            assert net.status == 200
            net_view = await net.json()
            assert net_view["preview"] is True and net_view["total_characters"] == 10
            for path in (
                "/api/world",
                "/api/network",
                "/api/characters/ada",
                "/api/characters/ada?preview=1",  # only the aggregated views have a look
                "/api/history?preview=1",
            ):
                assert (await client.get(path, headers=BEARER)).status == 503, path
            refused = await client.post(
                "/api/inject", json={"everywhere": True, "text": "A bell."}, headers=BEARER
            )
            assert refused.status == 503
            assert not (world / ".sim" / "interventions.json").exists()
            assert (await client.get("/api/world?preview=1")).status == 401  # the token
            gates.load.set()
            done = await next_event(events, "loaded")
        assert done["state"] == "ready" and done["preview"] is False
        answer = await client.get("/api/world?preview=1", headers=BEARER)
        assert answer.status == 200
        view = await answer.json()
        assert view["preview"] is False and view["load"] is None
        assert view["total_characters"] == 10
        net_view = await (await client.get("/api/network?preview=1", headers=BEARER)).json()
        assert net_view["preview"] is False
        ada = await client.get("/api/characters/ada", headers=BEARER)
        assert (await ada.json())["name"] == MARKUP
    finally:
        gates.release()
        await client.close()


async def test_a_world_that_does_not_validate_ends_in_its_problems_after_its_first_look(
    world: Path, monkeypatch: pytest.MonkeyPatch
):
    """A file that passes the look's checks but not the load's (an unknown place, a mood
    that is not a string): the look answers meanwhile, and the load's end turns every
    view, the first look's included, into the 422 naming each file and field."""
    _edit(world / "characters" / "ada.json", state__location="atlantis")
    _edit(world / "characters" / "bram.json", state__mood=7)
    gates = Gates(monkeypatch)
    gates.look.set()
    client = await _client(world)
    try:
        async with client.get("/api/events", headers=BEARER) as events:
            hello = await next_event(events, "hello")
            if not hello["load"]["preview"]:
                await next_event(events, "preview")
            answer = await client.get("/api/world?preview=1", headers=BEARER)
            assert answer.status == 200
            view = await answer.json()
            assert view["preview"] is True and view["total_characters"] == 10
            gates.load.set()
            done = await next_event(events, "loaded")
        assert done["state"] == "invalid" and done["preview"] is False
        for path in ("/api/world?preview=1", "/api/network?preview=1", "/api/world"):
            answer = await client.get(path, headers=BEARER)
            assert answer.status == 422, path
            problems = (await answer.json())["load"]["problems"]
            assert {(p["file"], p["field"]) for p in problems} == {
                ("characters/ada.json", "state.location"),
                ("characters/bram.json", "state.mood"),
            }
    finally:
        gates.release()
        await client.close()


async def test_a_small_world_gets_no_first_look(world: Path):
    """Below ``preview_from`` entity files (the default: 20,000) the world is only loaded:
    ``?preview=1`` answers as without it (``"preview": false``, the validated world); a
    ``preview`` that is not 0 or 1 is a 400 naming it."""
    client = await _client(world, None)
    try:
        answer = await client.get("/api/world?preview=1", headers=BEARER)
        assert answer.status == 200
        view = await answer.json()
        assert view["preview"] is False and view["total_characters"] == 10
        assert client.app is not None and client.app[CACHE].status.preview is False
        bad = await client.get("/api/world?preview=yes", headers=BEARER)
        assert bad.status == 400 and "preview" in (await bad.json())["error"]
    finally:
        await client.close()


def test_the_first_look_keeps_only_what_passes_its_checks(world: Path, tmp_path: Path):
    """Read under the load's rules and checked minimally, each failing file is left out
    (counted, never shown): a link to a file outside the world, a hard link, a file over
    the size limit, malformed JSON, an id that is not its file's name, a file name that is
    not an id, a location that is not an id (a trailing newline included), an empty name.
    What passes is kept as the files give it (a name with markup is a string like any
    other), with only the views' fields; a tie that fails is dropped, not its character.
    The pending journal's files are read in place of those they rewrite."""
    chars = world / "characters"
    outside = tmp_path / "outside.json"
    outside.write_bytes((chars / "ada.json").read_bytes().replace(b'"ada"', b'"zed"'))
    (chars / "zed.json").symlink_to(outside)
    os.link(outside, chars / "yan.json")
    _edit(chars / "bram.json", identity__description="x" * 4096)
    (chars / "xia.json").write_bytes(b'{"identity": {"id": "xia", ')
    _edit(chars / "corin.json", identity__id="someone-else")
    (chars / "Bad Name.json").write_bytes((chars / "orla.json").read_bytes())
    _edit(chars / "isolde.json", state__location="quay\n")
    _edit(chars / "nessa.json", identity__name="")
    _edit(chars / "tam.json", identity__name=MARKUP)
    _edit(chars / "wren.json", relationships={"pell": {"kind": "friend", "trust": 2.0}})
    _edit(chars / "pell.json", relationships={"wren": {"kind": "friend", "trust": 0.75}})
    write_journal(  # a committed tick not yet applied: Ada is renamed by it
        world, {"characters/ada.json": (chars / "ada.json").read_bytes().replace(b"Ada", b"Adah")}
    )
    sizes = [p.stat().st_size for p in chars.glob("*.json") if p.name != "bram.json"]
    look = preview.scan(world, max(sizes) + 100)
    assert sorted(look.world.characters) == ["ada", "brother-elm", "orla", "pell", "tam", "wren"]
    # left out: zed (a link), yan (a hard link), bram (too big), xia (malformed), corin
    # (another id), "Bad Name", isolde (a location with a newline), nessa (no name)
    assert look.skipped == 8
    assert look.files == 14 + 9  # ada's file read from the journal, in place of its own
    assert look.world.characters["tam"]["identity"]["name"] == MARKUP
    assert look.world.characters["ada"]["identity"]["name"].startswith("Adah")
    pell = orjson.loads((chars / "pell.json").read_bytes())
    assert look.world.characters["pell"] == {
        "identity": {"id": "pell", "name": pell["identity"]["name"]},
        "state": {"location": pell["state"]["location"]},
        "relationships": {"wren": {"kind": "friend", "trust": 0.75}},
    }
    assert "relationships" not in look.world.characters["wren"]  # its one tie out of range
    assert len(look.world.locations) == 9
    assert look.world.tick == 0


async def test_a_world_whose_folder_is_a_link_gets_no_first_look(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``characters/`` a link to a folder outside the world: the look reads nothing of it
    (it walks the folders as the load does) and is not taken; the load names the problem
    (a 422), and ``?preview=1`` answers that too."""
    outside = tmp_path / "elsewhere"
    (world / "characters").rename(outside)
    (world / "characters").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath, match="characters"):
        preview.scan(world, 1 << 20)
    monkeypatch.setattr(loading, "WAIT", 10.0)
    client = await _client(world)
    try:
        answer = await client.get("/api/world?preview=1", headers=BEARER)
        assert answer.status == 422
        load = (await answer.json())["load"]
        assert load["preview"] is False
        assert any(p["file"] == "characters" for p in load["problems"]), load["problems"]
    finally:
        await client.close()
