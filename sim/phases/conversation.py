"""Conversation (off unless named in ``[tick] phases``, after intentions): a character who
intends to speak to someone present opens a conversation; with ``max_participants`` above
two, others at the place join who mean to speak to someone in it or whom someone in it
addresses. The participants take turns in order (opener, partner, joiners), one call per
utterance that sees the dialogue so far, until one says it ends or ``max_turns`` is
reached. The resolution sees each whole dialogue, the narrative may quote it, and the
export lists each utterance.

The turns of all conversations go as rounds: round ``n`` asks every conversation still
open for its ``n``-th utterance in one batch (different conversations in parallel), so the
calls of one conversation (entity key ``conversation:{opener}``) run in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field

from sim.llm.errors import LLMError
from sim.phases.base import (
    PhaseAnswer,
    TickContext,
    ask,
    character_view,
    place_view,
    public,
    to_json,
)
from sim.world import Entity

NAME = "conversation"
SECTION = "conversation"
CHAIN = "conversation"


class Utterance(PhaseAnswer, title="Utterance"):
    says: str = Field(description="what the speaker says now, one to three sentences")
    ends: bool = Field(description="true if the speaker ends the conversation with this")


def conversations_at(ctx: TickContext, location_id: str) -> list[dict[str, Any]]:
    """This tick's conversations at a place (``[]`` without the phase), openers in order."""
    held = ctx.results.get(NAME, {})
    return [c for _, c in sorted(held.items()) if c["location"] == location_id]


def dialogues_at(ctx: TickContext, location_id: str) -> list[dict[str, Any]]:
    """The conversations at a place as the resolution and the narrative see them: who took
    part (names) and the whole dialogue, in order."""
    characters = ctx.world.characters  # names looked up for who talked, not for everyone

    def name(cid: str) -> Any:
        return characters[cid]["identity"]["name"]

    return [
        {
            "participants": [name(cid) for cid in talk["participants"]],
            "dialogue": [
                {"speaker": name(line["speaker"]), "says": line["says"]} for line in talk["lines"]
            ],
        }
        for talk in conversations_at(ctx, location_id)
        if talk["lines"]
    ]


def speakers(intentions: Iterable[tuple[str, str, str | None]]) -> dict[str, str]:
    """Who means to speak to whom, from ``(character, action, target)`` of each intention:
    a ``speak`` with a target other than the speaker."""
    return {
        cid: target
        for cid, action, target in intentions
        if action == "speak" and target and target != cid
    }


def choose(
    speaks: Mapping[str, str], characters: Mapping[str, Entity], limit: int, size: int
) -> list[tuple[str, list[str]]]:
    """(opener, participants) of each conversation this tick: a character who means to
    speak to someone at the same place (``speaks``: ``speakers``), in id order, neither
    already talking; at most ``limit``. With ``size`` above two, others then join
    (``_join``). Over every character of ``characters``: a sharded tick's coordinator
    chooses for the whole world (``TickContext.talks``), each shard holds its own."""
    talking: set[str] = set()
    opened: list[tuple[str, list[str]]] = []
    for cid in sorted(speaks):
        if len(opened) >= limit:
            break
        other = speaks[cid]
        char = characters.get(cid)
        partner = characters.get(other)
        if char is None or partner is None or cid in talking or other in talking:
            continue
        if char["state"]["location"] != partner["state"]["location"]:
            continue
        talking.update((cid, other))
        opened.append((cid, [cid, other]))
    if size > 2:
        for _, participants in opened:
            _join(speaks, characters, participants, talking, size)
    return opened


