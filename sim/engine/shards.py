"""A sharded tick's workers and the coordinator's side of the wire (``sim tick --workers N``).

The coordinator (the ``Runner``) loads the world, begins the tick's log and holds the one
adapter stack: the budget, the endpoint's concurrency, recovery, the policy gate and a
resume's replay. Each worker (``sim.engine.shard_worker``, a process of its own) loads the
same world read-only and runs every phase for its part: the characters at its places as the
tick began. Its phases build their requests and apply the answers there; each call goes to
the coordinator, which sends it through the stack and logs it as any call; the call's
events come back with it, in order.

``Shards`` holds the workers (processes on this machine, or Ray actors with ``--executor
ray``, started by ``sim.engine.shard_processes``), kept for the run, and talks to them:
their calls answered or logged, each phase's barrier (``gather``, ``broadcast``), the
tick's messages, vectors, world fields and whole entities sent to every worker. What a
tick does with them, phase by phase, is ``sim.engine.sharded_tick``; what the messages
hold and how the parts are merged, ``sim.engine.split``.

A worker that dies ends the tick with an error naming it; a coordinator that dies closes
the workers' sockets, and they exit. Nothing but the coordinator writes to the world.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from sim.engine.shard_processes import (
    LocalProcess,
    RayActor,
    WorkerDied,
    start_actors,
    start_local,
)
from sim.engine.split import Logged, ShardFinal, ShardPlan, StandIn
from sim.engine.wire import Outbox, frame, portable, receive
from sim.errors import RunError
from sim.llm.client import finished_events, timed_answer
from sim.llm.errors import LLMChainNotFoundError, LLMError
from sim.llm.events import LLMEvent
from sim.llm.streaming import StreamHub
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.messages import Sent


@dataclass
class _Worker:
    index: int
    process: LocalProcess | RayActor
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: the worker's phase reports and final part, in order; an exception when it failed
    inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    outbox: Outbox = field(init=False)
    #: what the worker sent once (``Outbox(share=True)``)
    shared: dict[int, Any] = field(default_factory=dict)
    #: the stand-in request object of each call in flight (its events are paired by it)
    tokens: dict[str, StandIn] = field(default_factory=dict)
    #: the pieces of its part come so far (``ShardFinal.pieces``)
    part: ShardFinal = field(default_factory=lambda: ShardFinal({}, {}))

    def describe(self) -> str:
        return f"worker {self.index + 1} ({self.process.describe()})"


Sink = Callable[[LLMEvent], None]


class Shards:
    """The worker processes (or Ray actors) of a run's sharded ticks, from its first tick to
    its end (``async with``): ``count`` of them, for a tick of ``count + 1`` shards whose
    first the coordinator runs itself. Each tick: ``open`` (every worker loads the world
    while the coordinator does), ``begin`` (its plan, or none), the phases' barriers
    (``gather``, ``broadcast``), then ``gather("final")``.

    Args:
        root: the world's folder.
        count: the worker processes (or actors).
        max_entity_bytes: ``[limits] max_entity_bytes`` (each worker's load holds to it).
        slots: ``[llm] max_concurrency``, over the coordinator's calls and the workers'.
        executor: ``local``: each worker a process here; ``ray``: a Ray actor.
        ray_address: the Ray cluster (``None``: ``RAY_ADDRESS``, else a local instance).
    """

    def __init__(
        self,
        root: Path,
        count: int,
        max_entity_bytes: int,
        slots: int,
        executor: str = "local",
        ray_address: str | None = None,
    ) -> None:
        self.root = root
        self.count = count
        self.max_entity_bytes = max_entity_bytes
        self.executor = executor
        self.ray_address = ray_address
        #: ``[llm] max_concurrency`` over the whole tick: each worker's clients hold it
        #: too, so N workers would otherwise have N times as many calls in flight
        self.slots = asyncio.Semaphore(slots)
        self.workers: list[_Worker] = []
        #: this tick's: the workers given a part, the adapter that answers their calls, the
        #: tick's event sink, and what logs the calls they run themselves (``local_calls``)
        self.active: list[_Worker] = []
        self.adapter: Adapter | None = None
        self.events: Sink = _no_events
        self.log: Callable[[Sequence[Logged]], None] | None = None
        #: where the text of the calls answered here streams (``[llm] stream``)
        self.stream: StreamHub | None = None
        #: the calls read since the log was last written, and whose worker waits for them
        self._unlogged: list[tuple[_Worker, list[tuple[int, Logged]]]] = []
        #: the phase this process runs now (``starting``), and the calls of later phases
        #: the workers ran already (``waits_after``): logged once it starts their phase
        self._phase: str | None = None
        self._held: list[tuple[_Worker, int, Logged]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Shards:
        if self.executor == "ray":
            started = await start_actors(self.root, self.count, self.ray_address)
        else:
            started = await start_local(self.root, self.count)
        for index, process, reader, writer in started:
            worker = _Worker(index, process, reader, writer)
            worker.outbox = Outbox(writer)
            self.workers.append(worker)
            task = asyncio.create_task(self._serve(worker))
            self._tasks.add(task)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """End the workers: let them go when the run ended well, else at once (one may
        be loading a big world, and would see its socket closed only after)."""
        await self.close(now=bool(exc) and exc[0] is not None)

    async def close(self, now: bool = False) -> None:
        """End the workers: let them go, or end them at once (``now``)."""
        for task in self._tasks:
            task.cancel()
        for worker in self.workers:
            worker.writer.close()
        for worker in self.workers:
            await worker.process.stop(now=now)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def open(self) -> None:
        """A tick starts: every worker loads the world as it is now (the last tick
        committed), while the coordinator loads it too."""
        data = frame(("open", self.max_entity_bytes))
        for worker in self.workers:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                worker.writer.write(data)

    def begin(
        self,
        plans: Sequence[ShardPlan],
        adapter: Adapter,
        events: Sink,
        log: Callable[[Sequence[Logged]], None] | None,
        stream: StreamHub | None = None,
    ) -> None:
        """Give the first ``len(plans)`` workers their part of this tick; the others sit it
        out (a world with fewer occupied places than shards). ``stream``: the tick's
        ``StreamHub``, where the text of the workers' calls answered here streams."""
        self.adapter = adapter
        self.events = events
        self.log = log
        self.stream = stream
        self._unlogged = []
        self.active = self.workers[: len(plans)]
        for worker in self.workers:  # what the last tick's calls shared goes with it
            worker.shared.clear()
            worker.tokens.clear()
            worker.part = ShardFinal({}, {})  # and the pieces of a part it did not end
        for worker, plan in zip(self.workers, plans, strict=False):
            worker.writer.write(frame(("plan", plan)))
        for worker in self.workers[len(plans) :]:
            worker.writer.write(frame(("skip",)))

    def end(self) -> None:
        """This tick is over: let go of what it handed in (its adapter, event sink and
        log, which hold the tick's world and records), as one process's tick does when it
        returns, not at the next tick's ``begin`` (after its load: two worlds at once)."""
        self.adapter = None
        self.events = _no_events
        self.log = None
        self.stream = None
        self._unlogged = []
        self._phase = None
        self._held = []
        self.active = []

    async def _serve(self, worker: _Worker) -> None:
        """Read one worker's messages until it ends: calls are answered, events go to the
        tick's sink, the rest to its inbox."""
        try:
            while True:
                message = await receive(worker.reader, worker.shared)
                kind = message[0]
                if kind == "call":
                    task = asyncio.create_task(self._answer(worker, message[1], message[2]))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif kind == "logged":
                    self._logged(worker, message[1])
                elif kind == "piece":  # of its part: the last comes as its "final"
                    worker.part.add(message[1])
                elif kind == "final":
                    self._write()
                    part, worker.part = worker.part, ShardFinal({}, {})
                    part.add(message[1])
                    worker.inbox.put_nowait(("final", part))
                    del part
                else:  # a phase's end, a failure: the calls before it logged first
                    self._write()
                    worker.inbox.put_nowait(message)
                # not held while the next one is awaited: a worker's last message is its
                # part of the world, which the closing task's traceback would keep alive
                # in a reference cycle until the process's last collection
                del message
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            how = await worker.process.ended()
            worker.inbox.put_nowait(
                (
                    "failed",
                    WorkerDied(
                        f"{worker.describe()} died in the middle of the tick ({how}); "
                        "nothing was committed, the next run resumes the tick"
                    ),
                )
            )

    async def _answer(self, worker: _Worker, n: int, request: ModelRequest) -> None:
        """Answer one of a worker's calls through the tick's adapter, and log it here as
        its answer comes back (``finished_events``, as the client would): a call answered
        is in the log whatever happens to the worker after."""
        assert self.adapter is not None
        call = request.call
        phase = call.phase if call is not None else ""
        key = call.entity_key if call is not None else None
        context: dict[str, Any] = {
            "history": request.history,
            "previous_response_id": request.previous_response_id,
            "depth": call.depth if call is not None else 0,
            "call": call,
        }
        # the events of one call are paired by their request object: a stand-in here (a
        # call sent again after its provider lost its chain keeps the first one's)
        rid = call.request_id if call is not None else f"{worker.index}:{n}"
        stand_in = worker.tokens.get(rid)
        if stand_in is None:
            stand_in = worker.tokens[rid] = StandIn(key)
            called = LLMEvent(
                "llm_called",
                phase,
                key,
                request.settings.model,
                cast(Any, stand_in),
                **context,
            )
            self.events(called)
        async with self.slots:
            if self.stream is None:
                answer, latency = await timed_answer(self.adapter, request)
            else:  # its text shown as it comes, as the coordinator's own calls' is
                with self.stream.call(phase, key) as text:
                    streamed = replace(request, stream_to=text)
                    answer, latency = await timed_answer(self.adapter, streamed)
        if isinstance(answer, LLMChainNotFoundError) and request.previous_response_id:
            # the worker's client sends it again with the window: not the call's end
            lost = LLMEvent(
                "llm_failed",
                phase,
                key,
                request.settings.model,
                cast(Any, stand_in),
                latency=latency,
                error_code=answer.code,
                error=answer,
                final=False,
                **context,
            )
            self.events(lost)
        else:
            worker.tokens.pop(rid, None)
            ended = finished_events(
                phase,
                stand_in,
                request.settings,
                latency,
                context,
                response=answer if isinstance(answer, AdapterResponse) else None,
                error=answer if isinstance(answer, LLMError) else None,
            )
            for event in ended:
                self.events(event)
        sent = answer if isinstance(answer, AdapterResponse) else portable(answer)
        with contextlib.suppress(ConnectionError, OSError):
            worker.outbox.post(("answer", n, sent))

    def _logged(self, worker: _Worker, calls: list[tuple[int, Logged]]) -> None:
        """Calls the worker ran itself (those it finished in one turn of its event loop):
        logged with the others read in this turn of ours (``_write``)."""
        if self.log is None:
            raise RunError(f"{worker.describe()} ran a call itself; this tick logs none so")
        if not self._unlogged:
            asyncio.get_running_loop().call_soon(self._write)
        self._unlogged.append((worker, calls))

    def _write(self) -> None:
        """Log the calls read since the last time (one write, flushed), count their
        events, then tell each worker its calls are in the log (one message), which a
        worker ``sim.engine.shard_worker.LOCAL_UNLOGGED`` calls ahead of the log waits
        for. A call of a phase this process has not started yet is held until it does
        (``starting``): the log holds a phase's calls after the record of the one before,
        and the tick's sinks count each call in its own phase's report."""
        unlogged, self._unlogged = self._unlogged, []
        self._log([(worker, n, logged) for worker, calls in unlogged for n, logged in calls])

    def starting(self, phase: str) -> None:
        """This process starts ``phase``: the workers' calls of it, held so far, are logged
        at the next turn of the event loop, once the phase has made its report (the first
        thing each phase does), where the tick's sinks count them; until then the calls
        that come are held behind them, in their order."""
        asyncio.get_running_loop().call_soon(self._start, phase)

    def _start(self, phase: str) -> None:
        if self.log is None:  # the tick ended first
            return
        self._phase = phase
        held, self._held = self._held, []
        self._log(held)

    def _log(self, calls: list[tuple[_Worker, int, Logged]]) -> None:
        ready: list[tuple[_Worker, int, Logged]] = []
        for call in calls:  # a worker's calls come in its order, and are held in it
            (ready if call[2].record.phase == self._phase else self._held).append(call)
        if not ready:
            return
        assert self.log is not None
        self.log([logged for _, _, logged in ready])
        told: dict[int, tuple[_Worker, list[int]]] = {}
        for worker, n, logged in ready:
            for event in logged.counted():
                self.events(event)
            told.setdefault(worker.index, (worker, []))[1].append(n)
        for worker, numbers in told.values():
            with contextlib.suppress(ConnectionError, OSError):
                worker.outbox.queue(frame(("logged", numbers)))

    async def gather(self, kind: str) -> list[Any]:
        """Each of this tick's workers' next message, which must be of ``kind``, in
        worker order.

        Raises:
            WorkerDied: a worker ended; or what a worker's phase raised.
        """
        pending = {asyncio.ensure_future(w.inbox.get()): w for w in self.active}
        by_worker: dict[int, Any] = {}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    worker = pending.pop(future)
                    message = future.result()
                    if message[0] == "failed":
                        raise message[1]
                    if message[0] != kind:
                        raise RunError(f"{worker.describe()} sent {message[0]!r}, not {kind!r}")
                    by_worker[worker.index] = message[1]
        finally:
            for future in pending:
                future.cancel()
        return [by_worker[worker.index] for worker in self.active]

    def broadcast(
        self,
        states: Mapping[tuple[str, str], Any],
        talks: list[tuple[str, list[str]]] | None = None,
        wanted: list[tuple[str, str]] | None = None,
    ) -> None:
        """End a phase's barrier: every worker gets the state the others changed, the
        tick's conversations when the next phase holds them (``TickContext.talks``), and
        the entities it is to send whole (``split.mixed``; then the barrier ends with
        ``wholes``)."""
        data = frame(("barrier", dict(states), talks, wanted))
        for worker in self.active:
            worker.writer.write(data)

    def deliver(self, sent: Sequence[Sent]) -> None:
        """Every worker gets the tick's messages, every shard's (``split.delivers``), to
        deliver those to its own characters."""
        data = frame(("deliver", list(sent)))
        for worker in self.active:
            worker.writer.write(data)

    def vectors(self, dimensions: int, vectors: Sequence[Mapping[str, bytes]], again: bool) -> None:
        """Each worker gets the vectors it asked for before a phase (``split.wanted``),
        in worker order, of ``dimensions`` numbers; ``again``: the cache's file was of
        another length, and dropped: every shard asks once more for what it lacks."""
        for worker, theirs in zip(self.active, vectors, strict=True):
            worker.writer.write(frame(("vectors", dimensions, dict(theirs), again)))

    def world(self, meta: dict[str, Any], view: dict[str, Any] | None) -> None:
        """Every worker gets the world's fields and their view after a phase run here on
        the whole world (``run_over_the_world``, ``TickContext.world_as_seen``)."""
        data = frame(("world", meta, view))
        for worker in self.active:
            worker.writer.write(data)

    def wholes(self, wholes: Mapping[tuple[str, str], bytes]) -> None:
        """Every worker gets the whole entities of ``split.mixed``, each as its shard sent
        it: the barrier is over."""
        data = frame(("wholes", dict(wholes)))
        for worker in self.active:
            worker.writer.write(data)


def _no_events(event: LLMEvent) -> None:
    """No tick runs: no event is counted."""
