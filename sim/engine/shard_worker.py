"""One shard's worker process of a sharded tick (``sim.engine.shards``; its messages and
the merge of its part: ``sim.engine.split``).

Started by the coordinator as ``python -m sim.engine.shard_worker FD WORLD`` with one end of a
socket pair: it reads its ``ShardPlan``, loads the world read-only, runs each phase for its
part and reports at each phase's end; at a barrier (``split.waits_after``) it waits for the
others' changes, elsewhere it goes on to its next phase. Then it sends its part of the world
(or, before a phase that runs over the whole world, ``split.alone``, hands it over whole)
and is done with the tick. It writes nothing to the world folder; if the coordinator goes,
its socket closes and it exits.

Its calls go one of two ways (``ShardPlan.local``): to the coordinator, which answers them
through the run's adapter stack (``RemoteAdapter``); or, when every endpoint is a local,
free model (the offline provider) and nothing of the run's must see each call (no budget,
no policy, not a resume), through a stack of its own (``LocalAdapter``), which sends the
coordinator each call's finished record to log and uses the answer at once
(``LOCAL_UNLOGGED``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from sim.config import Config
from sim.engine import repair
from sim.engine.recorder import attempt_record, call_record, phase_results
from sim.engine.split import (
    Ends,
    HandOver,
    Logged,
    PhaseDone,
    ShardFinal,
    ShardPlan,
    StandIn,
    alone,
    barrier_after,
    changed_states,
    delivers,
    over_the_world,
    owned,
    phase_roles,
    states_of,
    take_states,
    take_wholes,
    wanted,
    wholes_of,
)
from sim.engine.stack import Stack, build_stack
from sim.engine.wire import Outbox, frame, hello, portable, receive
from sim.errors import RunError
from sim.llm.budget import Price
from sim.llm.client import finished_events, timed_answer
from sim.llm.errors import LLMError
from sim.llm.events import LLMEvent, null_sink
from sim.llm.store import ResponseStore
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.phases import resolve_phases
from sim.phases.apply import deliver
from sim.phases.base import TickContext
from sim.phases.templates import Prompts
from sim.storage import Storage, entity_forms
from sim.ticklog.format import packed_call_line
from sim.world import World

#: the calls a worker running a local model's calls (``ShardPlan.local``) keeps in flight.
#: The model answers without suspending, so more in flight runs no faster; but the event
#: loop writes to the socket only between its turns, each of which runs every call then
#: ready, and the socket takes about 200 KB at a time (Linux's default buffer): with 1,024
#: in flight, records of calls made (resolution's are 10-20 KB) waited in the worker for
#: seconds while the coordinator, done with its own shard, waited for them. 16 still left
#: it waiting; 4 did not (40,000 characters, offline, 2 shards)
LOCAL_IN_FLIGHT = 4
#: how many of its own calls a worker (``ShardPlan.local``) may use before the coordinator
#: says they are in the log. The order of the socket already keeps the log whole: a call
#: is logged before anything the worker sent after it (later calls, the phase's end, its
#: part of the world), so a resume replays a prefix of what the worker did, and asks the
#: free local model again for the rest. Waiting for each call's round trip instead left
#: the worker idle while the coordinator ran its own shard; this bounds only what waits in
#: the socket's buffer when the coordinator falls behind (about 4 KB a call: at 100,000
#: characters the coordinator fell 32,768 calls behind, and its worker then waited, 4 s
#: of a 32 s tick's phases).
LOCAL_UNLOGGED = 65536
#: a worker sends the calls it ran in messages of at most this many (``LocalAdapter``), so
#: the coordinator logs one while the worker runs the next
LOGGED_BATCH = 64


class RemoteAdapter:
    """The worker's adapter: each call is answered by the coordinator's stack."""

    def __init__(self, name: str, outbox: Outbox, waiting: dict[int, asyncio.Future[Any]]):
        self.name = name
        self.outbox = outbox
        #: the calls sent, by number, until their answer comes (``serve`` sets it)
        self.waiting = waiting
        self._n = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self._n += 1
        n = self._n
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[n] = future
        self.outbox.post(("call", n, request))
        answer = await future
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, AdapterResponse)
        return answer

    async def delete_response(self, response_id: str) -> None:
        raise RuntimeError("a shard's worker deletes no response: the coordinator does")

    def send_logged(self) -> None:
        """Send the calls run here that are not on their way yet (``LocalAdapter``); the
        coordinator's answers are logged there."""


