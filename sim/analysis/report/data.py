"""What the report shows, gathered from the tick logs and the world files.

Only what the page displays is kept: per tick, where each character was (as an index into
the location list), the scenes (narrative, intentions, outcomes) and the numbers; per
character, its memory summary over time and the tokens and cost of its calls. Each tick's
numbers, per-character totals and characters' places come from its summary
(``sim.ticklog.summary``), so the logs are read without their call records and their state
snapshots are unpacked only at a few evenly spread ticks (names, map and memory summaries:
``SNAPSHOTS``), and at every tick whose summary is older than places (its log says where
characters were). The same snapshots give the charts of the characters' own state fields
over the ticks (``field_charts``), and each tick's ``intervention`` records the
interventions marked on the page.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sim.analysis import logview
from sim.errors import LogError, SimError
from sim.gcpause import gc_paused
from sim.llm.budget import Cost, Price, price_usage
from sim.llm.types import Usage
from sim.storage import Storage
from sim.ticklog.books import Books
from sim.ticklog.format import list_logs
from sim.ticklog.reader import TickLog, read_log
from sim.ticklog.records import InterventionRecord
from sim.ticklog.summary import (
    Places,
    Summary,
    read_summary,
    summarize,
    summary_numbers,
    summary_path,
)
from sim.world import World

#: entity-key prefixes of the chains that belong to one character
CHARACTER_CHAINS = ("intention", "memory")
#: memory summaries kept per character (a summary changes every tick once memory is full,
#: and hundreds of characters times a hundred ticks of them would dwarf everything else)
MEMORY_VERSIONS = 16
#: ticks whose state snapshot is unpacked for names, connections and memory summaries
#: (evenly spread, the first always; the world's current state is read too): unpacking
#: every tick's was most of a long history's report
SNAPSHOTS = MEMORY_VERSIONS
#: threads reading ticks, and how many ticks are read ahead of the one being gathered
READERS = 2
READ_AHEAD = 3


@dataclass
class Snapshot:
    """The part of a world's state the report needs."""

    tick: int
    names: dict[str, str] = field(default_factory=dict)  # location and character ids
    connections: dict[str, list[str]] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    summaries: dict[str, str] = field(default_factory=dict)
    world_name: str = ""
    #: character -> its own state fields, flattened (``votes.harbour``: the state charts)
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)


def _snapshot_of(tick: int, files: dict[str, Any]) -> Snapshot:
    """Read a snapshot from parsed entity dicts keyed by relative path."""
    snap = Snapshot(tick)
    for rel, data in files.items():
        if not isinstance(data, dict):
            continue
        if rel == "world.json":
            snap.world_name = str(data.get("name", ""))
            continue
        kind = rel.partition("/")[0]
        try:
            ident = data["identity"]["id"]
            snap.names[ident] = str(data["identity"].get("name") or ident)
            if kind == "locations":
                snap.connections[ident] = [str(c) for c in data["state"]["connections"]]
            elif kind == "characters":
                snap.where[ident] = str(data["state"]["location"])
                snap.summaries[ident] = str((data.get("memory") or {}).get("summary") or "")
                snap.fields[ident] = own_state(data["state"])
        except (KeyError, TypeError, AttributeError):
            continue
    return snap


#: a character's state fields the engine knows (the charts show the world's own)
KNOWN_STATE = frozenset({"location", "mood", "inventory"})
#: at most this many state fields are charted, and a text field with more distinct values
#: than this is free text, not a category
MAX_FIELDS = 12
MAX_CATEGORIES = 12
#: categories drawn per field (the rest are summed as "other")
SHOWN_CATEGORIES = 8


