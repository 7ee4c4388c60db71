"""Interventions between ticks: ``sim inject`` (an event) and ``sim set`` (a field edit).

Both are written at once, atomically (``Storage.commit``'s journal), and wait in
``.sim/interventions.json`` for the next tick, which writes them into its log as
``intervention`` records and removes the file in its own commit. A tick that fails or is
interrupted does not commit, so they stay pending for the next run.

- ``inject``: the next tick's inputs show the event to everyone at the location (or
  everywhere): intentions, resolution, narrative and declared phases get it as
  ``happenings``. Nothing else changes until a model reacts to it.
- ``set``: the edit goes into the entity file at once, validated by the models
  ``Storage`` loads worlds with (and, for a field a declared phase ``writes``, by that
  answer's schema). The pending record keeps who, what, before and after for the log.

The pending file is part of the state a tick starts from (``sim.ticklog.format
.is_state_file``): its ``state_before`` snapshot holds it, so ``sim replay`` re-runs the
tick with the same events and the same edit, byte for byte, and a rewind or fork to that
tick gets them back.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from sim import safefs
from sim.errors import InputError, InvalidWorld
from sim.phases.happenings import Happenings
from sim.storage import MAX_DEPTH, Storage, dump_json
from sim.storage.normal import normal_form
from sim.storage.statefiles import MAX_PENDING, MAX_TEXT, PENDING_VERSION, parse_pending
from sim.terminal import one_line
from sim.ticklog.format import INTERVENTIONS
from sim.ticklog.records import InterventionRecord, record_data
from sim.world import ID_RE, Character, Entity, Location, World, relationship_problems

if TYPE_CHECKING:
    from sim.config import Config
    from sim.ticklog.reader import TickLog

#: the pending file, relative to the world folder
PENDING = INTERVENTIONS
MAX_PENDING_BYTES = 4 * 1024 * 1024
#: fields ``sim set`` may not change: the file name and the engine's chains
PROTECTED = ("identity.id", "_openai")


@dataclass
class Pending:
    """The interventions waiting for the next tick, and the file's bytes (``None``: none)."""

    records: list[InterventionRecord] = field(default_factory=list)
    raw: bytes | None = None

    def happenings(self) -> Happenings:
        return Happenings.of(self.records)


# -- the pending file -------------------------------------------------------------------------


def load_pending(root: Path, world: World | None = None) -> Pending:
    """The interventions waiting in ``root``'s pending file (none when it is absent).

    With ``world`` (the world they wait in), each must also fit it (``world_problems``).

    Raises:
        InputError: the file is not a regular file inside the world, too large, not
            JSON of the expected shape, or a record in it is not an intervention.
        InvalidWorld: with ``world``, records that name what the world does not hold.
    """
    path = root / PENDING
    try:
        raw = safefs.read_optional(root, PENDING, MAX_PENDING_BYTES)
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror}") from None
    if raw is None:
        return Pending()
    records = parse_pending(raw, path)
    if world is not None:
        problems = world_problems(world, records, path)
        if problems:
            raise InvalidWorld(problems)
    return Pending(records, raw)


def world_problems(
    world: World, records: Sequence[InterventionRecord], path: Path
) -> list[InputError]:
    """Each pending record that names what ``world`` does not hold: an inject at an
    unknown location, a set of an entity that is not there (the file is untrusted: only
    ``sim inject`` and ``sim set`` write it, and they check both)."""
    out: list[InputError] = []
    for i, record in enumerate(records):
        if record.kind == "inject" and record.location is not None:
            if record.location not in world.locations:
                out.append(
                    InputError(
                        path,
                        f"interventions.{i}.location",
                        f"unknown location {record.location!r}; expected one of the ids "
                        "in locations/ (or null: everywhere)",
                    )
                )
        elif record.kind == "set":
            kind, _, eid = (record.target or "").partition("/")
            entities = {"characters": world.characters, "locations": world.locations}.get(kind)
            if entities is None or eid not in entities or not record.path:
                out.append(
                    InputError(
                        path,
                        f"interventions.{i}.target",
                        f"expected an entity of this world, as characters/<id> or "
                        f"locations/<id>, and a field path (got {record.target!r}, "
                        f"{record.path!r})",
                    )
                )
    return out


