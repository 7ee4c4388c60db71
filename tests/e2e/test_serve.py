"""``sim serve``: the JSON API and its trust boundary, with aiohttp's own test client
against a real server on 127.0.0.1, and the command as a user starts it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from sim.cli import main
from sim.cli.common import build_config
from sim.serve.app import Settings, make_app
from sim.serve.boundary import MAX_BODY
from sim.ticklog.format import list_logs
from sim.ticklog.reader import read_log
from tests.conftest import copy_demo, shard_workers_of, tree, with_a_tally
from tests.e2e.serve_client import next_event, served

TOKEN = "t0ken-for-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
SECRET = "sk-serve-test-secret-123456"


@pytest.fixture
def world(tmp_path: Path) -> Path:
    return copy_demo(tmp_path / "demo")


async def _client(world: Path, read_only: bool = False) -> TestClient[Any, Any]:
    return await served(world, TOKEN, read_only=read_only)


@pytest.fixture
async def client(world: Path) -> AsyncIterator[TestClient[Any, Any]]:
    served = await _client(world)
    try:
        yield served
    finally:
        await served.close()


async def _post(client: TestClient[Any, Any], path: str, body: Any) -> Any:
    return await client.post(path, json=body, headers=BEARER)


async def _until_idle(client: TestClient[Any, Any], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state: dict[str, Any] = await (await client.get("/api/run", headers=BEARER)).json()
        if not state["running"]:
            return state
        await asyncio.sleep(0.05)
    raise AssertionError("the run did not end")


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    """``sim ARGS`` in a process of its own, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def _log_content(world: Path) -> list[list[bytes]]:
    """Each tick log's records without what differs between two runs of one tick by
    ``sim tick`` too (latency, elapsed, the commit's clock, the run's idempotency nonce),
    calls sorted (they complete in any order)."""
    volatile = {"latency", "elapsed", "committed_at", "timings", "wall", "started_at", "scope"}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in volatile}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    out = []
    for _, path in list_logs(world):
        log = read_log(path)
        out.append(sorted(orjson.dumps(strip(r.model_dump(mode="json"))) for r in log.records))
    return out


# -- reading and running ----------------------------------------------------------------


async def test_world_and_a_tick_run_from_the_api_equal_sim_tick(tmp_path: Path, world: Path):
    """Two ticks run by ``POST /api/run`` leave the world byte-identical to ``sim tick
    --ticks 2`` on a copy, with the same logs; ``/api/ticks/2`` shows that tick's scenes."""
    other = copy_demo(tmp_path / "other")
    served = await _client(world)
    try:
        view = await (await served.get("/api/world", headers=BEARER)).json()
        assert view["tick"] == 0 and view["total_characters"] == 10
        assert {c["name"] for c in view["characters"]} >= {"Ada Strand", "Pell Dunmore"}
        assert sum(loc["count"] for loc in view["locations"]) == 10
        started = await _post(served, "/api/run", {"ticks": 2})
        assert started.status == 202
        state = await _until_idle(served)
        assert state["done"] == 2 and state["error"] is None and state["calls"] > 0
        view = await (await served.get("/api/world", headers=BEARER)).json()
        assert view["tick"] == 2 and view["logged"] == [1, 2]
        tick = await (await served.get("/api/ticks/2", headers=BEARER)).json()
        assert tick["tick"] == 2 and tick["committed"] and tick["scenes"]
        scene = tick["scenes"][0]
        assert scene["narrative"] and scene["location"]["name"]
        assert all(row["name"] and "action" in row for row in scene["characters"])
        missing = await served.get("/api/ticks/9", headers=BEARER)
        assert missing.status == 404 and "no logged tick 9" in (await missing.json())["error"]
    finally:
        await served.close()
    done = _sim("tick", "--world", str(other), "--ticks", "2")
    assert done.returncode == 0, done.stderr
    assert tree(world) == tree(other)
    assert _log_content(world) == _log_content(other)


async def test_a_run_with_workers_gives_one_processs_world_with_workers_started_once(
    tmp_path: Path, world: Path
):
    """``sim serve --workers 2``: three ticks run from the page leave the world and its
    logs as ``sim tick --ticks 3`` in one process does; one worker process serves every
    tick (started with the run, not once a tick, although the world's lock is let go
    between ticks), and is gone when the run ends."""
    reference = copy_demo(tmp_path / "ref")
    done = _sim("tick", "--world", str(reference), "--ticks", "3")
    assert done.returncode == 0, done.stderr
    app = make_app(Settings(world, build_config(None, world), TOKEN, workers=2))
    served: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await served.start_server()
    seen: list[list[int]] = []
    try:
        async with served.get("/api/events", headers=BEARER) as events:
            await next_event(events, "hello")
            assert (await _post(served, "/api/run", {"ticks": 3})).status == 202
            for _ in range(2):  # the third tick's event may come once the run has ended
                ticked = await next_event(events, "tick")
                seen.append(shard_workers_of(world))
                assert ticked["workers"] == 2 and ticked["note"] is None
        state = await _until_idle(served)
        assert state["done"] == 3 and state["error"] is None, state
    finally:
        await served.close()
    assert len(seen[0]) == 1 and seen[0] == seen[1]
    assert not shard_workers_of(world)
    assert tree(world) == tree(reference)
    assert _log_content(world) == _log_content(reference)


