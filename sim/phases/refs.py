"""References: answer fields that name something in the world, and the ids valid for them.

An intention's target (an exit for a move, someone present for speech, an object there for
an act), an outcome's ``character_id`` and ``moved_to``, the objects a location update
removes, and the fields of a declared phase's schema marked ``"x-sim-ref"`` name things in
the world. For one request only some ids are valid; the phase builds a ``Refs`` per
request, which gives both halves of keeping a world valid on any model:

- ``enums``: the valid ids as ``enum`` in the schema sent (``[llm] constrain_refs =
  "schema"``), so a server that enforces schemas (llama.cpp and vLLM grammars, OpenAI strict
  mode) cannot produce another;
- ``check``: the answer checked before it is used, whatever the mode. A problem is worded
  for the model and names the valid ids; recovery feeds it back like a schema error, within
  ``json_max_retries``, and an answer still wrong falls back for its entity
  (``verified``), so no invalid id reaches the world or the tick log's results.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from sim.config import ConstrainRefs
from sim.llm.enums import EnumCases, EnumEach, EnumField, SchemaEnums
from sim.llm.errors import LLMError, LLMSchemaError
from sim.providers import find_profile

if TYPE_CHECKING:
    from sim.phases.intentions import Intention
    from sim.phases.resolution import Resolution
    from sim.world import Entity, World

#: how many valid ids a message lists before it says "and N more"
_SHOWN = 40

Check = Callable[[BaseModel], "str | None"]


def mode_for(setting: ConstrainRefs, provider_kind: str) -> Literal["schema", "validate"]:
    """The mode a phase runs in: its setting, ``auto`` resolved for the provider kind by
    its profile (``ProviderProfile.constrain_refs``, which says why; a package's provider
    that declares none: ``validate``)."""
    if setting != "auto":
        return setting
    found = find_profile(provider_kind)
    return found.constrain_refs if found is not None else "validate"


def listed(ids: Sequence[str]) -> str:
    """Ids for a message to the model: quoted, comma-separated, long lists cut short."""
    if not ids:
        return "(none)"
    shown = ", ".join(f'"{i}"' for i in ids[:_SHOWN])
    more = len(ids) - _SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def _q(value: object) -> str:
    """A value the model wrote, quoted for a message and cut short: it is echoed into the
    re-ask and the log, and nothing bounds its length."""
    text = value if isinstance(value, str) else str(value)
    return repr(text if len(text) <= 60 else text[:57] + "...")


def thing_key(name: str) -> str:
    """A name as an added object is compared with the world's places and characters:
    case and surrounding space ignored ("bram hollis " is Bram Hollis)."""
    return " ".join(name.split()).casefold()


def _unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True, slots=True)
class IntentionRefs:
    """The ids one character's intention may name: exits, others present, objects."""

    exits: tuple[str, ...]
    people: tuple[str, ...]
    objects: tuple[str, ...]
    #: whom ``message`` may reach (``sim.messages``); ``None``: no message channel
    contacts: tuple[str, ...] | None = None

    def enums(self) -> SchemaEnums:
        """``target`` limited to every id any action may name (or null); and per action,
        what that action may name (``cases``): ``move`` an exit (no exit: no move),
        ``speak`` someone here, ``act`` an object here or carried (none: null), ``wait``
        null; a world's own verbs any of them, or null; ``message`` a contact (none: no
        message)."""
        cases: tuple[tuple[str, tuple[str, ...]], ...] = (
            ("move", self.exits),
            ("speak", self.people),
            ("act", self.objects),
            ("wait", ()),
        )
        omit = () if self.exits else ("move",)
        targets = _unique((*self.exits, *self.people, *self.objects))
        if self.contacts is not None:
            cases = (*cases, ("message", self.contacts))
            targets = _unique((*targets, *self.contacts))
            if not self.contacts:
                omit = (*omit, "message")
        return SchemaEnums(
            (EnumField(("target",), targets),), EnumCases("action", "target", cases, omit=omit)
        )

    def problem(self, answer: Intention) -> str | None:
        """What is wrong with the intention's target, for the model; ``None``: nothing."""
        action, target = answer.action, answer.target
        verb: str = action  # ``message`` widens the schema's action (``sim.messages``)
        if verb == "message" and self.contacts is not None:
            if target in self.contacts:
                return None
            if not self.contacts:
                return 'you have no one to message: choose another action than "message"'
            return (
                f"target {_q(target)} is not someone you have a tie with: to message, set "
                f"target to one of {listed(self.contacts)}"
            )
        if action == "wait":
            if target is None:
                return None
            return f'target {_q(target)} is not allowed for "wait": set target to null'
        valid = {"move": self.exits, "speak": self.people, "act": self.objects}.get(action)
        if valid is None:  # a world's own verb: anyone or anything here, or nothing
            valid = _unique((*self.people, *self.objects, *self.exits))
            if target is None or target in valid:
                return None
            return (
                f"target {_q(target)} is not here: for {action!r} use one of "
                f"{listed(valid)}, or null"
            )
        if action == "move":
            if target in self.exits:
                return None
            if not self.exits:
                return 'there is no exit from here: choose another action than "move"'
            return (
                f"target {_q(target)} is not an exit from here: to move, set target to one of "
                f"{listed(self.exits)}"
            )
        what = "someone here" if action == "speak" else "an object here or carried"
        if not valid:  # no one to speak to, nothing to use: only null names nothing wrong
            if target is None:
                return None
            nothing = "no one else is here" if action == "speak" else "there is nothing here"
            return f"target {_q(target)} is not {what} ({nothing}): set target to null"
        if target in valid:
            return None
        return f"target {_q(target)} is not {what}: set target to one of {listed(valid)}"


