"""A first look at a big world while its full load runs: who is where, counted.

The validated load of a 100,000-character world (``Storage.load``: every file parsed,
validated by pydantic and normalised) takes seconds. Before it, ``scan`` reads each
entity file once and keeps only what the aggregated views need (``/api/world``'s places
and counts, ``/api/network`` by place): a character's id, name, location and ties, a
place's id, name and connections. The files are read as the load reads them (a packed
world's from its pack, ``sim.pack``)
(``sim.safefs``: no link followed, no hard link, no file over ``max_entity_bytes``, the
pending journal's files in place of those it rewrites), and what is kept is checked
minimally: each id matches the id pattern and its file's name, each name is a non-empty
string, each location, tie and connection names an id. A file that fails is left out
(``skipped``), never shown; the full load names its problem. Nothing else of a file is
kept, and what is kept is only ever answered as JSON (the page shows it as text).

The first look is answered only when asked for (``?preview=1``) and only until the full
load ends; then the views are those of the validated world, or the world's problems (a
422) if it does not validate.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sim import safefs
from sim.errors import SimError
from sim.gcpause import gc_paused
from sim.pack import is_packed, read_pack
from sim.storage import Storage
from sim.world import ID_RE, TRUST_RANGE, World

#: the longest id kept (as ``sim.world.EntityId``)
MAX_ID = 128

Entity = dict[str, Any]


@dataclass(frozen=True)
class Preview:
    """What ``scan`` kept, as a ``World`` of minimal entities (only the views' fields),
    and how many entity files were left out for failing the minimal checks."""

    world: World
    files: int
    skipped: int
    seconds: float


_IS_ID = ID_RE.fullmatch  # whole: ``$`` alone would let a trailing newline through


def _id(value: Any) -> str | None:
    if type(value) is str and len(value) <= MAX_ID and _IS_ID(value):
        return value
    return None


def _name(value: Any) -> str | None:
    return value if type(value) is str and value else None


def _ties(value: Any) -> dict[str, Entity]:
    """A character's ties kept: those to an id, with a kind (a non-empty string) and a
    trust in range (a tie that fails is left out of the first look, not the file)."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, Entity] = {}
    for other, tie in value.items():
        if _id(other) is None or not isinstance(tie, dict):
            continue
        kind, trust = tie.get("kind"), tie.get("trust", 0.5)
        if (
            _name(kind) is None
            or isinstance(trust, bool)
            or not isinstance(trust, int | float)
            or not TRUST_RANGE[0] <= trust <= TRUST_RANGE[1]
        ):
            continue
        out[other] = {"kind": kind, "trust": trust}
    return out


def character(eid: str, data: Any) -> Entity | None:
    """What the first look keeps of a character file named ``eid``: its id, name,
    location and ties; ``None``: it fails the minimal checks."""
    if type(data) is not dict:
        return None
    identity, state = data.get("identity"), data.get("state")
    if type(identity) is not dict or type(state) is not dict or identity.get("id") != eid:
        return None
    name, where = identity.get("name"), state.get("location")
    if type(name) is not str or not name or _id(where) is None:
        return None
    kept: Entity = {"identity": {"id": eid, "name": name}, "state": {"location": where}}
    relations = data.get("relationships")
    if relations:
        ties = _ties(relations)
        if ties:
            kept["relationships"] = ties
    return kept


def location(eid: str, data: Any) -> Entity | None:
    """What the first look keeps of a location file named ``eid``: its id, name and
    connections; ``None``: it fails the minimal checks."""
    if type(data) is not dict:
        return None
    identity, state = data.get("identity"), data.get("state")
    if type(identity) is not dict or type(state) is not dict:
        return None
    name, links = _name(identity.get("name")), state.get("connections")
    if identity.get("id") != eid or name is None or not isinstance(links, list):
        return None
    connections = [c for c in links if _id(c) is not None]
    return {"identity": {"id": eid, "name": name}, "state": {"connections": connections}}


Keep = Callable[[str, Any], "Entity | None"]


def _read(dir_fd: int, name: str, shown: Path, limit: int) -> bytes | None:
    """An entity file's bytes, read as the load reads them (``sim.safefs.read_at``: a
    regular file of its own, no link followed, at most ``limit`` bytes); ``None``: it
    breaks a rule, or cannot be read (the load names the problem)."""
    try:
        return safefs.read_at(dir_fd, name, shown, limit, one_link=True)
    except (SimError, OSError):
        return None


def _kind(
    world_dir: Path,
    kind: str,
    keep: Keep,
    limit: int,
    overlay: dict[str, bytes | None],
    pack: dict[str, bytes] | None,
) -> tuple[dict[str, Entity], int]:
    """``kind``'s entities kept by id (sorted), and how many of its files were left out.
    Each file is parsed as it is read (from its folder, or from a packed world's ``pack``),
    and only what ``keep`` keeps of it is held."""
    out: dict[str, Entity] = {}
    files = 0
    loads, decode_error = orjson.loads, orjson.JSONDecodeError

    def take(name: str, raw: bytes | None) -> None:
        eid = _id(name[:-5])  # less ".json"
        if eid is None or raw is None:
            return
        try:
            entity = keep(eid, loads(raw))
        except decode_error:
            return
        if entity is not None:
            out[eid] = entity

    prefix = f"{kind}/"
    if pack is not None:
        for rel, packed in pack.items():
            if rel.startswith(prefix) and rel not in overlay:
                files += 1
                take(rel[len(prefix) :], packed)
    else:
        folder = world_dir / kind  # named in no error: a skipped file is only counted
        with safefs.open_dir(world_dir, [kind]) as dir_fd:
            for name in sorted(os.listdir(dir_fd)):
                if name.endswith(".json") and f"{kind}/{name}" not in overlay:
                    files += 1
                    take(name, _read(dir_fd, name, folder, limit))
    for rel, raw in sorted(overlay.items()):  # the pending journal's files, as the load
        rest = rel[len(prefix) :]
        if rel.startswith(prefix) and "/" not in rest and rest.endswith(".json") and raw:
            files += 1
            take(rest, raw)
    return {eid: out[eid] for eid in sorted(out)}, files - len(out)


def scan(world_dir: Path, max_entity_bytes: int) -> Preview:
    """The first look at the world in ``world_dir`` (see the module's docstring).

    Raises:
        SimError, OSError: ``world.json``, the pending journal or a folder cannot be read
            as the load reads them (the load names the problem; there is no first look).
    """
    started = time.perf_counter()
    storage = Storage(world_dir, max_entity_bytes)
    meta = storage.load_meta()  # validated, as the load validates it
    overlay = storage.pending_files()
    pack = read_pack(world_dir, max_entity_bytes) if is_packed(world_dir) else None
    with gc_paused():  # many short-lived dicts, no cycles: the collector only slows it
        characters, skipped_c = _kind(
            world_dir, "characters", character, max_entity_bytes, overlay, pack
        )
        locations, skipped_l = _kind(
            world_dir, "locations", location, max_entity_bytes, overlay, pack
        )
    world = World(world_dir, dict(meta), characters, locations)
    files = len(characters) + len(locations) + skipped_c + skipped_l
    return Preview(world, files, skipped_c + skipped_l, time.perf_counter() - started)