async def test_a_run_that_cannot_shard_says_why_on_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """With a package's phase over the whole world a ``--workers 2`` run goes on in one
    process; its events say so, and no worker is started."""
    world = with_a_tally(tmp_path / "tally", monkeypatch)
    config = build_config(None, world)
    app = make_app(Settings(world, config, TOKEN, workers=2))
    served: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await served.start_server()
    try:
        async with served.get("/api/events", headers=BEARER) as events:
            await next_event(events, "hello")
            assert (await _post(served, "/api/step", {})).status == 202
            ticked = await next_event(events, "tick")
        assert ticked["workers"] == 1 and "phase 'tally' runs over" in ticked["note"]
        assert (await _until_idle(served))["error"] is None
    finally:
        await served.close()
    assert not shard_workers_of(world)


async def test_pause_stops_after_the_tick_running(client: TestClient[Any, Any], world: Path):
    assert (await _post(client, "/api/run", {"ticks": 50})).status == 202
    paused = await _post(client, "/api/pause", {})
    assert paused.status == 200
    state = await _until_idle(client)
    assert 0 <= state["done"] < 50
    view = await (await client.get("/api/world", headers=BEARER)).json()
    assert view["tick"] == state["done"]  # each tick committed whole
    assert (await _post(client, "/api/pause", {})).status == 409  # nothing to pause
    assert (await _post(client, "/api/step", {})).status == 202
    stepped = await _until_idle(client)
    assert stepped["done"] == 1
    after = await (await client.get("/api/world", headers=BEARER)).json()
    assert after["tick"] == view["tick"] + 1


async def test_a_second_run_is_refused_while_one_goes(client: TestClient[Any, Any]):
    assert (await _post(client, "/api/run", {"ticks": 3})).status == 202
    second = await _post(client, "/api/run", {"ticks": 1})
    assert second.status == 409 and "a run is going" in (await second.json())["error"]
    inject = await _post(client, "/api/inject", {"everywhere": True, "text": "A bell rings."})
    assert inject.status == 409
    await _until_idle(client)


async def test_events_stream_phases_and_ticks_and_a_tick_run_elsewhere(
    client: TestClient[Any, Any], world: Path
):
    """``/api/events`` carries each phase's progress and each committed tick, and a tick
    committed by a ``sim tick`` in another process shows as a ``world`` event."""
    seen: list[tuple[str, dict[str, Any]]] = []
    async with client.get("/api/events", headers=BEARER) as events:
        assert events.headers["Content-Type"].startswith("text/event-stream")

        async def read_until(kind: str) -> dict[str, Any]:
            name = ""
            while True:
                line = (await asyncio.wait_for(events.content.readline(), 60)).decode()
                if line.startswith("event: "):
                    name = line[7:].strip()
                elif line.startswith("data: "):
                    data = orjson.loads(line[6:])
                    seen.append((name, data))
                    if name == kind:
                        return data

        hello = await read_until("hello")
        assert hello["tick"] == 0
        await _post(client, "/api/step", {})
        committed = await read_until("tick")
        assert committed["tick"] == 1
        kinds = [k for k, _ in seen]
        assert "phase" in kinds and "progress" in kinds
        phases = [d["name"] for k, d in seen if k == "phase" and d["stage"] == "start"]
        assert phases[:3] == ["intentions", "resolution", "narrative"]
        await read_until("world")
        await _until_idle(client)
        started = time.monotonic()
        done = _sim("tick", "--world", str(world))
        assert done.returncode == 0, done.stderr
        elsewhere = await read_until("world")
        assert elsewhere["tick"] == 2
        assert time.monotonic() - started < 30


async def test_character_inspector_and_history(client: TestClient[Any, Any]):
    await _post(client, "/api/step", {})
    await _until_idle(client)
    ada = await (await client.get("/api/characters/ada", headers=BEARER)).json()
    assert ada["name"] == "Ada Strand" and ada["entity"]["identity"]["goals"]
    assert "memory" in ada["entity"] and "state" in ada["entity"]
    # the calls of her own chains (her intention, at least) over the logged ticks
    assert ada["books"]["calls"] >= 1 and ada["books"]["tokens"] > 0
    missing = await client.get("/api/characters/nobody", headers=BEARER)
    assert missing.status == 404 and "nobody" in (await missing.json())["error"]
    history = await (await client.get("/api/history", headers=BEARER)).json()
    assert [t["t"] for t in history["ticks"]] == [1] and history["ticks"][0]["tokens"] > 0


