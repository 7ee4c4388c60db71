"""How a sharded tick's world is split over its shards and merged back: the plain data of it.

``partition`` splits the occupied places, in the order ``World.characters_at`` gives them,
into contiguous runs of about equal numbers of characters (the coordinator's run smaller
when the workers run their calls themselves: ``LOCAL_FIRST_SHARE``), so the merged results
come in the order one process gives them; ``unshardable`` says why a tick cannot be split
(``SHARDABLE``: the phases that can), ``local_calls`` whether the workers run their
calls on stacks of their own and ``waits_after`` after which phases the shards wait for
each other. The messages a worker is told and sends are data classes here
(``ShardPlan``; ``Logged``, ``PhaseDone``, ``ShardFinal``), and so is what the coordinator
merges them into (``merge_reports``, ``merge_results``, ``Merged``); at a barrier the
characters' and places' states are compared and exchanged
(``states_of``, ``changed_states``, ``take_states``).

Owns no process, socket or event loop: the coordinator's side of the wire and the workers
are ``sim.engine.shards`` (with ``sim.engine.sharded_tick``) and ``sim.engine.shard_worker``,
all of which use this.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

from sim import messages
from sim.config import Config
from sim.errors import RunError
from sim.llm.events import LLMEvent
from sim.llm.types import AdapterResponse, Usage
from sim.phases import PhaseSpec
from sim.phases.base import PhaseReport
from sim.phases.happenings import Happenings
from sim.world import World

if TYPE_CHECKING:
    from sim.mind.vectors import VectorCache
    from sim.phases.base import TickContext

# -- the messages -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardPlan:
    """What one worker is told at the start of a tick."""

    index: int
    root: Path
    config: Config
    tick: int
    #: the places of this shard, in ``World.characters_at`` order
    locations: tuple[str, ...]
    #: the call namer's copy (``sim.engine.recorder.CallNames``)
    names: Any
    adapter_name: str
    #: this tick's injected events (``sim inject``)
    happenings: Happenings
    #: run the calls here, on a stack of the worker's own (``local_calls``): each call's
    #: record is sent to the coordinator to log, not the call to answer
    local: bool = False
    #: the world's seed (the local stack's offline model is seeded with it)
    seed: int = 0


@dataclass(eq=False)
class StandIn:
    """The request of a worker's call, as the coordinator's events carry it: its entity key
    (what an event sink may read of it) and an identity that pairs the call's events."""

    entity_key: str | None


@dataclass
class Logged:
    """A call a worker ran on its own stack (``ShardPlan.local``), for the tick's log: its
    record, its line and cost (``sim.engine.recorder.call_record``), its instructions' text
    the first time the worker sends them, and its events as the tick's sinks count them
    (no request, chain window, identity or answer text in them)."""

    #: the call's record, without what only the log's line needs (its input, result,
    #: chain window and settings)
    record: Any
    #: the record's line in the log (``packed_call_line``)
    line: bytes
    cost: Any
    instructions: str | None
    #: ``None``: one answer at the first attempt, with no notice and no fallback; its one
    #: event is made again from the record (``counted``)
    events: list[LLMEvent] | None

    def counted(self) -> list[LLMEvent]:
        """The call's events for the tick's sinks (account, guard, progress)."""
        if self.events is not None:
            return self.events
        r = self.record
        final = r.attempts[-1]
        tokens = r.usage
        usage = Usage(tokens.input_tokens, tokens.output_tokens, tokens.cached_input_tokens)
        response = AdapterResponse(
            parsed=cast(Any, None),
            response_id=r.response_id,
            usage=usage,
            model=r.response_model,
            finish_reason=r.finish_reason,
            endpoint=r.endpoint,
        )
        return [
            LLMEvent(
                "llm_completed",
                r.phase,
                r.entity_key,
                r.response_model,
                cast(Any, StandIn(r.entity_key)),
                attempt=final.attempt,
                latency=r.latency,
                usage=usage,
                response=response,
                depth=r.depth,
                provider=final.provider,
                endpoint=r.endpoint,
            )
        ]


@dataclass
class PhaseDone:
    """A worker's end of one phase."""

    name: str
    report: PhaseReport
    results: dict[str, Any]
    #: ("character" | "location", id) -> its ``state`` now, for those whose state changed
    states: dict[tuple[str, str], Any]


