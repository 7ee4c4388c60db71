"""Phase 3, apply: outcomes become world state, deterministically, under the rules.

Rules: a character moves only along a connection of the location it started the tick in;
an outcome for a character who is not at that location (or does not exist) is ignored and
reported; a second outcome for the same character is ignored and reported. Every character
gets exactly one new memory cell: its outcome, or what it meant to do when nothing was
resolved for it (with the mind on, ``[memory]``: rated, its mentions found).

With the message channel on (``[messages]``, ``sim.messages``), the messages of the tick
are delivered here: the inboxes shown this tick are emptied, then each ``message``
intention (in the world's order of characters) goes into its recipient's inbox and memory
(after the recipient's own cell), and into the log (this phase's results). A message
reaches anyone with a tie, wherever they are: in a sharded tick (``sim tick --workers``)
each shard checks its own senders' messages here, against their ties as this phase left
them, and delivers none; every shard's then go to every shard, which delivers those to its
own characters (``deliver``, called by ``sim.engine.sharded_tick`` and the workers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sim import messages
from sim.mind.cells import Mentions, mind_on, new_cell, remember
from sim.phases.base import PhaseReport, TickContext
from sim.phases.intentions import Intention
from sim.phases.resolution import LocationUpdate, Outcome, RatedOutcome
from sim.world import Entity, World

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
    _edit_items(state["inventory"], outcome.lost, outcome.gained)


def _apply_location_update(location: Entity, update: LocationUpdate) -> None:
    state = location["state"]
    if update.atmosphere:
        state["atmosphere"] = update.atmosphere
    _edit_items(state["objects"], update.objects_removed, update.objects_added)


def _edit_items(items: list[str], removed: Iterable[str], added: Iterable[str]) -> None:
    """Take ``removed`` out of a list of things (those present), then add the new ``added``."""
    for item in removed:
        if item in items:
            items.remove(item)
    for item in added:
        if item not in items:
            items.append(item)


def _gaps(ctx: TickContext, cells: dict[str, str]) -> list[str]:
    """Per place, the characters present whom no outcome reached, and why: its resolution
    fell back (``Resolution.empty``: the call failed, or its answer named what is not
    there, after every re-ask), or the game master left them out. Each still remembers
    what they meant to do (``unresolved_text``)."""
    resolved = [report for report in ctx.reports if report.name == "resolution"]
    if not resolved:  # a world whose phases resolve nothing: no outcome is expected
        return []
    failed = {key for report in resolved for key in report.errors}
    out = []
    for lid, present in ctx.occupancy.items():
        missing = sorted(cid for cid in present if cid not in cells)
        if not missing:
            continue
        if f"resolution:{lid}" in failed:
            why = "its resolution fell back"
        elif lid not in ctx.resolutions:
            why = "it was not resolved"
        else:
            why = "the game master gave them none"
        out.append(f"{lid}: {', '.join(missing)} ({why}; remembered as what they meant to do)")
    return out


def _messages(ctx: TickContext, world: World, report: PhaseReport) -> list[messages.Sent]:
    """The tick's messages, each from a character to one of its contacts (checked again:
    an intention reaches here verified, or as the idle fallback)."""
    settings = messages.rule(ctx.config)
    if settings is None:
        return []
    sent = []
    for cid, char in world.characters.items():
        intention = ctx.intentions.get(cid)
        if intention is None or intention.action != messages.MESSAGE:
            continue
        target = intention.target
        if target not in world.characters or target not in messages.contacts(char, settings):
            report.warnings.append(f"{cid}: message to {target!r} ignored: not a tie")
            continue
        sent.append(messages.Sent(cid, target, intention.content))
    return sent


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    world = ctx.world
    cells: dict[str, str] = {}
    importance: dict[str, int] = {}  # rated by the resolution (``[memory] rate = "model"``)
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
            if isinstance(outcome, RatedOutcome):
                importance[cid] = outcome.importance
            _apply_outcome(ctx, report, location, world.characters[cid], outcome)
        if resolution.location_update is not None:
            _apply_location_update(location, resolution.location_update)
    report.gaps.extend(_gaps(ctx, cells))
    mentions = Mentions(world) if mind_on(ctx.config) else None
    sent = _messages(ctx, world, report)
    if messages.rule(ctx.config) is not None:
        for char in world.characters.values():  # shown in this tick's inputs: read
            char.pop("inbox", None)
    if sent:
        ctx.results[NAME] = {"messages": [item.record() for item in sent]}
    part = ctx.part  # a shard's characters (``sim tick --workers``); None: all
    for cid, char in world.characters.items():
        if part is not None and cid not in part:
            continue
        own = cells.get(cid) or unresolved_text(char["identity"]["name"], ctx.intentions[cid])
        _remember(ctx, char, own, mentions, importance.get(cid))
    if part is None:  # one process delivers here; a shard, every shard's after (``deliver``)
        _deliver(ctx, sent, mentions)


def deliver(ctx: TickContext, sent: Sequence[messages.Sent]) -> None:
    """A sharded tick's messages, every shard's, in the world's order of their senders,
    into the inbox and memory of the recipients among this shard's characters
    (``ctx.part``), after this shard's ``apply`` ran: what ``run`` delivers in one
    process."""
    part = ctx.part
    ours = [item for item in sent if part is None or item.recipient in part]
    _deliver(ctx, ours, Mentions(ctx.world) if mind_on(ctx.config) else None)


def _deliver(ctx: TickContext, sent: Sequence[messages.Sent], mentions: Mentions | None) -> None:
    world = ctx.world
    for item in sent:
        recipient = world.characters[item.recipient]
        inbox = recipient.setdefault("inbox", [])
        inbox.append({"tick": ctx.tick, "from": item.sender, "text": item.text})
        name = world.characters[item.sender]["identity"]["name"]
        _remember(ctx, recipient, messages.memory_text(name, item.text), mentions, None)


def _remember(
    ctx: TickContext, char: Entity, text: str, mentions: Mentions | None, rating: int | None
) -> None:
    """A new cell of this tick in ``char``'s memory (rated and its mentions found when the
    mind is on)."""
    if mentions is None:
        char["memory"]["cells"].append({"tick": ctx.tick, "text": text})
    else:
        remember(char["memory"], new_cell(ctx.tick, text, ctx.config.memory, mentions, rating))
