"""Tidy tables of a world's history, built from its tick logs and its folder (stdlib only).

Seven tables, one row per observation, for ``sim export`` and ``sim.analysis.load``:

- ``characters``: one row per committed tick and character, and a baseline row per
  character for the tick before the first logged one (its ``state_before``: tick 0 for a
  whole history) when the window starts there. The state columns (``location``,
  ``mood``, ``inventory``, ``memory_summary``, every custom field of ``state`` flattened
  to ``state.<path>`` and every identity field but the id flattened to
  ``identity.<path>``) are the character
  *after* the tick; ``action``, ``target``, ``content``, ``reasoning`` and ``outcome`` are
  what it meant to do during the tick and what came of it (empty in a baseline row).
- ``interactions``: one row per speech, act or custom verb of a tick, and per utterance of
  its conversations (``kind`` ``utterance``), at the location where
  the character stood when the tick began (``from`` the character, ``to`` its target).
- ``locations``: one row per committed tick and location: who is there after the tick and
  the tick's narrative of the place (the scene of those who were there when it began).
- ``edges``: one row per tick and relationship (``from`` the character holding it, ``to``
  the other, ``kind``, ``trust`` and the world's own attributes as columns), the network
  after the tick, with the same baseline tick as ``characters``.
- ``messages``: one row per message a tick delivered (``[messages]``, ``sim.messages``):
  ``from`` the sender, ``to`` the recipient (a tie, wherever they were) and its ``text``;
  the recipient sees it in the next tick's input.
- ``calls``: one row per logged call record, superseded ones included (a resumed tick may
  have sent a call twice: both were billed), with tokens and cost over every attempt
  (``sim.ticklog.books``) and the cost empty (``None``) where a model had no price.
- ``surveys``: one row per tick, character and question answered with ``sim ask`` (a
  study's surveys): the answer (a coded answer's value), its format and reason; the last
  answer given when a question was asked twice at one tick, failed answers left out.

The state after tick N is the ``state_before`` snapshot of tick N+1's log (read with the
log reader, ``sim.ticklog.reader``), or the world folder itself when N is the world's
current tick. Only committed ticks up to the world's current tick are exported: an
interrupted tick changed nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.errors import InputError, LogError
from sim.llm.budget import Price
from sim.llm.store import split_key
from sim.ticklog.books import call_cost, call_usage
from sim.ticklog.format import read_state, unpack_state
from sim.ticklog.reader import TickLog, read_logs
from sim.world import Relationship

#: a table cell: JSON-like (lists and objects are kept as such until a writer encodes them)
Cell = Any

CHARACTER_COLUMNS = (
    "tick",
    "character",
    "location",
    "mood",
    "inventory",
    "action",
    "target",
    "content",
    "reasoning",
    "outcome",
    "memory_summary",
)
INTERACTION_COLUMNS = ("tick", "location", "from", "to", "kind", "content")
LOCATION_COLUMNS = ("tick", "location", "occupants", "narrative")
SURVEY_COLUMNS = ("tick", "character", "question", "format", "answer", "reason", "model")
CALL_COLUMNS = (
    "tick",
    "phase",
    "entity",
    "model",
    "attempts",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost_usd",
    "latency",
    "error",
    "request_id",
)
EDGE_COLUMNS = ("tick", "from", "to", "kind", "trust")
MESSAGE_COLUMNS = ("tick", "from", "to", "text")
#: the edges table's key columns, and the prefix of an attribute named like one
_EDGE_KEYS = ("tick", "from", "to")
EDGE_ATTRIBUTE_PREFIX = "attribute."
#: a relationship's trust when its file leaves it out
DEFAULT_TRUST: float = Relationship.model_fields["trust"].default
#: the prefix of a flattened custom state field's column (``state.health``)
STATE_PREFIX = "state."
#: the prefix of a flattened identity field's column (``identity.age``)
IDENTITY_PREFIX = "identity."
#: intention actions that are not interactions with someone or something
_NOT_INTERACTIONS = frozenset({"move", "wait"})
#: the kind an interaction is listed as, by intention action (others keep their verb)
_KINDS = {"speak": "speech", "act": "act"}


@dataclass
class Table:
    """One tidy table: its columns in order and its rows (a dict per row, by column)."""

    name: str
    columns: list[str]
    rows: list[dict[str, Cell]] = field(default_factory=list)

    def records(self) -> list[dict[str, Cell]]:
        """Every row with every column, in column order (a missing cell is ``None``)."""
        return [{column: row.get(column) for column in self.columns} for row in self.rows]


@dataclass
class Tables:
    """The tables of ``sim export``, and the logs that could not be read."""

    characters: Table
    interactions: Table
    locations: Table
    calls: Table
    ticks: list[int] = field(default_factory=list)
    problems: list[LogError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    surveys: Table = field(default_factory=lambda: Table("surveys", list(SURVEY_COLUMNS)))
    #: one row per relationship per tick (the network after the tick)
    edges: Table = field(default_factory=lambda: Table("edges", list(EDGE_COLUMNS)))
    #: one row per message delivered (the message channel)
    messages: Table = field(default_factory=lambda: Table("messages", list(MESSAGE_COLUMNS)))

    def all(self) -> list[Table]:
        return [
            self.characters,
            self.interactions,
            self.locations,
            self.calls,
            self.surveys,
            self.edges,
            self.messages,
        ]


# -- typed views of what the tables read -------------------------------------------------------


class _View(BaseModel):
    """Lenient: the tables read a few fields and ignore the rest."""

    model_config = ConfigDict(extra="ignore")


class _CharacterState(BaseModel):
    """A character's ``state``: the known fields, and the custom ones as ``model_extra``."""

    model_config = ConfigDict(extra="allow")

    location: str = ""
    mood: str = ""
    inventory: list[Any] = []


