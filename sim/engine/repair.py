"""Engine state inside a world folder that is corrupt: found before any call, repaired safely.

The engine keeps state of its own in a world: each entity's ``_openai`` field (response
chains and usage counters) and the response store behind the chains
(``.sim/responses/<chain>/<entity>.json``). Either can be damaged (a truncated copy, a hand
edit, a crafted archive). Losing a chain is always safe: the next call of that entity
simply starts a fresh conversation, as at depth 0. So a damaged chain or store file is
dropped and that chain restarted empty, in the tick's own atomic commit, and the tick's
summary says so. ``sim check`` lists the same repairs before anything is paid for.

Damage that cannot be repaired without losing the user's data (a corrupt commit journal, an
invalid entity) is refused elsewhere with the command that fixes it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim import safefs
from sim.errors import InputError
from sim.storage.statefiles import store_problem
from sim.ticklog.format import STORE_DIR as STORE_DIR  # the shard worker reads it here
from sim.world import ID_RE, Entity, World

_CHAIN_KEY = re.compile(r"^([a-z0-9][a-z0-9_-]*)_chain$")
_USAGE_KEYS = ("total_input_tokens", "total_output_tokens", "total_requests")
#: the largest response-store file read (one chain of one entity: a few exchanges)
MAX_STORE_BYTES = 64 * 1024 * 1024


@dataclass
class Repair:
    """One damaged piece of engine state and what the next tick does about it."""

    path: Path
    problem: str
    action: str
    entity: tuple[str, str] | None = None  # (kind, id) whose ``_openai`` is changed
    chain: str | None = None  # the chain restarted empty
    store_rel: str | None = None  # the store file deleted in the tick's commit

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}; {self.action}"


@dataclass
class Repairs:
    items: list[Repair] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.items)

    def notes(self) -> list[str]:
        return [f"repaired: {item}" for item in self.items]

    def store_deletions(self) -> list[str]:
        return sorted({i.store_rel for i in self.items if i.store_rel is not None})


def _valid_chain(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def _valid_usage(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(value.get(k, 0), int) and not isinstance(value.get(k, 0), bool)
        for k in _USAGE_KEYS
    )


def _openai_problems(root: Path, kind: str, eid: str, entity: Entity) -> list[Repair]:
    if "_openai" not in entity:
        return []
    path = root / kind / f"{eid}.json"
    state = entity["_openai"]
    if not isinstance(state, dict):
        return [
            Repair(
                path,
                f"field '_openai' is {type(state).__name__}, expected an object",
                "the next tick resets it (its chains restart empty, its usage counters at 0)",
                entity=(kind, eid),
            )
        ]
    out: list[Repair] = []
    for key, value in state.items():
        match = _CHAIN_KEY.match(key)
        if match and not _valid_chain(value):
            chain = match.group(1)
            out.append(
                Repair(
                    path,
                    f"field '_openai.{key}' is not a list of response ids",
                    "the next tick restarts that chain empty",
                    entity=(kind, eid),
                    chain=chain,
                    store_rel=f"{STORE_DIR}/{chain}/{eid}.json",
                )
            )
        elif key == "usage" and not _valid_usage(value):
            out.append(
                Repair(
                    path,
                    "field '_openai.usage' is not an object of token counts",
                    "the next tick resets the counters (the tick logs keep the real totals)",
                    entity=(kind, eid),
                )
            )
    return out


def _store_problems(root: Path, world: World) -> list[Repair]:
    out: list[Repair] = []
    chains = safefs.list_names(root, [".sim", "responses"], "") or []
    for chain in chains:
        chain_path = root / STORE_DIR / chain
        if os.path.islink(chain_path) or not os.path.isdir(chain_path):
            out.append(
                Repair(
                    chain_path,
                    "is not a folder (a link or a file)",
                    f"refused: remove it (`rm {chain_path}`); the engine never makes one",
                )
            )
            continue
        names = safefs.list_names(root, [".sim", "responses", chain], ".json") or []
        for name in names:
            eid = name.removesuffix(".json")
            rel = f"{STORE_DIR}/{chain}/{name}"
            try:
                raw = safefs.read_file(root, rel, MAX_STORE_BYTES)
                problem = store_problem(raw)
            except safefs.UnsafePath as exc:
                out.append(
                    Repair(
                        root / rel,
                        exc.problem,
                        f"refused: remove it (`rm {root / rel}`); the engine only writes "
                        "regular files there",
                    )
                )
                continue
            except InputError as exc:
                problem = exc.problem
            except OSError as exc:
                problem = f"cannot be read ({exc.strerror})"
            if problem is None:
                continue
            kind = "characters" if eid in world.characters else "locations"
            valid_id = bool(ID_RE.match(chain)) and bool(ID_RE.match(eid))
            out.append(
                Repair(
                    root / rel,
                    problem,
                    "the next tick drops this store file and restarts that chain empty",
                    entity=(kind, eid) if valid_id else None,
                    chain=chain,
                    store_rel=rel if valid_id else None,
                )
            )
    return out


def inspect(world: World) -> Repairs:
    """Every damaged piece of engine state in a loaded world (reads, writes nothing).

    Raises:
        InputError: damage that cannot be repaired (a store folder that is a link).
    """
    root = world.root
    items: list[Repair] = []
    for kind, entities in (("characters", world.characters), ("locations", world.locations)):
        for eid, entity in entities.items():
            items.extend(_openai_problems(root, kind, eid, entity))
    items.extend(_store_problems(root, world))
    refused = [i for i in items if i.action.startswith("refused")]
    if refused:
        raise InputError(refused[0].path, None, f"{refused[0].problem}; {refused[0].action}")
    return Repairs(items)


def apply(world: World, repairs: Repairs) -> None:
    """Make the repairs in the loaded world's entities (saved by the tick's commit)."""
    for item in repairs.items:
        if item.entity is None:
            continue
        kind, eid = item.entity
        entities = world.characters if kind == "characters" else world.locations
        entity = entities.get(eid)
        if entity is None:
            continue
        state = entity.get("_openai")
        if not isinstance(state, dict):
            entity["_openai"] = {}
            continue
        if item.chain is not None and f"{item.chain}_chain" in state:
            state[f"{item.chain}_chain"] = []
        if "usage" in state and not _valid_usage(state["usage"]):
            del state["usage"]