async def test_inject_set_and_ask_call_what_the_commands_call(
    client: TestClient[Any, Any], world: Path
):
    made = await _post(client, "/api/inject", {"at": "quay", "text": "A gull screams."})
    assert made.status == 200, await made.text()
    assert (await made.json())["applies_at_tick"] == 1
    pending = orjson.loads((world / ".sim" / "interventions.json").read_bytes())
    assert "A gull screams." in orjson.dumps(pending).decode()
    changed = await _post(client, "/api/set", {"assignment": 'ada.state.mood="furious"'})
    assert changed.status == 200, await changed.text()
    ada = orjson.loads((world / "characters" / "ada.json").read_bytes())
    assert ada["state"]["mood"] == "furious"
    asked = await _post(client, "/api/ask", {"character": "ada", "question": "Who is Pell?"})
    assert asked.status == 200, await asked.text()
    answer = (await asked.json())["answers"][0]
    assert answer["name"] == "Ada Strand" and answer["answer"]
    assert (world / ".sim" / "interviews.jsonl").is_file()


# -- the trust boundary -----------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/api/world", "/api/ticks/1", "/api/events", "/api/history", "/api/run", "/"]
)
async def test_every_request_needs_the_token(client: TestClient[Any, Any], path: str):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        refused = await client.get(path, headers=headers)
        assert refused.status == 401, (path, headers)
        assert "token" in (await refused.json())["error"]


async def test_changes_need_the_token_and_write_nothing_without(
    client: TestClient[Any, Any], world: Path
):
    before = tree(world, logs=True)
    for path, body in [
        ("/api/run", {"ticks": 1}),
        ("/api/step", {}),
        ("/api/inject", {"everywhere": True, "text": "x"}),
        ("/api/set", {"assignment": 'ada.state.mood="x"'}),
        ("/api/ask", {"everyone": True, "question": "hi?"}),
        ("/api/rewind", {"tick": 1}),
        ("/api/fork", {"tick": 1, "to": "elsewhere"}),
    ]:
        refused = await client.post(path, json=body)
        assert refused.status == 401, path
    await asyncio.sleep(0.3)
    assert tree(world, logs=True) == before


async def test_the_page_sets_a_session_cookie_from_the_token(client: TestClient[Any, Any]):
    opened = await client.get(f"/?token={TOKEN}", allow_redirects=False)
    assert opened.status == 303 and opened.headers["Location"] == "/"
    cookie = opened.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    page = await client.get("/")  # the cookie jar sends the session
    assert page.status == 200 and "text/html" in page.headers["Content-Type"]
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert (await client.get("/api/world")).status == 200
    wrong = await client.get("/?token=nope", allow_redirects=False)
    assert wrong.status == 200  # the session still holds; a wrong token sets nothing
    assert "Set-Cookie" not in wrong.headers
    # a change by cookie must carry the page's Origin
    bare = await client.post("/api/inject", json={"everywhere": True, "text": "x"})
    assert bare.status == 403 and "Origin" in (await bare.json())["error"]
    origin = f"http://127.0.0.1:{client.port}"
    ok = await client.post(
        "/api/inject", json={"everywhere": True, "text": "x"}, headers={"Origin": origin}
    )
    assert ok.status == 200


async def test_another_host_is_refused_dns_rebinding(client: TestClient[Any, Any]):
    for host in ("evil.example", f"evil.example:{client.port}", "127.0.0.1:1"):
        refused = await client.get("/api/world", headers={**BEARER, "Host": host})
        assert refused.status == 421, host
        assert "not this server's address" in (await refused.json())["error"]
    for host in (f"localhost:{client.port}", f"127.0.0.1:{client.port}"):
        assert (await client.get("/api/world", headers={**BEARER, "Host": host})).status == 200


async def test_a_change_from_another_origin_is_refused_csrf(
    client: TestClient[Any, Any], world: Path
):
    before = tree(world, logs=True)
    for origin in ("http://evil.example", "null", f"http://localhost:{client.port + 1}"):
        refused = await client.post(
            "/api/inject",
            json={"everywhere": True, "text": "x"},
            headers={**BEARER, "Origin": origin},
        )
        assert refused.status == 403, origin
    # a form post (no preflight) is not JSON: refused
    form = await client.post("/api/run", data={"ticks": "1"}, headers=BEARER)
    assert form.status == 415
    assert tree(world, logs=True) == before


