"""The world's data model: what a character, a location and ``world.json`` must contain.

Entities live as plain dicts (the spec's contract: the LLM client mutates them in place),
validated and normalised by the pydantic models here when they are loaded. Normalising
puts known fields first in a fixed order and fills defaults; fields the engine does not
know are kept, in their order, at every level.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
)

ID_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
ID_RE = re.compile(ID_PATTERN)

EntityId = Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=128)]

#: the highest tick number a world may reach (a tick log's name, a header's number and
#: every sum over ticks stay far inside 64 bits)
MAX_TICK = 999_999_999
#: a seed is sent to providers as a signed 64-bit integer
MAX_SEED = 2**63 - 1
#: the most memory cells a character may keep
MAX_MEMORY_CAPACITY = 100_000

Tick = Annotated[int, Field(ge=0, le=MAX_TICK)]


class _Open(BaseModel):
    """Known fields validated; unknown fields kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True)


class WorldMeta(_Open):
    name: str
    description: str = ""
    tick: Tick = 0
    seed: int = Field(0, ge=-MAX_SEED - 1, le=MAX_SEED)


class CharacterIdentity(_Open):
    id: EntityId
    name: Annotated[str, StringConstraints(min_length=1)]
    description: str = ""
    personality: str = ""
    goals: list[str] = []


class CharacterState(_Open):
    location: EntityId
    mood: str = ""
    inventory: list[str] = []


class MemoryCell(_Open):
    tick: Tick
    text: str
    #: 1..10, rated by the model that wrote the cell or by a declared rule (``[memory]``)
    importance: int | None = Field(None, ge=1, le=10)
    #: ids of the characters and locations the cell mentions
    mentions: list[EntityId] | None = None
    #: a reflection's sources: the ticks of the cells it was drawn from
    sources: list[Annotated[int, Field(ge=0)]] | None = None


#: a cell's optional fields, left out of its file while unset (older worlds keep their bytes)
_OPTIONAL_CELL = ("importance", "mentions", "sources")
#: a memory's optional fields, left out of its file while unset
_OPTIONAL_MEMORY = ("archive", "unreflected", "plan")
#: a character's optional fields, left out of its file when it has none
_OPTIONAL_CHARACTER = ("relationships", "inbox")


class DailyPlanItem(_Open):
    model_config = ConfigDict(extra="allow", strict=True, title="PlanItem")

    at: Annotated[str, StringConstraints(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]
    intention: str


class DailyPlan(_Open):
    date: Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]
    items: list[DailyPlanItem] = []


class Memory(_Open):
    capacity: int = Field(5, ge=1, le=MAX_MEMORY_CAPACITY)
    cells: list[MemoryCell] = []
    summary: str = ""
    #: the long-term store (``[memory] mode = "retrieve"``): cells evicted from ``cells``
    archive: list[MemoryCell] | None = None
    #: importance accumulated since the last reflection (the ``reflection`` phase)
    unreflected: int | None = Field(None, ge=0)
    #: today's plan (the ``planning`` phase): ``{date, items: [{at, intention}]}``
    plan: DailyPlan | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in _OPTIONAL_MEMORY:
            if data.get(key) is None:
                data.pop(key, None)
        for cells in (data["cells"], data.get("archive") or ()):
            for cell in cells:
                for key in _OPTIONAL_CELL:
                    if cell.get(key, 0) is None:
                        del cell[key]
        return data


#: the bounds of a relationship's ``trust``
TRUST_RANGE = (0.0, 1.0)


class Relationship(_Open):
    """How a character stands to another: a kind, a trust and any attributes of the
    world's own (kept, exported as columns of the ``edges`` table)."""

    kind: Annotated[str, StringConstraints(min_length=1)]
    trust: float = Field(0.5, ge=TRUST_RANGE[0], le=TRUST_RANGE[1])


class InboxMessage(_Open):
    """A message a character received (``[messages]``): shown in its next tick's input."""

    tick: Tick
    #: the sender's id
    from_: EntityId = Field(alias="from")
    text: str

    model_config = ConfigDict(populate_by_name=True)  # merged with _Open's