class LocalAdapter(RemoteAdapter):
    """The worker's adapter when its calls run here (``ShardPlan.local``): each call goes
    through ``stack`` (a local, free model's: no network, no cost); its record for the
    tick's log is made here (``call_record``) and sent to the coordinator with the events
    its sinks count (the answer's text and parsed result left out), and the answer is
    used at once: its record is on the socket before anything made with it
    (``LOCAL_UNLOGGED``)."""

    def __init__(
        self,
        name: str,
        outbox: Outbox,
        waiting: dict[int, asyncio.Future[Any]],
        inner: Adapter,
        config: Config,
    ) -> None:
        super().__init__(name, outbox, waiting)
        self.inner = inner
        self.config = config
        self._prices: dict[str, Price | None] = {}
        #: the instructions digests whose text went to the coordinator already
        self._told: set[str] = set()
        #: the calls finished in this turn of the event loop, sent together (``send_logged``)
        self._unsent: list[tuple[int, Logged]] = []

    def send_logged(self) -> None:
        """The calls finished since the last time, in one message: pickled plainly
        (nothing in it is shared with other messages: ``post`` would ask of each of its
        objects whether it is)."""
        unsent, self._unsent = self._unsent, []
        if unsent:
            self.outbox.queue(frame(("logged", unsent)))

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        answer, latency = await timed_answer(self.inner, request)
        call = request.call
        if call is not None:
            response = answer if isinstance(answer, AdapterResponse) else None
            error = answer if isinstance(answer, LLMError) else None
            context: dict[str, Any] = {
                "history": request.history,
                "previous_response_id": request.previous_response_id,
                "depth": call.depth,
                "call": call,
            }
            ended = finished_events(
                call.phase,
                None,  # the call's entity key is its identity's
                request.settings,
                latency,
                context,
                response=response,
                error=error,
            )
            earlier = [attempt_record(event) for event in ended[:-1]]
            made = call_record(call, ended[-1], earlier, self.config, self._prices)
            assert made is not None  # a worker runs its calls here only when not resuming
            record, cost = made
            text = None
            if call.instructions_digest not in self._told:
                self._told.add(call.instructions_digest)
                text = call.instructions
            counted: list[LLMEvent] | None = None
            plain = (
                response is not None
                and len(response.attempts) <= 1
                and response.notice is None
                and response.fallback_from is None
            )
            if not plain:  # the coordinator's sinks read more than the record says
                # (usage, errors, notices), without the answer itself, the request, the
                # chain window or the call's identity
                light = {
                    "history": (),
                    "previous_response_id": None,
                    "depth": call.depth,
                    "call": None,
                }
                counted = finished_events(
                    call.phase,
                    StandIn(call.entity_key),
                    request.settings,
                    latency,
                    light,
                    response=replace(response, parsed=cast(Any, None), raw="")
                    if response is not None
                    else None,
                    error=cast(LLMError, portable(error)) if error is not None else None,
                )
            self._n += 1
            n = self._n
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self.waiting[n] = future
            line = packed_call_line(record, own_digest=True)
            slim = record.model_copy(
                update={"input": "", "result": None, "history": [], "settings": {}}
            )
            if not self._unsent:
                asyncio.get_running_loop().call_soon(self.send_logged)
            self._unsent.append((n, Logged(slim, line, cost, text, counted)))
            if len(self._unsent) >= LOGGED_BATCH:  # on its way while the next are made
                self.send_logged()
            if len(self.waiting) > LOCAL_UNLOGGED:  # far ahead of the log: wait for it
                await future
            else:
                # a turn of the event loop (the model answers without suspending), as the
                # coordinator's own calls get one (``Slotted``): the records go out and the
                # coordinator's word of what is logged comes in as the calls are made, not
                # in a heap at the phase's end (at 100,000 characters the worker's peak
                # memory 1.74-1.85 GiB, not 2.0 GiB)
                await asyncio.sleep(0)
        if isinstance(answer, LLMError):
            raise answer
        return answer