#: a worker's part goes to the coordinator in messages of about this many bytes of files
#: (``ShardFinal.pieces``), each pickled, sent and read while the next is made: in one
#: message, a 40,000-character world's worker pickled 73 MB into new memory (each page of
#: which the kernel clears when first touched) and copied it to its socket's buffer, 1.0 s,
#: while the coordinator, done with its own part, waited 0.2-0.7 s for it (0.05-0.18 s in
#: pieces)
FINAL_PIECE = 1 << 21


@dataclass
class ShardFinal:
    """A worker's part of the world after the last phase: each of its characters' and
    places' files as the commit writes them (``sim.storage.entity_forms``; ``None``: as
    loaded), made on the worker's core, not pickled as objects and dumped again."""

    files: dict[str, bytes | None]
    store: dict[str, bytes | None]
    deletions: list[tuple[str, str]] = field(default_factory=list)
    #: what the tick's result says of the part, as its files hold it (``Ends``)
    ends: Ends = field(default_factory=lambda: Ends({}, {}))

    def pieces(self, size: int = FINAL_PIECE) -> Iterator[ShardFinal]:
        """This part in pieces of about ``size`` bytes of files each, the deletions and
        the ends with the last: sent one after another, so that no one message holds the
        whole part (``FINAL_PIECE``)."""
        piece = ShardFinal({}, {})
        held = 0
        for in_store, entries in ((False, self.files), (True, self.store)):
            for rel, data in entries.items():
                (piece.store if in_store else piece.files)[rel] = data
                held += len(rel) + (len(data) if data is not None else 0)
                if held >= size:
                    yield piece
                    piece, held = ShardFinal({}, {}), 0
        piece.deletions = self.deletions
        piece.ends = self.ends
        yield piece

    def add(self, piece: ShardFinal) -> None:
        """Put the next of a part's ``pieces`` in this one."""
        self.files.update(piece.files)
        self.store.update(piece.store)
        self.deletions.extend(piece.deletions)
        self.ends.add(piece.ends)


@dataclass
class Ends:
    """What a tick's result (``TickResult``: who moved, the characters' and places' names)
    needs of some entities as the tick ends: a worker sends its part's with its files, so
    ``sim tick`` need not parse those files again to know it."""

    #: per character: its name and its place
    characters: dict[str, tuple[str, str]]
    #: per place: its name
    places: dict[str, str]

    @classmethod
    def of(cls, world: World, characters: Iterable[str], places: Iterable[str]) -> Ends:
        """These entities' ends, as ``world`` holds them."""
        chars, locs = world.characters, world.locations
        return cls(
            {
                cid: (chars[cid]["identity"]["name"], chars[cid]["state"]["location"])
                for cid in characters
            },
            {lid: locs[lid]["identity"]["name"] for lid in places},
        )

    def add(self, other: Ends) -> None:
        self.characters.update(other.characters)
        self.places.update(other.places)


@dataclass
class HandOver:
    """A worker's part, handed to the coordinator before a phase that runs over the whole
    world (``alone``): each of its characters and places whole (``wholes_of``), its
    phases' typed results so far (what the later phases read of them: ``TickContext``'s
    ``intentions`` and ``resolutions``), its response-store changes and the responses
    its chains evicted. The coordinator runs the rest of the tick with them, as one
    process; the worker is done with the tick."""

    wholes: dict[tuple[str, str], bytes]
    intentions: dict[str, Any]
    resolutions: dict[str, Any]
    store: dict[str, bytes | None]
    deletions: list[tuple[str, str]]


@dataclass
class Merged:
    """What a sharded tick's phases left besides the world: the response-store changes,
    the responses to delete once it commits, and every shard's entity files
    (``ShardFinal.files``; the coordinator's own part's too) for its commit."""

    store: dict[str, bytes | None]
    deletions: list[tuple[str, str]]
    files: dict[str, bytes | None] = field(default_factory=dict)
    #: the workers' parts as the tick ends (in the coordinator's world their entities
    #: stay as it last saw them: ``files`` is not parsed again)
    ends: Ends = field(default_factory=lambda: Ends({}, {}))