def encode_pending(records: Sequence[InterventionRecord]) -> bytes:
    """The pending file's bytes (pretty JSON, like every world file)."""
    return dump_json(
        {"version": PENDING_VERSION, "interventions": [record_data(r) for r in records]}
    )


def logged(log: TickLog) -> list[InterventionRecord]:
    """The interventions a logged tick applied, in order."""
    return [r for r in log.records if isinstance(r, InterventionRecord)]


# -- sim inject -------------------------------------------------------------------------------


@dataclass
class Made:
    """An intervention just recorded, and what waits for the next tick now."""

    record: InterventionRecord
    tick: int
    pending: list[InterventionRecord]

    @property
    def applies_at(self) -> int:
        return self.tick + 1


def _append(
    storage: Storage,
    world: World,
    record: InterventionRecord,
    pending: Pending,
    changed: tuple[str, Entity] | None = None,
) -> Made:
    """Write the pending file (and the ``changed`` entity: ``kind/id``, its dict) in one
    commit. Only those files are written: the other entities are left as they are on disk,
    even where a tick would rewrite them in normal form."""
    records = [*pending.records, record]
    meta = world.meta
    only = World(world.root, meta, {}, {}, {"world.json": dump_json(meta)})
    if changed is not None:
        rel, entity = changed
        kind, _, entity_id = rel.partition("/")
        (only.characters if kind == "characters" else only.locations)[entity_id] = entity
    storage.commit(only, {PENDING: encode_pending(records)})
    return Made(record, world.tick, records)


def _check_room(pending: Pending, root: Path) -> None:
    if len(pending.records) >= MAX_PENDING:
        raise InputError(
            root / PENDING, None, f"{MAX_PENDING} interventions already wait; run a tick first"
        )


def inject(root: Path, text: str, at: str | None) -> Made:
    """Record an event for the next tick at location ``at`` (``None``: everywhere).

    Raises:
        InputError: empty or overlong text, an unknown location, a bad pending file.
        InvalidWorld: the world itself does not load.
    """
    text = text.strip()
    if not text:
        raise InputError(None, "TEXT", "expected the event's text (not empty)")
    if len(text) > MAX_TEXT:
        raise InputError(None, "TEXT", f"at most {MAX_TEXT} characters (got {len(text)})")
    storage = Storage(root)
    with storage.lock():
        storage.recover()
        world = storage.load()
        if at is not None and at not in world.locations:
            raise InputError(
                None,
                "--at",
                f"unknown location {at!r}; expected one of: {', '.join(world.locations)}",
            )
        pending = load_pending(root)
        _check_room(pending, root)
        fields: dict[str, Any] = {"kind": "inject", "n": len(pending.records) + 1, "text": text}
        fields["location"] = at
        return _append(storage, world, InterventionRecord(**fields), pending)


# -- sim set ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assignment:
    """``ENTITY.field.path=JSON``, parsed."""

    entity: str
    path: tuple[str, ...]
    value: Any


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _big_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -(2**63) <= value < 2**64
    if isinstance(value, dict):
        return any(_big_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_big_int(v) for v in value)
    return False


