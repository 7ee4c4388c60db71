"""Phase 1, intentions: each character says what it means to do this tick."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, create_model

from sim import messages, sections
from sim.llm.errors import LLMError
from sim.llm.tools import ToolCalls
from sim.phases import intention_steps
from sim.phases.base import (
    PhaseAnswer,
    TickContext,
    character_view,
    exits_view,
    memory_view,
    place_view,
    public,
)
from sim.phases.intention_tools import intention_data, tools_for
from sim.phases.refs import IntentionRefs, check_for, verified
from sim.world import Entity, World, relationships_view

NAME = "intentions"
SECTION = "phase1"
CHAIN = "intention"
RECENT_CELLS = 3
BUILTIN_ACTIONS = ("move", "speak", "act", "wait")


# A world's [actions] verbs widen ``action`` in a subclass (``intention_schema``). The
# docstring below is the schema's description, sent to the model: changing it changes
# every intentions request and its digest.
class Intention(PhaseAnswer, title="Intention"):
    """What a character means to do: move, speak, act on something, or wait."""

    action: Literal["move", "speak", "act", "wait"]
    target: str | None = Field(
        description="move: a connected location id; speak: a present character id; "
        "act: an object here or carried; wait: null"
    )
    content: str = Field(
        description="speak: the words said; act: what is done; move, wait: how",
        max_length=300,
    )
    reasoning: str = Field(description="why, in a sentence", max_length=300)

    @classmethod
    def fallback(cls) -> Intention:
        """The spec's idle intention, used when the call failed."""
        return cls(action="wait", target=None, content="", reasoning="LLM error, using fallback")


#: each schema ``_schema_for`` made -> how to make it again: a class made at run time
#: is not found by its name, so a process that receives one (``sim tick --workers``)
#: rebuilds it (``sim.engine.wire``)
MADE: dict[type[Intention], tuple[str, ...]] = {}


@lru_cache(maxsize=64)
def _schema_for(verbs: tuple[str, ...]) -> type[Intention]:
    actions = Literal[(*BUILTIN_ACTIONS, *verbs)]  # type: ignore[valid-type]
    model: type[Intention] = create_model(
        "Intention",
        __base__=Intention,
        action=(actions, ...),
    )
    MADE[model] = verbs
    return model


def schema_for_verbs(verbs: tuple[str, ...]) -> type[Intention]:
    """The Intention schema with these ``[actions]`` verbs (the same class each time)."""
    return _schema_for(verbs)


def intention_schema(actions: Mapping[str, str]) -> type[Intention]:
    """The Intention schema for a world: the built-in actions plus its ``[actions]`` verbs
    (``Intention`` itself when it has none, so its schema and digest stay the same)."""
    return _schema_for(tuple(actions)) if actions else Intention


def character_input(
    world: World,
    char: Entity,
    tick: int,
    here: list[str],
    view: dict[str, Any] | None = None,
    happenings: list[str] | None = None,
    people: Sequence[tuple[Entity, dict[str, Any]]] | None = None,
    memory_doc: dict[str, Any] | None = None,
    contacts: list[dict[str, str]] | None = None,
) -> str:
    """The model's view of one character at the start of a tick.

    Args:
        here: ids of every character at the same location (including this one).
        view: the world as models see it (``world_view``); default: its name only.
        happenings: events injected here this tick (``sim inject``); the key is left out
            when there are none, so inputs without them stay as they were.
        people: ``people_here(world, here)`` when the caller keeps it per location (every
            character there sees the same others).
        memory_doc: the memory as shown (``TickContext.memory_for``); default: the window.
        contacts: whom a message may reach (``sim.messages.contacts_view``), with the
            channel on; then the messages received last tick are shown too.
    """
    state, memory = char["state"], char["memory"]
    loc = world.locations[state["location"]]
    everyone = people_here(world, here) if people is None else people
    present = [seen for other, seen in everyone if other is not char]
    doc: dict[str, Any] = {
        "tick": tick,
        "world": view if view is not None else world.meta["name"],
        "character": character_view(char),
        "memory": memory_view(memory, RECENT_CELLS) if memory_doc is None else memory_doc,
        "location": place_view(loc),
        "exits": exits_view(world, loc),
        "present": present,
    }
    if happenings:
        doc["happenings"] = happenings
    ties = relationships_view(world, char)
    if ties:  # typed relationships (docs/world-format.md); left out when there are none
        doc["relationships"] = ties
    if contacts is not None:  # the message channel ([messages]): whom, and what came in
        if contacts:
            doc["contacts"] = contacts
        inbox = messages.inbox_view(world, char)
        if inbox:
            doc["messages"] = inbox
    return sections.dumps(doc)