class _Memory(_View):
    summary: str = ""


class _Character(_View):
    identity: dict[str, Any] = {}
    state: _CharacterState
    memory: _Memory = _Memory()
    relationships: dict[str, dict[str, Any]] | None = None


class _Intention(_View):
    action: str = ""
    target: str | None = None
    content: str = ""
    reasoning: str = ""


class _Outcome(_View):
    character_id: str
    outcome: str = ""


class _Resolution(_View):
    outcomes: list[_Outcome] = []


class _Message(BaseModel):
    """A delivered message as the apply phase logs it (``sim.messages.Sent.record``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    from_: str = Field(alias="from")
    to: str
    text: str = ""


def _message_rows(log: TickLog, notes: list[str]) -> list[dict[str, Cell]]:
    sent = log.phase_results("apply").get("messages")
    if not isinstance(sent, list):
        return []
    rows: list[dict[str, Cell]] = []
    for item in sent:
        try:
            message = _Message.model_validate(item)
        except ValidationError:
            notes.append(f"tick {log.tick}: a logged message not understood; left out")
            continue
        rows.append(
            {"tick": log.tick, "from": message.from_, "to": message.to, "text": message.text}
        )
    return rows


@dataclass
class _State:
    """Characters and location ids of one state snapshot."""

    characters: dict[str, _Character]
    locations: list[str]


def _state(files: Mapping[str, bytes], where: str) -> _State:
    characters: dict[str, _Character] = {}
    locations: list[str] = []
    for rel in sorted(files):
        kind, _, name = rel.partition("/")
        if kind == "locations" and name.endswith(".json"):
            locations.append(name.removesuffix(".json"))
        elif kind == "characters" and name.endswith(".json"):
            try:
                characters[name.removesuffix(".json")] = _Character.model_validate_json(files[rel])
            except ValidationError as exc:
                problem = exc.errors()[0]
                loc = ".".join(str(p) for p in problem["loc"])
                raise InputError(f"{where}: {rel}", loc or None, problem["msg"]) from None
    return _State(characters, locations)


def flatten(value: Mapping[str, Any], prefix: str = STATE_PREFIX) -> dict[str, Cell]:
    """Nested objects as dotted columns: ``{"a": {"b": 1}}`` -> ``{"state.a.b": 1}``.

    Lists and empty objects stay whole (one cell); writers encode them as JSON text.
    """
    out: dict[str, Cell] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict) and item:
            out.update(flatten(item, name + "."))
        else:
            out[name] = item
    return out


def _results(log: TickLog, phase: str, model: type[_View], notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in log.phase_results(phase).items():
        try:
            out[key] = model.model_validate(value)
        except ValidationError:
            notes.append(f"tick {log.tick}: {phase} result for {key!r} not understood; left empty")
    return out


# -- building -----------------------------------------------------------------------------------


def _window(ticks: list[int], first: int | None, last: int | None) -> list[int]:
    return [t for t in ticks if (first is None or t >= first) and (last is None or t <= last)]


def build_tables(root: Path, first: int | None = None, last: int | None = None) -> Tables:
    """The tidy tables of a world's committed ticks ``first``..``last`` (inclusive).

    Raises:
        InputError: not a world folder, a bad tick range, or a snapshot that is not a world.
    """
    if first is not None and last is not None and first > last:
        raise InputError(None, "--from/--to", f"--from {first} is after --to {last}")
    current_files = read_state(root)
    if "world.json" not in current_files:
        raise InputError(root / "world.json", None, "not found: is this a world folder?")
    try:
        meta = orjson.loads(current_files["world.json"])
        current_tick = int(meta["tick"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise InputError(root / "world.json", "tick", "expected an integer tick") from None

    logs, problems = read_logs(root)
    by_tick = {log.tick: log for log in logs if log.tick <= current_tick}
    committed = sorted(t for t, log in by_tick.items() if log.committed)
    ticks = _window(committed, first, last)
    tables = Tables(
        Table("characters", list(CHARACTER_COLUMNS)),
        Table("interactions", list(INTERACTION_COLUMNS)),
        Table("locations", list(LOCATION_COLUMNS)),
        Table("calls", list(CALL_COLUMNS)),
        ticks=ticks,
        problems=problems,
    )
    custom: dict[str, None] = {}  # custom columns in first-seen order
    identity: dict[str, None] = {}
    attributes: dict[str, None] = {}  # edge attributes beyond kind and trust
    for i, tick in enumerate(ticks):
        log = by_tick[tick]
        before = _state(log.state(), f"{log.path}: state_before")
        if i == 0 and tick == committed[0]:  # the state before the first logged tick
            for row in _baseline_rows(tick - 1, before):
                custom.update(dict.fromkeys(k for k in row if k.startswith(STATE_PREFIX)))
                identity.update(dict.fromkeys(k for k in row if k.startswith(IDENTITY_PREFIX)))
                tables.characters.rows.append(row)
            for row in _edge_rows(tick - 1, before):
                attributes.update(dict.fromkeys(k for k in row if k not in EDGE_COLUMNS))
                tables.edges.rows.append(row)
        after_log = by_tick.get(tick + 1)
        if tick == current_tick:
            after: _State | None = _state(current_files, str(root))
        elif after_log is not None and after_log.state_before is not None:
            after = _state(unpack_state(after_log.state_before), f"{after_log.path}")
        else:
            after = None
            tables.notes.append(
                f"tick {tick}: the state after it is not logged (tick {tick + 1}'s log is "
                "missing); its state columns are empty"
            )
        for row in _character_rows(log, before, after, tables.notes):
            custom.update(dict.fromkeys(k for k in row if k.startswith(STATE_PREFIX)))
            identity.update(dict.fromkeys(k for k in row if k.startswith(IDENTITY_PREFIX)))
            tables.characters.rows.append(row)
        tables.interactions.rows.extend(_interaction_rows(log, before, tables.notes))
        tables.locations.rows.extend(_location_rows(log, before, after))
        tables.calls.rows.extend(_call_rows(log))
        tables.messages.rows.extend(_message_rows(log, tables.notes))
        if after is not None:
            for row in _edge_rows(tick, after):
                attributes.update(dict.fromkeys(k for k in row if k not in EDGE_COLUMNS))
                tables.edges.rows.append(row)
    compacted = [(t, by_tick[t].compacted) for t in ticks if by_tick[t].compacted is not None]
    if compacted:
        dropped = sum(record.calls for _, record in compacted if record is not None)
        tables.notes.append(
            f"{len(compacted)} ticks (first {compacted[0][0]}, last {compacted[-1][0]}) were "
            f"compacted by `sim log --compact`: their {dropped} calls are not in the calls "
            "table (`sim usage` counts them from their summaries)"
        )
    tables.characters.columns.extend(custom)
    tables.characters.columns.extend(identity)
    tables.edges.columns.extend(attributes)
    tables.surveys.rows.extend(_survey_rows(root, first, last, current_tick, problems))
    return tables


def _snapshot_cells(char: _Character) -> dict[str, Cell]:
    """A character's state columns, custom ``state.*`` and ``identity.*`` ones included."""
    cells: dict[str, Cell] = {
        "location": char.state.location,
        "mood": char.state.mood,
        "inventory": list(char.state.inventory),
        "memory_summary": char.memory.summary,
    }
    cells.update(flatten(char.state.model_extra or {}))
    cells.update(flatten({k: v for k, v in char.identity.items() if k != "id"}, IDENTITY_PREFIX))
    return cells