def parse_assignment(text: str) -> Assignment:
    """``ada.state.mood="angry"`` -> (``ada``, (``state``, ``mood``), ``"angry"``).

    Raises:
        InputError: no ``=``, a malformed path, or a value that is not JSON.
    """
    where = "ASSIGNMENT"
    target, sep, raw = text.partition("=")
    if not sep:
        raise InputError(None, where, f"expected ENTITY.field.path=JSON (got {text!r})")
    parts = tuple(target.strip().split("."))
    if len(parts) < 2 or not all(parts):
        raise InputError(
            None,
            where,
            f"expected an entity id and a field path like ada.state.mood (got {target.strip()!r})",
        )
    if not ID_RE.match(parts[0]):
        raise InputError(None, where, f"{parts[0]!r} is not an entity id ({ID_RE.pattern})")
    if not raw.strip():
        raise InputError(None, where, f"expected a JSON value after '=' (got {text!r})")
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        raise InputError(
            None,
            where,
            f"the value {raw!r} is not JSON; a string needs quotes, e.g. "
            f"{target.strip()}='\"{raw.strip()}\"'",
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(None, where, "the value must be a finite number")
    if _depth(value) > MAX_DEPTH - 10:
        raise InputError(None, where, "the value is nested too deeply")
    if _big_int(value):
        raise InputError(None, where, "an integer outside the 64-bit range; store it as a string")
    return Assignment(parts[0], parts[1:], value)


_ABSENT: Any = object()


def _get(node: Any, path: Sequence[str]) -> Any:
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _ABSENT
    return node


def _put(entity: Entity, path: Sequence[str], value: Any) -> str | None:
    """Set ``path`` in ``entity`` (missing objects are created); why not, if it cannot be."""
    node: Any = entity
    for i, part in enumerate(path):
        last = i == len(path) - 1
        shown = ".".join(path[: i + 1])
        if isinstance(node, dict):
            if last:
                node[part] = value
                return None
            node = node.setdefault(part, {})
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                return f"{shown}: expected an index below {len(node)} into the list"
            if last:
                node[int(part)] = value
                return None
            node = node[int(part)]
        else:
            return f"{'.'.join(path[:i])} is not an object (it holds {type(node).__name__})"
    return None


def _model_problem(kind: str, entity: Entity) -> tuple[str, str] | None:
    model: type[BaseModel] = Character if kind == "characters" else Location
    try:
        model.model_validate(entity)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "string_pattern_mismatch":
            return where, f"expected an id matching {ID_RE.pattern}"
        return where, str(err["msg"]).lower().replace("input should be", "expected")
    return None


def _id_problem(entity_id: str, entity: Entity) -> tuple[str, str] | None:
    """Replacing ``identity`` whole must keep the id: it is the file's name."""
    if entity["identity"]["id"] != entity_id:
        return "identity.id", f"must stay {entity_id!r}: the id is the file's name"
    return None


def _reference_problem(world: World, kind: str, entity: Entity) -> tuple[str, str] | None:
    if kind == "characters":
        where = entity["state"]["location"]
        if where not in world.locations:
            return "state.location", (
                f"unknown location {where!r}; expected one of: {', '.join(world.locations)}"
            )
        cid = entity["identity"]["id"]
        for _, field, message in relationship_problems({cid: entity}, world.characters):
            return field, message
        return None
    for i, target in enumerate(entity["state"]["connections"]):
        if target not in world.locations:
            return f"state.connections.{i}", f"connection to missing location {target!r}"
    return None


def _schema_checks(config: Config | None, root: Path) -> dict[tuple[str, str], tuple[str, Any]]:
    """(kind, field path) -> (phase, answer field type) for every field a declared phase
    ``writes``: a set value must fit what that phase would write there."""
    if config is None or not config.phases:
        return {}
    from sim.phases import resolve_phases

    out: dict[tuple[str, str], tuple[str, Any]] = {}
    try:
        specs = resolve_phases(config, root)
    except InputError:
        return {}  # `sim check` names the config problem; the models still check the value
    for spec in specs:
        declared = spec.declared
        if declared is None or declared.per == "world":
            continue
        kind = "characters" if declared.per == "character" else "locations"
        for write in declared.writes:
            if write.merges_relationships:  # merges a list of updates: not the field's type
                continue
            model: Any = declared.schema
            annotation: Any = None
            for part in write.answer:
                annotation = model.model_fields[part].annotation
                model = annotation
            out[(kind, ".".join(write.target))] = (spec.name, annotation)
    return out


@dataclass(frozen=True)
class Edit:
    """A ``sim set`` checked against the world: the entity's kind, the dotted path, the
    value before (``_ABSENT`` if none) and the whole entity after."""

    kind: str
    dotted: str
    before: Any
    edited: Entity


def check_assignment(
    root: Path, world: World, parsed: Assignment, config: Config | None = None
) -> Edit:
    """Check ``parsed`` against ``world`` as ``sim set`` does, writing nothing.

    Raises:
        InputError: an unknown entity, a protected field, or a value the entity's file
            would not be valid with (file, field and expectation named).
    """
    limit = config.limits.max_entity_bytes if config is not None else None
    if parsed.entity in world.characters:
        kind, entity = "characters", world.characters[parsed.entity]
    elif parsed.entity in world.locations:
        kind, entity = "locations", world.locations[parsed.entity]
    else:
        raise InputError(
            None,
            "ASSIGNMENT",
            f"no character or location {parsed.entity!r}; characters: "
            f"{', '.join(world.characters) or 'none'}; locations: {', '.join(world.locations)}",
        )
    path = root / kind / f"{parsed.entity}.json"
    dotted = ".".join(parsed.path)
    for protected in PROTECTED:
        if dotted == protected or dotted.startswith(protected + "."):
            raise InputError(path, dotted, f"{protected} is the engine's; it cannot be set")
    check = _schema_checks(config, root).get((kind, dotted))
    if check is not None:
        phase, annotation = check
        try:
            TypeAdapter(annotation).validate_python(parsed.value, strict=True)
        except ValidationError as exc:
            msg = str(exc.errors()[0]["msg"])
            raise InputError(
                path,
                dotted,
                f"phase {phase!r} writes this field: expected what its schema allows "
                f"({msg[:1].lower() + msg[1:]}; got {parsed.value!r})",
            ) from None
    before = _get(entity, parsed.path)
    edited = copy.deepcopy(entity)
    problem = _put(edited, parsed.path, copy.deepcopy(parsed.value))
    if problem is not None:
        raise InputError(path, dotted, problem)
    found = (
        _model_problem(kind, edited)
        or _id_problem(parsed.entity, edited)
        or _reference_problem(world, kind, edited)
    )
    if found is not None:
        raise InputError(path, found[0], f"{found[1]} (got {parsed.value!r})")
    # as a load gives it: a key set where it was missing, or an object given with its
    # keys in another order, is committed in normal form (``sim.storage.normal``)
    edited = normal_form(Character if kind == "characters" else Location, edited)
    if limit is not None and len(dump_json(edited)) > limit:
        raise InputError(path, dotted, f"the file would exceed [limits] max_entity_bytes ({limit})")
    return Edit(kind, dotted, before, edited)


def set_field(root: Path, assignment: str, config: Config | None = None) -> Made:
    """Change one field of a character or location now, for the next tick's log to record.

    Args:
        root: the world folder.
        assignment: ``ENTITY.field.path=JSON_VALUE``.
        config: the world's config: fields its declared phases write are checked against
            their answer schemas, and ``[limits] max_entity_bytes`` applies.

    Raises:
        InputError: a bad assignment, an unknown entity, a protected field, or a value the
            entity's file would not be valid with (file, field and expectation named);
            nothing is written.
    """
    parsed = parse_assignment(assignment)
    limit = config.limits.max_entity_bytes if config is not None else None
    storage = Storage(root, limit) if limit is not None else Storage(root)
    with storage.lock():
        storage.recover()
        world = storage.load()
        edit = check_assignment(root, world, parsed, config)
        kind, dotted, before, edited = edit.kind, edit.dotted, edit.before, edit.edited
        pending = load_pending(root)
        _check_room(pending, root)
        fields: dict[str, Any] = {
            "kind": "set",
            "n": len(pending.records) + 1,
            "target": f"{kind}/{parsed.entity}",
            "path": dotted,
            "before": None if before is _ABSENT else before,
            "after": parsed.value,
        }
        record = InterventionRecord(**fields)
        return _append(storage, world, record, pending, (f"{kind}/{parsed.entity}", edited))


def describe(record: InterventionRecord) -> str:
    """One line for people: ``inject at square: "A storm..."`` / ``set characters/ada
    state.mood: "calm" -> "angry"``."""
    if record.kind == "inject":
        where = f"at {record.location}" if record.location else "everywhere"
        line = f"inject {where}: {orjson.dumps(record.text).decode()}"
    else:
        before = orjson.dumps(record.before).decode()
        after = orjson.dumps(record.after).decode()
        line = f"set {record.target} {record.path}: {before} -> {after}"
    return one_line(line)  # read back from a world's files or its logs: untrusted


Kind = Literal["inject", "set"]

__all__ = [
    "PENDING",
    "Assignment",
    "Edit",
    "Kind",
    "Made",
    "Pending",
    "check_assignment",
    "describe",
    "encode_pending",
    "inject",
    "load_pending",
    "logged",
    "parse_assignment",
    "parse_pending",
    "set_field",
    "world_problems",
]
