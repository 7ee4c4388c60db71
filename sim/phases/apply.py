"""Phase 3, apply: outcomes become world state, deterministically, under the rules.

Rules: a character moves only along a connection of the location it started the tick in;
an outcome for a character who is not at that location (or does not exist) is ignored and
reported; a second outcome for the same character is ignored and reported. Every character
gets exactly one new memory cell: its outcome, or what it meant to do when nothing was
resolved for it.
"""

from __future__ import annotations

from sim.phases.base import PhaseReport, TickContext
from sim.phases.intentions import Intention
from sim.phases.resolution import LocationUpdate, Outcome
from sim.world import Entity

NAME = "apply"


def unresolved_text(name: str, intention: Intention) -> str:
    """The memory of a tick whose outcome is unknown: what the character meant to do."""
    if intention.action == "wait":
        return f"{name} waited; nothing came of it."
    target = f" {intention.target}" if intention.target else ""
    what = {"move": "meant to go to", "speak": "meant to speak to", "act": "meant to use"}
    verb = what.get(intention.action, f"meant to {intention.action}")
    return f"{name} {verb}{target}, but nothing came of it."


def _apply_outcome(
    ctx: TickContext, report: PhaseReport, location: Entity, char: Entity, outcome: Outcome
) -> None:
    state = char["state"]
    if outcome.moved_to is not None and outcome.moved_to != state["location"]:
        if outcome.moved_to in location["state"]["connections"]:
            state["location"] = outcome.moved_to
        else:
            report.warnings.append(
                f"{location['identity']['id']}: move of {outcome.character_id} to "
                f"{outcome.moved_to!r} ignored: not connected"
            )
    if outcome.mood:
        state["mood"] = outcome.mood
    inventory: list[str] = state["inventory"]
    for item in outcome.lost:
        if item in inventory:
            inventory.remove(item)
    for item in outcome.gained:
        if item not in inventory:
            inventory.append(item)


def _apply_location_update(location: Entity, update: LocationUpdate) -> None:
    state = location["state"]
    if update.atmosphere:
        state["atmosphere"] = update.atmosphere
    objects: list[str] = state["objects"]
    for item in update.objects_removed:
        if item in objects:
            objects.remove(item)
    for item in update.objects_added:
        if item not in objects:
            objects.append(item)


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    world = ctx.world
    cells: dict[str, str] = {}
    for lid, present in ctx.occupancy.items():
        location = world.locations[lid]
        resolution = ctx.resolutions.get(lid)
        if resolution is None:
            continue
        here = set(present)
        for outcome in resolution.outcomes:
            cid = outcome.character_id
            if cid not in here:
                known = "unknown character" if cid not in world.characters else "not present"
                report.warnings.append(f"{lid}: outcome for {cid!r} ignored: {known}")
                continue
            if cid in cells:
                report.warnings.append(f"{lid}: second outcome for {cid!r} ignored")
                continue
            cells[cid] = outcome.outcome
            _apply_outcome(ctx, report, location, world.characters[cid], outcome)
        if resolution.location_update is not None:
            _apply_location_update(location, resolution.location_update)
    for cid, char in world.characters.items():
        text = cells.get(cid) or unresolved_text(char["identity"]["name"], ctx.intentions[cid])
        char["memory"]["cells"].append({"tick": ctx.tick, "text": text})