async def serve(sock: socket.socket, root: Path) -> None:
    """Serve the coordinator's ticks until it closes the socket: each tick, ``open`` (load
    the world), then a ``plan`` (run the part, send it) or ``skip``."""
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**26)
    outbox = Outbox(writer, share=True)
    waiting: dict[int, asyncio.Future[Any]] = {}
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    running = False

    async def listen() -> None:
        try:
            while True:
                message = await receive(reader)
                if message[0] == "answer":
                    future = waiting.pop(message[1], None)
                    if future is not None and not future.done():
                        future.set_result(message[2])
                elif message[0] == "logged":  # these calls are in the tick's log
                    for n in message[1]:
                        future = waiting.pop(n, None)
                        if future is not None and not future.done():
                            future.set_result(None)
                else:
                    inbox.put_nowait(message)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            if running:
                os._exit(3)  # the coordinator is gone, or the tick stopped: so does this
            inbox.put_nowait(("closed",))

    listening = asyncio.create_task(listen())
    world: World | BaseException | None = None
    while True:
        message = await inbox.get()
        if message[0] == "closed":  # perhaps after an "open": a Ray actor's process lives on
            gc.enable()
            break
        if message[0] == "open":  # the last tick committed: load the world as it is now
            # the collector is paused from the load until the part is sent and the world
            # freed, as the coordinator's is over its tick (``Runner.run_async``): its full
            # collections would rescan the world, on the tick's critical path
            gc.disable()
            try:
                world = Storage(root, message[1]).load()
            except Exception as exc:  # told with the plan, as the part's failure
                world = exc
            continue
        if message[0] != "plan":  # "skip": no part of this tick
            world = None
            _collect()
            continue
        plan: ShardPlan = message[1]
        running = True
        outbox.shared.clear()  # what the last tick's requests shared goes with it
        stack: Stack | None = None
        adapter: RemoteAdapter
        if plan.local:  # the offline model, say: run here, each call logged by the coordinator
            stack = build_stack(plan.config, plan.seed)
            adapter = LocalAdapter(plan.adapter_name, outbox, waiting, stack.adapter, plan.config)
        else:
            adapter = RemoteAdapter(plan.adapter_name, outbox, waiting)
        try:
            if not isinstance(world, World):
                raise world if world is not None else RunError("no world was loaded")
            final = await run_part(plan, world, adapter, writer, inbox)
            pieces = list(final.pieces()) if final is not None else []
            for piece in pieces[:-1]:  # each read by the coordinator while the next is made
                writer.write(frame(("piece", piece)))
                await writer.drain()
            if pieces:
                writer.write(frame(("final", pieces[-1])))
            del pieces
            del final  # what it holds of the world goes with the world, below
        except Exception as exc:
            writer.write(frame(("failed", portable(exc))))
        finally:
            # sent before the world is freed: a big part waits in the buffer for the
            # event loop, which freeing a whole world object by object would hold up
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
            world = None
            if stack is not None:
                await stack.aclose()
            _collect()
        running = False
    await listening


def _collect() -> None:
    """The tick's part is done and its world freed: the collector runs again, and once
    now, while the coordinator commits (what the tick left in cycles, on a small heap)."""
    gc.enable()
    gc.collect()