def own_state(state: Any) -> dict[str, Any]:
    """A character's own state fields (not ``location``, ``mood``, ``inventory``), nested
    objects flattened to dotted names."""
    out: dict[str, Any] = {}
    if not isinstance(state, dict):
        return out

    def walk(value: dict[str, Any], prefix: str) -> None:
        for key, item in value.items():
            if isinstance(item, dict) and item:
                walk(item, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = item

    walk({k: v for k, v in state.items() if k not in KNOWN_STATE}, "")
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def field_charts(series: dict[int, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per own state field, its course over the ticks of ``series`` (tick -> character ->
    flattened fields): ``{"f", "kind": "num", "t", "mean", "min", "max", "n"}`` for a field
    whose values are all numbers, ``{"f", "kind": "cat", "t", "cats", "counts"}`` (counts
    per tick, in ``cats`` order; ``other`` sums the rest) for one of text or booleans with
    at most ``MAX_CATEGORIES`` values. Lists, objects and free text are left out."""
    ticks = sorted(series)
    names: dict[str, None] = {}
    for tick in ticks:
        for fields in series[tick].values():
            names.update(dict.fromkeys(fields))
    out: list[dict[str, Any]] = []
    for name in sorted(names):
        per_tick = [[f[name] for f in series[t].values() if f.get(name) is not None] for t in ticks]
        values = [v for vs in per_tick for v in vs]
        if not values:
            continue
        if all(_is_number(v) for v in values):
            out.append(
                {
                    "f": name,
                    "kind": "num",
                    "t": ticks,
                    "mean": [sum(vs) / len(vs) if vs else None for vs in per_tick],
                    "min": [min(vs) if vs else None for vs in per_tick],
                    "max": [max(vs) if vs else None for vs in per_tick],
                    "n": [len(vs) for vs in per_tick],
                }
            )
        elif all(isinstance(v, str | bool) for v in values):
            labels = [orjson.dumps(v).decode() if isinstance(v, bool) else v for v in values]
            totals: dict[str, int] = {}
            for label in labels:
                totals[label] = totals.get(label, 0) + 1
            if len(totals) > MAX_CATEGORIES:
                continue  # free text
            cats = sorted(totals, key=lambda c: (-totals[c], c))
            shown, rest = cats[:SHOWN_CATEGORIES], set(cats[SHOWN_CATEGORIES:])
            counts = []
            for vs in per_tick:
                row = [0] * (len(shown) + (1 if rest else 0))
                for v in vs:
                    label = orjson.dumps(v).decode() if isinstance(v, bool) else v
                    row[shown.index(label) if label not in rest else len(shown)] += 1
                counts.append(row)
            out.append(
                {
                    "f": name,
                    "kind": "cat",
                    "t": ticks,
                    "cats": [*shown, *(["other"] if rest else [])],
                    "counts": counts,
                }
            )
        if len(out) == MAX_FIELDS:
            break
    return out


def _interventions(log: TickLog) -> list[list[str | None]]:
    """The interventions the tick applied (``sim inject``, ``sim set``), as the page shows
    them: ``["inject", location id or None (everywhere), text]`` or ``["set", "<file>
    <field>", "<before> → <after>"]``."""
    out: list[list[str | None]] = []
    for record in log.records:
        if not isinstance(record, InterventionRecord):
            continue
        if record.kind == "inject":
            out.append(["inject", record.location, record.text or ""])
        else:
            change = (
                f"{orjson.dumps(record.before).decode()} → {orjson.dumps(record.after).decode()}"
            )
            out.append(["set", f"{record.target} {record.path}", change])
    return out


def _undo_sets(snap: Snapshot, log: TickLog) -> Snapshot:
    """``snap`` (the log's ``state_before``) with the own state fields its ``sim set``
    interventions changed put back as they were: the state after the previous tick, which
    the charts show (the sets are marked just before this tick)."""
    for record in log.records:
        if not isinstance(record, InterventionRecord) or record.kind != "set":
            continue
        kind, _, cid = (record.target or "").partition("/")
        path = record.path or ""
        fields = snap.fields.get(cid)
        if kind != "characters" or fields is None or not path.startswith("state."):
            continue
        name = path.removeprefix("state.")
        for key in [k for k in fields if k == name or k.startswith(name + ".")]:
            del fields[key]
        fields.update(own_state({name: record.before}) if record.before is not None else {})
    return snap


def snapshot_from_log(log: TickLog) -> Snapshot | None:
    """The state at the start of a logged tick (``None`` when the log has none)."""
    try:
        state = log.state()
    except (LogError, ValueError):
        return None
    files: dict[str, Any] = {}
    for rel, raw in state.items():
        if rel == "world.json" or rel.startswith(("characters/", "locations/")):
            try:
                files[rel] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
    return _snapshot_of(log.tick - 1, files)


def snapshot_from_world(world: World) -> Snapshot:
    files: dict[str, Any] = {"world.json": world.meta}
    files.update({f"characters/{k}.json": v for k, v in world.characters.items()})
    files.update({f"locations/{k}.json": v for k, v in world.locations.items()})
    return _snapshot_of(world.tick, files)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


class _Index:
    """Stable positions for ids: the page refers to locations and characters by index."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.pos: dict[str, int] = {}

    def add(self, ident: str) -> int:
        if ident not in self.pos:
            self.pos[ident] = len(self.ids)
            self.ids.append(ident)
        return self.pos[ident]


def _fallbacks(log: TickLog) -> list[str]:
    out: list[str] = []
    for name, record in log.phases.items():
        for key in record.report.fallbacks:
            reason = record.report.errors.get(key)
            out.append(f"{name} {key}" + (f": {reason}" if reason else ""))
    return out


def _scenes(log: TickLog, chars: _Index, locs: _Index, where: dict[str, str]) -> list[Any]:
    """Per occupied location: its narrative and each present character's intention and
    outcome. Characters with an intention but no outcome are listed with an empty one."""
    narratives = log.phase_results("narrative")
    resolutions = log.phase_results("resolution")
    intentions = log.phase_results("intentions")
    present: dict[str, list[str]] = {}
    for cid, lid in where.items():
        present.setdefault(lid, []).append(cid)
    scenes: list[Any] = []
    add_char = chars.add
    seen = chars.pos  # looked up first: nearly every character is indexed already
    empty: dict[str, Any] = {}
    for lid in sorted(set(narratives) | set(resolutions) | set(present)):
        outcomes: dict[str, str] = {}
        resolution = resolutions.get(lid)
        for item in (resolution or {}).get("outcomes", []) if isinstance(resolution, dict) else []:
            if isinstance(item, dict) and item.get("character_id") is not None:
                outcomes[str(item["character_id"])] = _text(item.get("outcome"))
        rows = []
        here = present.get(lid)
        for cid in sorted(set(here).union(outcomes) if here else outcomes):
            intent = intentions.get(cid)
            if not isinstance(intent, dict):
                intent = empty
            action, target, content = (
                intent.get("action"),
                intent.get("target"),
                intent.get("content"),
            )
            at = seen.get(cid)
            rows.append(
                [
                    add_char(cid) if at is None else at,
                    "" if action is None else str(action),
                    "" if target is None else str(target),
                    "" if content is None else str(content),
                    outcomes.get(cid, ""),
                ]
            )
        scenes.append({"l": locs.add(lid), "n": _text(narratives.get(lid)), "r": rows})
    return scenes


def _character_chains(log: TickLog) -> set[str]:
    """The built-in per-character chains, and those of phases declared per character."""
    chains = set(CHARACTER_CHAINS)
    declared = log.header.config.get("phases") or {}
    for name, section in declared.items() if isinstance(declared, dict) else ():
        is_declared = isinstance(section, dict) and bool(section.get("schema"))
        if is_declared and section.get("per", "character") == "character":
            chains.add(str(name))  # a Python phase's subjects are its own business
    return chains


def _declared(log: TickLog, chars: _Index, locs: _Index) -> list[Any]:
    """Per phase the world declared (or a package added): each subject's answer, on one line."""
    out: list[Any] = []
    for name in log.phases:
        if name in logview.BUILTIN:
            continue
        rows = []
        for subject, answer in log.phase_results(name).items():
            ref = ["c", chars.add(subject)] if subject in chars.pos else None
            if ref is None and subject in locs.pos:
                ref = ["l", locs.add(subject)]
            rows.append([ref or ["w", subject], logview.answer_text(answer)])
        if rows:
            out.append({"p": name, "r": rows})
    return out


#: what a character's tokens are summed by: the prices' key, the owner, the model, the
#: provider and the price factor
_PricedGroup = tuple[str, str, str, str, float]


class _CharacterBooks:
    """Each character's calls, failures and tokens per model over the ticks, kept apart by
    the ``[prices]`` each tick ran with, and priced once per character, model and table at
    the end (pricing every group of every tick was most of the report's time)."""

    def __init__(self) -> None:
        # owner -> [calls, failures, timed out]
        self.counts: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        self.tables: dict[str, dict[str, Price]] = {}
        # per priced group: [input, cached, output] tokens
        self.tokens: defaultdict[_PricedGroup, list[int]] = defaultdict(lambda: [0, 0, 0])
        #: entity key -> (chain, owner)
        self._split: dict[str, tuple[str, str]] = {}

    def add(self, log: TickLog, summary: Summary) -> None:
        """A tick's calls of per-character chains, from its summary: every record and
        attempt, at the tick's own prices (as ``sim log`` and ``sim usage`` count)."""
        table = log.header.prices
        prices = orjson.dumps(
            {m: [p.input, p.cached_input, p.output] for m, p in table.items()},
            option=orjson.OPT_SORT_KEYS,
        ).decode()
        self.tables.setdefault(prices, table)
        chains = _character_chains(log)
        groups = summary.groups
        # per model entry: what its tokens are priced by
        priced_by = [
            (prices, model, groups.provider(m), groups.factor(m))
            for m, model in enumerate(groups.models)
        ]
        split = self._split
        counts_of = self.counts
        tokens = self.tokens
        for key, requests, failures, timed_out, model, inp, cached, outp in zip(
            groups.keys,
            groups.requests,
            groups.failures,
            groups.timed_out,
            groups.model,
            groups.input,
            groups.cached,
            groups.output,
            strict=True,
        ):
            parts = split.get(key or "")
            if parts is None:
                chain, _, owner = (key or "").partition(":")
                parts = split[key or ""] = (chain, owner)
            chain, owner = parts
            if chain not in chains or not owner:
                continue
            # two hundred thousand groups in a 500 x 100 history: summed inline
            counts = counts_of[owner]
            counts[0] += requests
            counts[1] += failures
            counts[2] += timed_out
            table, name, provider, factor = priced_by[model]
            sums = tokens[table, owner, name, provider, factor]
            sums[0] += inp
            sums[1] += cached
            sums[2] += outp

    def books(self) -> dict[str, Books]:
        out = {
            owner: Books(calls=c[0], failures=c[1], timed_out=c[2])
            for owner, c in self.counts.items()
        }
        cache: dict[str, dict[str, Price | None]] = {prices: {} for prices in self.tables}
        for (prices, owner, model, provider, factor), (inp, cached, outp) in self.tokens.items():
            usage = Usage(input_tokens=inp, cached_input_tokens=cached, output_tokens=outp)
            books = out[owner]
            books.usage = books.usage + usage
            table = self.tables[prices]
            books.cost = books.cost + price_usage(
                usage, model, table, cache[prices], provider, factor
            )
        return out


def _read(path: Path, problems: list[LogError], state: bool = True) -> TickLog | None:
    """A tick's log without its call records (the numbers come from its summary) and,
    unless ``state``, without its state snapshot."""
    try:
        return read_log(path, calls=False, state=state)
    except LogError as exc:
        problems.append(exc)
        return None


def _summary_file(world_dir: Path, tick: int) -> Summary | None:
    """The tick's summary file, places included (``None``: none, or unreadable)."""
    path = summary_path(world_dir, tick)
    if os.path.lexists(path):
        with contextlib.suppress(LogError):  # derived data: the log still says it all
            summary = read_summary(path, places=True)
            if summary.head.tick == tick:
                return summary
    return None


def _summary_of_log(log: TickLog, problems: list[LogError]) -> Summary:
    """A tick's summary computed from its full log (a log without a summary file)."""
    try:
        return summarize(read_log(log.path))
    except LogError as exc:  # read once already: only a file changed meanwhile gets here
        problems.append(exc)
        return summarize(log)


def _sampled(numbers: list[int], limit: int) -> set[int]:
    """At most ``limit`` of ``numbers``, evenly spread, always the first and the last."""
    return set(_thin(numbers, limit)) if limit > 1 else set(numbers[:limit])


def _thin(history: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` versions, evenly spread, always the first and the last."""
    if len(history) <= limit:
        return history
    step = (len(history) - 1) / (limit - 1)
    return [history[round(i * step)] for i in range(limit)]


@dataclass
class _Loaded:
    """A tick as the report reads it: its log (without calls), its summary, where each
    character was at its start and, when unpacked, its state snapshot."""

    log: TickLog
    summary: Summary
    where: dict[str, str]
    snap: Snapshot | None


def _where(places: Places | None, snap: Snapshot | None) -> dict[str, str]:
    """Character -> location at a tick's start: from its summary, else its snapshot."""
    if places is not None:
        return places.where()
    return dict(snap.where) if snap is not None else {}


def _world_or_none(world_dir: Path) -> World | None:
    try:
        return Storage(world_dir).load()
    except (SimError, OSError):  # an invalid world still gets a report of its logs
        return None


def collect(world_dir: Path, first: int | None = None, last: int | None = None) -> dict[str, Any]:
    """Everything the page shows, as plain JSON-ready data.

    Args:
        world_dir: the world folder.
        first, last: the range of ticks to include (default: every logged tick).

    Returns:
        A dict with ``world``, ``ticks``, ``chars``, ``locs``, ``edges``, ``fields`` (the
        own state fields' charts), ``problems`` and ``logged`` (how many tick logs the
        world has, in the range or not).
    """
    with gc_paused():
        return _collect(world_dir, first, last)


def _collect(world_dir: Path, first: int | None, last: int | None) -> dict[str, Any]:
    world = _world_or_none(world_dir)
    listed = list_logs(world_dir)
    paths = dict(listed)
    problems: list[LogError] = []
    chars, locs = _Index(), _Index()
    names: dict[str, str] = {}
    connections: dict[str, list[str]] = {}
    summaries: dict[str, list[Any]] = {}
    series: dict[int, dict[str, dict[str, Any]]] = {}  # tick -> character -> own fields
    per_character = _CharacterBooks()
    world_name = ""
    current = snapshot_from_world(world) if world is not None else None

    def wanted(number: int) -> bool:
        return (first is None or number >= first) and (last is None or number <= last)

    sampled = _sampled([n for n, _ in listed if wanted(n)], SNAPSHOTS)

    def load(number: int) -> tuple[_Loaded | None, list[LogError]]:
        """A tick's log, summary and places (and the problems reading them)."""
        seen: list[LogError] = []
        found = _summary_file(world_dir, number)
        # without places (a summary written before them, or none), the log's snapshot
        # says where characters were; a tick after the range is where the range ended
        sample = number in sampled or not wanted(number)
        unpack = sample or found is None or found.places is None
        log = _read(paths[number], seen, state=unpack)
        if log is None:
            return None, seen
        summary = found if found is not None else _summary_of_log(log, seen)
        snap = snapshot_from_log(log) if unpack else None
        if snap is not None:
            snap = _undo_sets(snap, log)
        return _Loaded(log, summary, _where(summary.places, snap), snap), seen

    # Each tick in the range, and the one after each (whose start is where it ended): read
    # a few ahead on other threads (decompressing a log releases the GIL), handled in order.
    selected = [n for n, _ in listed if wanted(n)]
    jobs = sorted(set(selected) | {n + 1 for n in selected if n + 1 in paths})
    ticks: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        pending: dict[int, Future[tuple[_Loaded | None, list[LogError]]]] = {}
        done: dict[int, _Loaded | None] = {}
        queue = iter(jobs)

        def result(number: int) -> _Loaded | None:
            """Tick ``number`` read (its problems noted if it is in the range)."""
            if number not in done:
                while number not in pending:
                    following = next(queue)
                    pending[following] = pool.submit(load, following)
                for following in itertools.islice(queue, max(0, READ_AHEAD - len(pending))):
                    pending[following] = pool.submit(load, following)
                loaded, seen = pending.pop(number).result()
                if wanted(number):
                    problems.extend(seen)
                done[number] = loaded
            return done[number]

        for number in selected:
            loaded = result(number)
            after_loaded = result(number + 1) if number + 1 in paths else None
            for older in [n for n in done if n < number]:
                del done[older]  # one log in memory, plus the next one: logs can be large
            if loaded is None:
                continue
            log, summary, where, snap = loaded.log, loaded.summary, loaded.where, loaded.snap
            after_where: dict[str, str] | None = None
            after: Snapshot | None = None
            if after_loaded is not None:
                after_where, after = after_loaded.where, after_loaded.snap
            elif (
                number + 1 not in paths
                and current is not None
                and current.tick == log.tick
                and log.committed
            ):
                after_where, after = current.where, current
            for s in (snap, after):
                if s is None:
                    continue
                names.update(s.names)
                connections.update(s.connections)
                series.setdefault(s.tick, s.fields)
                world_name = s.world_name or world_name
                for lid in sorted(s.connections):
                    locs.add(lid)
                for cid, text in s.summaries.items():
                    history = summaries.setdefault(cid, [])
                    if not history or history[-1][1] != text:
                        history.append([s.tick, text])
            for places in (where, after_where or {}):
                for cid in sorted(places):
                    chars.add(cid)
            numbers = summary_numbers(summary.head)
            per_character.add(log, summary)
            moves = []
            if after_where is not None:
                for cid, dest in sorted(after_where.items()):
                    if cid in where and where[cid] != dest:
                        moves.append([chars.add(cid), locs.add(where[cid]), locs.add(dest)])
            ticks.append(
                {
                    "t": log.tick,
                    "committed": log.committed,
                    "calls": numbers["calls"],
                    "failures": numbers["failures"],
                    "tokens": numbers["tokens"],
                    "cost": numbers["cost"],
                    "wall": numbers["wall"],
                    "fallbacks": _fallbacks(log),
                    "at": {chars.add(c): locs.add(lid) for c, lid in sorted(where.items())},
                    "moves": moves,
                    "scenes": _scenes(log, chars, locs, where),
                    "phases": _declared(log, chars, locs),
                    "iv": _interventions(log),
                }
            )
    totals = per_character.books()
    if current is not None:
        names.update(current.names)  # the newest names
        for lid in sorted(current.connections):
            connections.setdefault(lid, current.connections[lid])
            locs.add(lid)
        for cid in sorted(current.where):
            chars.add(cid)
        world_name = current.world_name or world_name
    for tick in ticks:  # JSON object keys are strings; the page wants [char, loc] pairs
        tick["at"] = sorted(tick["at"].items())
    edges = _edges(connections, locs)
    return {
        "world": world_name or world_dir.name,
        "ticks": ticks,
        "chars": [
            _character(cid, names.get(cid, cid), totals.get(cid), summaries.get(cid, []))
            for cid in chars.ids
        ],
        "locs": [{"id": lid, "name": names.get(lid, lid)} for lid in locs.ids],
        "edges": edges,
        "fields": field_charts(series),
        "problems": [str(p) for p in problems],
        "logged": len(listed),
    }


def _character(cid: str, name: str, totals: Books | None, memory: list[Any]) -> dict[str, Any]:
    totals = totals or Books(cost=Cost())
    return {
        "id": cid,
        "name": name,
        "tokens": totals.tokens,
        "cost": totals.cost.value,
        "calls": totals.calls,
        "failures": totals.failures,
        "memory": _thin(memory, MEMORY_VERSIONS),
        "memory_versions": len(memory),
    }


def _edges(connections: dict[str, list[str]], locs: _Index) -> list[list[int]]:
    """``[a, b, one_way]`` per connected pair (a < b for two-way ones, drawn once)."""
    pairs = {(a, b) for a, targets in connections.items() for b in targets if a != b}
    out: list[list[int]] = []
    for a, b in sorted(pairs):
        if (b, a) in pairs:
            if a < b:
                out.append([locs.add(a), locs.add(b), 0])
        else:
            out.append([locs.add(a), locs.add(b), 1])
    return out
