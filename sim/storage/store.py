"""Storage: load and validate a world folder, commit a tick atomically, lock the world.

A commit goes through the redo journal of ``sim.storage.journal`` (``Storage.commit`` and
``Storage.recover`` call it): this module reads and checks the world's files, works out
which changed, and holds the world's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from sim import safefs
from sim.errors import InputError, InvalidWorld, WorldLockedError
from sim.pack import PACK, both_forms, both_forms_problem, entity_files, is_packed, read_pack
from sim.safefs import UnsafePath
from sim.storage.filetext import DIGITS_ONLY, LONG_DIGITS, find_big_int, shape_problem
from sim.storage.filetext import MAX_DEPTH as MAX_DEPTH  # sim.storage names it
from sim.storage.journal import (
    JOURNAL,
    SIM_DIR,
    CorruptJournal,
    apply_journal,
    check_rels,
    journal_overlay,
    recover_journal,
    write_journal,
)
from sim.storage.normal import normal_form, normal_order
from sim.world import (
    ID_RE,
    Character,
    Entity,
    Location,
    World,
    WorldMeta,
    relationship_problems,
)

ENTITY_KINDS = ("characters", "locations")
_KIND_MODELS: dict[str, type[BaseModel]] = {"characters": Character, "locations": Location}
#: entity files checked between two reports of a load's progress (``Storage.load``)
PROGRESS_EVERY = 1000
#: default size limit of one entity file (``[limits] max_entity_bytes``)
MAX_ENTITY_BYTES = 8 * 1024 * 1024
#: the setting of that limit, as a size error names it
ENTITY_LIMIT = "[limits] max_entity_bytes"


PROMPTS_DIR = "prompts"
MAX_PROMPT_BYTES = 1024 * 1024


def read_prompt(root: Path, name: str) -> str | None:
    """The world's ``prompts/<name>.md`` as text, or ``None`` if it has none.

    Raises:
        InputError: not a regular file inside the world, too large, or not UTF-8.
    """
    rel = f"{PROMPTS_DIR}/{name}.md"
    try:
        raw = safefs.read_optional(root, rel, MAX_PROMPT_BYTES)
    except OSError as exc:
        raise InputError(root / rel, None, f"cannot read: {exc.strerror}") from None
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            root / rel, None, f"not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None


def prompt_problems(root: Path) -> list[InputError]:
    """Every ``prompts/*.md`` that a tick could not read (``sim check`` runs this)."""
    problems: list[InputError] = []
    try:
        names = safefs.list_names(root, [PROMPTS_DIR], ".md") or []
    except InputError as exc:
        return [exc]
    for name in names:
        try:
            read_prompt(root, name.removesuffix(".md"))
        except InputError as exc:
            problems.append(exc)
    return problems


def dump_json(data: Any) -> bytes:
    """Pretty-printed UTF-8 JSON with a trailing newline: the one format of world files."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"


def normal_bytes(rel: str, raw: bytes) -> bytes | None:
    """A world file as a commit writes it once loaded (``dump_json`` of its normal form),
    or ``None`` when ``rel`` is not ``world.json`` or an entity file, or it does not load
    (two files of the same normal form hold the same state in two layouts: what an older
    sim wrote with keys out of order, and what it writes now)."""
    kind, _, name = rel.partition("/")
    model: type[BaseModel] | None = None
    if rel == "world.json":
        model = WorldMeta
    elif name.endswith(".json") and "/" not in name:
        model = _KIND_MODELS.get(kind)
    if model is None:
        return None
    try:
        data = orjson.loads(raw)
        return dump_json(normal_form(model, data)) if isinstance(data, dict) else None
    except (orjson.JSONDecodeError, ValidationError, TypeError, RecursionError):
        return None  # orjson's JSONEncodeError (nested too deep to write) is a TypeError


def _normal_dump(model: type[BaseModel], entity: Entity, loaded: bytes | None) -> bytes | None:
    """``entity``'s file in normal form, or ``None`` when that is ``loaded`` (its bytes as
    loaded). Out of order, ``entity`` is put in order in place (``normal_order``)."""
    data = dump_json(entity)
    if data == loaded:
        return None
    if normal_order(model, entity):
        data = dump_json(entity)
        if data == loaded:
            return None
    return data


def entity_forms(
    world: World, characters: Iterable[str], locations: Iterable[str]
) -> dict[str, bytes | None]:
    """These entities' files as ``Storage.changed_files`` makes them (in normal form, put in
    order in place), ``None`` for one whose form is the file as loaded: a sharded tick's
    shard makes its own part's, each on its own core, for the coordinator's commit."""
    return dict(_forms(world, characters, locations, {}))


def _forms(
    world: World,
    characters: Iterable[str],
    locations: Iterable[str],
    given: Mapping[str, bytes | None],
) -> Iterator[tuple[str, bytes | None]]:
    """Each entity's file in normal form (``None``: as loaded), one at a time; those in
    ``given`` as they are there."""
    originals = world.originals
    kinds: tuple[tuple[str, type[BaseModel], dict[str, Entity], Iterable[str]], ...] = (
        ("characters", Character, world.characters, characters),
        ("locations", Location, world.locations, locations),
    )
    for kind, model, entities, ids in kinds:
        for entity_id in ids:
            rel = f"{kind}/{entity_id}.json"
            if rel in given:
                yield rel, given[rel]
            else:
                yield rel, _normal_dump(model, entities[entity_id], originals.get(rel))


def _stem(rel: str) -> str:
    """``Path(rel).stem``, without building the path for a name ending in ``.json``."""
    name = rel.rpartition("/")[2]
    if name.endswith(".json") and len(name) > len(".json"):  # ".json" alone is its own stem
        return name[: -len(".json")]
    return Path(name).stem


def _describe(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        return f"expected an id matching {ID_RE.pattern} (got {err.get('input')!r})"
    msg = str(err["msg"])
    msg = msg[0].lower() + msg[1:] if msg else msg
    return f"expected {msg.removeprefix('input should be ')} (got {err.get('input')!r})"


def _after_path(problem: InputError) -> str:
    """A problem's message without its file: ``field 'x': what`` or ``what``."""
    return f"field '{problem.field}': {problem.problem}" if problem.field else problem.problem


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


class Storage:
    """Reads and writes one world folder.

    Every file is read and written through ``sim.safefs``: no symbolic link is followed
    inside the world, and only regular files are read or written; an entity file or
    ``world.json`` with another name (a hard link) is refused by name.

    Args:
        root: the world folder (holding ``world.json``, ``characters/``, ``locations/``).
        max_entity_bytes: the largest entity file loaded (larger ones are refused by name).
    """

    def __init__(self, root: Path, max_entity_bytes: int = MAX_ENTITY_BYTES) -> None:
        self.root = Path(root)
        self.max_entity_bytes = max_entity_bytes

    # -- loading ------------------------------------------------------------------------

    def _parse(
        self,
        rel: str,
        raw: bytes,
        model: type[BaseModel],
        problems: list[InputError],
        base: Path | None = None,
    ) -> Entity | None:
        """``raw``, the file ``rel``, parsed, checked and in normal form; ``None`` with its
        problems added to ``problems`` (each naming the file, under ``base``: the world
        folder, or a packed world's pack; its ``Path`` is built only then, which was a tenth
        of a big world's load)."""

        def path() -> Path:
            return (base or self.root) / rel

        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            problems.append(InputError(path(), None, f"malformed JSON: {exc}"))
            return None
        if not isinstance(data, dict):
            problems.append(InputError(path(), None, "expected a JSON object at the top level"))
            return None
        problem = shape_problem(raw, data)
        if problem is not None:
            problems.append(InputError(path(), *problem))
            return None
        if LONG_DIGITS in raw.translate(DIGITS_ONLY):
            big = find_big_int(json.loads(raw))
            if big is not None:
                problems.append(
                    InputError(
                        path(), big, "integer outside the 64-bit range; store it as a string"
                    )
                )
                return None
        try:
            normal = normal_form(model, data)
        except ValidationError as exc:
            for err in exc.errors():
                problems.append(InputError(path(), _field(err["loc"]), _describe(err)))
            return None
        return normal

    def _read(self, rel: str, problems: list[InputError]) -> bytes | None:
        """A world file's bytes (no link followed, size-limited); problems are collected."""
        try:
            return safefs.read_file(
                self.root, rel, self.max_entity_bytes, one_link=True, setting=ENTITY_LIMIT
            )
        except InputError as exc:
            problems.append(exc)
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(InputError(self.root / rel, None, f"cannot read: {exc.strerror}"))
        return None

    def _read_at(self, dir_fd: int, name: str, shown: Path) -> bytes:
        return safefs.read_at(
            dir_fd, name, shown, self.max_entity_bytes, one_link=True, setting=ENTITY_LIMIT
        )

    def _sources(
        self,
        kind: str,
        overlay: Mapping[str, bytes | None],
        problems: list[InputError],
        pack: Mapping[str, bytes] | None,
    ) -> dict[str, bytes]:
        """``kind/<name>.json`` -> bytes, as the world stands (pending journal included):
        from its folder, or from ``pack`` (a packed world's, ``sim.pack``)."""
        out: dict[str, bytes] = {}
        prefix = f"{kind}/"
        if pack is not None:
            out = {rel: raw for rel, raw in pack.items() if rel.startswith(prefix)}
            for rel in overlay:
                out.pop(rel, None)
        else:
            self._read_folder(kind, overlay, problems, out)
        for rel, data in overlay.items():
            if rel.startswith(prefix) and "/" not in rel[len(prefix) :] and data is not None:
                out[rel] = data
        return {rel: out[rel] for rel in sorted(out)}

    def _read_folder(
        self,
        kind: str,
        overlay: Mapping[str, bytes | None],
        problems: list[InputError],
        out: dict[str, bytes],
    ) -> None:
        """``kind``'s files read from its folder into ``out``, but those in ``overlay``."""
        folder = self.root / kind
        try:
            with safefs.open_dir(self.root, [kind]) as dir_fd:
                names = sorted(n for n in os.listdir(dir_fd) if n.endswith(".json"))
                for name in names:
                    rel = f"{kind}/{name}"
                    if rel in overlay:
                        continue
                    try:
                        try:  # named in an error only: the file's path is built then
                            out[rel] = self._read_at(dir_fd, name, folder)
                        except (InputError, OSError):  # read again, naming the file
                            out[rel] = self._read_at(dir_fd, name, folder / name)
                    except InputError as exc:
                        problems.append(exc)
                    except FileNotFoundError:
                        pass  # removed while listing
                    except OSError as exc:
                        problems.append(
                            InputError(folder / name, None, f"cannot read: {exc.strerror}")
                        )
        except FileNotFoundError:
            problems.append(
                InputError(
                    folder,
                    None,
                    f"the {kind}/ folder is missing (a world with none needs an empty folder)",
                )
            )
        except InputError as exc:
            problems.append(exc)

    def _read_kind(
        self,
        kind: str,
        model: type[BaseModel],
        problems: list[InputError],
        originals: dict[str, bytes],
        overlay: Mapping[str, bytes | None],
        pack: Mapping[str, bytes] | None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[dict[str, Entity], set[str]]:
        """Valid entities by id, and the ids of files that exist but are invalid;
        ``progress`` is told every ``PROGRESS_EVERY`` files checked, and at the end."""
        out: dict[str, Entity] = {}
        invalid: set[str] = set()
        sources = self._sources(kind, overlay, problems, pack)
        base = self.root / PACK if pack is not None else self.root
        for done, (rel, raw) in enumerate(sources.items()):
            if progress is not None and done % PROGRESS_EVERY == 0:
                progress(done)
            stem = _stem(rel)
            entity = self._parse(rel, raw, model, problems, base)
            if entity is None:
                invalid.add(stem)
                continue
            entity_id = entity["identity"]["id"]
            if entity_id != stem:
                problems.append(
                    InputError(
                        base / rel,
                        "identity.id",
                        f"id {entity_id!r} must equal the file name {stem!r}",
                    )
                )
                invalid.add(stem)
                continue
            out[entity_id] = entity
            originals[rel] = raw
        if progress is not None:
            progress(len(sources))
        return out, invalid

    def load(self, progress: Callable[[int], None] | None = None) -> World:
        """Load and validate the world; raise ``InvalidWorld`` listing every problem.

        Writes nothing. A committed tick still waiting in the journal (after a crash) is
        read from the journal, so the world is seen wholly at its newest committed tick.
        ``progress`` is told how many entity files have been checked so far, now and then
        (``sim serve`` shows it while a big world loads). A packed world's entities are
        read from its pack (``sim.pack``), each checked as a file is, and named in a
        problem as ``world.pack/<kind>/<id>.json``.
        """
        if not self.root.is_dir():
            raise InputError(self.root, None, "world folder not found")
        overlay = self.pending_files()
        problems: list[InputError] = []
        originals: dict[str, bytes] = {}
        meta = self._meta(overlay, problems, originals)
        pack = self._pack(problems)
        base = self.root / PACK if pack is not None else self.root
        checked = seen = 0  # files checked: of the kinds before, and so far

        def told(done: int) -> None:
            nonlocal seen
            seen = checked + done
            if progress is not None:
                progress(seen)

        characters, bad_characters = self._read_kind(
            "characters", Character, problems, originals, overlay, pack, told
        )
        checked = seen
        locations, bad_locations = self._read_kind(
            "locations", Location, problems, originals, overlay, pack, told
        )
        del pack  # each entity's bytes are in ``originals``
        known_locations = set(locations) | bad_locations

        def problem(kind: str, eid: str, field: str, message: str) -> None:
            """A problem in the entity file ``<kind>/<eid>.json``."""
            problems.append(InputError(base / kind / f"{eid}.json", field, message))

        for cid in sorted(set(characters) & set(locations)):
            problem(
                "locations",
                cid,
                "identity.id",
                f"duplicate id {cid!r}: also used by characters/{cid}.json",
            )
        for cid, char in characters.items():
            where = char["state"]["location"]
            if where not in known_locations:
                problem(
                    "characters",
                    cid,
                    "state.location",
                    f"unknown location {where!r}; expected one of the ids in locations/",
                )
        for cid, field, message in relationship_problems(
            characters, set(characters) | bad_characters
        ):
            problem("characters", cid, field, message)
        for lid, loc in locations.items():
            for i, target in enumerate(loc["state"]["connections"]):
                if target not in known_locations:
                    problem(
                        "locations",
                        lid,
                        f"state.connections.{i}",
                        f"connection to missing location {target!r}",
                    )
        problems.extend(prompt_problems(self.root))
        if not locations and not bad_locations:
            problems.append(
                InputError(base / "locations", None, "a world needs at least one location")
            )
        if overlay:  # a problem in a file the pending journal writes is the journal's
            blamed = [p for p in problems if p.path is not None and self._rel(p.path) in overlay]
            if blamed:
                raise CorruptJournal(
                    self.root,
                    "would write an invalid world ("
                    + "; ".join(f"{self._rel(p.path)}: {_after_path(p)}" for p in blamed if p.path)
                    + ")",
                )
        if problems:
            raise InvalidWorld(problems)
        assert meta is not None
        return World(self.root, meta, characters, locations, originals)

    def _pack(self, problems: list[InputError]) -> dict[str, bytes] | None:
        """A packed world's entity files (``None``: the world is in folders).

        Raises:
            InvalidWorld: the pack cannot be read, or has entity folders beside it
                (``problems`` so far, and that): no entity is read.
        """
        if not is_packed(self.root):
            return None
        folders = both_forms(self.root)
        try:
            if folders:
                raise both_forms_problem(self.root, folders)
            return read_pack(self.root, self.max_entity_bytes, ENTITY_LIMIT)
        except InputError as exc:
            raise InvalidWorld([*problems, exc]) from None
        except OSError as exc:
            cannot = InputError(self.root / PACK, None, f"cannot read: {exc.strerror}")
            raise InvalidWorld([*problems, cannot]) from None

    def _meta(
        self,
        overlay: Mapping[str, bytes | None],
        problems: list[InputError],
        originals: dict[str, bytes],
    ) -> Entity | None:
        """``world.json`` validated (the pending journal's, if it writes one)."""
        meta_path = self.root / "world.json"
        meta_raw = overlay.get("world.json")
        if meta_raw is None:
            meta_raw = self._read("world.json", problems)
            if meta_raw is None and not problems:
                problems.append(InputError(meta_path, None, "world.json is missing"))
        if meta_raw is None:
            return None
        meta = self._parse("world.json", meta_raw, WorldMeta, problems)
        if meta is not None:
            originals["world.json"] = meta_raw
        return meta

    def load_meta(self) -> Entity:
        """``world.json`` alone, validated as ``load`` validates it, without reading an
        entity (``sim serve`` refuses a world whose folder or ``world.json`` is bad before
        it serves, and loads the rest after). Writes nothing.

        Raises:
            InputError: the world folder is missing.
            InvalidWorld: ``world.json`` is missing or invalid (each problem named).
            CorruptJournal: the pending journal cannot be applied.
        """
        if not self.root.is_dir():
            raise InputError(self.root, None, "world folder not found")
        problems: list[InputError] = []
        meta = self._meta(self.pending_files(), problems, {})
        if meta is None or problems:
            raise InvalidWorld(problems)
        return meta

    def _rel(self, path: Path) -> str:
        """The world file a problem's path names (an entity inside a pack: its own path)."""
        try:
            return path.relative_to(self.root).as_posix().removeprefix(f"{PACK}/")
        except ValueError:
            return ""

    def pending_files(self) -> dict[str, bytes | None]:
        """The files of a committed journal still waiting to be applied (``{}``: none).

        Refused whole when one of them is something no commit writes
        (``sim.storage.journalcheck``); ``load`` checks its entities and ``world.json``.

        Raises:
            CorruptJournal: naming the journal and each file at fault; nothing is written.
        """
        files = journal_overlay(self.root)
        if files:
            # the checks read the formats of the engine's state, some defined by modules
            # that build on this one (interventions, the response store's repair)
            from sim.storage.journalcheck import journal_problems

            problems = journal_problems(self.root, files)
            if problems:
                raise CorruptJournal(
                    self.root, "holds what no commit writes (" + "; ".join(problems) + ")"
                )
        return files

    # -- committing ---------------------------------------------------------------------

    def changed_files(
        self,
        world: World,
        *,
        adopt: bool = False,
        given: Mapping[str, bytes | None] | None = None,
    ) -> dict[str, bytes]:
        """Entity and world files whose serialised form differs from what was loaded.

        Each is written in normal form, as a load keeps it: an entity whose dump differs
        from its loaded bytes is first put in order (``normal_order``: the keys a tick
        appended to one of its dicts, like a memory's ``archive`` after its ``plan``, in
        their places), in the world too (same content, the dict itself kept), and is
        changed only if that form differs. An unchanged entity costs its dump alone.

        ``adopt``: ``world.originals`` takes each new form as it is found (a tick about
        to commit them): a big world's loaded bytes are then freed as they are replaced,
        never held beside their new form (at 100,000 characters, hundreds of megabytes at
        the tick's peak). Should the commit then fail, the world object is stale.

        ``given``: entity files already in this form (``entity_forms``, made by a sharded
        tick's shards, each for its own part): taken as they are, not dumped again.
        """
        out: dict[str, bytes] = {}
        originals = world.originals
        # one at a time: adopted, each loaded file is freed before the next is made
        for rel, data in _forms(world, world.characters, world.locations, given or {}):
            if data is not None:
                out[rel] = data
                if adopt:
                    originals[rel] = data
        meta = _normal_dump(WorldMeta, world.meta, originals.get("world.json"))
        if meta is not None:
            out["world.json"] = meta
            if adopt:
                originals["world.json"] = meta
        return out

    def commit(
        self,
        world: World,
        extra: Mapping[str, bytes | None] | None = None,
        *,
        changed: Mapping[str, bytes] | None = None,
        whole: bool = False,
    ) -> list[str]:
        """Atomically write every changed entity, ``world.json`` and ``extra`` files.

        Args:
            world: the mutated world (its ``meta["tick"]`` already advanced).
            extra: more files relative to the world folder: bytes to write, ``None`` to
                delete; each must be one of ``sim.storage.journal.COMMIT_PATHS``.
            changed: ``changed_files(world)`` when the caller already has it (the tick
                computes it once for its log and its commit; serialising 100,000
                entities twice cost seconds and a second copy of the world in memory).
            whole: ``world`` holds every entity of the world, as ``load`` gave it (a
                tick's): a packed world's new pack is made from its files in memory,
                not from the pack read again (a pack's size less at the commit's peak).

        Returns:
            The relative paths written or deleted.

        Raises:
            UnsafePath: an ``extra`` path is not a file a commit writes, or a link is on it.
            OSError: the disk refused (full, read-only); nothing was committed unless the
                journal's rename had happened, in which case the next run finishes it.
        """
        # a committed journal still pending (the caller skipped recover()) is carried into
        # this one, so its files are never lost
        files: dict[str, bytes | None] = self.pending_files()
        files.update(self.changed_files(world) if changed is None else changed)
        check_rels(self.root, extra or {})  # entity paths are built from validated ids
        files.update(extra or {})
        self.check_sizes(files)
        entities = None
        if whole and is_packed(self.root):
            entities = entity_files(world.originals)
        write_journal(self.root, files)  # the commit point
        apply_journal(self.root, files, entities)
        for rel, data in files.items():
            if data is not None:
                world.originals[rel] = data
            else:
                world.originals.pop(rel, None)
        return sorted(files)

    def check_sizes(self, files: Mapping[str, bytes | None]) -> None:
        """Refuse to commit an entity file or ``world.json`` that loading would refuse
        (over ``max_entity_bytes``): the world would stop at the next load.

        Raises:
            InputError: naming the first such file, its size and the limit.
        """
        for rel, data in sorted(files.items()):
            if data is None or len(data) <= self.max_entity_bytes:
                continue
            if rel == "world.json" or rel.startswith(("characters/", "locations/")):
                raise InputError(
                    self.root / rel,
                    None,
                    f"the tick would write {len(data)} bytes, over the limit of "
                    f"{self.max_entity_bytes} ({ENTITY_LIMIT}), which loading enforces: "
                    "nothing was committed (raise the limit to go on)",
                )

    def pending_journal(self) -> bool:
        """Whether a committed tick is waiting to be written into place."""
        return os.path.lexists(self.root / JOURNAL)

    def check_engine_dirs(self) -> None:
        """Refuse a world whose ``.sim`` folders are links or files (the tick log and the
        response store are written there).

        Raises:
            UnsafePath: naming the folder.
        """
        for rel in (SIM_DIR, f"{SIM_DIR}/log", f"{SIM_DIR}/responses"):
            path = self.root / rel
            if os.path.islink(path):
                raise UnsafePath(path, None, "is a symlink; expected a folder inside the world")
            if os.path.lexists(path) and not os.path.isdir(path):
                raise UnsafePath(path, None, "expected a folder")

    def recover(self) -> bool:
        """Finish a commit interrupted by a crash, or discard an uncommitted one.

        Call with the lock held. Returns whether a committed journal was replayed.

        A committed journal is applied only when everything it writes is what a commit
        writes: the world is loaded through it first, and any problem in a file it writes
        refuses it whole.

        Raises:
            CorruptJournal: the journal cannot be applied safely (nothing is written).
            InvalidWorld: the world through the journal is invalid elsewhere.
        """
        self.check_engine_dirs()
        if self.pending_journal():
            self.load()
        return recover_journal(self.root)

    # -- locking ------------------------------------------------------------------------

    def running_elsewhere(self) -> bool:
        """Whether another process holds the world's lock right now (a tick is running).

        A non-blocking probe: the lock is taken and released at once if it is free.
        """
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # releases a lock taken by the probe
        return False

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
