"""Phase 2a, resolution: each occupied location's game master resolves the intentions of
everyone present into per-character outcomes and an optional change to the place."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints, create_model

from sim import sections
from sim.config import Config
from sim.llm.errors import LLMError
from sim.mind.cells import rated_by_model
from sim.phases.base import (
    PhaseAnswer,
    TickContext,
    ask,
    exits_view,
    own_fields,
    place_view,
    public,
)
from sim.phases.conversation import dialogues_at
from sim.phases.intentions import Intention
from sim.phases.refs import ResolutionRefs, check_for, thing_key, verified
from sim.world import Entity, World

NAME = "resolution"
SECTION = "phase2a"
CHAIN = "resolution"


#: an object's name as a model may write it into the world
Thing = Annotated[str, StringConstraints(min_length=1, max_length=60)]
#: the most objects one answer may add or remove for one character or place
MAX_THINGS = 5


class Outcome(PhaseAnswer, title="Outcome"):
    character_id: str = Field(description="id of a character present at this location")
    outcome: str = Field(description="what happened to them, one or two sentences", max_length=300)
    moved_to: str | None = Field(description="id of the connected location they reached, or null")
    mood: str | None = Field(description="their new mood, or null if unchanged", max_length=40)
    gained: list[Thing] = Field(description="objects they now carry", max_length=MAX_THINGS)
    lost: list[Thing] = Field(description="objects they no longer carry", max_length=MAX_THINGS)


class LocationUpdate(PhaseAnswer, title="LocationUpdate"):
    atmosphere: str | None = Field(
        description="the place's new atmosphere, or null", max_length=160
    )
    objects_added: list[Thing] = Field(max_length=MAX_THINGS)
    objects_removed: list[Thing] = Field(max_length=MAX_THINGS)


class Resolution(PhaseAnswer, title="Resolution"):
    """The game master's ruling for one location and tick."""

    outcomes: list[Outcome]
    location_update: LocationUpdate | None

    @classmethod
    def empty(cls) -> Resolution:
        """The fallback when the call failed: nothing is resolved, nothing changes."""
        return cls(outcomes=[], location_update=None)


def named_things(world: World) -> frozenset[str]:
    """What an added object must not be called: every location's and character's id and
    name, folded (``thing_key``): a game master copying the cast or the exits into the
    objects (Gemma 3 270M added "Bram Hollis" to The Drowned Bell)."""
    names = [*world.locations, *world.characters]
    for entity in (*world.locations.values(), *world.characters.values()):
        name = entity["identity"].get("name")
        if isinstance(name, str):
            names.append(name)
    return frozenset(thing_key(name) for name in names)


class RatedOutcome(Outcome, title="RatedOutcome"):
    """An outcome that also rates how much it matters to the character (``[memory]``)."""

    importance: int = Field(
        ge=1, le=10, description="how much this matters to them: 1 mundane .. 10 life-changing"
    )


#: the resolution whose outcomes rate their importance: asked when the mind keeps rated
#: cells (``sim.mind.cells.rated_by_model``); same title, so the offline model resolves it
RatedResolution = create_model(
    "RatedResolution", __base__=Resolution, outcomes=(list[RatedOutcome], ...)
)


def resolution_schema(config: Config) -> type[Resolution]:
    """The schema this world's resolution answers: rated outcomes when the mind asks."""
    return RatedResolution if rated_by_model(config) else Resolution


def _add_own(view: dict[str, Any], char: Entity) -> None:
    for key, value in own_fields(char).items():
        view.setdefault(key, value)


def location_input(
    world: World,
    location_id: str,
    tick: int,
    present: list[str],
    intentions: dict[str, Intention],
    view: dict[str, Any] | None = None,
    happenings: list[str] | None = None,
    conversations: list[dict[str, Any]] | None = None,
) -> str:
    """The game master's view: the place, its exits, and what everyone here intends, with
    each character's own fields (the game master may know their secrets), and the events
    injected here this tick (``happenings``, left out when there are none), and this
    tick's ``conversations`` here (the conversation phase; left out when none)."""
    loc = world.locations[location_id]
    characters = []
    for cid in present:
        char = world.characters[cid]
        who = {
            "id": cid,
            "name": char["identity"]["name"],
            "personality": char["identity"]["personality"],
            "goals": char["identity"]["goals"],
            "mood": char["state"]["mood"],
            "inventory": char["state"]["inventory"],
        }
        _add_own(who, char)
        who["intention"] = intentions[cid].model_dump()
        characters.append(who)
    doc: dict[str, Any] = {
        "tick": tick,
        "world": view if view is not None else world.meta["name"],
        "location": place_view(loc),
        "exits": exits_view(world, loc),
        "characters": characters,
    }
    if happenings:
        doc["happenings"] = happenings
    if conversations:
        doc["conversations"] = conversations
    return sections.dumps(doc)


def template_context(ctx: TickContext, lid: str) -> dict[str, Any]:
    """What a resolution (or narrative) template sees besides ``world``, ``tick``, ``actions``."""
    world = ctx.world
    loc = world.locations[lid]
    here = ctx.occupancy.get(lid, [])
    return {
        "location": public(loc),
        "exits": exits_view(world, loc),
        "present": [public(world.characters[cid]) for cid in here],
        "intentions": {
            cid: ctx.intentions[cid].model_dump() for cid in here if cid in ctx.intentions
        },
        "happenings": ctx.happenings.here(lid),
        "conversations": dialogues_at(ctx, lid),
    }


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    world = ctx.world
    occupied = list(ctx.occupancy)
    client = ctx.client(SECTION, [world.locations[lid] for lid in occupied], NAME)
    view = ctx.world_view
    constrain = ctx.refs_mode(SECTION) == "schema"
    places = named_things(world)
    schema = resolution_schema(ctx.config)
    requests = []
    checks = []
    for lid in occupied:

        def context(lid: str = lid) -> dict[str, Any]:
            return template_context(ctx, lid)

        def default(lid: str = lid) -> str:
            return location_input(
                world,
                lid,
                ctx.tick,
                ctx.occupancy[lid],
                ctx.intentions,
                view,
                ctx.happenings.here(lid),
                dialogues_at(ctx, lid),
            )

        loc = world.locations[lid]
        refs = ResolutionRefs(
            present=tuple(ctx.occupancy[lid]),
            exits=tuple(loc["state"]["connections"]),
            objects=tuple(dict.fromkeys(loc["state"]["objects"])),
            places=places,
        )
        check = check_for(refs.problem)
        checks.append(check)
        enums = refs.enums() if constrain else None
        requests.append(
            ctx.request(NAME, schema, f"{CHAIN}:{lid}", context, default, enums=enums, check=check)
        )
    results = await ask(client, requests, report)
    for lid, request, check, result in zip(occupied, requests, checks, results, strict=True):
        result = verified(result, check)
        if isinstance(result, LLMError):
            report.fail(str(request.entity_key), result)
            result = Resolution.empty()
        ctx.resolutions[lid] = result
