"""The world's data model: what a character, a location and ``world.json`` must contain.

Entities live as plain dicts (the spec's contract: the LLM client mutates them in place),
validated and normalised by the pydantic models here when they are loaded. Normalising
puts known fields first in a fixed order and fills defaults; fields the engine does not
know are kept, in their order, at every level.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

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


#: fields a model's file leaves out while ``None``, by the model they belong to (the
#: serializers above drop them: a cell's within its memory). ``sim.storage.normal`` builds
#: the normal form without the dump from these: a serializer that changes anything else
#: must be taught to it (tests/unit/test_storage_normal.py fails until it is)
DROPPED_WHEN_NONE: dict[type[BaseModel], tuple[str, ...]] = {
    MemoryCell: _OPTIONAL_CELL,
    Memory: _OPTIONAL_MEMORY,
    Character: _OPTIONAL_CHARACTER,
}


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
    characters: dict[str, Entity], known: Collection[str]
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