class Character(_Open):
    identity: CharacterIdentity
    state: CharacterState
    memory: Memory = Memory()
    #: other character id -> the relationship; left out of the file when there are none
    relationships: dict[EntityId, Relationship] | None = None
    #: messages received in the last tick (``sim.messages``); left out when there are none
    inbox: list[InboxMessage] | None = None

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave ``relationships`` and ``inbox`` out of a file that has none (older files
        keep their bytes)."""
        data: dict[str, Any] = handler(self)
        for key in _OPTIONAL_CHARACTER:
            if data.get(key, 0) is None:
                del data[key]
        return data


class LocationIdentity(_Open):
    id: EntityId
    name: Annotated[str, StringConstraints(min_length=1)]
    description: str = ""


class LocationState(_Open):
    connections: list[EntityId]
    objects: list[str] = []
    atmosphere: str = ""


class Location(_Open):
    identity: LocationIdentity
    state: LocationState


# -- the normal form, without a dump when the input already is it ---------------------------

#: fields a model's file leaves out while ``None``, by the model they belong to (the
#: serializers above drop them: a cell's within its memory)
_DROPPED: dict[type[BaseModel], tuple[str, ...]] = {
    MemoryCell: _OPTIONAL_CELL,
    Memory: _OPTIONAL_MEMORY,
    Character: _OPTIONAL_CHARACTER,
}

# how a field's value is checked to be as the dump writes it
_PLAIN = 0  # str, int, bool, lists and str-keyed dicts of them: strict validation keeps them
_FLOAT = 1  # strict validation turns an int into a float: the dump writes 1.0 for 1
_MODEL = 2  # a nested model
_MODELS = 3  # a list of models
_MODEL_MAP = 4  # a str-keyed dict of models
#: StringConstraints that change the text (a value would differ from its dump)
_TRANSFORMS = ("strip_whitespace", "to_upper", "to_lower")


@dataclass(frozen=True)
class _Shape:
    """What a model's dump looks like, for ``_is_normal``."""

    #: the key orders of a normal dict without fields of its own: every field's key in
    #: order, less any of the dropped ones
    layouts: frozenset[tuple[str, ...]]
    #: every name a field may be given in the input (name, alias)
    names: frozenset[str]
    #: (key, how its value is checked, its model's shape, left out while None), for the
    #: fields whose value needs a look
    checks: tuple[tuple[str, int, _Shape | None, bool], ...]


_SHAPES: dict[type[BaseModel], _Shape] = {}


def _strip(annotation: Any) -> tuple[Any, bool]:
    """An annotation without ``Annotated`` and ``| None``; whether it allowed ``None``."""
    optional = False
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            args = get_args(annotation)
            for meta in args[1:]:
                if any(getattr(meta, name, None) for name in _TRANSFORMS):
                    raise TypeError(f"{annotation}: a transforming constraint")
            annotation = args[0]
        elif origin in (Union, types.UnionType):
            args = tuple(a for a in get_args(annotation) if a is not type(None))
            if len(args) != 1:
                raise TypeError(f"{annotation}: a union")
            optional = optional or len(args) < len(get_args(annotation))
            annotation = args[0]
        else:
            return annotation, optional


def _classify(annotation: Any) -> tuple[int, _Shape | None]:
    """How a value of ``annotation`` is checked (TypeError for a type not understood: the
    fast path must know every field, or a new one would slip through unchecked)."""
    bare, _ = _strip(annotation)
    if isinstance(bare, type) and issubclass(bare, BaseModel):
        return _MODEL, _shape(bare)
    if bare is float:
        return _FLOAT, None
    if bare in (str, int, bool):
        return _PLAIN, None
    origin, args = get_origin(bare), get_args(bare)
    if origin is list and len(args) == 1:
        kind, sub = _classify(args[0])
        if kind == _PLAIN:
            return _PLAIN, None
        if kind == _MODEL:
            return _MODELS, sub
    if origin is dict and len(args) == 2 and _classify(args[0])[0] == _PLAIN:
        kind, sub = _classify(args[1])
        if kind == _PLAIN:
            return _PLAIN, None
        if kind == _MODEL:
            return _MODEL_MAP, sub
    raise TypeError(f"{annotation}: not a type the normal-form check knows")


def _shape(model: type[BaseModel]) -> _Shape:
    """``model``'s shape, built once (TypeError for a model the check cannot vouch for)."""
    known = _SHAPES.get(model)
    if known is not None:
        return known
    config = model.model_config
    decorators = model.__pydantic_decorators__
    if (
        config.get("strict") is not True
        or config.get("extra") != "allow"
        or any(config.get(k) for k in ("str_strip_whitespace", "str_to_lower", "str_to_upper"))
        or model.model_computed_fields
        or decorators.field_serializers
        or decorators.validators
        or decorators.field_validators
        or decorators.model_validators
        or (decorators.model_serializers and model not in (Memory, Character))
    ):
        raise TypeError(f"{model.__name__}: the normal-form check cannot vouch for it")
    dropped = _DROPPED.get(model, ())
    keys: dict[str, str] = {}  # field name -> its key in the dump
    names: set[str] = set()
    checks: list[tuple[str, int, _Shape | None, bool]] = []
    for name, info in model.model_fields.items():
        alias = info.serialization_alias or info.alias or name
        if info.exclude or (info.validation_alias not in (None, info.alias)):
            raise TypeError(f"{model.__name__}.{name}: the normal-form check cannot vouch for it")
        keys[name] = alias
        names.update((name, alias))
        kind, sub = _classify(info.annotation)
        if kind != _PLAIN or name in dropped:
            checks.append((alias, kind, sub, name in dropped))
    layouts = {tuple(keys.values())}
    for name in dropped:  # every subset of the dropped fields left out
        layouts |= {tuple(k for k in layout if k != keys[name]) for layout in layouts}
    shape = _Shape(frozenset(layouts), frozenset(names), tuple(checks))
    _SHAPES[model] = shape
    return shape