@dataclass(frozen=True, slots=True)
class ResolutionRefs:
    """The ids one location's resolution may name.

    Attributes:
        present: the characters here (each gets at most one outcome; one left out is
            remembered as what it meant to do, by apply).
        exits: where they may move.
        objects: the objects here (the only ones a location update may remove).
        places: ids and names of every location and character, folded (``thing_key``):
            what an added object (a place's or one a character gains) must not be called
            (a model copying the exits or the cast into the objects).
    """

    present: tuple[str, ...]
    exits: tuple[str, ...]
    objects: tuple[str, ...]
    places: frozenset[str]

    def enums(self) -> SchemaEnums:
        return SchemaEnums(
            (
                EnumField(("outcomes", "*", "character_id"), self.present),
                EnumField(("outcomes", "*", "moved_to"), self.exits),
                EnumField(("location_update", "objects_removed", "*"), self.objects),
            ),
            each=EnumEach(("outcomes",), "character_id", self.present),
        )

    def problem(self, answer: Resolution) -> str | None:
        """Every problem with the resolution's references, for the model."""
        problems: list[str] = []
        seen: set[str] = set()
        for item in answer.outcomes:
            cid = item.character_id
            if cid not in self.present:
                problems.append(f"character_id {_q(cid)} is not a character here")
            elif cid in seen:
                problems.append(f"a second outcome for {_q(cid)}")
            seen.add(cid)
            for obj in item.gained:
                if thing_key(obj) in self.places:
                    problems.append(f"gained names {_q(obj)} of {_q(cid)}, a place or character")
            if item.moved_to is not None and item.moved_to not in self.exits:
                problems.append(
                    f"moved_to {_q(item.moved_to)} of {_q(cid)} is not an exit from here "
                    f"(exits: {listed(self.exits)}; null if they stay)"
                )
        update = answer.location_update
        if update is not None:
            for obj in update.objects_removed:
                if obj not in self.objects:
                    problems.append(
                        f"objects_removed names {_q(obj)}, which is not here "
                        f"(objects here: {listed(self.objects)})"
                    )
            for obj in update.objects_added:
                if thing_key(obj) in self.places:
                    problems.append(
                        f"objects_added names {_q(obj)}, a place or character: "
                        "add only things, or nothing"
                    )
        if not problems:
            return None
        return (
            "; ".join(problems) + f". Give exactly one outcome for each character here: "
            f"character_id one of {listed(self.present)}"
        )