def _join(
    speaks: Mapping[str, str],
    characters: Mapping[str, Entity],
    participants: list[str],
    talking: set[str],
    size: int,
) -> None:
    """Add to a conversation, up to ``size``, the characters at its place not talking yet
    who mean to speak to someone in it, or whom someone in it means to speak to: round by
    round (a joiner may bring another), each round in id order."""
    where = characters[participants[0]]["state"]["location"]
    present = [
        cid
        for cid in sorted(characters)
        if cid not in talking and characters[cid]["state"]["location"] == where
    ]
    while len(participants) < size:
        inside = set(participants)
        addressed = {speaks.get(p) for p in participants}
        joining = [
            cid
            for cid in present
            if cid not in talking and (cid in addressed or speaks.get(cid) in inside)
        ]
        if not joining:
            return
        for cid in joining[: size - len(participants)]:
            participants.append(cid)
            talking.add(cid)


def utterance_input(
    ctx: TickContext, speaker: Entity, talk: dict[str, Any], turn: int, max_turns: int
) -> str:
    world = ctx.world
    names = {cid: world.characters[cid]["identity"]["name"] for cid in talk["participants"]}
    me = speaker["identity"]["id"]
    opener = talk["participants"][0]
    doc: dict[str, Any] = {
        "tick": ctx.tick,
        "world": ctx.world_view,
        "speaker": character_view(speaker),
        "with": [{"id": cid, "name": names[cid]} for cid in talk["participants"] if cid != me],
        "location": place_view(world.locations[talk["location"]], objects=False),
        "opening": ctx.intentions[opener].content,
        "dialogue": [
            {"speaker": names[line["speaker"]], "says": line["says"]} for line in talk["lines"]
        ],
        "turn": turn,
        "max_turns": max_turns,
    }
    return to_json(doc)


async def run(ctx: TickContext) -> None:
    report = ctx.report(NAME)
    config = ctx.config.conversation
    world = ctx.world
    talks: dict[str, dict[str, Any]] = {}
    opened = ctx.talks
    if opened is None:  # one process: chosen here, over the world
        speaks = speakers((cid, i.action, i.target) for cid, i in ctx.intentions.items())
        limit, size = config.max_conversations_per_tick, config.max_participants
        opened = choose(speaks, world.characters, limit, size)
    elif ctx.part is not None:  # a shard: those of its part, of all the tick holds
        opened = [(opener, people) for opener, people in opened if opener in ctx.part]
    for opener, participants in opened:
        where = world.characters[opener]["state"]["location"]
        talks[opener] = {
            "location": where,
            "participants": participants,
            "lines": [],
            "ended": "cap",
        }
    ctx.results[NAME] = talks
    openers = list(talks)
    client = ctx.client(SECTION, [world.characters[o] for o in openers], NAME)
    report.entities += len(openers)  # several calls each: failures count per conversation
    active = list(openers)
    for turn in range(1, config.max_turns + 1):
        if not active:
            break
        requests = []
        for opener in active:
            talk = talks[opener]
            speaker = world.characters[talk["participants"][(turn - 1) % len(talk["participants"])]]

            def context(
                speaker: Entity = speaker, talk: dict[str, Any] = talk, turn: int = turn
            ) -> dict[str, Any]:
                return {"speaker": public(speaker), "conversation": talk, "turn": turn}

            def default(
                speaker: Entity = speaker, talk: dict[str, Any] = talk, turn: int = turn
            ) -> str:
                return utterance_input(ctx, speaker, talk, turn, config.max_turns)

            key = f"{CHAIN}:{opener}"
            requests.append(ctx.request(NAME, Utterance, key, context, default))
        results = await ask(client, requests, report)
        still = []
        for opener, request, result in zip(active, requests, results, strict=True):
            talk = talks[opener]
            if isinstance(result, LLMError):
                report.fail(f"{request.entity_key}#{turn}", result)
                talk["ended"] = "failed"
                continue
            speaker_id = talk["participants"][(turn - 1) % len(talk["participants"])]
            talk["lines"].append({"speaker": speaker_id, "says": result.says.strip()})
            if result.ends:
                talk["ended"] = "said"
            else:
                still.append(opener)
        active = still