async def run_part(
    plan: ShardPlan,
    world: World,
    adapter: RemoteAdapter,
    writer: asyncio.StreamWriter,
    barriers: asyncio.Queue[Any],
) -> ShardFinal | None:
    """Run ``plan``'s part of the tick on ``world``: its phases, their barriers, and the
    part as the commit writes it; ``None`` when the part was handed to the coordinator
    before a phase that runs over the whole world (``split.alone``), and sent already."""
    config = plan.config
    if world.tick + 1 != plan.tick:
        raise RunError(f"the world is at tick {world.tick}, not {plan.tick - 1}")
    repairs = repair.inspect(world)
    repair.apply(world, repairs)
    store = ResponseStore(world.root, repair.STORE_DIR)
    for rel in repairs.store_deletions():
        chain, _, name = rel.removeprefix(".sim/responses/").partition("/")
        store.discard(f"{chain}:{name.removesuffix('.json')}")
    prompts = Prompts(world.root)
    phases = resolve_phases(config, world.root)
    ctx = TickContext(world, config, adapter, store, plan.tick)
    ctx.namer = plan.names
    ctx.prompts = prompts
    ctx.happenings = plan.happenings
    where = world.characters_at()
    ctx.occupancy = {lid: where[lid] for lid in plan.locations if lid in where}
    mine = [cid for present in ctx.occupancy.values() for cid in present]
    ctx.part = frozenset(mine)
    ctx.places = frozenset(plan.locations)
    if plan.local:  # no server to keep busy: the socket sent as the calls are made
        ctx.in_flight = LOCAL_IN_FLIGHT

    # the coordinator makes each call's events as it answers it: none are sent from here
    ctx.events = null_sink
    names = [spec.name for spec in phases]
    roles = phase_roles(phases)
    for i, spec in enumerate(phases):
        if alone(spec):  # the coordinator runs the rest of the tick: this part goes to it
            adapter.send_logged()
            adapter.outbox.post(("handover", _handed(ctx, store, mine, plan.locations)))
            adapter.outbox.flush()
            return None
        # after the last phase the part goes at once; after one the others need not wait
        # for (``waits_after``), the next phase starts at once, and no state is sent
        barrier, exchange = barrier_after(names, i, plan.local, roles)
        before = states_of(world, mine, ctx.occupancy, spec.name, roles.writers) if barrier else {}
        cache = ctx.embedded(spec.name)
        again = cache is not None
        while cache is not None and again:  # the coordinator fetches every shard's vectors
            adapter.outbox.post(("texts", wanted(ctx, cache, spec.name)))
            adapter.outbox.flush()
            await writer.drain()
            _, dimensions, vectors, again = await barriers.get()
            cache.take(dimensions, vectors)
        if over_the_world(spec):  # the coordinator runs it on the whole world
            adapter.send_logged()
            adapter.outbox.post(("wholes", wholes_of(world, owned(mine, plan.locations))))
            adapter.outbox.flush()
            await writer.drain()
            _, meta, view = await barriers.get()
            ctx.take_world(meta, view)
        else:
            await spec.run(ctx)
            changed = changed_states(world, before)
            done = PhaseDone(spec.name, ctx.reports[-1], phase_results(spec.name, ctx), changed)
            adapter.send_logged()  # the phase's calls before its end, in the log too
            adapter.outbox.post(("phase", done))
            adapter.outbox.flush()
        if delivers(spec.name, config):  # every shard's messages: to its own characters
            await writer.drain()
            deliver(ctx, (await barriers.get())[1])
        if barrier:
            await writer.drain()
            message = await barriers.get()
            take_states(world, message[1], before)
            if message[2] is not None:  # the next phase's conversations, all of the tick's
                ctx.talks = message[2]
            if exchange:  # whole entities of who shares a place across shards
                own = owned(mine, plan.locations)
                adapter.outbox.post(
                    ("wholes", wholes_of(world, (k for k in message[3] if k in own)))
                )
                adapter.outbox.flush()
                await writer.drain()
                wholes = await barriers.get()
                take_wholes(world, wholes[1], own)
    evicted = [pair for client in ctx.clients for pair in client.pending_deletions]
    return ShardFinal(
        files=entity_forms(world, mine, ctx.occupancy),
        store=store.changes(),
        deletions=evicted,
        ends=Ends.of(world, mine, ctx.occupancy),
    )


def _handed(
    ctx: TickContext, store: ResponseStore, mine: list[str], places: tuple[str, ...]
) -> HandOver:
    """This shard's part, whole, and what its phases left, for the coordinator to run the
    rest of the tick with (``split.alone``)."""
    return HandOver(
        wholes=wholes_of(ctx.world, owned(mine, places)),
        intentions=ctx.intentions,
        resolutions=ctx.resolutions,
        store=store.changes(),
        deletions=[pair for client in ctx.clients for pair in client.pending_deletions],
    )


class ShardActor:
    """A shard's worker as a Ray actor (``sim tick --executor ray``): ``run`` connects to
    the coordinator, says which shard it is with the run's token (``wire.hello``), and
    serves the tick as a process would. It reads the world by its path: on another
    machine, the folder must be there at the same path (one shared filesystem)."""

    def run(self, host: str, port: int, index: int, root: str, token: bytes) -> int:
        node = socket.gethostname()
        if not (Path(root) / "world.json").is_file():
            raise RunError(
                f"the world folder {root} is not on node {node}: with --executor ray, every "
                "node that runs a worker reads the world at the same path (one filesystem "
                "they all mount)"
            )
        sock = socket.create_connection((host, port))
        sock.sendall(hello(token, index, os.getpid(), node))
        asyncio.run(serve(sock, Path(root)))
        return 0


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    asyncio.run(serve(sock, Path(argv[1])))
    # the run is over: nothing is left to write, and freeing a whole world object by
    # object would keep the coordinator waiting for this process to end
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