async def test_bad_input_gets_a_4xx_naming_the_problem_and_writes_nothing(
    client: TestClient[Any, Any], world: Path
):
    before = tree(world, logs=True)
    cases: list[tuple[str, Any, int, str]] = [
        ("/api/run", {"ticks": 0}, 400, "ticks"),
        ("/api/run", {"ticks": "3"}, 400, "ticks"),
        ("/api/run", {"tick": 3}, 400, "tick"),
        ("/api/run", [1], 400, "JSON object"),
        ("/api/inject", {"text": "x"}, 400, "at and everywhere"),
        ("/api/inject", {"at": "nowhere", "text": "x"}, 400, "nowhere"),
        ("/api/inject", {"at": "quay", "text": ""}, 400, "text"),
        ("/api/set", {"assignment": "ada.state.mood=not json"}, 400, "JSON"),
        ("/api/set", {"assignment": 'ghost.state.mood="x"'}, 400, "ghost"),
        ("/api/ask", {"character": "ghost", "question": "hi?"}, 400, "ghost"),
        ("/api/rewind", {"tick": 0}, 400, "tick"),
        ("/api/rewind", {"tick": 1}, 400, "no log for tick 1"),
        ("/api/rewind", {"tick": 5}, 400, "expected 1..1"),
        ("/api/fork", {"tick": 3, "to": "later"}, 400, "expected 1..1"),
        ("/api/fork", {"to": "later"}, 400, "tick"),
    ]
    for path, body, status, named in cases:
        answer = await _post(client, path, body)
        assert answer.status == status, (path, body, await answer.text())
        assert named in (await answer.json())["error"], (path, body)
    broken = await client.post(
        "/api/run", data=b"{not json", headers={**BEARER, "Content-Type": "application/json"}
    )
    assert broken.status == 400 and "not JSON" in (await broken.json())["error"]
    for bad in ("/api/world?limit=0", "/api/world?offset=x", "/api/ticks/-1"):
        assert (await client.get(bad, headers=BEARER)).status in (400, 404), bad
    assert tree(world, logs=True) == before


async def test_request_bodies_are_size_limited(client: TestClient[Any, Any], world: Path):
    before = tree(world, logs=True)
    huge = {"everywhere": True, "text": "x" * (MAX_BODY + 10)}
    refused = await _post(client, "/api/inject", huge)
    assert refused.status == 413
    assert tree(world, logs=True) == before


async def test_read_only_refuses_every_change(world: Path):
    served = await _client(world, read_only=True)
    before = tree(world.parent, logs=True)
    try:
        assert (await served.get("/api/world", headers=BEARER)).status == 200
        for path, body in [
            ("/api/run", {"ticks": 1}),
            ("/api/step", {}),
            ("/api/pause", {}),
            ("/api/inject", {"everywhere": True, "text": "x"}),
            ("/api/set", {"assignment": 'ada.state.mood="x"'}),
            ("/api/ask", {"everyone": True, "question": "hi?"}),
            ("/api/rewind", {"tick": 1}),
            ("/api/fork", {"tick": 1, "to": "elsewhere"}),
        ]:
            refused = await _post(served, path, body)
            assert refused.status == 403, path
            assert "read-only" in (await refused.json())["error"]
    finally:
        await served.close()
    assert tree(world.parent, logs=True) == before