def _baseline_rows(tick: int, before: _State) -> list[dict[str, Cell]]:
    """The characters as they stood before the first exported tick (its ``state_before``),
    as rows of the tick before it: no intention or outcome, only state."""
    return [
        {"tick": tick, "character": cid, **_snapshot_cells(before.characters[cid])}
        for cid in sorted(before.characters)
    ]


def _edge_rows(tick: int, state: _State) -> list[dict[str, Cell]]:
    """One row per relationship in a state (``from`` the holder, ``to`` the other), its
    attributes as columns (nested ones flattened)."""
    rows: list[dict[str, Cell]] = []
    for cid in sorted(state.characters):
        ties = state.characters[cid].relationships or {}
        for other in sorted(ties):
            tie = {"trust": DEFAULT_TRUST, **ties[other]}  # a file may leave the default out
            cells = flatten(tie, "")
            for key in _EDGE_KEYS:  # an attribute named like a key column keeps its value
                if key in cells:
                    cells[f"{EDGE_ATTRIBUTE_PREFIX}{key}"] = cells.pop(key)
            rows.append({"tick": tick, "from": cid, "to": other, **cells})
    return rows


def _survey_rows(
    root: Path, first: int | None, last: int | None, current: int, problems: list[LogError]
) -> list[dict[str, Cell]]:
    """The answers of ``.sim/interviews.jsonl`` at ticks ``first``..``last`` (tick 0 too)."""
    from sim.interview import read_interviews

    try:
        interviews = read_interviews(root)
    except LogError as exc:
        problems.append(exc)
        return []
    latest: dict[tuple[int, str, str], dict[str, Cell]] = {}
    for i in interviews:
        if i.failed or i.tick > current:
            continue
        if (first is not None and i.tick < first) or (last is not None and i.tick > last):
            continue
        latest[(i.tick, i.character, i.question)] = {
            "tick": i.tick,
            "character": i.character,
            "question": i.question,
            "format": i.format or "text",
            "answer": i.value if i.format is not None else i.answer,
            "reason": i.reason,
            "model": i.answered_by or i.model,
        }
    return [latest[key] for key in sorted(latest)]


