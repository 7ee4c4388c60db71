"""What a tick's answers name, checked against the world they were asked about.

For the real-model bench (``bench/real_model.py``) and ``make test-model``: every field of a
built-in phase's answer that names something in the world is a reference, valid when it
names what the request offered:

- an intention's ``target``: for ``move`` a location connected to the character's, for
  ``speak`` another character present, for ``act`` an object there or carried (``wait``
  and a world's own verbs name nothing checked here);
- an outcome's ``character_id`` (a character present at the location) and ``moved_to``
  (``null``, or a location connected to it);
- a location update's ``objects_removed`` (objects that were there).

A ``Snapshot`` is the world as a tick began; a call's answers are checked against it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    """Where everyone and everything was as a tick began."""

    #: character id -> (location id, inventory)
    characters: dict[str, tuple[str, tuple[str, ...]]]
    #: location id -> (connections, objects)
    locations: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]

    @classmethod
    def read(cls, world: Path) -> Snapshot:
        characters = {}
        for path in sorted((world / "characters").glob("*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            state = data.get("state") or {}
            characters[data["identity"]["id"]] = (
                str(state.get("location")),
                tuple(str(o) for o in state.get("inventory") or ()),
            )
        locations = {}
        for path in sorted((world / "locations").glob("*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            state = data.get("state") or {}
            locations[data["identity"]["id"]] = (
                tuple(str(c) for c in state.get("connections") or ()),
                tuple(str(o) for o in state.get("objects") or ()),
            )
        return cls(characters, locations)

    def present(self, location: str) -> set[str]:
        return {cid for cid, (where, _) in self.characters.items() if where == location}


@dataclass
class Tally:
    """References counted: how many, how many valid, and the invalid ones (field, value)."""

    total: int = 0
    valid: int = 0
    invalid: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, value: Any, allowed: Iterable[str]) -> None:
        self.total += 1
        if isinstance(value, str) and value in set(allowed):
            self.valid += 1
        else:
            self.invalid.append((name, repr(value)))

    def __iadd__(self, other: Tally) -> Tally:
        self.total += other.total
        self.valid += other.valid
        self.invalid += other.invalid
        return self

    @property
    def share(self) -> float:
        return self.valid / self.total if self.total else 1.0


def intention_refs(character: str, answer: Mapping[str, Any], world: Snapshot) -> Tally:
    tally = Tally()
    if character not in world.characters:
        return tally
    where, inventory = world.characters[character]
    connections, objects = world.locations.get(where, ((), ()))
    action, target = answer.get("action"), answer.get("target")
    allowed: tuple[str, ...] | None = None
    if action == "move":
        allowed = tuple(connections)
    elif action == "speak":
        allowed = tuple(world.present(where) - {character})
    elif action == "act":
        allowed = (*objects, *inventory)
    # with no one to speak to or nothing to use, null names nothing wrong (the engine's rule)
    if allowed is not None and (allowed or target is not None or action == "move"):
        tally.add("intention.target", target, allowed)
    return tally


def resolution_refs(location: str, answer: Mapping[str, Any], world: Snapshot) -> Tally:
    tally = Tally()
    connections, objects = world.locations.get(location, ((), ()))
    present = world.present(location)
    for outcome in answer.get("outcomes") or ():
        if not isinstance(outcome, Mapping):
            continue
        tally.add("outcome.character_id", outcome.get("character_id"), present)
        if outcome.get("moved_to") is not None:
            tally.add("outcome.moved_to", outcome.get("moved_to"), connections)
    update = answer.get("location_update")
    if isinstance(update, Mapping):
        for name in update.get("objects_removed") or ():
            tally.add("location_update.objects_removed", name, objects)
    return tally


def answer_refs(call: Mapping[str, Any], answer: Any, world: Snapshot) -> Tally:
    """The references in one answer of a logged call (``record_data`` of a call record)."""
    if not isinstance(answer, Mapping):
        return Tally()
    kind, _, entity = str(call.get("entity_key") or "").partition(":")
    if call.get("phase") == "intentions" and kind == "intention":
        return intention_refs(entity, answer, world)
    if call.get("phase") == "resolution" and kind == "resolution":
        return resolution_refs(entity, answer, world)
    return Tally()


def raw_answers(call: Mapping[str, Any]) -> list[Any]:
    """Every answer the model gave for a call, re-asked ones included (JSON it sent; the
    used answer stands in for a final attempt whose text was not kept)."""
    out = []
    attempts = list(call.get("attempts") or ())
    for index, attempt in enumerate(attempts):
        try:
            out.append(json.loads(attempt.get("raw") or ""))
        except (json.JSONDecodeError, TypeError):
            if index == len(attempts) - 1 and call.get("error_code") is None:
                out.append(call.get("result"))
    return out


def every_answer(calls: Iterable[Mapping[str, Any]], world: Snapshot) -> Tally:
    """The references in every answer the model gave (whether used or not)."""
    tally = Tally()
    for call in calls:
        for answer in raw_answers(call):
            tally += answer_refs(call, answer, world)
    return tally


def applied(calls: Iterable[Mapping[str, Any]], world: Snapshot) -> Tally:
    """The references in the answers the tick used (calls that did not fail)."""
    tally = Tally()
    for call in calls:
        if call.get("error_code") is None:
            tally += answer_refs(call, call.get("result"), world)
    return tally


def outcomes_given(calls: Iterable[Mapping[str, Any]], world: Snapshot) -> tuple[int, int]:
    """(characters present at a resolved location who got an outcome, characters present)."""
    got = present_total = 0
    for call in calls:
        kind, _, location = str(call.get("entity_key") or "").partition(":")
        if call.get("phase") != "resolution" or kind != "resolution":
            continue
        present = world.present(location)
        result = call.get("result") if call.get("error_code") is None else None
        named = {
            o.get("character_id")
            for o in (result or {}).get("outcomes") or ()
            if isinstance(o, Mapping)
        }
        present_total += len(present)
        got += len(present & named)
    return got, present_total


def moves(before: Snapshot, after: Snapshot) -> int:
    """Characters whose location changed."""
    return sum(
        1
        for cid, (where, _) in after.characters.items()
        if cid in before.characters and before.characters[cid][0] != where
    )


def world_problems(world: Snapshot) -> list[str]:
    """References the committed world files hold that name nothing: a character's
    location, a location's connections."""
    problems = [
        f"character {cid}: location {where!r}"
        for cid, (where, _) in world.characters.items()
        if where not in world.locations
    ]
    problems += [
        f"location {lid}: connection {c!r}"
        for lid, (connections, _) in world.locations.items()
        for c in connections
        if c not in world.locations
    ]
    return problems