# -- the split ---------------------------------------------------------------------------------


#: the built-in phases a shard can run on its part: each is about the characters (or
#: places) of one place at a time
SHARDABLE = frozenset(
    {
        "intentions",
        "conversation",
        "resolution",
        "narrative",
        "apply",
        "memory",
        "reflection",
        "planning",
    }
)
#: the shardable phases whose subjects are chosen over the whole world before they run:
#: ``conversation`` holds at most ``max_conversations_per_tick`` a tick, the first
#: openers by id wherever they are. The phase before is a barrier, at which the
#: coordinator chooses them from every shard's intentions (``TickContext.talks``) and
#: sends them to every worker with the states
CHOSEN_OVER_THE_WORLD = frozenset({"conversation"})
#: the shardable phases that change a character's or place's ``state`` (``apply``: moves,
#: moods, a place's atmosphere): only at their barrier are the states compared and sent
#: (``states_of``, ``changed_states``); the others' leave every state as it was, which
#: ``tests/unit/test_shard_files.py`` checks phase by phase (serialising each shard's
#: states twice a phase was about 0.3 s of the coordinator's 11 s at 40,000 characters)
STATE_WRITERS = frozenset({"apply"})


#: the shardable phases that read nothing of another shard's part: a character's own
#: fields and the world's (``memory`` folds a character's own evicted cells into its own
#: summary). ``reflection`` and ``planning`` read who is where and the place a character
#: is at, which another shard's ``apply`` may have changed
OWN_PART_READERS = frozenset({"memory"})


@dataclass(frozen=True)
class PhaseRoles:
    """What a tick's phases do across the shards' parts, beyond the built-ins' own
    (``phase_roles``): which change ``state`` (``STATE_WRITERS``, and a declared phase
    that ``writes`` into it), and which read whole entities of whoever is present at a
    place (a declared phase per character or per place: its templates see each present
    character's fields, memory included)."""

    writers: frozenset[str] = STATE_WRITERS
    readers: frozenset[str] = frozenset()


def phase_roles(phases: Sequence[PhaseSpec]) -> PhaseRoles:
    """The ``PhaseRoles`` of a tick's phases: a declared or a package's phase about one
    place at a time (``PhaseSpec.per``) reads whoever is present whole; a declared one
    writes states when its ``writes`` go into ``state``, a package's may (its code is
    not read: it is taken to)."""
    writers = set(STATE_WRITERS)
    readers = set()
    for spec in phases:
        if spec.per is None:
            continue
        readers.add(spec.name)
        declared = spec.declared
        if declared is None or any(write.target[0] == "state" for write in declared.writes):
            writers.add(spec.name)
    return PhaseRoles(frozenset(writers), frozenset(readers))


def barrier_after(
    names: Sequence[str], i: int, local: bool, roles: PhaseRoles
) -> tuple[bool, bool]:
    """For the ``i``-th of a tick's phases ``names``: whether the shards wait at its end
    (``waits_after``; never after the last), and whether whole entities are exchanged
    there (``mixed``: the next phase reads whoever is present, and ``apply`` has run).
    The coordinator and every worker decide it here, alike: a barrier one side expected
    and the other did not would leave both waiting."""
    later = names[i + 1 :]
    moved = "apply" in names[: i + 1]
    barrier = bool(later) and waits_after(names[i], local, later, roles, moved)
    return barrier, barrier and later[0] in roles.readers and moved