def _character_rows(
    log: TickLog, before: _State, after: _State | None, notes: list[str]
) -> list[dict[str, Cell]]:
    intentions = _results(log, "intentions", _Intention, notes)
    outcomes: dict[str, str] = {}
    for resolution in _results(log, "resolution", _Resolution, notes).values():
        for outcome in resolution.outcomes:
            outcomes[outcome.character_id] = outcome.outcome
    ids = sorted(set(before.characters) | set(after.characters if after else ()))
    rows: list[dict[str, Cell]] = []
    for cid in ids:
        row: dict[str, Cell] = {"tick": log.tick, "character": cid}
        now = after.characters.get(cid) if after is not None else None
        if now is not None:
            row.update(_snapshot_cells(now))
        intention = intentions.get(cid)
        if intention is not None:
            row.update(
                action=intention.action,
                target=intention.target,
                content=intention.content,
                reasoning=intention.reasoning,
            )
        row["outcome"] = outcomes.get(cid)
        rows.append(row)
    return rows


def _interaction_rows(log: TickLog, before: _State, notes: list[str]) -> list[dict[str, Cell]]:
    rows: list[dict[str, Cell]] = []
    intentions = _results(log, "intentions", _Intention, notes)
    for cid in sorted(intentions):
        intention = intentions[cid]
        if intention.action in _NOT_INTERACTIONS or not intention.action:
            continue
        char = before.characters.get(cid)
        rows.append(
            {
                "tick": log.tick,
                "location": char.state.location if char is not None else None,
                "from": cid,
                "to": intention.target,
                "kind": _KINDS.get(intention.action, intention.action),
                "content": intention.content,
            }
        )
    rows.extend(_utterance_rows(log))
    return rows


