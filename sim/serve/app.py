"""The web application: the page, its JSON API and its server-sent events (``make_app``).

Every request passes the trust boundary first (``sim.serve.boundary``: the token or the
page's session cookie, ``Host``, ``Origin``, JSON bodies, the body limit, read-only, the
security headers); a library error becomes a 4xx naming it (``problems``), and what needs
the world waits for its load (``loaded``). Every control calls what the matching command
calls (``sim.interventions.inject`` / ``set_field``, ``sim.interview.ask``, the ``Runner``,
``sim.engine.rewind.rewind`` / ``fork``),
under the world's lock where the command takes it. Nothing answered holds the config's
API key: no endpoint shows the config. Events reach the page's streams through the
``Hub`` (``sim.serve.hub``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.config import Config
from sim.errors import InputError, SimError, UserError, WorldLockedError
from sim.llm.errors import LLMError
from sim.llm.redact import redact_text
from sim.serve import loading, runs, views
from sim.serve.boundary import MAX_BODY, SECURITY_HEADERS, Handler, guard, headers, problem
from sim.serve.driver import Busy, Driver
from sim.serve.hub import Hub
from sim.world import World

#: ticks one ``POST /api/run`` may ask for
MAX_RUN = 10_000
#: the longest name a fork's folder may have (``POST /api/fork``)
FOLDER_NAME_MAX = 100
#: what a fork's folder's name may hold: letters, digits, ``.``, ``_`` and ``-``, starting
#: with a letter or digit (no separator, no ``..``, nothing hidden, nothing a shell reads)
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: how often the world's tick is read to notice a tick committed by another process (s)
POLL_SECONDS = 0.5
#: the page's files, shipped in the package (``static/``)
STATIC = {
    "page.js": "text/javascript",
    "page.css": "text/css",
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RunBody(_Body):
    ticks: int = Field(ge=1, le=MAX_RUN)


class InjectBody(_Body):
    text: str = Field(min_length=1)
    at: str | None = None
    everywhere: bool = False


class SetBody(_Body):
    #: ``ENTITY.FIELD.PATH=JSON_VALUE``, as ``sim set`` takes it
    assignment: str = Field(min_length=1)


class RewindBody(_Body):
    #: go back to the state at the start of this tick (as ``sim rewind --tick``)
    tick: int = Field(ge=1, le=10**9)


class ForkBody(_Body):
    #: start the new world from the state at the start of this tick (as ``sim fork --tick``)
    tick: int = Field(ge=1, le=10**9)
    #: the new world's folder: a new name beside the world's folder, nothing else
    to: str = Field(min_length=1, max_length=FOLDER_NAME_MAX)
    seed: int | None = Field(default=None, ge=0)


class AskBody(_Body):
    question: str = Field(min_length=1)
    character: str | None = None
    everyone: bool = False


@dataclass
class Settings:
    """What one server serves, and how."""

    world_dir: Path
    config: Config
    token: str
    read_only: bool = False
    #: the page's session cookie's value (set by opening ``/?token=TOKEN``)
    session: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    #: ``world_dir`` is a study's or a sweep's folder (its runs are listed, not changed)
    runs: runs.Kind | None = None
    #: the world as the caller loaded it, and its stamp taken before (``WorldCache.prime``);
    #: ``None``: the server loads it in the background as it starts
    loaded: tuple[World, tuple[int, ...]] | None = None
    #: told how a load of the world in the background ended, or how another turned it
    #: from ready to invalid or back (on the loading thread: ``WorldCache.on_loaded``)
    on_loaded: Callable[[loading.Status], None] | None = None
    #: a run's ticks on this many shards of the world (``sim serve --workers``), each a
    #: process, or a Ray actor (``executor``, ``ray_address``): as ``sim tick --workers``
    workers: int = 1
    executor: str = "local"
    ray_address: str | None = None


SETTINGS = web.AppKey("settings", Settings)
DRIVER = web.AppKey("driver", Driver)
CACHE = web.AppKey("cache", loading.WorldCache)
LOGS = web.AppKey("logs", views.LogViews)


HUB = web.AppKey("hub", Hub)


def _error_text(exc: SimError) -> str:
    if isinstance(exc, InputError) and exc.path is None:
        return f"{exc.field}: {exc.problem}" if exc.field else exc.problem
    return str(exc)


async def _body(request: web.Request, model: type[_Body]) -> Any:
    """The request's JSON body as ``model``; a 400 naming the problem otherwise."""
    raw = await request.read()
    try:
        data = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        raise _HTTPProblem(400, f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _HTTPProblem(400, "expected a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise _HTTPProblem(400, f"{where}: {first['msg']}") from None


class _HTTPProblem(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Library errors as JSON with a 4xx naming the problem (never a traceback)."""
    try:
        return await handler(request)
    except _HTTPProblem as exc:
        return problem(exc.status, exc.message)
    except loading.Loading as exc:
        return web.json_response(
            {
                "error": "the world is still loading (every file is read and validated); "
                "ask again in a moment, or wait for the 'loaded' event",
                "load": exc.status.to_dict(),
            },
            status=503,
            headers={"Retry-After": "1"},
        )
    except loading.Unloadable as exc:
        return web.json_response(
            {
                "error": redact_text(f"the world could not be loaded: {exc}"),
                "load": exc.status.to_dict(),
            },
            status=422,
            dumps=_dumps,
        )
    except WorldLockedError as exc:
        return problem(409, str(exc))
    except Busy as exc:
        return problem(409, str(exc))
    except UserError as exc:
        return problem(400, _error_text(exc))
    except LLMError as exc:
        return problem(502, f"{type(exc).__name__}: {exc}")


#: what answers while the world loads: the page, the events, the run's state, the runs
NO_WORLD = {"/api/events", "/api/runs", "/api/pause"}
#: what may be answered from a big world's first look while it loads (``?preview=1``)
PREVIEWED = {"/api/world", "/api/network"}


def _preview(request: web.Request) -> bool:
    """Whether the request asks for the first look while the world loads (``?preview=1``)."""
    raw = request.query.get("preview", "0")
    if raw not in ("0", "1"):
        raise _HTTPProblem(400, f"preview: expected 0 or 1 (got {raw!r})")
    return request.path in PREVIEWED and raw == "1"


@web.middleware
async def loaded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request that reads or changes the world waits a little for its first load, then
    is told it is loading (a 503, ``Retry-After``); one that asks for the first look
    (``?preview=1``) waits for it or for the load."""
    path = request.path
    if (
        path.startswith("/api/")
        and path not in NO_WORLD
        and not (path == "/api/run" and request.method == "GET")
    ):
        await request.app[CACHE].ready(preview=_preview(request))
    return await handler(request)


# -- the page ---------------------------------------------------------------------------


def _static(name: str) -> bytes:
    return resources.files("sim.serve").joinpath("static", name).read_bytes()


async def index(request: web.Request) -> web.StreamResponse:
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC:
        return problem(404, f"no file {name!r}")
    return web.Response(body=_static(name), content_type=STATIC[name], charset="utf-8")


# -- reading ----------------------------------------------------------------------------


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _HTTPProblem(400, f"{name}: expected a whole number (got {raw!r})") from None
    if not low <= value <= high:
        raise _HTTPProblem(400, f"{name}: expected {low} to {high} (got {value})")
    return value


async def get_world(request: web.Request) -> web.StreamResponse:
    offset = _int(request, "offset", 0, 0, 10**9)
    limit = _int(request, "limit", views.PAGE, 1, views.MAX_PAGE)
    cache, preview = request.app[CACHE], _preview(request)

    def read() -> dict[str, Any]:
        look = cache.first_look("places", views.places_view) if preview else None
        world, places = look or cache.derived("places", views.places_view)
        view = views.world_view(world, offset, limit, places)
        view["read_only"] = request.app[SETTINGS].read_only
        view["run"] = request.app[DRIVER].state.to_dict()
        view["preview"] = look is not None
        view["load"] = cache.status.to_dict() if look is not None else None
        return view

    return web.json_response(await asyncio.to_thread(read), dumps=_dumps)


async def get_network(request: web.Request) -> web.StreamResponse:
    cache, preview = request.app[CACHE], _preview(request)

    def read() -> dict[str, Any]:
        look = cache.first_look("network", views.network_view) if preview else None
        _, view = look or cache.derived("network", views.network_view)
        return {**view, "preview": look is not None}

    return web.json_response(await asyncio.to_thread(read), dumps=_dumps)


async def get_character(request: web.Request) -> web.StreamResponse:
    cid = request.match_info["id"]
    cache, logs = request.app[CACHE], request.app[LOGS]

    def read() -> dict[str, Any]:
        view = views.character_view(cache.get(), cid)
        view["books"] = logs.character_books(cid)
        view["recalled"] = logs.recalled(cid)
        return view

    try:
        view = await asyncio.to_thread(read)
    except InputError as exc:
        return problem(404, _error_text(exc))
    return web.json_response(view, dumps=_dumps)


async def get_tick(request: web.Request) -> web.StreamResponse:
    raw = request.match_info["n"]
    if not raw.isdigit() or len(raw) > 9:
        return problem(400, f"tick: expected a tick number (got {raw!r})")
    try:
        view = await asyncio.to_thread(request.app[LOGS].tick, int(raw))
    except InputError as exc:
        return problem(404, _error_text(exc))
    return web.json_response(view, dumps=_dumps)


async def get_history(request: web.Request) -> web.StreamResponse:
    return web.json_response(await asyncio.to_thread(request.app[LOGS].history), dumps=_dumps)


async def get_runs(request: web.Request) -> web.StreamResponse:
    """A study's or a sweep's runs and their progress (``kind`` ``null``: a world)."""
    folder = request.app[SETTINGS].world_dir

    def read() -> dict[str, Any]:
        view = runs.runs_view(folder)
        return {"kind": None, "runs": []} if view is None else view.to_dict()

    return web.json_response(await asyncio.to_thread(read), dumps=_dumps)


async def get_run(request: web.Request) -> web.StreamResponse:
    return web.json_response(request.app[DRIVER].state.to_dict())


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``hello`` (the tick, the run and the world's load), then
    ``preview`` (a big world's first look was taken: ``?preview=1`` answers from it),
    ``loaded`` (a load in the background ended: ready or invalid), ``run``, ``phase``,
    ``progress``, ``tick`` (a tick this server ran committed) and ``world`` (the world's
    tick changed, whoever ran it)."""
    hub, settings = request.app[HUB], request.app[SETTINGS]
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    response.headers.update(SECURITY_HEADERS)
    queue = hub.add()  # before the first await: a stop from here on ends this stream too
    try:
        await response.prepare(request)
        hello = {
            "tick": views.world_tick(settings.world_dir),
            "run": request.app[DRIVER].state.to_dict(),
            # a study's or a sweep's folder has no world to load
            "load": None if settings.runs else request.app[CACHE].status.to_dict(),
        }
        await response.write(_event("hello", hello))
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), 15)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            if item is None:
                break
            await response.write(_event(*item))
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        hub.listeners.discard(queue)
    return response


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


# -- changing ---------------------------------------------------------------------------


async def post_run(request: web.Request) -> web.StreamResponse:
    body = await _body(request, RunBody)
    request.app[DRIVER].start(body.ticks)
    return web.json_response(request.app[DRIVER].state.to_dict(), status=202)


async def post_step(request: web.Request) -> web.StreamResponse:
    await _body(request, _Body)
    request.app[DRIVER].start(1)
    return web.json_response(request.app[DRIVER].state.to_dict(), status=202)


async def post_pause(request: web.Request) -> web.StreamResponse:
    await _body(request, _Body)
    driver = request.app[DRIVER]
    if not driver.pause():
        return problem(409, "no run is going")
    return web.json_response(driver.state.to_dict())


def _idle(request: web.Request) -> None:
    if request.app[DRIVER].state.running:
        raise _HTTPProblem(409, "a run is going; pause it or wait for it to end")


async def post_inject(request: web.Request) -> web.StreamResponse:
    from sim.interventions import describe, inject

    body = await _body(request, InjectBody)
    if (body.at is None) == (not body.everywhere):
        raise _HTTPProblem(400, "expected exactly one of at and everywhere")
    _idle(request)
    made = await asyncio.to_thread(inject, request.app[SETTINGS].world_dir, body.text, body.at)
    return _made(made, describe(made.record))


async def post_set(request: web.Request) -> web.StreamResponse:
    from sim.interventions import describe, set_field

    body = await _body(request, SetBody)
    _idle(request)
    settings = request.app[SETTINGS]
    made = await asyncio.to_thread(set_field, settings.world_dir, body.assignment, settings.config)
    return _made(made, describe(made.record))


def _made(made: Any, text: str) -> web.Response:
    return web.json_response(
        {
            "recorded": text,
            "tick": made.tick,
            "applies_at_tick": made.applies_at,
            "pending": len(made.pending),
        }
    )


async def post_rewind(request: web.Request) -> web.StreamResponse:
    """``sim rewind --tick N``: the world back to the start of tick N, later logs aside."""
    from sim.engine import rewind as history

    body = await _body(request, RewindBody)
    _idle(request)
    done = await asyncio.to_thread(history.rewind, request.app[SETTINGS].world_dir, body.tick)
    return web.json_response(
        {
            "tick": body.tick - 1,
            "next_tick": body.tick,
            "logs_moved": done.logs_moved,
            "moved_to": done.moved_to.name if done.moved_to is not None else None,
        }
    )


def fork_destination(world_dir: Path, name: str) -> Path:
    """The folder ``name`` beside ``world_dir``, for ``POST /api/fork``: a request may only
    name a new folder there, never a path (no separator, no ``..``, no hidden name, no
    existing file, folder or link, not even an empty folder or a dangling link).

    Raises:
        _HTTPProblem: a 400 naming what is wrong with ``name``.
    """
    if not FOLDER_NAME.fullmatch(name) or ".." in name:
        raise _HTTPProblem(
            400,
            f"to: expected a new folder's name (letters, digits, '.', '_' and '-', starting "
            f"with a letter or digit, no '..'; got {name!r})",
        )
    parent = world_dir.resolve().parent
    dest = parent / name
    if os.path.lexists(dest):
        raise _HTTPProblem(400, f"to: {name!r} already exists beside the world; choose a new name")
    return dest


async def post_fork(request: web.Request) -> web.StreamResponse:
    """``sim fork --tick N --to NAME``: a new world beside this one; this one is only read."""
    from sim.engine import rewind as history

    body = await _body(request, ForkBody)
    world_dir = request.app[SETTINGS].world_dir
    dest = fork_destination(world_dir, body.to)
    made = await asyncio.to_thread(history.fork, world_dir, body.tick, dest, body.seed)
    return web.json_response(
        {
            "world": made.name,
            "path": str(made),
            "tick": body.tick - 1,
            "next_tick": body.tick,
        },
        status=201,
    )


async def post_ask(request: web.Request) -> web.StreamResponse:
    from sim.interview import ask

    body = await _body(request, AskBody)
    if (body.character is None) == (not body.everyone):
        raise _HTTPProblem(400, "expected exactly one of character and everyone")
    settings = request.app[SETTINGS]
    who = None if body.everyone else [str(body.character)]
    asked = await asyncio.to_thread(ask, settings.world_dir, settings.config, body.question, who)
    return web.json_response(
        {
            "tick": asked.tick,
            "question": asked.question,
            "answers": [
                {
                    "id": i.character,
                    "name": asked.names.get(i.character, i.character),
                    "answer": i.answer,
                    "error": i.error,
                }
                for i in asked.interviews
            ],
        },
        dumps=_dumps,
    )


# -- the application --------------------------------------------------------------------


async def _watch(app: web.Application) -> AsyncIterator[None]:
    """Publish ``world`` whenever the world's committed tick changes (any process)."""
    settings, hub, cache = app[SETTINGS], app[HUB], app[CACHE]
    loop = app[DRIVER].loop = asyncio.get_running_loop()

    def told(status: loading.Status) -> None:  # on the loading thread
        with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
            loop.call_soon_threadsafe(hub.publish, "loaded", status.to_dict())
        if settings.on_loaded is not None:
            settings.on_loaded(status)

    def looked(status: loading.Status) -> None:  # on the loading thread
        with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
            loop.call_soon_threadsafe(hub.publish, "preview", status.to_dict())

    cache.on_loaded, cache.on_look = told, looked
    if settings.runs is None and settings.loaded is None:
        cache.start()
    settings.loaded = None  # kept by the cache alone (dropped at the next change)

    async def poll() -> None:
        last = views.world_tick(settings.world_dir)
        while True:
            await asyncio.sleep(POLL_SECONDS)
            if cache.status.state == "invalid" and await asyncio.to_thread(cache.fixed):
                cache.start()  # its files changed since it failed: the page hears `loaded`
            tick = views.world_tick(settings.world_dir)
            if tick is not None and tick != last:
                last = tick
                hub.publish("world", {"tick": tick})

    task = asyncio.create_task(poll())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    hub.close()
    app[DRIVER].pause()
    await asyncio.to_thread(app[DRIVER].join)  # the tick running commits first


async def _close_listeners(app: web.Application) -> None:
    app[HUB].close()


def make_app(settings: Settings) -> web.Application:
    """The application serving ``settings.world_dir``."""
    app = web.Application(
        middlewares=[headers, guard(settings), problems, loaded], client_max_size=MAX_BODY
    )
    if settings.runs is None:
        settings.runs = runs.folder_kind(settings.world_dir)
    app[SETTINGS] = settings
    app[HUB] = Hub()
    app[CACHE] = loading.WorldCache(
        settings.world_dir,
        settings.config.limits.max_entity_bytes,
        warm={"places": views.places_view, "network": views.network_view},
    )
    if settings.loaded is not None:
        app[CACHE].prime(*settings.loaded)
    app[LOGS] = views.LogViews(settings.world_dir)
    app[DRIVER] = Driver(
        settings.world_dir,
        settings.config,
        app[HUB].publish,
        workers=settings.workers,
        executor=settings.executor,
        ray_address=settings.ray_address,
    )
    app.cleanup_ctx.append(_watch)
    app.on_shutdown.append(_close_listeners)
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/world", get_world)
    app.router.add_get("/api/characters/{id}", get_character)
    app.router.add_get("/api/network", get_network)
    app.router.add_get("/api/ticks/{n}", get_tick)
    app.router.add_get("/api/history", get_history)
    app.router.add_get("/api/run", get_run)
    app.router.add_get("/api/runs", get_runs)
    app.router.add_get("/api/events", events)
    app.router.add_post("/api/run", post_run)
    app.router.add_post("/api/step", post_step)
    app.router.add_post("/api/pause", post_pause)
    app.router.add_post("/api/inject", post_inject)
    app.router.add_post("/api/set", post_set)
    app.router.add_post("/api/ask", post_ask)
    app.router.add_post("/api/rewind", post_rewind)
    app.router.add_post("/api/fork", post_fork)
    return app