def waits_after(
    phase: str,
    local: bool,
    later: Sequence[str] = (),
    roles: PhaseRoles = PhaseRoles(),
    moved: bool = False,
) -> bool:
    """Whether each shard waits at ``phase``'s end for the others (a barrier), before its
    next phase (of ``later``, the phases after it). ``moved``: ``apply`` has run by
    ``phase``'s end, so a place may hold characters of several shards.

    After a phase that changes states (``STATE_WRITERS``) it does, when a later phase
    reads states the others changed: not when each later one reads its own part only
    (``OWN_PART_READERS``: after ``apply``, ``memory`` needs nothing of the others, whose
    states reach the coordinator with their parts). After the others, only a worker whose
    calls go through the coordinator (not ``local``) waits, so that no call of the next
    phase is paid before the coordinator has checked this one (``PhaseGuard``), as in one
    process. A worker running a free local model's calls itself (``local_calls``) goes
    straight on: what it needs of the next phase is its own part's, and the coordinator
    logs those calls only once it starts that phase itself (``Shards.starting``), so the
    log still holds each phase's calls between the record of the phase before and its
    own. A barrier after every phase made both shards wait, at each phase's end, for
    whichever was slower in that phase. Before a phase whose subjects are chosen over
    the whole world (``CHOSEN_OVER_THE_WORLD``) every shard waits for that choice, and
    before one that reads whole present entities (``PhaseRoles.readers``) once characters
    may have moved, for the entities of whoever shares a place with another shard's
    (``mixed``)."""
    if not local or (later and later[0] in CHOSEN_OVER_THE_WORLD):
        return True
    if later and later[0] in roles.readers and moved:
        return True
    return phase in roles.writers and not OWN_PART_READERS.issuperset(later)


#: the coordinator's share of the characters against each worker's 1 when the workers run
#: their calls themselves (``local_calls``): besides its own shard it logs and counts every
#: call a worker ran (about 30 µs each, against about 185 µs a call of its own), writes the
#: log's head while the workers start (``TickRecorder.open``) and records each phase's
#: end, while a worker goes on. Traced at 40,000 and 100,000 characters (offline, 2
#: shards, with no barrier: memory reads only its own part): at 0.9 the worker ended its
#: memory 1.5 s (40,000) and 4 s (100,000) before the coordinator did; at 0.72 the
#: coordinator waited 1.5 s at the end of intentions (100,000) for the worker's; 0.8 ended
#: the shards' phases first at both sizes. The split only moves work, never the result
LOCAL_FIRST_SHARE = 0.8


def partition(
    occupancy: Mapping[str, Sequence[str]], workers: int, first: float = 1.0
) -> list[tuple[str, ...]]:
    """The occupied places split into at most ``workers`` contiguous runs (in the order
    given) of about equal numbers of characters, the first ``first`` times the others'
    share; none empty."""
    total = sum(len(present) for present in occupancy.values())
    parts: list[list[str]] = [[] for _ in range(max(1, workers))]
    shares = [first, *([1.0] * (len(parts) - 1))]
    bounds: list[float] = []  # the characters before each run's end
    reached = 0.0
    for share in shares:
        reached += share
        bounds.append(reached * total / sum(shares))
    done = 0
    k = 0
    for lid, present in occupancy.items():
        while k < len(parts) - 1 and parts[k] and done >= bounds[k]:
            k += 1
        parts[k].append(lid)
        done += len(present)
    return [tuple(part) for part in parts if part]


def local_calls(*, local_stack: bool, budget: bool, gated: bool, resume: bool) -> bool:
    """Whether a sharded tick's workers run their calls on stacks of their own
    (``ShardPlan.local``) rather than send each to the coordinator: when the run's stack is
    the config's and every endpoint of it a local model that costs nothing
    (``Stack.local``: the offline provider), the run has no budget, no policy gate sees
    each call (``gated``) and the tick is not a resume (whose answers come from its log).
    Then no limit of the run is held at the coordinator: there is no server to share,
    nothing to spend, nothing to replay."""
    return local_stack and not (budget or gated or resume)


def unshardable(phases: Sequence[PhaseSpec], config: Config) -> str | None:
    """Why this tick cannot run on several workers (``None``: it can): its first phase
    that runs on a part comes after one that runs ``alone`` (from which on the
    coordinator runs the tick by itself), or there is none; or its calls go as batches."""
    for spec in phases:
        if over_the_world(spec):
            continue
        if alone(spec):
            return (
                f"phase {spec.name!r} runs over the whole world, before any phase that runs "
                f"on a part of it; --workers runs the built-in phases "
                f"{', '.join(sorted(SHARDABLE))} and phases about one place at a time "
                '(declared, or a package\'s that says per = "character" or "location") on '
                "each part, up to the first phase that runs over the whole world"
            )
        break
    if config.llm.batch:
        return "[llm] batch sends each phase's calls as one batch from one process"
    return None