def _utterance_rows(log: TickLog) -> list[dict[str, Cell]]:
    """One ``utterance`` row per line of the conversation phase's dialogues, to the others
    taking part (a list when there are several)."""
    rows: list[dict[str, Cell]] = []
    talks = log.phase_results("conversation")
    for opener in sorted(talks):
        talk = talks[opener]
        if not isinstance(talk, dict):
            continue
        people = [p for p in talk.get("participants") or () if isinstance(p, str)]
        for line in talk.get("lines") or ():
            if not isinstance(line, dict):
                continue
            speaker = line.get("speaker")
            others = [p for p in people if p != speaker]
            rows.append(
                {
                    "tick": log.tick,
                    "location": talk.get("location"),
                    "from": speaker,
                    "to": ", ".join(others),
                    "kind": "utterance",
                    "content": line.get("says"),
                }
            )
    return rows


def _location_rows(log: TickLog, before: _State, after: _State | None) -> list[dict[str, Cell]]:
    narratives = log.phase_results("narrative")
    occupants: dict[str, list[str]] = {}
    if after is not None:
        for cid in sorted(after.characters):
            occupants.setdefault(after.characters[cid].state.location, []).append(cid)
    ids = sorted(set(before.locations) | set(after.locations if after else ()))
    return [
        {
            "tick": log.tick,
            "location": lid,
            "occupants": occupants.get(lid, []) if after is not None else None,
            "narrative": str(narratives[lid]) if lid in narratives else None,
        }
        for lid in ids
    ]


def _call_rows(log: TickLog) -> list[dict[str, Cell]]:
    prices = log.header.prices
    cache: dict[str, Price | None] = {}
    rows: list[dict[str, Cell]] = []
    for call in log.call_records:
        usage = call_usage(call)
        cost = call_cost(call, prices, cache)
        rows.append(
            {
                "tick": log.tick,
                "phase": call.phase,
                "entity": split_key(call.entity_key)[1] if call.entity_key else None,
                # where it ran, as `sim usage --by model` names it (the model that answered,
                # or failed last), not the model the config asked for
                "model": call.every_attempt()[-1].target,
                "attempts": len(call.every_attempt()),
                "input_tokens": usage.input_tokens,
                "cached_input_tokens": usage.cached_input_tokens,
                "output_tokens": usage.output_tokens,
                "cost_usd": cost.value,
                "latency": call.latency,
                "error": call.error_code,
                "request_id": call.request_id,
            }
        )
    return rows


__all__ = [
    "CALL_COLUMNS",
    "CHARACTER_COLUMNS",
    "EDGE_COLUMNS",
    "IDENTITY_PREFIX",
    "INTERACTION_COLUMNS",
    "LOCATION_COLUMNS",
    "STATE_PREFIX",
    "SURVEY_COLUMNS",
    "Table",
    "Tables",
    "build_tables",
    "flatten",
]
