"""A tick's phases over its shards (``sim tick --workers N``): ``run_sharded``.

The coordinator runs the first shard itself, on the tick's context (its calls through
``Slotted``), and the workers (``sim.engine.shards.Shards``) the others. At the end of
each phase the workers report (the phase's report and results, the state their characters
and places now have) and, where a later phase needs it (``split.barrier_after``), wait; the
coordinator logs the phase, checks it, and sends every worker the others' state, so a
character who moved is where the next phase looks for it. After the last phase each worker
sends its characters' and places' files as the commit writes them (made there, on its
core, while the coordinator makes its own part's), its response-store changes and the
responses to delete; the coordinator puts them in the world and commits the tick once, as
with one process.

What crosses the shards besides, each at its phase: the tick's conversations, chosen over
the world; the messages of ``[messages]``; provider embeddings, fetched here for every
shard (``share_vectors``); a phase declared per world, run here on the whole world
(``run_over_the_world``); and before a package's phase that may read or write any entity,
every worker's part, from which on the tick runs here alone (``take_over``). The merged
results come in the order one process gives them (``sim.engine.split``), so with the
offline provider the world files, the log's story and its books are those of
``--workers 1``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sim.engine.recorder import HELD_APART, phase_results
from sim.engine.shards import Shards
from sim.engine.split import (
    CHOSEN_OVER_THE_WORLD,
    LOCAL_FIRST_SHARE,
    HandOver,
    Logged,
    Merged,
    PhaseDone,
    ShardFinal,
    ShardPlan,
    Wanted,
    alone,
    barrier_after,
    changed_states,
    check_part,
    delivers,
    merge_messages,
    merge_reports,
    merge_results,
    mixed,
    over_the_world,
    owned,
    partition,
    phase_roles,
    states_of,
    take_states,
    take_wholes,
    texts_in_order,
    wanted,
    wholes_of,
)
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.phases import PhaseSpec
from sim.phases.apply import deliver
from sim.phases.base import PhaseReport, TickContext
from sim.phases.conversation import choose, speakers
from sim.storage import entity_forms

if TYPE_CHECKING:
    from sim.mind.vectors import VectorCache  # numpy: only where a phase needs it


async def run_sharded(
    ctx: TickContext,
    phases: Sequence[PhaseSpec],
    shards: Shards,
    names: Any,
    adapter_name: str,
    on_phase: Callable[[str, bool, PhaseReport | None], None],
    phase_end: Callable[[str, dict[str, Any]], None],
    check: Callable[[PhaseReport], None],
    prepare: Callable[[str, Sequence[str]], Awaitable[None]],
    log: Callable[[Sequence[Logged]], None] | None = None,
    open_log: Callable[[], object] = lambda: None,
) -> Merged:
    """Run the tick's phases on ``shards.count + 1`` shards of ``ctx.world``, the first
    here (on ``ctx``, whose adapter and events are the tick's), the others on the workers,
    and put their parts in it.

    Args:
        names: the tick's call namer (``TickRecorder.names``); each worker gets a copy.
        on_phase: a phase starts (``True``) or ends (``False``, with its report).
        phase_end: log a phase's merged results (``TickRecorder.phase_end``).
        check: raises if the tick must stop after a phase (``PhaseGuard.check``).
        log: the workers run their calls on stacks of their own (``local_calls``), and
            this logs each (``TickRecorder.logged``); ``None``: each call comes here.
        open_log: writes the log's head (``TickRecorder.open``), called once the workers
            have their plans and before this process's first call: the workers start
            their part while it is written (at 100,000 characters, 1.3 s of the state as
            the tick began), their calls held until this process starts their phase.
        prepare: fetches a phase's provider embeddings of the texts given, with the
            tick's budget, embedder and log (``share_vectors``).

    Raises:
        WorkerDied: a worker ended mid-tick; or what a worker's phase raised.
    """
    world = ctx.world
    everywhere = ctx.occupancy
    parts = partition(everywhere, shards.count + 1, LOCAL_FIRST_SHARE if log else 1.0)
    plans = [
        ShardPlan(
            i,
            world.root,
            ctx.config,
            ctx.tick,
            part,
            names.copy(),
            adapter_name,
            ctx.happenings,
            local=log is not None,
            seed=world.seed,
        )
        for i, part in enumerate(parts)
        if i > 0
    ]
    # the order one process gives results in: characters, then places, as the world has them
    order = {cid: i for i, cid in enumerate(world.characters)}
    for lid in everywhere:
        order.setdefault(lid, len(order))
    # a phase declared per place: every place, in the world's order
    places_order = {lid: i for i, lid in enumerate(world.locations)}
    merged = Merged({}, [])
    shards.begin(plans, ctx.adapter, ctx.events, log, ctx.stream)
    here = parts[0] if parts else ()
    mine = [cid for lid in here for cid in everywhere[lid]]
    adapter = ctx.adapter
    ctx.occupancy = {lid: everywhere[lid] for lid in here}
    ctx.part = frozenset(mine)
    # this shard's places, and every place no one was at: no worker holds those
    ctx.places = frozenset(here).union(lid for lid in world.locations if lid not in everywhere)
    ctx.adapter = Slotted(adapter, shards.slots)
    names = [spec.name for spec in phases]
    roles = phase_roles(phases)
    speaks: dict[str, str] = {}  # who means to speak to whom, over every shard
    by_itself = False  # from a phase that runs ``alone`` on: the workers are done
    logged: dict[str, dict[str, Any]] = {}  # each phase's results, as one process's
    try:
        open_log()  # the workers have their plans: they start while it is written
        for i, spec in enumerate(phases):
            on_phase(spec.name, True, None)
            shards.starting(spec.name)
            later = names[i + 1 :]
            if not by_itself and alone(spec):  # the rest of the tick, here on the whole world
                evicted = await take_over(ctx, shards, mine, everywhere, order, logged)
                merged.deletions.extend(evicted)
                ctx.adapter = adapter
                by_itself = True
            if by_itself:  # as one process runs it
                if ctx.embedded(spec.name) is not None:
                    texts = ctx.embedding_texts(spec.name)
                    await prepare(spec.name, [text for _, some in texts for text in some])
                await spec.run(ctx)
                report = ctx.reports[-1]
                phase_end(spec.name, phase_results(spec.name, ctx))
                on_phase(spec.name, False, report)
                check(report)
                continue
            barrier, exchange = barrier_after(names, i, log is not None, roles)
            before = states_of(world, mine, here, spec.name, roles.writers) if barrier else {}
            cache = ctx.embedded(spec.name)
            if cache is not None:  # every shard waits for its vectors
                await share_vectors(ctx, spec.name, cache, shards, order, prepare)
            done: list[PhaseDone] = []
            if over_the_world(spec):  # here alone, on the whole world
                await run_over_the_world(ctx, spec, shards, owned(mine, ctx.places), everywhere)
                report = ctx.reports[-1]
                ours = results = phase_results(spec.name, ctx)
            else:
                await spec.run(ctx)
                report = ctx.reports[-1]
                done = await shards.gather("phase")
                merge_reports(report, [d.report for d in done])
                ours = phase_results(spec.name, ctx)
                per_place = spec.per == "location"
                results = merge_results(
                    [ours, *(d.results for d in done)], places_order if per_place else order
                )
            if delivers(spec.name, ctx.config):  # every shard's messages, to every shard
                sent = merge_messages([ours, *(d.results for d in done)], order)
                shards.deliver(sent)
                deliver(ctx, sent)
                results = {"messages": [item.record() for item in sent]} if sent else {}
            if spec.name == "intentions" and CHOSEN_OVER_THE_WORLD.intersection(later):
                # what the tick's conversations are chosen from
                speaks = speakers((c, d["action"], d["target"]) for c, d in results.items())
            elif spec.name == "conversation" and ctx.talks is not None:
                # as one process holds them: in the order they were opened
                results = {o: results[o] for o, _ in ctx.talks if o in results}
            if spec.name == "narrative":
                ctx.narratives = results
            logged[spec.name] = results
            phase_end(spec.name, results)
            on_phase(spec.name, False, report)
            check(report)
            if i + 1 == len(phases):  # the workers send their parts without a barrier,
                # each its files, made while this process makes its own part's
                merged.files = entity_forms(world, mine, here)
                break
            if not barrier:  # the workers went on
                continue
            states = changed_states(world, before)
            for part in done:
                states.update(part.states)
            take_states(world, states, before)
            talks = None
            if later[0] in CHOSEN_OVER_THE_WORLD:  # the tick's conversations, chosen here
                talk = ctx.config.conversation
                limit, size = talk.max_conversations_per_tick, talk.max_participants
                talks = ctx.talks = choose(speaks, world.characters, limit, size)
            wanted = mixed(world, parts, everywhere) if exchange else None  # across shards
            shards.broadcast(states, talks, wanted)
            if wanted is not None:
                own = owned(mine, ctx.places)
                wholes = wholes_of(world, (key for key in wanted if key in own))
                for theirs in await shards.gather("wholes"):
                    wholes.update(theirs)
                shards.wholes(wholes)
                take_wholes(world, wholes, own)
        finals: list[ShardFinal] = await shards.gather("final")
    finally:
        ctx.occupancy = everywhere
        ctx.part = None
        ctx.places = None
        ctx.talks = None
        ctx.adapter = adapter
        shards.end()
    for final in finals:
        check_part(world, final)
        merged.files.update(final.files)
        merged.ends.add(final.ends)
        merged.store.update(final.store)
        merged.deletions.extend(final.deletions)
    return merged


async def run_over_the_world(
    ctx: TickContext,
    spec: PhaseSpec,
    shards: Shards,
    own: set[tuple[str, str]],
    everywhere: dict[str, list[str]],
) -> None:
    """Run ``spec``, a phase the world declares per world (``split.over_the_world``), here,
    on the whole world: every worker sends each entity of its part whole, as it is now,
    this context takes them (its ``own`` are current already), runs the phase as one
    process would, and sends every worker the world's fields it wrote and their view."""
    wholes: dict[tuple[str, str], bytes] = {}
    for theirs in await shards.gather("wholes"):
        wholes.update(theirs)
    take_wholes(ctx.world, wholes, own)
    del wholes
    part, places, occupancy = ctx.part, ctx.places, ctx.occupancy
    ctx.part, ctx.places, ctx.occupancy = None, None, everywhere
    try:
        await spec.run(ctx)
    finally:
        ctx.part, ctx.places, ctx.occupancy = part, places, occupancy
    shards.world(*ctx.world_as_seen())


async def take_over(
    ctx: TickContext,
    shards: Shards,
    mine: Sequence[str],
    everywhere: dict[str, list[str]],
    order: Mapping[str, int],
    logged: Mapping[str, dict[str, Any]],
) -> list[tuple[str, str]]:
    """Before a phase that runs ``alone`` (a package's that may read or write any
    entity): every worker hands its part over (``HandOver``) and is done with the tick;
    this context takes it, whole, and holds what one process would hold by now (each
    phase's results, ``logged``, in its order; the workers' chains), so the rest of the
    tick runs here as in one process. Returns the responses the workers' chains evicted,
    deleted once the tick commits."""
    handed: list[HandOver] = await shards.gather("handover")
    shards.active = []  # nothing more is asked of them this tick
    own = owned(mine, ctx.places or ())
    for part in handed:
        take_wholes(ctx.world, part.wholes, own)
        ctx.store.take(part.store)
    ctx.take_results(
        merge_results([ctx.intentions, *(part.intentions for part in handed)], order),
        merge_results([ctx.resolutions, *(part.resolutions for part in handed)], order),
        {name: results for name, results in logged.items() if name not in HELD_APART and results},
    )
    ctx.part, ctx.places, ctx.occupancy, ctx.talks = None, None, everywhere, None
    return [pair for part in handed for pair in part.deletions]


async def share_vectors(
    ctx: TickContext,
    phase: str,
    cache: VectorCache,
    shards: Shards,
    order: Mapping[str, int],
    prepare: Callable[[str, Sequence[str]], Awaitable[None]],
) -> None:
    """Before ``phase``, which retrieves with a provider's embeddings: fetch what every
    shard's characters need (``split.wanted``), here, in the order one process would
    (``prepare``: ``TickContext.prepare_memory`` with the tick's budget, embedder and
    log), and send each worker the vectors it asked for. Twice when the cache's file
    turned out to be of another length than the model's vectors (dropped, as one
    process drops it): each shard then lacks what it had from the file. ``cache``: the
    phase's (``TickContext.embedded``)."""
    while True:
        theirs: list[Wanted] = await shards.gather("texts")
        before = cache.dimensions
        await prepare(phase, texts_in_order([wanted(ctx, cache, phase), *theirs], order))
        again = bool(before) and cache.dimensions != before
        sent = [cache.vectors_of(text for _, texts in part for text in texts) for part in theirs]
        shards.vectors(cache.dimensions, sent, again)
        if not again:
            return


class Slotted:
    """The coordinator's own shard's adapter: its calls hold a slot of ``[llm]
    max_concurrency`` shared with the workers' (``Shards.slots``), and each gives the
    event loop a turn before it is sent. A local model answers without suspending, so the
    phase's tasks would otherwise run the whole shard without one, while the workers
    wait for their calls to be logged. The turn comes before the call, not after its
    answer: a Ctrl-C landing there would cancel a call already paid for, its answer
    never logged, and the resumed tick would pay for it again."""

    def __init__(self, inner: Adapter, slots: asyncio.Semaphore) -> None:
        self.inner = inner
        self.name = inner.name
        self.slots = slots

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        await asyncio.sleep(0)
        async with self.slots:
            return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)
