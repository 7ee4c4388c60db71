"""Storage: load and validate a world folder, commit a tick atomically, lock the world.

Commit protocol (a redo journal, so a crash at any instant leaves tick N or N+1, never a
mix): every file the tick changes is first written into one journal file, which is
fsynced and then renamed to ``.sim/journal.json`` — that rename is the commit point. The
files are then overwritten in place (the journal makes that safe), the filesystem is
synced once, and the journal removed. ``recover()`` — run under the lock before every tick —
replays a committed journal and discards an uncommitted one. One journal write and one
sync per tick keeps saves fast for worlds of thousands of files.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from sim.errors import InputError, InvalidWorld, WorldLockedError
from sim.world import ID_RE, Character, Entity, Location, World, WorldMeta

SIM_DIR = ".sim"
JOURNAL = f"{SIM_DIR}/journal.json"
JOURNAL_TMP = f"{SIM_DIR}/journal.tmp"

_libc_syncfs: Any = None
with contextlib.suppress(OSError, AttributeError, TypeError):
    _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    _libc_syncfs = _libc.syncfs


def dump_json(data: Any) -> bytes:
    """Pretty-printed UTF-8 JSON with a trailing newline: the one format of world files."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"


_WRITE_THREADS = 8
_PARALLEL_WRITES_FROM = 64


def _overwrite(item: tuple[Path, bytes]) -> None:
    """Replace a file's content in place (no truncate-to-zero, no rename)."""
    path, data = item
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


# orjson reads integers beyond 64 bits as floats, which would silently change them on save:
# files with a long run of digits are checked with the stdlib parser (cheap pre-filter).
_DIGITS_ONLY = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
_LONG_DIGITS = b"0" * 19


