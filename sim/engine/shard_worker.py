"""One shard's worker process of a sharded tick (``sim.engine.shards``).

Started by the coordinator as ``python -m sim.engine.shard_worker FD WORLD`` with one end of a
socket pair: it reads its ``ShardPlan``, loads the world read-only, runs each phase for its
part, reports at each phase's end and waits for the others' changes, then sends its part of
the world and exits. It writes nothing to the world folder; if the coordinator goes, its
socket closes and it exits.

Its calls go one of two ways (``ShardPlan.local``): to the coordinator, which answers them
through the run's adapter stack (``RemoteAdapter``); or, when every endpoint is a local,
free model (the offline provider) and nothing of the run's must see each call (no budget,
no policy, not a resume), through a stack of its own (``LocalAdapter``), which then sends
the coordinator the call's finished record to log and waits until it is logged before the
answer is used.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

import orjson

from sim.config import Config
from sim.engine import repair
from sim.engine.recorder import attempt_record, call_record, phase_results
from sim.engine.shards import (
    Logged,
    Outbox,
    PhaseDone,
    ShardFinal,
    ShardPlan,
    StandIn,
    frame,
    portable,
    receive,
)
from sim.engine.stack import Stack, build_stack
from sim.errors import RunError
from sim.gcpause import gc_paused
from sim.llm.budget import Price
from sim.llm.client import finished_events
from sim.llm.errors import LLMError
from sim.llm.events import LLMEvent, null_sink
from sim.llm.store import ResponseStore
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.phases import resolve_phases
from sim.phases.base import TickContext
from sim.phases.templates import Prompts
from sim.storage import Storage
from sim.ticklog.format import packed_call_line
from sim.world import World


class RemoteAdapter:
    """The worker's adapter: each call is answered by the coordinator's stack."""

    def __init__(self, name: str, writer: asyncio.StreamWriter) -> None:
        self.name = name
        self.outbox = Outbox(writer, share=True)
        self.waiting: dict[int, asyncio.Future[Any]] = {}
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


class LocalAdapter(RemoteAdapter):
    """The worker's adapter when its calls run here (``ShardPlan.local``): each call goes
    through ``stack`` (a local, free model's: no network, no cost); its record for the
    tick's log is made here (``call_record``) and sent to the coordinator with the events
    its sinks count (the answer's text and parsed result left out), and the answer is
    used only once the coordinator says it is in the log, as with one process."""

    def __init__(self, name: str, writer: asyncio.StreamWriter, inner: Adapter, config: Config):
        super().__init__(name, writer)
        self.inner = inner
        self.config = config
        self._prices: dict[str, Price | None] = {}
        #: the instructions digests whose text went to the coordinator already
        self._told: set[str] = set()

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        started = time.perf_counter()
        answer: AdapterResponse | LLMError
        try:
            answer = await self.inner.execute(request)
        except LLMError as exc:
            answer = exc
        except Exception as exc:  # a bug in an adapter: an LLMError, as the client has it
            answer = LLMError(f"Unexpected error: {exc!r}", code="unexpected", cause=exc)
        latency = time.perf_counter() - started
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
            # pickled plainly: nothing in it is shared with other messages (``post`` would
            # ask of each of its objects whether it is)
            self.outbox.queue(frame(("logged", n, Logged(slim, line, cost, text, counted))))
            await future  # in the tick's log: the answer may be used
        if isinstance(answer, LLMError):
            raise answer
        return answer


def _states(world: World, kind: str, ids: Iterator[str]) -> dict[tuple[str, str], bytes]:
    entities = world.characters if kind == "character" else world.locations
    return {(kind, eid): orjson.dumps(entities[eid]["state"]) for eid in ids}


async def serve(sock: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**26)
    plan: ShardPlan = await receive(reader)
    stack: Stack | None = None
    adapter: RemoteAdapter
    if plan.local:  # the offline model, say: run here, each call logged by the coordinator
        stack = build_stack(plan.config, plan.seed)
        adapter = LocalAdapter(plan.adapter_name, writer, stack.adapter, plan.config)
    else:
        adapter = RemoteAdapter(plan.adapter_name, writer)
    barriers: asyncio.Queue[Any] = asyncio.Queue()

    finished = False

    async def listen() -> None:
        try:
            while True:
                message = await receive(reader)
                if message[0] == "answer":
                    future = adapter.waiting.pop(message[1], None)
                    if future is not None and not future.done():
                        future.set_result(message[2])
                else:
                    barriers.put_nowait(message)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            if not finished:
                os._exit(3)  # the coordinator is gone, or the tick stopped: so does this

    listening = asyncio.create_task(listen())
    try:
        with gc_paused():
            final = await run_part(plan, adapter, writer, barriers)
        finished = True
        writer.write(frame(("final", final)))
    except Exception as exc:
        writer.write(frame(("failed", portable(exc))))
    finally:
        if stack is not None:
            await stack.aclose()
    await writer.drain()
    # the coordinator closes the socket when the tick is over
    await listening


async def run_part(
    plan: ShardPlan,
    adapter: RemoteAdapter,
    writer: asyncio.StreamWriter,
    barriers: asyncio.Queue[Any],
) -> ShardFinal:
    config = plan.config
    world = Storage(plan.root, config.limits.max_entity_bytes).load()
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

    # the coordinator makes each call's events as it answers it: none are sent from here
    ctx.events = null_sink
    for spec in phases:
        before = {
            **_states(world, "character", iter(mine)),
            **_states(world, "location", iter(ctx.occupancy)),
        }
        await spec.run(ctx)
        entities = {"character": world.characters, "location": world.locations}
        changed = {}
        for key, was in before.items():
            state = entities[key[0]][key[1]]["state"]
            if orjson.dumps(state) != was:
                changed[key] = state
        done = PhaseDone(spec.name, ctx.reports[-1], phase_results(spec.name, ctx), changed)
        adapter.outbox.post(("phase", done))
        adapter.outbox.flush()
        await writer.drain()
        message = await barriers.get()
        for (kind, eid), state in message[1].items():
            if (kind, eid) not in before:  # another shard's
                entities[kind][eid]["state"] = state
    evicted = [pair for client in ctx.clients for pair in client.pending_deletions]
    return ShardFinal(
        characters={cid: world.characters[cid] for cid in mine},
        locations={lid: world.locations[lid] for lid in ctx.occupancy},
        store=store.changes(),
        deletions=evicted,
    )


class ShardActor:
    """A shard's worker as a Ray actor (``sim tick --executor ray``): ``run`` connects to
    the coordinator, says which shard it is, and serves the tick as a process would."""

    def run(self, host: str, port: int, index: int) -> int:
        sock = socket.create_connection((host, port))
        sock.sendall(frame(("hello", index, os.getpid(), socket.gethostname())))
        asyncio.run(serve(sock))
        return 0


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    asyncio.run(serve(sock))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