def _is_normal(shape: _Shape, data: dict[str, Any]) -> bool:
    """Whether ``data``, valid for the model of ``shape``, is already its normal form: the
    model's ``model_dump(by_alias=True)`` would equal it, key order included.

    It is when each model's dict has its fields' keys in order (defaults present, none
    under another name), the fields the dump drops while ``None`` absent rather than
    ``None``, its own fields after them, and every float field a float: strict validation
    converts nothing else, and the dump writes every other value as it was given.
    """
    keys = tuple(data)
    if keys not in shape.layouts:
        names = shape.names
        known = 0
        for key in keys:
            if key not in names:
                break
            known += 1
        if keys[:known] not in shape.layouts or any(key in names for key in keys[known:]):
            return False
    for key, kind, sub, dropped in shape.checks:
        value = data.get(key)
        if value is None:
            if dropped and key in data:
                return False
            continue
        if kind == _FLOAT:
            if type(value) is not float:
                return False
        elif kind == _MODEL:
            if not _is_normal(sub, value):  # type: ignore[arg-type]
                return False
        elif kind == _MODELS:
            for item in value:
                if not _is_normal(sub, item):  # type: ignore[arg-type]
                    return False
        elif kind == _MODEL_MAP:
            for item in value.values():
                if not _is_normal(sub, item):  # type: ignore[arg-type]
                    return False
    return True


def normal_form(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` validated by ``model`` and normalised: what
    ``model.model_validate(data).model_dump(by_alias=True)`` gives.

    ``data`` itself when it already is that (what the engine writes; about half of a big
    world's load was the dump), else the dump. ``data`` must be parsed JSON the caller
    hands over (it may be returned as it is).

    Raises:
        ValidationError: ``data`` is not valid for ``model``.
    """
    validated = model.model_validate(data)
    if _is_normal(_shape(model), data):
        return data
    normal: dict[str, Any] = validated.model_dump(by_alias=True)
    return normal


for _model in (WorldMeta, Character, Location):  # a model the check cannot vouch for fails here
    _shape(_model)


Entity = dict[str, Any]


@dataclass
class World:
    """A loaded world: ``world.json`` plus characters and locations by id (sorted)."""

    root: Path
    meta: dict[str, Any]
    characters: dict[str, Entity]
    locations: dict[str, Entity]
    originals: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def tick(self) -> int:
        return int(self.meta["tick"])

    @property
    def seed(self) -> int:
        return int(self.meta["seed"])

    def characters_at(self) -> dict[str, list[str]]:
        """Location id -> ids of the characters there, both sorted."""
        where: dict[str, list[str]] = {}
        for cid, char in self.characters.items():
            where.setdefault(char["state"]["location"], []).append(cid)
        return {loc: where[loc] for loc in sorted(where)}


def relationship_problems(
    characters: dict[str, Entity], known: set[str]
) -> list[tuple[str, str, str]]:
    """Relationships naming a character that does not exist, or the character itself:
    ``(character id, field, message)`` for each, in id order.

    Args:
        known: every character id of the world (invalid files' too, so that one broken
            file is not blamed twice).
    """
    out = []
    for cid in sorted(characters):
        for other in characters[cid].get("relationships") or {}:
            where = f"relationships.{other}"
            if other == cid:
                out.append((cid, where, "a character cannot have a relationship to itself"))
            elif other not in known:
                out.append(
                    (
                        cid,
                        where,
                        f"unknown character {other!r}; expected one of the ids in characters/",
                    )
                )
    return out


#: keys of a relationship's view that are the other character's, not the tie's
_IDS = ("id", "name")


def relationships_view(world: World, char: Entity) -> list[dict[str, Any]]:
    """A character's relationships as it sees them: each other character's id and name,
    then the relationship's fields (``kind``, ``trust``, the world's own), in file order.
    Empty when it has none, so inputs of worlds without relationships stay as they were."""
    out = []
    for other, tie in (char.get("relationships") or {}).items():
        them = world.characters.get(other)
        name = them["identity"]["name"] if them is not None else other
        out.append({"id": other, "name": name, **{k: v for k, v in tie.items() if k not in _IDS}})
    return out