@dataclass(frozen=True, slots=True)
class DeclaredRefs:
    """The references of a declared phase's answer (``x-sim-ref`` fields) for one subject.

    Attributes:
        fields: (path, kind) of each marked field (``sim.phases.schema.ref_fields``).
        ids: kind -> the ids valid for this subject.
    """

    fields: tuple[tuple[tuple[str, ...], str], ...]
    ids: Mapping[str, tuple[str, ...]]

    def enums(self) -> SchemaEnums:
        return SchemaEnums(
            tuple(EnumField(path, self.ids.get(kind, ())) for path, kind in self.fields)
        )

    def problem(self, answer: BaseModel) -> str | None:
        data = answer.model_dump(mode="json")
        problems = []
        for path, kind in self.fields:
            valid = self.ids.get(kind, ())
            for value in _values(data, path):
                if value is not None and value not in valid:
                    where = ".".join(p for p in path if p != "*")
                    problems.append(
                        f"{where} {_q(value)} is not a {kind} id here: use one of {listed(valid)}"
                    )
        return "; ".join(problems) or None


def subject_ids(
    world: World,
    kinds: Collection[str],
    per: str,
    subject: Entity,
    where: Mapping[str, list[str]],
) -> dict[str, tuple[str, ...]]:
    """The ids each reference kind may name for one subject (``sim.phases.schema.REF_KINDS``)
    of a phase run ``per`` character, location or world: any character or location of the
    world, those present at the subject's place (a character subject left out), its exits,
    the objects there and those a character subject carries. ``where``: location id -> the
    characters there (``World.characters_at``)."""
    ids: dict[str, tuple[str, ...]] = {}
    if "character" in kinds:
        ids["character"] = tuple(world.characters)
    if "location" in kinds:
        ids["location"] = tuple(world.locations)
    if per == "world":
        places = list(world.locations.values())
        ids["present"] = tuple(world.characters)
        ids["exit"] = tuple(world.locations)
    else:
        lid = subject["identity"]["id"] if per == "location" else None
        place = world.locations[lid or subject["state"]["location"]]
        places = [place]
        me = subject["identity"]["id"] if per == "character" else None
        here = where.get(place["identity"]["id"], [])
        ids["present"] = tuple(c for c in here if c != me)
        ids["exit"] = tuple(place["state"]["connections"])
    things = [o for loc in places for o in loc["state"]["objects"]]
    if per == "character":
        things += subject["state"]["inventory"]
    ids["object"] = tuple(dict.fromkeys(things))
    return ids


def _values(data: Any, path: tuple[str, ...]) -> list[Any]:
    """The values at ``path`` in answer data (``*``: each item of a list)."""
    if not path:
        return [data]
    step, rest = path[0], path[1:]
    if step == "*":
        items = data if isinstance(data, list) else []
        return [v for item in items for v in _values(item, rest)]
    if isinstance(data, dict) and step in data:
        return _values(data[step], rest)
    return []


@dataclass(frozen=True, slots=True)
class _Check:
    """An answer check made from a ``problem`` function: an object rather than a closure,
    so a request pickles with it (``sim tick --workers`` sends requests between
    processes; the refs' ``problem`` methods pickle with their refs)."""

    problem: Callable[[Any], str | None]

    def __call__(self, answer: BaseModel) -> str | None:
        return self.problem(answer)


def check_for(problem: Callable[[Any], str | None]) -> Check:
    """An answer check (``LLMRequest.check``) from a ``problem`` function."""
    return _Check(problem)


def verified(result: Any, check: Check | None) -> Any:
    """A phase's result checked once more before it is used: an answer served from a tick
    log (resume, replay) or built from a tool call never passed recovery's check. A
    problem makes it an ``LLMSchemaError`` (the entity falls back)."""
    if check is None or isinstance(result, LLMError) or not isinstance(result, BaseModel):
        return result
    problem = check(result)
    if problem is None:
        return result
    return LLMSchemaError(f"the answer names what is not there: {problem}")


__all__ = [
    "ConstrainRefs",
    "DeclaredRefs",
    "IntentionRefs",
    "ResolutionRefs",
    "check_for",
    "listed",
    "mode_for",
    "subject_ids",
    "thing_key",
    "verified",
]
