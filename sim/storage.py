"""Storage: load and validate a world folder, commit a tick atomically, lock the world.

Commit protocol (a redo journal, so a crash at any instant leaves tick N or N+1, never a
mix): every file the tick changes is first written into one journal file, which is
fsynced and then renamed to ``.sim/journal.json`` — that rename is the commit point. The
files are then written into place (each by write-to-temp and rename), the filesystem is
synced, and the journal removed. ``recover()`` — run under the lock before every tick —
replays a committed journal and discards an uncommitted one. One journal write and one
sync per tick keeps saves fast for worlds of thousands of files.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from sim.errors import InputError, SimError, WorldLockedError
from sim.world import ID_RE, Character, Entity, Location, World, WorldMeta

SIM_DIR = ".sim"
JOURNAL = f"{SIM_DIR}/journal.json"
JOURNAL_TMP = f"{SIM_DIR}/journal.tmp"

_libc_syncfs: Any = None
with contextlib.suppress(OSError, AttributeError, TypeError):
    _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    _libc_syncfs = _libc.syncfs


class InvalidWorld(SimError):
    """Every problem found in a world folder, one per line."""

    def __init__(self, problems: list[InputError]) -> None:
        self.problems = problems
        lines = [str(p) for p in problems]
        head = "world is invalid" + (f" ({len(lines)} problems)" if len(lines) > 1 else "")
        super().__init__(head + ":\n  " + "\n  ".join(lines))


def dump_json(data: Any) -> bytes:
    """Pretty-printed UTF-8 JSON with a trailing newline: the one format of world files."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_filesystem(path: Path) -> None:
    """Flush everything written on the filesystem holding ``path`` (one syscall)."""
    if _libc_syncfs is not None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if _libc_syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    os.sync()


