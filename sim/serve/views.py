"""What the API answers: the world now, one character, one logged tick, the history.

Read from the world folder and its tick logs as ``sim report`` reads them
(``sim.analysis.report.data``), as plain JSON-ready values keyed by id. A big world is
answered in pages: ``world`` lists at most ``limit`` characters and at most ``MAP_PLACES``
places, each with a count of its occupants, so neither the answer nor the page grows with
the world.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from sim import sections
from sim.analysis.report.data import collect
from sim.errors import InputError, LogError
from sim.serve.loading import file_stamp, world_stamp
from sim.ticklog.format import list_logs
from sim.world import World

#: characters listed per page of ``/api/world`` by default, and at most
PAGE = 200
MAX_PAGE = 1000


def world_tick(world_dir: Path) -> int | None:
    """The committed tick of the world, read from ``world.json`` alone (cheap: polled);
    ``None`` when it cannot be read now (a commit renaming it, a broken file)."""
    try:
        with open(world_dir / "world.json", "rb") as handle:
            meta = orjson.loads(handle.read(1 << 20))
        tick = meta.get("tick") if isinstance(meta, dict) else None
    except (OSError, orjson.JSONDecodeError):
        return None
    return tick if isinstance(tick, int) and not isinstance(tick, bool) else None


#: logged ticks' views kept (each is a few hundred kB for a thousand characters)
KEPT_TICKS = 32


class LogViews:
    """``tick_view`` and ``history_view``, computed again only when what they read changed:
    the tick's log file (a resume or a compaction rewrites it) and the world's files
    (names come from the world as it is now)."""

    def __init__(self, world_dir: Path) -> None:
        self.world_dir = world_dir
        self._ticks: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._history: (
            tuple[tuple[Any, ...], tuple[dict[str, Any], dict[str, dict[str, Any]]]] | None
        ) = None
        self._recalled: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def tick(self, number: int) -> dict[str, Any]:
        paths = dict(list_logs(self.world_dir))
        if number not in paths:
            raise InputError(None, "tick", f"no logged tick {number}")
        key = (file_stamp(paths[number]), world_stamp(self.world_dir))
        kept = self._ticks.get(number)
        if kept is not None and kept[0] == key:
            return kept[1]
        view = tick_view(self.world_dir, number)
        if len(self._ticks) >= KEPT_TICKS:
            self._ticks.pop(next(iter(self._ticks)))
        self._ticks[number] = (key, view)
        return view

    def _both(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        logs = list_logs(self.world_dir)
        key = (tuple((n, file_stamp(p)) for n, p in logs), world_stamp(self.world_dir))
        if self._history is not None and self._history[0] == key:
            return self._history[1]
        both = history_view(self.world_dir)
        self._history = (key, both)
        return both

    def history(self) -> dict[str, Any]:
        return self._both()[0]

    def recalled(self, cid: str) -> dict[str, Any] | None:
        """What the last logged tick's intention call showed character ``cid`` of its
        memory (``recalled_view``); ``None`` before any tick is logged."""
        logs = list_logs(self.world_dir)
        if not logs:
            return None
        number, path = logs[-1]
        key = (number, file_stamp(path))
        if self._recalled is None or self._recalled[0] != key:
            self._recalled = (key, recalled_view(path))
        shown = self._recalled[1]
        if "problem" in shown:
            return {"tick": number, "mode": None, "lines": [], "problem": shown["problem"]}
        entry = shown["characters"].get(cid)
        if entry is None:
            return {"tick": number, "mode": None, "lines": [], "problem": "no intention call"}
        return {"tick": number, **entry, "problem": None}

    def character_books(self, cid: str) -> dict[str, Any] | None:
        """The calls, failures, tokens and cost of a character's own chains (intentions,
        memory, declared per-character phases) over the logged ticks."""
        return self._both()[1].get(cid)


#: the phase whose input's memory the inspector shows, and its calls' key prefix
RECALL_PHASE = "intentions"
RECALL_KEY = "intention:"


def recalled_view(path: Path) -> dict[str, Any]:
    """What each character's intention call in the log at ``path`` showed it of its
    memory, read back from the call's input as it was sent (``sim.sections``): under
    ``recall``, the cells ``[memory] mode = "retrieve"`` chose for its situation
    (``"mode": "retrieve"``); under ``recent``, the window's last cells (``"window"``); a
    world's own input template that shows neither: ``"mode": null``. A call made again
    (a retry) counts as its last. ``{"problem": ...}`` when the log cannot be read."""
    from sim.ticklog.reader import read_log
    from sim.ticklog.records import CallRecord

    try:
        log = read_log(path)
    except (LogError, InputError, OSError) as exc:
        return {"problem": str(exc)}
    out: dict[str, dict[str, Any]] = {}
    for record in log.records:
        if not isinstance(record, CallRecord) or record.phase != RECALL_PHASE:
            continue
        key = record.entity_key or ""
        if not key.startswith(RECALL_KEY):
            continue
        doc = sections.loads(record.input)
        memory = doc.get("memory") if isinstance(doc, dict) else None
        mode: str | None = None
        lines: Any = []
        if isinstance(memory, dict) and "recall" in memory:
            mode, lines = "retrieve", memory["recall"]
        elif isinstance(memory, dict) and "recent" in memory:
            mode, lines = "window", memory["recent"]
        if not isinstance(lines, list):
            lines = [lines]
        out[key.removeprefix(RECALL_KEY)] = {"mode": mode, "lines": [str(x) for x in lines]}
    return {"characters": out}


def _name(entity: dict[str, Any], fallback: str) -> str:
    identity = entity.get("identity")
    name = identity.get("name") if isinstance(identity, dict) else None
    return str(name) if name else fallback


def _location(entity: dict[str, Any]) -> str | None:
    state = entity.get("state")
    where = state.get("location") if isinstance(state, dict) else None
    return None if where is None else str(where)


#: the most places ``/api/world`` lists; a bigger world lists its busiest (the map draws them)
MAP_PLACES = 60


def places_view(world: World) -> dict[str, Any]:
    """The places ``/api/world`` lists (every one, or the ``MAP_PLACES`` with the most
    characters, ties by id), each with its ``count`` of characters there now, sorted by id;
    and how many places there are. Computed once per load (``WorldCache.derived``)."""
    counts: dict[str, int] = {}
    for entity in world.characters.values():
        where = _location(entity)
        if where is not None:
            counts[where] = counts.get(where, 0) + 1
    ids = sorted(world.locations)
    if len(ids) > MAP_PLACES:
        ids = sorted(sorted(ids, key=lambda lid: (-counts.get(lid, 0), lid))[:MAP_PLACES])
    locations = []
    for lid in ids:
        entity = world.locations[lid]
        state = entity.get("state")
        connections = state.get("connections") if isinstance(state, dict) else None
        locations.append(
            {
                "id": lid,
                "name": _name(entity, lid),
                "connections": [str(c) for c in connections or []],
                "count": counts.get(lid, 0),
            }
        )
    return {
        "locations": locations,
        "total_locations": len(world.locations),
        "locations_shown": "all" if len(ids) == len(world.locations) else "busiest",
    }


def world_view(
    world: World, offset: int = 0, limit: int = PAGE, places: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``GET /api/world``: the tick, the places (``places_view``, computed here unless
    given) and one page of the characters, sorted by id."""
    if places is None:
        places = places_view(world)
    ids = sorted(world.characters)
    page = ids[offset : offset + limit]
    return {
        "name": str(world.meta.get("name") or world.root.name),
        "tick": world.tick,
        "logged": [number for number, _ in list_logs(world.root)],
        **places,
        "total_characters": len(ids),
        "offset": offset,
        "limit": limit,
        "characters": [_listed(world, cid) for cid in page],
    }