async def test_the_api_key_appears_nowhere(world: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    served = await _client(world)
    try:
        await _post(served, "/api/step", {})
        await _until_idle(served)
        bodies = []
        for path in ("/api/world", "/api/ticks/1", "/api/history", "/api/run", "/"):
            answer = await served.get(path, headers=BEARER)
            bodies.append(await answer.text() + str(answer.headers))
        for name in ("page.js", "page.css"):
            bodies.append(await (await served.get(f"/static/{name}")).text())
        assert not any(SECRET in body for body in bodies)
    finally:
        await served.close()


async def test_world_text_is_returned_as_data_never_markup(world: Path):
    ada = world / "characters" / "ada.json"
    data = orjson.loads(ada.read_bytes())
    data["identity"]["name"] = HOSTILE
    ada.write_bytes(orjson.dumps(data))
    served = await _client(world)
    try:
        answer = await served.get("/api/world", headers=BEARER)
        assert answer.headers["Content-Type"].startswith("application/json")
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        names = [c["name"] for c in (await answer.json())["characters"]]
        assert HOSTILE in names
    finally:
        await served.close()


# -- the command ------------------------------------------------------------------------


def _serve(world: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", "--world", str(world), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


async def test_the_command_prints_the_address_with_its_token_first(world: Path):
    process, url = _serve(world)
    try:
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url
        base, _, token = url.partition("/?token=")
        async with ClientSession() as session:
            async with session.get(f"{base}/api/world") as refused:
                assert refused.status == 401
            headers = {"Authorization": f"Bearer {token}"}
            async with session.get(f"{base}/api/world", headers=headers) as answer:
                assert answer.status == 200
                assert (await answer.json())["tick"] == 0
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err


async def test_another_host_than_loopback_warns_and_still_needs_the_token(world: Path):
    process, url = _serve(world, "--host", "0.0.0.0")
    try:
        port = url.split(":")[2].split("/")[0]
        async with (
            ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/api/world") as refused,
        ):
            assert refused.status == 401
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert "warning: listening on 0.0.0.0" in err


def test_bad_workers_exit_2_before_serving(tmp_path: Path, world: Path):
    """``sim serve --workers`` is read as ``sim tick``'s: a bad count, a Ray address
    without Ray, or workers for a sweep's folder (whose runs the page lists, not runs)
    exits 2 naming the option, and serves nothing."""
    bad = _sim("serve", "--world", str(world), "--workers", "0")
    assert bad.returncode == 2 and "--workers" in bad.stderr and not bad.stdout
    bad = _sim("serve", "--world", str(world), "--ray-address", "127.0.0.1:1")
    assert bad.returncode == 2 and "--ray-address is for --executor ray" in bad.stderr
    out = tmp_path / "sweep"
    done = _sim("sweep", "--world", str(world), "--seeds", "1", "--ticks", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    bad = _sim("serve", "--world", str(out), "--workers", "2")
    assert bad.returncode == 2 and "is a sweep's folder" in bad.stderr and not bad.stdout


def test_a_bad_world_exits_2_before_serving(tmp_path: Path):
    broken = tmp_path / "w"
    shutil.copytree(copy_demo(tmp_path / "d"), broken)
    (broken / "world.json").write_text("{")
    done = CliRunner().invoke(main, ["serve", "--world", str(broken)])
    assert done.exit_code == 2, done.output
    assert "world.json" in done.output


def test_the_docs_example_drives_a_running_server(world: Path):
    """docs/serve.md's Python example, pointed at a real ``sim serve``, runs a tick."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    process, url = _serve(world)
    try:
        example = re.sub(r'url = "[^"]*"', f"url = {url!r}", code.group(1))
        exec(compile(example, "docs/serve.md", "exec"), {})
        deadline = time.monotonic() + 60
        while orjson.loads((world / "world.json").read_bytes())["tick"] != 1:
            assert time.monotonic() < deadline, "the example's tick did not commit"
            time.sleep(0.1)
    finally:
        process.terminate()
        process.communicate(timeout=60)


async def test_a_ticks_view_is_kept_until_what_it_reads_changes(client: TestClient[Any, Any]):
    """``/api/ticks/N`` is computed once, and again when the world's files change (the
    names it shows are the world's as they are now)."""
    await _post(client, "/api/step", {})
    await _until_idle(client)

    async def names() -> set[str]:
        view = await (await client.get("/api/ticks/1", headers=BEARER)).json()
        return {row["name"] for scene in view["scenes"] for row in scene["characters"]}

    assert "Ada Strand" in await names()
    assert await names() == await names()
    renamed = await _post(client, "/api/set", {"assignment": 'ada.identity.name="Ada Renamed"'})
    assert renamed.status == 200, await renamed.text()
    shown = await names()
    assert "Ada Renamed" in shown and "Ada Strand" not in shown


async def test_a_world_locked_by_another_process_is_a_409_and_a_run_says_why(
    client: TestClient[Any, Any], world: Path
):
    """While another process holds the world's lock (a ``sim tick`` running), a change
    answers 409 naming it and a run stops at once, its status saying why; nothing is
    written."""
    from sim.storage import Storage

    before = tree(world, logs=True)
    with Storage(world).lock():
        refused = await _post(client, "/api/inject", {"everywhere": True, "text": "x"})
        assert refused.status == 409
        assert "another sim process" in (await refused.json())["error"]
        assert (await _post(client, "/api/run", {"ticks": 2})).status == 202
        state = await _until_idle(client)
    assert state["done"] == 0 and "another sim process" in state["error"]
    assert tree(world, logs=True) == before


# -- rewind and fork ----------------------------------------------------------------------


async def test_rewind_and_fork_equal_sim_rewind_and_sim_fork(tmp_path: Path, world: Path):
    """``POST /api/rewind`` and ``POST /api/fork`` do what ``sim rewind`` and ``sim fork``
    do, byte for byte: the same world, the same logs moved aside, the same new world."""
    done = _sim("tick", "--world", str(world), "--ticks", "2")
    assert done.returncode == 0, done.stderr
    other = tmp_path / "other" / "demo"
    shutil.copytree(world, other)
    served = await _client(world)
    try:
        forked = await _post(served, "/api/fork", {"tick": 2, "to": "branch"})
        assert forked.status == 201, await forked.text()
        made = await forked.json()
        assert made["world"] == "branch" and made["tick"] == 1 and made["next_tick"] == 2
        assert Path(made["path"]) == world.parent / "branch"
        rewound = await _post(served, "/api/rewind", {"tick": 2})
        assert rewound.status == 200, await rewound.text()
        assert (await rewound.json()) == {
            "tick": 1,
            "next_tick": 2,
            "logs_moved": 1,
            "moved_to": "rewound-1",
        }
        view = await (await served.get("/api/world", headers=BEARER)).json()
        assert view["tick"] == 1 and view["logged"] == [1]
    finally:
        await served.close()
    for args in (
        ("fork", "--world", str(other), "--tick", "2", "--to", str(other.parent / "branch")),
        ("rewind", "--world", str(other), "--tick", "2"),
    ):
        done = _sim(*args)
        assert done.returncode == 0, done.stderr
    assert tree(world, logs=True) == tree(other, logs=True)
    assert tree(world.parent / "branch", logs=True) == tree(other.parent / "branch", logs=True)


async def test_a_rewind_waits_for_no_run(client: TestClient[Any, Any], world: Path):
    assert (await _post(client, "/api/run", {"ticks": 50})).status == 202
    refused = await _post(client, "/api/rewind", {"tick": 1})
    assert refused.status == 409 and "a run is going" in (await refused.json())["error"]
    await _post(client, "/api/pause", {})
    await _until_idle(client)


@pytest.mark.parametrize(
    "target",
    [
        "../escaped",
        "..",
        ".",
        "a/../../escaped",
        "sub/dir",
        "/tmp/escaped",
        "a\\b",
        ".hidden",
        "-rf",
        "a..b",
        "name\n",
        "x" * 101,
        "caf\u00e9",
        "nul\u0000",
        "",
        5,
        None,
        "demo",  # the world itself
        "taken",  # an empty folder
        "dangling",  # a link to nowhere
        "linked",  # a link to a folder
        "file.txt",
    ],
)
async def test_a_fork_may_only_make_a_new_folder_beside_the_world(
    tmp_path: Path, world: Path, target: Any
):
    """A hostile ``to`` (a path, ``..``, a hidden or odd name, something that exists, even
    an empty folder or a dangling link) is a 400 naming ``to``, and nothing is written
    anywhere."""
    done = _sim("tick", "--world", str(world))
    assert done.returncode == 0, done.stderr
    (tmp_path / "taken").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "aim").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "aim")
    (tmp_path / "file.txt").write_text("x")
    before = tree(tmp_path, logs=True)
    listed = sorted(os.listdir(tmp_path))
    served = await _client(world)
    try:
        refused = await _post(served, "/api/fork", {"tick": 1, "to": target})
        assert refused.status == 400, await refused.text()
        assert "to" in (await refused.json())["error"]
    finally:
        await served.close()
    assert tree(tmp_path, logs=True) == before
    assert sorted(os.listdir(tmp_path)) == listed
    assert not (tmp_path.parent / "escaped").exists() and not Path("/tmp/escaped").exists()
    assert os.listdir(tmp_path / "aim") == []


# -- the relationships network ------------------------------------------------------------


def _tie(world: Path, cid: str, other: str, kind: str, trust: float) -> None:
    path = world / "characters" / f"{cid}.json"
    data = orjson.loads(path.read_bytes())
    data.setdefault("relationships", {})[other] = {"kind": kind, "trust": trust}
    path.write_bytes(orjson.dumps(data))


async def test_the_network_draws_each_tie_once_by_character(world: Path):
    _tie(world, "ada", "bram", "rival", 0.2)
    _tie(world, "bram", "ada", "rival", 0.3)
    _tie(world, "orla", "ada", "sister", 0.9)
    served = await _client(world)
    try:
        net = await (await served.get("/api/network", headers=BEARER)).json()
    finally:
        await served.close()
    assert net["by"] == "character" and net["total_characters"] == 10
    assert net["total_ties"] == 2
    assert net["edges"] == [
        {"a": "ada", "b": "bram", "kind": "rival", "trust": 0.2, "mutual": True},
        {"a": "orla", "b": "ada", "kind": "sister", "trust": 0.9, "mutual": False},
    ]
    names = {n["id"]: n["name"] for n in net["nodes"]}
    assert names["ada"] == "Ada Strand" and len(names) == 10
    places = [n["location"] for n in net["nodes"]]
    assert places == sorted(places)  # grouped by place (ids sort as the places do here)


async def test_a_big_network_is_drawn_by_place(world: Path, monkeypatch: pytest.MonkeyPatch):
    """Past ``NETWORK_CHARACTERS``, ties are counted between and within places: the page
    never gets one node per character."""
    from sim.serve import views
    from sim.storage import Storage

    _tie(world, "ada", "bram", "rival", 0.2)
    _tie(world, "orla", "ada", "sister", 0.9)
    monkeypatch.setattr(views, "NETWORK_CHARACTERS", 3)
    where = {
        cid: orjson.loads((world / "characters" / f"{cid}.json").read_bytes())["state"]["location"]
        for cid in ("ada", "bram", "orla")
    }
    served = await _client(world)
    try:
        net = await (await served.get("/api/network", headers=BEARER)).json()
    finally:
        await served.close()
    assert net["by"] == "place" and net["total_ties"] == 2
    assert net["place_pairs"] == len(net["edges"])
    assert sum(n["count"] for n in net["nodes"]) == 10
    ties = sum(n["ties"] for n in net["nodes"]) + sum(e["ties"] for e in net["edges"])
    assert ties == 2
    for a, b in (("ada", "bram"), ("orla", "ada")):
        pa, pb = sorted((where[a], where[b]))
        if pa == pb:
            assert next(n for n in net["nodes"] if n["id"] == pa)["ties"] >= 1
        else:
            assert any(e["a"] == pa and e["b"] == pb for e in net["edges"])
    # past NETWORK_TIES pairs of places, only the most tied are drawn
    monkeypatch.setattr(views, "NETWORK_TIES", 1)
    capped = views.network_view(Storage(world).load())
    assert capped["place_pairs"] == 2 and len(capped["edges"]) == 1


# -- a study's or a sweep's folder ----------------------------------------------------------

STUDY = """\
world = "w"
seeds = "1"
ticks = 2
[conditions.control]
[conditions.announce]
inject = [{ tick = 2, at = "square", text = "The lord will pay half the mill." }]
"""


def _runs(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['group']}/{r['name']}" if r["group"] else r["name"]: r for r in view["runs"]}


async def test_a_study_folder_lists_its_arms_and_their_progress_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``GET /api/runs`` on a study's folder (an offline study) lists each arm with its
    tick and status, read again on each request: a run rewound and ticked on elsewhere
    shows as it goes. Changes are refused; nothing is written."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    done = runner.invoke(main, ["init", str(tmp_path / "w")])
    assert done.exit_code == 0, done.output
    (tmp_path / "study.toml").write_text(STUDY)
    done = runner.invoke(main, ["study", "run", "study.toml", "--out", "out"])
    assert done.exit_code == 0, done.output
    out = tmp_path / "out"
    served = await _client(out)
    try:
        view = await (await served.get("/api/runs", headers=BEARER)).json()
        assert view["kind"] == "study" and view["ticks"] == 2
        assert view["total"] == 2 and view["finished"] == 2
        runs = _runs(view)
        assert set(runs) == {"control/seed-1", "announce/seed-1"}
        arm = runs["announce/seed-1"]
        assert arm["status"] == "finished" and arm["tick"] == arm["target"] == 2
        assert arm["seed"] == 1 and arm["start_tick"] == 0
        # the arm is put back a tick elsewhere: waiting, then finished again
        run_dir = str(out / "announce" / "seed-1")
        assert _sim("rewind", "--world", run_dir, "--tick", "2").returncode == 0
        arm = _runs(await (await served.get("/api/runs", headers=BEARER)).json())["announce/seed-1"]
        assert arm["status"] == "waiting" and arm["tick"] == 1
        # a tick begun (its log open) and not committed: in progress
        opened = out / "announce" / "seed-1" / ".sim" / "log" / "tick-000002.jsonl"
        opened.parent.mkdir(parents=True, exist_ok=True)
        opened.write_text("")
        arm = _runs(await (await served.get("/api/runs", headers=BEARER)).json())["announce/seed-1"]
        assert arm["status"] == "in progress"
        opened.unlink()
        before = tree(out, logs=True)
        refused = await _post(served, "/api/run", {"ticks": 1})
        assert refused.status == 403 and "study's folder" in (await refused.json())["error"]
        assert tree(out, logs=True) == before
        # an arm's folder swapped for a link to another world: shown as such, not followed
        arm_dir = out / "control" / "seed-1"
        shutil.move(arm_dir, tmp_path / "moved")
        arm_dir.symlink_to(tmp_path / "moved")
        arm = _runs(await (await served.get("/api/runs", headers=BEARER)).json())["control/seed-1"]
        assert arm["status"] == "unreadable" and "symlink" in arm["problem"]
        assert arm["tick"] is None and arm["seed"] is None
    finally:
        await served.close()
    world = await _client(tmp_path / "w")
    try:
        plain = await (await world.get("/api/runs", headers=BEARER)).json()
        assert plain == {"kind": None, "runs": []}
    finally:
        await world.close()


async def test_a_sweep_folder_lists_its_runs_and_a_link_is_not_followed(tmp_path: Path):
    world = copy_demo(tmp_path / "demo")
    out = tmp_path / "sweep"
    done = _sim("sweep", "--world", str(world), "--seeds", "1-2", "--ticks", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out / "seed-1", elsewhere)
    (out / "seed-9").symlink_to(elsewhere)
    served = await _client(out)
    try:
        view = await (await served.get("/api/runs", headers=BEARER)).json()
    finally:
        await served.close()
    assert view["kind"] == "sweep" and view["ticks"] is None
    runs = _runs(view)
    assert set(runs) == {"seed-1", "seed-2"}  # the link is no run of this sweep
    assert runs["seed-2"]["tick"] == 1 and runs["seed-2"]["status"] == "stopped"
    assert runs["seed-2"]["seed"] == 2 and runs["seed-2"]["target"] is None


def test_the_command_serves_a_study_folder_and_a_broken_record_exits_2(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "study.json").write_text("{")
    done = CliRunner().invoke(main, ["serve", "--world", str(out)])
    assert done.exit_code == 2, done.output
    assert "study.json" in done.output


# -- what retrieval chose -------------------------------------------------------------------


async def test_the_inspector_shows_what_retrieval_chose_or_a_window(tmp_path: Path):
    """In ``worlds/minds`` (``[memory] mode = "retrieve"``) a character's view carries
    the cells retrieval put in the last tick's intention input, as the log recorded the
    call; in the demo (a window), the window's lines and ``"mode": "window"``."""
    from sim import sections
    from sim.ticklog.format import existing_log
    from sim.ticklog.records import CallRecord

    repo = Path(__file__).resolve().parents[2]
    minds = tmp_path / "minds"
    shutil.copytree(repo / "worlds" / "minds", minds, ignore=shutil.ignore_patterns(".sim"))
    demo = copy_demo(tmp_path / "demo")
    for world in (minds, demo):
        done = _sim("tick", "--world", str(world), "--ticks", "3")
        assert done.returncode == 0, done.stderr
    sent = next(
        r
        for r in read_log(existing_log(minds, 3)).records
        if isinstance(r, CallRecord) and r.entity_key == "intention:ada"
    )
    doc = sections.loads(sent.input)
    assert doc is not None
    served = await _client(minds)
    try:
        ada = await (await served.get("/api/characters/ada", headers=BEARER)).json()
    finally:
        await served.close()
    recalled = ada["recalled"]
    assert recalled["tick"] == 3 and recalled["mode"] == "retrieve"
    assert recalled["lines"] == doc["memory"]["recall"] and recalled["lines"]
    assert all(line.startswith("tick ") for line in recalled["lines"])
    served = await _client(demo)
    try:
        ada = await (await served.get("/api/characters/ada", headers=BEARER)).json()
        before = await (await served.get("/api/characters/bram", headers=BEARER)).json()
    finally:
        await served.close()
    assert ada["recalled"]["mode"] == "window" and ada["recalled"]["tick"] == 3
    window = next(
        r
        for r in read_log(existing_log(demo, 3)).records
        if isinstance(r, CallRecord) and r.entity_key == "intention:ada"
    )
    shown = sections.loads(window.input)
    assert shown is not None and "recall" not in shown["memory"]
    assert ada["recalled"]["lines"] == shown["memory"]["recent"] and ada["recalled"]["lines"]
    assert before["recalled"]["problem"] is None


# -- a big world's opening --------------------------------------------------------------------


async def test_the_world_loaded_at_start_serves_the_first_request(
    world: Path, monkeypatch: pytest.MonkeyPatch
):
    """The server loads the world once as it starts (in the background); that load is
    what the first ``/api/world`` and ``/api/network`` answer from, not a second one, and
    a world with no tick logged has no history to read. A world its caller loaded
    (``Settings.loaded``) is not loaded again. A change to the world's files is loaded
    again."""
    from sim.serve import loading
    from sim.storage import Storage

    stamp = loading.world_stamp(world)
    loaded = Storage(world).load()
    loads: list[Path] = []
    real = loading.Storage

    class Counting(real):  # type: ignore[misc, valid-type]
        def load(self, *args: Any, **kwargs: Any) -> Any:
            loads.append(self.root)
            return super().load(*args, **kwargs)

    monkeypatch.setattr(loading, "Storage", Counting)
    config = build_config(None, world)
    paths = ("/api/world", "/api/network", "/api/history", "/api/characters/ada")
    for primed, expected in (((loaded, stamp), 0), (None, 1)):
        loads.clear()
        app = make_app(Settings(world, config, TOKEN, loaded=primed))
        served: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await served.start_server()
        try:
            for path in (*paths, "/api/world"):
                assert (await served.get(path, headers=BEARER)).status == 200, path
            assert len(loads) == expected
        finally:
            await served.close()
    loads.clear()
    served = TestClient(TestServer(make_app(Settings(world, config, TOKEN)), host="127.0.0.1"))
    await served.start_server()
    try:
        # no tick logged: no history read (it would load the world again), books null
        ada = await (await served.get("/api/characters/ada", headers=BEARER)).json()
        assert ada["books"] is None and ada["recalled"] is None
        assert len(loads) == 1
        changed = await _post(served, "/api/set", {"assignment": 'ada.state.mood="calm"'})
        assert changed.status == 200
        ada = await (await served.get("/api/characters/ada", headers=BEARER)).json()
        assert ada["entity"]["state"]["mood"] == "calm" and len(loads) == 2
    finally:
        await served.close()


async def test_stopping_ends_every_event_stream_a_stalled_or_a_late_one() -> None:
    """The server's stop ends each ``/api/events`` stream: one whose reader stalled until
    its queue filled (the end takes its oldest event's place), and one that connects
    while it stops. A stream left open held the stop for aiohttp's 60 s timeout."""
    from sim.serve.hub import QUEUE, Hub

    hub = Hub()
    stalled, quiet = hub.add(), hub.add()
    for n in range(QUEUE + 5):
        hub.publish("progress", {"n": n})
    hub.close()
    items = [stalled.get_nowait() for _ in range(stalled.qsize())]
    assert len(items) == QUEUE and items[-1] is None
    assert [quiet.get_nowait() for _ in range(quiet.qsize())][-1] is None
    late = hub.add()
    assert late.get_nowait() is None


async def test_a_stream_that_connects_once_the_stop_began_ends_at_once(world: Path) -> None:
    """A page's ``/api/events`` that reaches the server after its stop began (the
    ``on_shutdown`` that ends the streams has run) ends at once, after its ``hello``:
    it held the stop for aiohttp's 60 s shutdown timeout (a browser test, stopping its
    server as the page's stream connected, timed out so under load)."""
    client = await _client(world)
    try:
        await client.app.shutdown()  # what stopping runs before waiting for requests
        async with client.get("/api/events", headers=BEARER) as events:
            assert events.status == 200
            body = await asyncio.wait_for(events.read(), 10)
        assert body.startswith(b"event: hello\n")
    finally:
        await client.close()