def intention_refs(
    world: World, char: Entity, here: Sequence[str], contacts: Sequence[str] | None = None
) -> IntentionRefs:
    """The ids one character's intention may name this tick: the exits of its location,
    the others there, the objects there and those it carries; with the message channel
    on, its ``contacts``."""
    loc = world.locations[char["state"]["location"]]
    cid = char["identity"]["id"]
    objects = dict.fromkeys([*loc["state"]["objects"], *char["state"]["inventory"]])
    return IntentionRefs(
        exits=tuple(loc["state"]["connections"]),
        people=tuple(other for other in here if other != cid),
        objects=tuple(objects),
        contacts=None if contacts is None else tuple(contacts),
    )


def people_here(world: World, here: list[str]) -> list[tuple[Entity, dict[str, Any]]]:
    """The characters ``here`` (ids), each with how the others there see them."""
    people = []
    for cid in here:
        other = world.characters[cid]
        seen = {
            "id": other["identity"]["id"],
            "name": other["identity"]["name"],
            "mood": other["state"]["mood"],
        }
        people.append((other, seen))
    return people


def template_context(
    world: World, char: Entity, here: list[str], happenings: list[str] | None = None
) -> dict[str, Any]:
    """What an intentions template sees besides ``world``, ``tick`` and ``actions``."""
    loc = world.locations[char["state"]["location"]]
    return {
        "character": public(char),
        "memory": char["memory"],
        "location": public(loc),
        "exits": exits_view(world, loc),
        "present": [public(world.characters[cid]) for cid in here if cid != char["identity"]["id"]],
        "happenings": happenings or [],
    }


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    world = ctx.world
    chars = ctx.characters()
    client = ctx.client(SECTION, chars, NAME)
    verbs = messages.actions(ctx.config)
    tools = tools_for(verbs) if ctx.config.phase1.mode == "tools" else None
    schema = intention_schema(verbs)
    channel = messages.rule(ctx.config)
    view = ctx.world_view
    constrain = tools is None and ctx.refs_mode(SECTION) == "schema"
    requests = []
    checks = []
    # who is where, as the others see them: built once per location, not per character
    people: dict[str, list[tuple[Entity, dict[str, Any]]]] = {}
    for char in chars:
        lid = char["state"]["location"]
        here = ctx.occupancy[lid]
        events = ctx.happenings.here(lid)
        reach = None if channel is None else messages.contacts(char, channel)

        def context(
            char: Entity = char, here: list[str] = here, events: list[str] = events
        ) -> dict[str, Any]:
            return template_context(world, char, here, events)

        def default(
            char: Entity = char,
            here: list[str] = here,
            events: list[str] = events,
            lid: str = lid,
            reach: list[str] | None = reach,
        ) -> str:
            everyone = people.get(lid)
            if everyone is None:
                everyone = people[lid] = people_here(world, here)
            memory = ctx.memory_for(char, here, events, NAME)
            shown = None if reach is None else messages.contacts_view(world, reach)
            return character_input(
                world, char, ctx.tick, here, view, events, everyone, memory, shown
            )

        key = f"{CHAIN}:{char['identity']['id']}"
        refs = intention_refs(world, char, here, reach)
        check = check_for(refs.problem)
        checks.append(check)
        enums = refs.enums() if constrain else None
        requests.append(
            ctx.request(NAME, schema, key, context, default, tools=tools, enums=enums, check=check)
        )
    if tools is not None and ctx.config.phase1.max_tool_steps > 0:  # look before acting
        results, calls = await intention_steps.decide(
            world,
            client,
            chars,
            requests,
            ctx.occupancy,
            ctx.config.phase1.max_tool_steps,
            action_tools=tools,
        )
        report.entities += len(chars)
    else:
        results, calls = await client.create_batch(requests), len(requests)
    report.calls += calls
    for char, request, check, result in zip(chars, requests, checks, results, strict=True):
        cid = char["identity"]["id"]
        if isinstance(result, ToolCalls):
            try:
                result = schema.model_validate(intention_data(result, verbs))
            except LLMError as exc:
                result = exc
        result = verified(result, check)
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
            result = Intention.fallback()
        ctx.intentions[cid] = result
