"""The world the server answers from: loaded in the background, then kept until it changes.

``sim serve`` prints its address before the world is loaded: a 100,000-character world
takes seconds to read and validate, and the page can say "loading" meanwhile. The first
load runs on a thread of its own (``WorldCache.start``); a request that needs the world
waits for it a little (``WAIT``, so a small world's requests never see it loading), then
is told it is still loading (``Loading``, a 503). Every file is validated as ``sim tick``
validates it (``Storage.load``) before anything of it is answered. A world that does not
load is kept as its problems, each naming its file and field (``Unloadable``, a 422),
until its files change; then it is loaded again, in the background. A loaded world is
kept until its files change (``_stamp``); then the next request loads it again.

A big world (``preview_from`` entity files or more) gets a first look before its load in
the background (``sim.serve.preview``: each file read once, only the aggregated views'
fields kept, checked minimally): until the load ends, a request that asks for it
(``first_look``) is answered from it, and every other one waits or is told the world is
loading, as before. The load then replaces it, with the validated world or its problems.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from sim.errors import InputError, InvalidWorld, SimError
from sim.gcpause import gc_paused
from sim.pack import PACK, is_packed, read_pack
from sim.serve.preview import Preview, scan
from sim.storage import MAX_ENTITY_BYTES, Storage
from sim.world import World

#: how long a request waits for the first load before it is told the world is loading (s)
WAIT = 1.0

#: how often a waiting request looks whether the load has ended (s)
POLL = 0.02

#: how long a request for the first look waits while it is being taken (s): it is
#: answered the moment the look is there (about a second for 100,000 characters)
LOOK_WAIT = 10.0

#: the files named by a failed load whose change is watched (a fix loads the world again)
WATCHED = 50

#: the entity files from which a world gets a first look before its load in the background
#: (a smaller one loads within ``WAIT``; measured: 10,000 files load in about 0.4 s)
PREVIEW_FROM = 20_000

State = Literal["loading", "ready", "invalid"]


def _stamp(world_dir: Path) -> tuple[int, ...]:
    """Changes when a tick commits (it rewrites ``world.json``), when ``sim set`` or
    ``sim inject`` records an intervention (each rewrites ``.sim/interventions.json``; a
    set rewrites its entity in place), when an entity file is added or removed (its
    folder's mtime) and when a packed world's pack is replaced. An entity file edited by
    hand while serving shows after the next of these."""
    out: list[int] = []
    for rel in ("world.json", ".sim/interventions.json", "characters", "locations", PACK):
        out.extend(file_stamp(world_dir / rel))
    return tuple(out)


def file_stamp(path: Path) -> tuple[int, ...]:
    """A file's mtime, inode and size (``(-1,)``: it cannot be read)."""
    try:
        stat = os.stat(path)
    except OSError:
        return (-1,)
    return (stat.st_mtime_ns, stat.st_ino, stat.st_size)


def world_stamp(world_dir: Path) -> tuple[int, ...]:
    """What a loaded world is kept by (see ``_stamp``): taken before a load, so a change
    made while it loads is noticed at the next request."""
    return _stamp(world_dir)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the world: its file (relative to the world), field, what."""

    file: str | None
    field: str | None
    problem: str

    def to_dict(self) -> dict[str, str | None]:
        return {"file": self.file, "field": self.field, "problem": self.problem}


@dataclass(frozen=True)
class Status:
    """Where the world's load stands, as ``GET /api/world`` (503, 422) and the ``loaded``
    event tell it."""

    state: State
    #: the load's wall time (while loading: so far, as of ``checked``)
    seconds: float | None = None
    characters: int | None = None
    locations: int | None = None
    #: why the world could not be loaded (``state == "invalid"``), as the terminal shows it
    error: str | None = None
    problems: tuple[Problem, ...] = ()
    #: while loading: the entity files there are, and how many were checked so far
    files: int | None = None
    checked: int = 0
    #: the world's name and tick, from its ``world.json`` (validated first, on its own)
    name: str | None = None
    tick: int | None = None
    #: while loading: a first look is answered (``?preview=1``), and the entity files it
    #: left out for failing its minimal checks
    preview: bool = False
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "name": self.name,
            "tick": self.tick,
            "files": self.files,
            "checked": self.checked,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "characters": self.characters,
            "locations": self.locations,
            "error": self.error,
            "problems": [p.to_dict() for p in self.problems],
            "preview": self.preview,
            "skipped": self.skipped,
        }


class Loading(Exception):
    """The world is still being loaded (a 503: ask again soon)."""

    def __init__(self, status: Status) -> None:
        super().__init__("the world is still loading; ask again in a moment")
        self.status = status


class Unloadable(Exception):
    """The world could not be loaded: ``status`` names each problem (a 422)."""

    def __init__(self, status: Status) -> None:
        super().__init__(status.error or "the world could not be loaded")
        self.status = status


def _entity_files(world_dir: Path) -> int | None:
    """How many entity files the world has (``None``: a folder or the pack cannot be
    read)."""
    if is_packed(world_dir):
        try:
            return len(read_pack(world_dir, None))
        except (SimError, OSError):
            return None
    total = 0
    for kind in ("characters", "locations"):
        if (world_dir / kind).is_symlink():
            return None  # the load refuses it; not even its names are counted
        try:
            with os.scandir(world_dir / kind) as entries:
                total += sum(1 for entry in entries if entry.name.endswith(".json"))
        except OSError:
            return None
    return total


def _problems(world_dir: Path, exc: SimError) -> tuple[Problem, ...]:
    found = exc.problems if isinstance(exc, InvalidWorld) else [exc]
    out = []
    for item in found:
        if isinstance(item, InputError):
            file = None
            if item.path is not None:
                try:
                    file = item.path.relative_to(world_dir).as_posix()
                except ValueError:
                    file = str(item.path)
            out.append(Problem(file, item.field, item.problem))
        else:
            out.append(Problem(None, None, str(item)))
    return tuple(out)


@dataclass
class WorldCache:
    """The world as last loaded, loaded again only when its files changed, and what was
    derived from it (``derived``), kept as long as it is.

    Args:
        world_dir: the world folder.
        max_entity_bytes: the largest entity file loaded (``[limits] max_entity_bytes``).
        on_loaded: called with the status when a load in the background ends, or another
            turns the world from ready to invalid or back (on the loading thread, ``_lock``
            held).
        preview_from: the entity files from which a load in the background is preceded
            by a first look (``None``: ``PREVIEW_FROM``).
        warm: what is derived from the first look as soon as it is taken, by name (as
            ``first_look`` keeps it), on the loading thread: a request then does not
            compute it beside the load.
        on_look: called with the status when a first look has been taken (on the
            loading thread, ``_lock`` held; the load follows).
    """

    world_dir: Path
    max_entity_bytes: int = MAX_ENTITY_BYTES
    on_loaded: Callable[[Status], None] | None = None
    preview_from: int | None = None
    warm: dict[str, Callable[[World], Any]] = field(default_factory=dict)
    on_look: Callable[[Status], None] | None = None
    _stamp: tuple[int, ...] = ()
    _world: World | None = None
    _derived: dict[str, Any] = field(default_factory=dict)
    #: why the world last failed to load, and what it is kept by (its stamp, its files')
    _failed: tuple[tuple[Any, ...], Status] | None = None
    _status: Status = field(default_factory=lambda: Status("loading"))
    #: the first look and what was derived from it, while a load in the background runs
    _preview: tuple[Preview, dict[str, Any]] | None = None
    #: set while the first look is being taken
    _looking: threading.Event = field(default_factory=threading.Event)
    #: set while no load runs in the background
    _idle: threading.Event = field(default_factory=threading.Event)
    #: held while a load runs, and while a request reads what is kept
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: held while a load in the background is started
    _gate: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._idle.set()

    @property
    def status(self) -> Status:
        return self._status

    def prime(self, world: World, stamp: tuple[int, ...]) -> None:
        """Keep ``world``, loaded by the caller after ``stamp`` was taken."""
        with self._lock:
            self._keep(world, stamp, 0.0)

    def _keep(self, world: World, stamp: tuple[int, ...], seconds: float) -> None:
        self._world, self._stamp, self._derived, self._failed = world, stamp, {}, None
        self._status = Status(
            "ready", seconds, len(world.characters), len(world.locations), None, ()
        )

    def _load(self, background: bool = False) -> Status:
        """Load the world (under ``_lock``), keep it or why it failed; the status.
        ``on_loaded`` is told how a load in the background ended, and how any other one
        did when it turned the world from ready to invalid or back."""
        before = self._status.state
        stamp = _stamp(self.world_dir)
        started = time.perf_counter()
        if background:
            name, tick = self._meta()
            files = _entity_files(self.world_dir)
            self._status = Status("loading", files=files, name=name, tick=tick)
            least = PREVIEW_FROM if self.preview_from is None else self.preview_from
            if name is not None and files is not None and files >= least:
                self._looking.set()
                try:
                    self._look()
                finally:
                    self._looking.clear()
                started = time.perf_counter()  # the load's own time, after the look

        def progress(checked: int) -> None:
            if background:
                took = time.perf_counter() - started
                self._status = replace(self._status, checked=checked, seconds=took)

        try:
            with gc_paused():  # a big acyclic heap: measured 20-40% of a 100,000-file load
                world = Storage(self.world_dir, self.max_entity_bytes).load(progress)
        except SimError as exc:
            self._fail(stamp, str(exc), _problems(self.world_dir, exc), started)
        except RecursionError:
            self._fail(stamp, "input nested too deeply to process", (), started)
        except OSError as exc:
            self._fail(stamp, f"cannot read the world: {exc}", (), started)
        except Exception as exc:  # a fault of the load's own: said, not a traceback
            self._fail(stamp, f"the load failed: {type(exc).__name__}: {exc}", (), started)
        else:
            self._keep(world, stamp, time.perf_counter() - started)
        finally:
            self._preview = None  # the load's answer replaces the first look
        if self.on_loaded is not None and (background or self._status.state != before):
            with contextlib.suppress(OSError):  # a terminal gone: the page is still told
                self.on_loaded(self._status)
        return self._status

    def _look(self) -> None:
        """Take the first look (``sim.serve.preview.scan``) and derive ``warm`` from it;
        nothing when it cannot be taken (the load names the problem)."""
        try:
            look = scan(self.world_dir, self.max_entity_bytes)
            derived = {name: make(look.world) for name, make in self.warm.items()}
        except Exception:  # whatever stops the look (a folder, a fault), the load runs and says
            return
        self._preview = (look, derived)
        self._status = replace(self._status, preview=True, skipped=look.skipped)
        if self.on_look is not None:
            self.on_look(self._status)

    def first_look(self, name: str, make: Callable[[World], Any]) -> tuple[World, Any] | None:
        """The first look at the world and ``make`` of it (kept as ``name``), while a load
        in the background runs and has one; ``None`` otherwise (ask ``derived``). Its
        world holds only the views' fields (``sim.serve.preview``): never the world."""
        kept = self._preview
        if kept is None or self._idle.is_set():
            return None
        look, derived = kept
        if name not in derived:
            derived[name] = make(look.world)
        return look.world, derived[name]

    def _meta(self) -> tuple[str | None, int | None]:
        """The world's name and tick from its ``world.json`` alone, validated (``None``s:
        it does not validate; the load names the problem)."""
        try:
            meta = Storage(self.world_dir, self.max_entity_bytes).load_meta()
        except (SimError, OSError, RecursionError):
            return None, None
        return str(meta.get("name") or self.world_dir.name), int(meta["tick"])

    def _fail(
        self, stamp: tuple[int, ...], error: str, problems: tuple[Problem, ...], started: float
    ) -> None:
        self._world, self._derived = None, {}
        self._status = Status("invalid", time.perf_counter() - started, None, None, error, problems)
        self._failed = (self._failed_key(stamp, problems), self._status)

    def _failed_key(self, stamp: tuple[int, ...], problems: tuple[Problem, ...]) -> tuple[Any, ...]:
        """What a failed load is kept by: the world's stamp and the first ``WATCHED`` named
        files' (a file fixed in place is noticed too)."""
        files = sorted({p.file for p in problems if p.file is not None})[:WATCHED]
        return (stamp, tuple(file_stamp(self.world_dir / f) for f in files))

    def start(self) -> None:
        """Load the world on a thread of its own (``status`` is ``loading`` until it ends;
        ``on_loaded`` is called then). Nothing is done while one runs."""
        with self._gate:
            if not self._idle.is_set():
                return
            self._idle.clear()
            self._status = Status("loading")

        def run() -> None:
            try:
                with self._lock:
                    self._load(background=True)
            finally:
                self._idle.set()

        # a daemon: stopping the server does not wait for a load (it writes nothing)
        threading.Thread(target=run, name="sim-serve-load", daemon=True).start()

    async def ready(self, wait: float | None = None, *, preview: bool = False) -> None:
        """Wait up to ``wait`` seconds (``WAIT``) for a load running in the background;
        with ``preview``, or for its first look (while it is being taken: up to
        ``LOOK_WAIT``).

        Raises:
            Loading: it is still running (with ``preview``: and has no first look).
        """
        started = time.monotonic()
        deadline = started + (WAIT if wait is None else wait)
        while not self._idle.is_set() and not (preview and self._preview is not None):
            now = time.monotonic()
            if now >= deadline and not (
                preview and self._looking.is_set() and now < started + LOOK_WAIT
            ):
                raise Loading(self._status)
            await asyncio.sleep(POLL)

    def _current(self) -> tuple[World, dict[str, Any]]:
        """The world as its files are now, and what was derived from it so far."""
        if not self._idle.is_set():
            raise Loading(self._status)
        with self._lock:
            stamp = _stamp(self.world_dir)
            if self._world is not None and stamp == self._stamp:
                return self._world, self._derived
            failed = self._failed
            if failed is None:  # changed since it was loaded (or never loaded): load now
                self._world, self._derived = None, {}  # not held beside its next load
                self._load()
                if self._world is None:
                    raise Unloadable(self._status)
                return self._world, self._derived
            key, status = failed
            if key == self._failed_key(stamp, status.problems):
                raise Unloadable(status)
        # changed since it failed: loaded again in the background, as at the start
        self.start()
        raise Loading(self._status)

    def fixed(self) -> bool:
        """Whether the world failed to load and its files have changed since (the server
        then loads it again: ``start``)."""
        failed = self._failed
        if failed is None or not self._idle.is_set():
            return False
        key, status = failed
        return key != self._failed_key(_stamp(self.world_dir), status.problems)

    def get(self) -> World:
        """The world as its files are now.

        Raises:
            Loading: a load runs in the background (the first, or after a failed one).
            Unloadable: the world does not load, and has not changed since it failed.
        """
        return self._current()[0]

    def derived(self, name: str, make: Callable[[World], Any]) -> tuple[World, Any]:
        """The world as it is now and ``make(world)``, computed once per load."""
        world, kept = self._current()
        if name not in kept:
            kept[name] = make(world)
        return world, kept[name]