def _find_big_int(value: Any, path: str = "") -> str | None:
    """The dotted path of the first integer outside the signed 64-bit range, if any."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return path if not -(2**63) <= value < 2**64 else None
    items: Any = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _find_big_int(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


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

    def _parse(
        self, path: Path, raw: bytes, model: type[BaseModel], problems: list[InputError]
    ) -> Entity | None:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(InputError(path, None, f"malformed JSON: {exc}"))
            return None
        if not isinstance(data, dict):
            problems.append(InputError(path, None, "expected a JSON object at the top level"))
            return None
        if _LONG_DIGITS in raw.translate(_DIGITS_ONLY):
            big = _find_big_int(json.loads(raw))
            if big is not None:
                problems.append(
                    InputError(path, big, "integer outside the 64-bit range; store it as a string")
                )
                return None
        try:
            normal: Entity = model.model_validate(data).model_dump(by_alias=True)
        except ValidationError as exc:
            for err in exc.errors():
                problems.append(InputError(path, _field(err["loc"]), _describe(err)))
            return None
        return normal

    def _sources(self, kind: str, overlay: Mapping[str, bytes | None]) -> dict[str, bytes]:
        """``kind/<name>.json`` -> bytes, as the world stands (pending journal included)."""
        out: dict[str, bytes] = {}
        folder = self.root / kind
        if folder.is_dir():
            for path in folder.glob("*.json"):
                rel = f"{kind}/{path.name}"
                if rel not in overlay:
                    out[rel] = path.read_bytes()
        prefix = f"{kind}/"
        for rel, data in overlay.items():
            if rel.startswith(prefix) and "/" not in rel[len(prefix) :] and data is not None:
                out[rel] = data
        return {rel: out[rel] for rel in sorted(out)}

    def _read_kind(
        self,
        kind: str,
        model: type[BaseModel],
        problems: list[InputError],
        originals: dict[str, bytes],
        overlay: Mapping[str, bytes | None],
    ) -> tuple[dict[str, Entity], set[str]]:
        """Valid entities by id, and the ids of files that exist but are invalid."""
        out: dict[str, Entity] = {}
        invalid: set[str] = set()
        for rel, raw in self._sources(kind, overlay).items():
            path = self.root / rel
            entity = self._parse(path, raw, model, problems)
            if entity is None:
                invalid.add(path.stem)
                continue
            entity_id = entity["identity"]["id"]
            if entity_id != path.stem:
                problems.append(
                    InputError(
                        path,
                        "identity.id",
                        f"id {entity_id!r} must equal the file name {path.stem!r}",
                    )
                )
                invalid.add(path.stem)
                continue
            out[entity_id] = entity
            originals[rel] = raw
        return out, invalid

    def load(self) -> World:
        """Load and validate the world; raise ``InvalidWorld`` listing every problem.

        Writes nothing. A committed tick still waiting in the journal (after a crash) is
        read from the journal, so the world is seen wholly at its newest committed tick.
        """
        if not self.root.is_dir():
            raise InputError(self.root, None, "world folder not found")
        overlay = self._journal_overlay()
        problems: list[InputError] = []
        originals: dict[str, bytes] = {}
        meta_path = self.root / "world.json"
        meta: Entity | None = None
        meta_raw = overlay.get("world.json")
        if meta_raw is None and meta_path.is_file():
            meta_raw = meta_path.read_bytes()
        if meta_raw is None:
            problems.append(InputError(meta_path, None, "world.json is missing"))
        else:
            meta = self._parse(meta_path, meta_raw, WorldMeta, problems)
            if meta is not None:
                originals["world.json"] = meta_raw
        characters, _ = self._read_kind("characters", Character, problems, originals, overlay)
        locations, bad_locations = self._read_kind(
            "locations", Location, problems, originals, overlay
        )
        known_locations = set(locations) | bad_locations

        for cid in sorted(set(characters) & set(locations)):
            problems.append(
                InputError(
                    self.root / "locations" / f"{cid}.json",
                    "identity.id",
                    f"duplicate id {cid!r}: also used by characters/{cid}.json",
                )
            )
        for cid, char in characters.items():
            where = char["state"]["location"]
            if where not in known_locations:
                problems.append(
                    InputError(
                        self.root / "characters" / f"{cid}.json",
                        "state.location",
                        f"unknown location {where!r}; expected one of the ids in locations/",
                    )
                )
        for lid, loc in locations.items():
            for i, target in enumerate(loc["state"]["connections"]):
                if target not in known_locations:
                    problems.append(
                        InputError(
                            self.root / "locations" / f"{lid}.json",
                            f"state.connections.{i}",
                            f"connection to missing location {target!r}",
                        )
                    )
        if not locations and not bad_locations:
            problems.append(
                InputError(self.root / "locations", None, "a world needs at least one location")
            )
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
        # a committed journal still pending is carried into this one, so its files are
        # never lost even if the caller skipped recover()
        files: dict[str, bytes | None] = self._journal_overlay()
        files.update(self.changed_files(world))  # paths built from validated ids
        self._check_rels(extra or {})
        files.update(extra or {})
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

    def _check_rels(self, rels: Iterable[str]) -> None:
        """``_check_rel`` for many paths, looking at each parent folder once."""
        parents_ok: set[str] = set()
        for rel in rels:
            self._check_rel(rel, parents_ok)

    def _check_rel(self, rel: str, parents_ok: set[str] | None = None) -> None:
        """Refuse a path outside the world, the journal itself, or one that a folder or
        file already in the world makes impossible. ``parents_ok`` caches parent folders
        already checked (os.path, not pathlib: this runs for every file of a commit)."""
        path = Path(rel)
        parts = path.parts
        if not rel or path.is_absolute() or ".." in parts or parts in ((), (".",)):
            raise ValueError(f"refusing to write outside the world folder: {rel!r}")
        posix = path.as_posix()
        if posix in (JOURNAL, JOURNAL_TMP):
            raise ValueError(f"refusing to write the engine's own journal: {rel!r}")
        root = os.fspath(self.root)
        if os.path.isdir(os.path.join(root, posix)):
            raise ValueError(f"refusing to replace a folder with a file: {rel!r}")
        checked = parents_ok if parents_ok is not None else set()
        for end in range(len(parts) - 1, 0, -1):  # the parents, deepest first
            parent = "/".join(parts[:end])
            if parent in checked:
                break  # and so were its own parents
            if os.path.isfile(os.path.join(root, parent)):
                raise ValueError(f"{rel!r}: {parent!r} is a file, not a folder")
            checked.add(parent)

    def _apply(self, files: Mapping[str, bytes | None]) -> None:
        # Files are overwritten in place: the committed journal already makes the tick
        # atomic (recovery rewrites every file from it), and on common filesystems an
        # in-place write is several times cheaper than write-temp-and-rename.
        made: set[Path] = set()
        writes: list[tuple[Path, bytes]] = []
        for rel, data in files.items():
            target = self.root / rel
            if data is None:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()
                continue
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            writes.append((target, data))
        if len(writes) > _PARALLEL_WRITES_FROM:
            with ThreadPoolExecutor(_WRITE_THREADS) as pool:
                for _ in pool.map(_overwrite, writes):
                    pass
        else:
            for item in writes:
                _overwrite(item)
        _sync_filesystem(self.root)
        (self.root / JOURNAL).unlink()
        _fsync_dir(self.root / SIM_DIR)

    def _journal_overlay(self) -> dict[str, bytes | None]:
        """The files of a committed but not yet applied journal, or ``{}``."""
        path = self.root / JOURNAL
        try:
            journal = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return {}
        return {
            rel: (None if text is None else text.encode("utf-8"))
            for rel, text in journal["files"].items()
        }

    def pending_journal(self) -> bool:
        """Whether a committed tick is waiting to be written into place."""
        return (self.root / JOURNAL).is_file()

    def recover(self) -> bool:
        """Finish a commit interrupted by a crash, or discard an uncommitted one.

        Call with the lock held. Returns whether a committed journal was replayed.
        """
        with contextlib.suppress(FileNotFoundError):
            (self.root / JOURNAL_TMP).unlink()
        files = self._journal_overlay()
        if not files and not (self.root / JOURNAL).is_file():
            return False
        self._check_rels(files)
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