def _listed(world: World, cid: str) -> dict[str, Any]:
    """A character as ``/api/world`` lists it: its place named (a big world lists only its
    busiest places)."""
    where = _location(world.characters[cid])
    place = world.locations.get(where) if where is not None else None
    return {
        "id": cid,
        "name": _name(world.characters[cid], cid),
        "location": where,
        "location_name": None if where is None else _name(place or {}, where),
    }


#: the most characters the network draws one by one; past it, it is drawn by place
NETWORK_CHARACTERS = 150
#: the most ties drawn one by one; past it, the network is drawn by place
NETWORK_TIES = 1500


def _ties(world: World) -> dict[tuple[str, str], dict[str, Any]]:
    """Every tie between two characters once, as ``(lower id, higher id)`` -> the first
    one's view of it (``kind``, ``trust``) and whether the other holds one back. A tie to a
    character that does not exist is left out (``sim validate`` names it)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for cid in sorted(world.characters):
        relations = world.characters[cid].get("relationships")
        if not isinstance(relations, dict):
            continue
        for other in sorted(relations):
            if other == cid or other not in world.characters:
                continue
            tie = relations[other]
            pair = (cid, other) if cid < other else (other, cid)
            if pair in out:
                out[pair]["mutual"] = True
                continue
            kind = tie.get("kind") if isinstance(tie, dict) else None
            trust = tie.get("trust") if isinstance(tie, dict) else None
            out[pair] = {
                "a": cid,
                "b": other,
                "kind": None if kind is None else str(kind),
                "trust": (
                    trust
                    if isinstance(trust, int | float) and not isinstance(trust, bool)
                    else None
                ),
                "mutual": False,
            }
    return out


def network_view(world: World) -> dict[str, Any]:
    """``GET /api/network``: the characters' ties (from their ``relationships``), each tie
    once. A world of at most ``NETWORK_CHARACTERS`` characters and ``NETWORK_TIES`` ties is
    answered by character (``"by": "character"``: ``nodes`` with ``id``, ``name``,
    ``location``; ``edges`` with ``a``, ``b``, ``kind``, ``trust``, ``mutual``); a bigger
    one by place (``"by": "place"``: ``nodes`` with ``id``, ``name``, ``count``, ``ties``
    within; ``edges`` with ``a``, ``b``, ``ties`` between, the ``NETWORK_TIES`` most tied
    of the ``place_pairs`` pairs of places with a tie; ``total_places`` places have a
    character, and past ``MAP_PLACES`` only that many, the busiest, are drawn, with the
    ties between them), so the page never draws one node per character, nor per place, of
    a big world. Nodes are sorted by place, then id."""
    ties = _ties(world)
    order = {lid: i for i, lid in enumerate(sorted(world.locations))}

    def where(cid: str) -> str:
        return _location(world.characters[cid]) or ""

    base = {
        "tick": world.tick,
        "total_characters": len(world.characters),
        "total_ties": len(ties),
    }
    if len(world.characters) <= NETWORK_CHARACTERS and len(ties) <= NETWORK_TIES:
        ids = sorted(world.characters, key=lambda c: (order.get(where(c), len(order)), c))
        return {
            **base,
            "by": "character",
            "nodes": [
                {"id": c, "name": _name(world.characters[c], c), "location": where(c) or None}
                for c in ids
            ],
            "edges": list(ties.values()),
        }
    counts: dict[str, int] = {}
    for cid in world.characters:
        counts[where(cid)] = counts.get(where(cid), 0) + 1
    within: dict[str, int] = {}
    between: dict[tuple[str, str], int] = {}
    for a, b in ties:
        pa, pb = where(a), where(b)
        if pa == pb:
            within[pa] = within.get(pa, 0) + 1
        else:
            key = (pa, pb) if pa < pb else (pb, pa)
            between[key] = between.get(key, 0) + 1
    shown = set(counts)
    if len(shown) > MAP_PLACES:  # the busiest places, as the map shows them
        shown = set(sorted(counts, key=lambda p: (-counts[p], p))[:MAP_PLACES])
        between = {pair: n for pair, n in between.items() if pair[0] in shown and pair[1] in shown}
    places = sorted(shown, key=lambda p: (order.get(p, len(order)), p))
    return {
        **base,
        "by": "place",
        "nodes": [
            {
                "id": p,
                "name": _name(world.locations[p], p) if p in world.locations else p or "?",
                "count": counts[p],
                "ties": within.get(p, 0),
            }
            for p in places
        ],
        # the most-tied pairs of places, at most NETWORK_TIES lines
        "edges": [
            {"a": a, "b": b, "ties": n}
            for (a, b), n in sorted(
                sorted(between.items(), key=lambda item: (-item[1], item[0]))[:NETWORK_TIES]
            )
        ],
        "place_pairs": len(between),
        "total_places": len(counts),
    }


def character_view(world: World, cid: str) -> dict[str, Any]:
    """``GET /api/characters/{id}``: the character's file as it is now (identity, goals,
    state, memory, relationships), and its name."""
    entity = world.characters.get(cid)
    if entity is None:
        raise InputError(None, "id", f"no character {cid!r}")
    return {"id": cid, "name": _name(entity, cid), "tick": world.tick, "entity": entity}


def _ref(table: list[dict[str, Any]], index: int) -> dict[str, str]:
    item = table[index]
    return {"id": str(item["id"]), "name": str(item["name"])}


def tick_view(world_dir: Path, number: int) -> dict[str, Any]:
    """``GET /api/ticks/{n}``: a logged tick's scenes (narrative, each character's intention
    and outcome), moves, interventions and numbers, as ``sim report`` reads them.

    Raises:
        InputError: no log of that tick.
    """
    if number not in dict(list_logs(world_dir)):
        raise InputError(None, "tick", f"no logged tick {number}")
    data = collect(world_dir, number, number)
    if not data["ticks"]:
        problems = "; ".join(data["problems"]) or "its log could not be read"
        raise InputError(None, "tick", f"tick {number}: {problems}")
    tick = data["ticks"][0]
    chars, locs = data["chars"], data["locs"]
    scenes = []
    for scene in tick["scenes"]:
        scenes.append(
            {
                "location": _ref(locs, scene["l"]),
                "narrative": scene["n"],
                "characters": [
                    {
                        **_ref(chars, row[0]),
                        "action": row[1],
                        "target": row[2],
                        "content": row[3],
                        "outcome": row[4],
                    }
                    for row in scene["r"]
                ],
            }
        )
    return {
        "tick": tick["t"],
        "committed": tick["committed"],
        "calls": tick["calls"],
        "failures": tick["failures"],
        "tokens": tick["tokens"],
        "cost": tick["cost"],
        "wall": tick["wall"],
        "scenes": scenes,
        "moves": [
            {"character": _ref(chars, c), "from": _ref(locs, a), "to": _ref(locs, b)}
            for c, a, b in tick["moves"]
        ],
        "interventions": [{"kind": k, "where": w, "what": t} for k, w, t in tick["iv"]],
        "fallbacks": tick["fallbacks"],
        "problems": data["problems"],
    }


def history_view(world_dir: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``GET /api/history``: per logged tick its calls, tokens, cost and wall time, and the
    charts of the characters' own state fields over the ticks; and, per character, the
    calls, failures, tokens and cost of its own chains over the logged ticks (for the
    inspector: ``character_books``, ``None`` before any tick is logged). With no tick
    logged there is nothing to read: the world is not loaded again (for a big world that
    load is seconds)."""
    if not list_logs(world_dir):
        return {"ticks": [], "fields": [], "problems": []}, {}
    data = collect(world_dir)
    view = {
        "ticks": [
            {key: t[key] for key in ("t", "committed", "calls", "failures", "tokens", "cost")}
            for t in data["ticks"]
        ],
        "fields": data["fields"],
        "problems": data["problems"],
    }
    books = {
        str(c["id"]): {key: c[key] for key in ("calls", "failures", "tokens", "cost")}
        for c in data["chars"]
    }
    return view, books