def alone(spec: PhaseSpec) -> bool:
    """Whether ``spec`` may read or write any entity: a package's phase that does not say
    it is about one place at a time (``PhaseSpec.per``; its code is not read). From the
    first such phase on, a sharded tick runs in the coordinator alone: each worker hands
    it its part (``HandOver``) and is done with the tick."""
    if over_the_world(spec) or spec.per is not None:
        return False
    return spec.name not in SHARDABLE or spec.kind != "builtin"


def over_the_world(spec: PhaseSpec) -> bool:
    """Whether ``spec`` is a phase the world declares per world: one subject, the world,
    whose templates see every character and place whole. The coordinator runs it alone,
    on the whole world (each worker sends it every entity of its part, whole, and waits),
    and sends back the world's fields it wrote (``sim.engine.sharded_tick.run_over_the_world``)."""
    return spec.declared is not None and spec.declared.per == "world"


def delivers(phase: str, config: Config) -> bool:
    """Whether every shard, once ``phase`` has run on each, waits for the messages of all
    (``merge_messages``) and delivers them to its own characters (``[messages]``:
    ``sim.phases.apply.deliver``): a message reaches a tie wherever it is."""
    return phase == "apply" and messages.rule(config) is not None


# -- provider embeddings ------------------------------------------------------------------------

#: per character (its id), the texts it needs vectors of that a shard's cache lacks
Wanted = list[tuple[str, list[str]]]


def wanted(ctx: TickContext, cache: VectorCache, phase: str) -> Wanted:
    """What this shard's characters (``ctx.characters()``) need of ``cache`` before
    ``phase``, and ``cache`` lacks: each character's texts (``TickContext.embedding_texts``)
    not in it, those with none left out. The coordinator fetches every shard's, in the
    world's order (``texts_in_order``), and sends each shard the vectors it asked for."""
    out: Wanted = []
    for cid, texts in ctx.embedding_texts(phase):
        missing = cache.missing(texts)
        if missing:
            out.append((cid, missing))
    return out


def texts_in_order(parts: Sequence[Wanted], order: Mapping[str, int]) -> list[str]:
    """The shards' wanted texts as one process lists them: by character, in the world's
    order (``order``). Fetching these finds the same texts missing, in the same order,
    as one process finds among all of its characters' (``VectorCache.missing`` keeps the
    first of each): a text a shard's cache holds, the coordinator's does too."""
    merged = sorted((pair for part in parts for pair in part), key=lambda pair: order[pair[0]])
    return [text for _, texts in merged for text in texts]


def merge_messages(
    parts: Sequence[Mapping[str, Any]], order: Mapping[str, int]
) -> list[messages.Sent]:
    """The tick's messages, from each shard's ``apply`` results (each its own senders'),
    in the world's order of their senders (``order``), as one process sends them."""
    sent = [
        messages.Sent(item["from"], item["to"], item["text"])
        for part in parts
        for item in part.get("messages", ())
    ]
    return sorted(sent, key=lambda item: order[item.sender])


# -- the merge ---------------------------------------------------------------------------------


def merge_reports(into: PhaseReport, parts: Sequence[PhaseReport]) -> None:
    """Add the shards' reports of one phase to the coordinator's (whose usage, retries,
    timeouts and fallback models the tick's events already counted)."""
    for part in parts:
        into.calls += part.calls
        into.failures += part.failures
        into.fallbacks.extend(part.fallbacks)
        into.errors.update(part.errors)
        into.warnings.extend(part.warnings)
        into.entities += part.entities


def merge_results(parts: Sequence[Mapping[str, Any]], order: Mapping[str, int]) -> dict[str, Any]:
    """The shards' results of one phase as one process orders them: by ``order`` (each
    character's and place's place in the world), else as they came."""
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    late = len(order)
    keys = sorted(merged, key=lambda key: order.get(key, late))
    return {key: merged[key] for key in keys}


def states_of(
    world: World,
    part: Sequence[str],
    places: Iterable[str],
    phase: str,
    writers: frozenset[str] = STATE_WRITERS,
) -> dict[tuple[str, str], bytes]:
    """The ``state`` of each character of ``part`` and each place of ``places``, as bytes,
    before ``phase``: compared at its end, to send the others what changed. None for a
    phase that changes no state (not one of ``writers``: ``PhaseRoles.writers``)."""
    if phase not in writers:
        return {}
    found = {("character", cid): orjson.dumps(world.characters[cid]["state"]) for cid in part}
    for lid in places:
        found["location", lid] = orjson.dumps(world.locations[lid]["state"])
    return found