def _describe(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        return f"expected an id matching {ID_RE.pattern} (got {err.get('input')!r})"
    msg = str(err["msg"])
    msg = msg[0].lower() + msg[1:] if msg else msg
    return f"expected {msg.removeprefix('input should be ')} (got {err.get('input')!r})"


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


class Storage:
    """Reads and writes one world folder.

    Args:
        root: the world folder (holding ``world.json``, ``characters/``, ``locations/``).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- loading ------------------------------------------------------------------------

    def _read(self, path: Path, model: type[BaseModel], problems: list[InputError]) -> Entity | None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            problems.append(InputError(path, None, f"cannot read: {exc.strerror}"))
            return None
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(InputError(path, None, f"malformed JSON: {exc}"))
            return None
        if not isinstance(data, dict):
            problems.append(InputError(path, None, "expected a JSON object at the top level"))
            return None
        try:
            normal: Entity = model.model_validate(data).model_dump(by_alias=True)
        except ValidationError as exc:
            for err in exc.errors():
                problems.append(InputError(path, _field(err["loc"]), _describe(err)))
            return None
        return normal

    def _read_kind(
        self, kind: str, model: type[BaseModel], problems: list[InputError], originals: dict[str, bytes]
    ) -> dict[str, Entity]:
        folder = self.root / kind
        out: dict[str, Entity] = {}
        if not folder.is_dir():
            return out
        for path in sorted(folder.glob("*.json")):
            entity = self._read(path, model, problems)
            if entity is None:
                continue
            entity_id = entity["identity"]["id"]
            if entity_id != path.stem:
                problems.append(
                    InputError(path, "identity.id",
                               f"id {entity_id!r} must equal the file name {path.stem!r}")
                )
                continue
            out[entity_id] = entity
            originals[f"{kind}/{path.name}"] = path.read_bytes()
        return out

    def load(self) -> World:
        """Load and validate the world; raise ``InvalidWorld`` listing every problem.

        Writes nothing.
        """
        if not self.root.is_dir():
            raise InputError(self.root, None, "world folder not found")
        problems: list[InputError] = []
        originals: dict[str, bytes] = {}
        meta_path = self.root / "world.json"
        if not meta_path.is_file():
            raise InvalidWorld([InputError(meta_path, None, "world.json is missing")])
        meta = self._read(meta_path, WorldMeta, problems)
        characters = self._read_kind("characters", Character, problems, originals)
        locations = self._read_kind("locations", Location, problems, originals)
        if meta is not None:
            originals["world.json"] = meta_path.read_bytes()

        for cid in sorted(set(characters) & set(locations)):
            problems.append(
                InputError(self.root / "locations" / f"{cid}.json", "identity.id",
                           f"duplicate id {cid!r}: also used by characters/{cid}.json")
            )
        for cid, char in characters.items():
            where = char["state"]["location"]
            if where not in locations:
                problems.append(
                    InputError(self.root / "characters" / f"{cid}.json", "state.location",
                               f"unknown location {where!r}; expected one of the ids in locations/")
                )
        for lid, loc in locations.items():
            for i, target in enumerate(loc["state"]["connections"]):
                if target not in locations:
                    problems.append(
                        InputError(self.root / "locations" / f"{lid}.json",
                                   f"state.connections.{i}",
                                   f"connection to missing location {target!r}")
                    )
        if not locations and not problems:
            problems.append(InputError(self.root / "locations", None, "a world needs at least one location"))
        if problems:
            raise InvalidWorld(problems)
        assert meta is not None
        return World(self.root, meta, characters, locations, originals)

    # -- committing ---------------------------------------------------------------------

    def changed_files(self, world: World) -> dict[str, bytes]:
        """Entity and world files whose serialised form differs from what was loaded."""
        out: dict[str, bytes] = {}
        for kind, entities in (("characters", world.characters), ("locations", world.locations)):
            for entity_id, entity in entities.items():
                rel = f"{kind}/{entity_id}.json"
                data = dump_json(entity)
                if world.originals.get(rel) != data:
                    out[rel] = data
        meta = dump_json(world.meta)
        if world.originals.get("world.json") != meta:
            out["world.json"] = meta
        return out

    def commit(self, world: World, extra: Mapping[str, bytes | None] | None = None) -> list[str]:
        """Atomically write every changed entity, ``world.json`` and ``extra`` files.

        Args:
            world: the mutated world (its ``meta["tick"]`` already advanced).
            extra: more files relative to the world folder: bytes to write, ``None`` to delete.

        Returns:
            The relative paths written or deleted.
        """
        files: dict[str, bytes | None] = dict(self.changed_files(world))
        files.update(extra or {})
        for rel in files:
            self._check_rel(rel)
        sim_dir = self.root / SIM_DIR
        sim_dir.mkdir(exist_ok=True)
        journal = {
            "version": 1,
            "files": {rel: (None if b is None else b.decode("utf-8")) for rel, b in files.items()},
        }
        tmp = self.root / JOURNAL_TMP
        with open(tmp, "wb") as handle:
            handle.write(orjson.dumps(journal))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.root / JOURNAL)  # the commit point
        _fsync_dir(sim_dir)
        self._apply(files)
        for rel, data in files.items():
            if data is not None:
                world.originals[rel] = data
            else:
                world.originals.pop(rel, None)
        return sorted(files)

    def _check_rel(self, rel: str) -> None:
        path = Path(rel)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(f"refusing to write outside the world folder: {rel!r}")

    def _apply(self, files: Mapping[str, bytes | None]) -> None:
        made: set[Path] = set()
        for rel, data in files.items():
            target = self.root / rel
            if data is None:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()
                continue
            parent = target.parent
            if parent not in made:
                parent.mkdir(parents=True, exist_ok=True)
                made.add(parent)
            tmp = target.with_name(target.name + ".sim-tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        _sync_filesystem(self.root)
        (self.root / JOURNAL).unlink()
        _fsync_dir(self.root / SIM_DIR)

    def pending_journal(self) -> bool:
        """Whether a committed tick is waiting to be written into place."""
        return (self.root / JOURNAL).is_file()

    def recover(self) -> bool:
        """Finish a commit interrupted by a crash, or discard an uncommitted one.

        Call with the lock held. Returns whether a committed journal was replayed.
        """
        with contextlib.suppress(FileNotFoundError):
            (self.root / JOURNAL_TMP).unlink()
        journal_path = self.root / JOURNAL
        if not journal_path.is_file():
            return False
        journal = orjson.loads(journal_path.read_bytes())
        files = {
            rel: (None if text is None else text.encode("utf-8"))
            for rel, text in journal["files"].items()
        }
        for rel in files:
            self._check_rel(rel)
        self._apply(files)
        return True

    # -- locking ------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the world's lock; a second process gets ``WorldLockedError`` at once.

        The lock is an ``flock`` on the world folder itself, so taking it writes nothing
        and a crashed holder releases it automatically.
        """
        if not self.root.is_dir():
            raise InputError(self.root, None, "world folder not found")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WorldLockedError(
                    f"{self.root}: another sim process is running this world; "
                    "wait for it to finish, then run the command again"
                ) from None
            yield
        finally:
            os.close(fd)
