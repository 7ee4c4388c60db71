"""The world's data model: what a character, a location and ``world.json`` must contain.

Entities live as plain dicts (the spec's contract: the LLM client mutates them in place),
validated and normalised by the pydantic models here when they are loaded. Normalising
puts known fields first in a fixed order and fills defaults; fields the engine does not
know are kept, in their order, at every level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

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


class Memory(_Open):
    capacity: int = Field(5, ge=1, le=MAX_MEMORY_CAPACITY)
    cells: list[MemoryCell] = []
    summary: str = ""


class Character(_Open):
    identity: CharacterIdentity
    state: CharacterState
    memory: Memory = Memory()


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