def changed_states(
    world: World, before: Mapping[tuple[str, str], bytes]
) -> dict[tuple[str, str], Any]:
    """The states of ``before``'s entities that are no longer what they were."""
    entities = {"character": world.characters, "location": world.locations}
    changed = {}
    for key, was in before.items():
        state = entities[key[0]][key[1]]["state"]
        if orjson.dumps(state) != was:
            changed[key] = state
    return changed


def take_states(
    world: World,
    states: Mapping[tuple[str, str], Any],
    mine: Mapping[tuple[str, str], bytes],
) -> None:
    """Put the states the other shards changed (all of ``states`` but ``mine``) in
    ``world``: a character who moved is where the next phase looks for it."""
    entities = {"character": world.characters, "location": world.locations}
    for (kind, eid), state in states.items():
        if (kind, eid) not in mine:
            entities[kind][eid]["state"] = state


def mixed(
    world: World, parts: Sequence[Sequence[str]], occupancy: Mapping[str, Sequence[str]]
) -> list[tuple[str, str]]:
    """The entities another shard needs whole now, ``("character" | "location", id)``:
    every place that a character of another shard has moved to (or a character of its
    own from it), with everyone there, where a phase reading whole present entities
    (``PhaseRoles.readers``) runs for each of them and for the place, in the shards that
    hold them. ``parts``: each shard's places as the tick began (a place no shard holds,
    empty then, is the first's); ``occupancy``: who was where then (a character is its
    place's shard's); ``world``: where they are now. In the world's order."""
    owner_of_place = {lid: i for i, part in enumerate(parts) for lid in part}
    owner = {cid: owner_of_place[lid] for lid, present in occupancy.items() for cid in present}
    people: set[str] = set()
    places: set[str] = set()
    for lid, present in world.characters_at().items():
        shards = {owner_of_place.get(lid, 0), *(owner[cid] for cid in present)}
        if len(shards) > 1:
            people.update(present)
            places.add(lid)
    return [("character", cid) for cid in world.characters if cid in people] + [
        ("location", lid) for lid in world.locations if lid in places
    ]


def wholes_of(world: World, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
    """These entities whole, as bytes (``mixed``: sent to every shard)."""
    entities = {"character": world.characters, "location": world.locations}
    return {(kind, eid): orjson.dumps(entities[kind][eid]) for kind, eid in keys}


def take_wholes(
    world: World, wholes: Mapping[tuple[str, str], bytes], mine: Iterable[tuple[str, str]]
) -> None:
    """Put the other shards' entities of ``wholes`` in ``world`` as they are now (the
    shard's own, ``mine``, are its to change and stay as they are)."""
    entities = {"character": world.characters, "location": world.locations}
    own = set(mine)
    for (kind, eid), data in wholes.items():
        if (kind, eid) not in own:
            entities[kind][eid] = orjson.loads(data)


def owned(part: Iterable[str], places: Iterable[str]) -> set[tuple[str, str]]:
    """A shard's own entities, keyed as ``mixed`` keys them."""
    return {("character", cid) for cid in part} | {("location", lid) for lid in places}


def check_part(world: World, part: ShardFinal) -> None:
    """A worker's part names only entities of ``world`` (its files and its ``Ends``).

    Raises:
        RunError: naming the first file or entity that is not one of the world's; the
            tick ends uncommitted, with nothing made up put in the world or its commit.
    """
    entities = {"characters": world.characters, "locations": world.locations}
    for rel in part.files:
        kind, _, name = rel.partition("/")
        if not name.endswith(".json") or name.removesuffix(".json") not in entities.get(kind, {}):
            raise RunError(f"a shard sent {rel!r}, which is not a file of this world's")
    for kind, ids in (("characters", part.ends.characters), ("locations", part.ends.places)):
        unknown = sorted(ids.keys() - entities[kind].keys())
        if unknown:
            raise RunError(
                f"a shard sent {kind}/{unknown[0]}.json, which is not a file of this world's"
            )
