"""The runner: one tick = load, phases in order, atomic commit, then post-commit cleanup."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from sim import interrupts
from sim.config import Config
from sim.engine import deletions, repair
from sim.engine.guard import PhaseGuard
from sim.engine.recorder import TickRecorder
from sim.engine.sharded_tick import run_sharded
from sim.engine.shards import Shards
from sim.engine.split import Ends, Logged, Merged, local_calls, unshardable
from sim.engine.stack import Stack, batch_transport, build_stack, with_recovery
from sim.errors import InputError, SimError, TickInterrupted, UserError
from sim.gcpause import gc_paused
from sim.interventions import PENDING, Pending, load_pending
from sim.llm.batching import BatchOptions, BatchProgress
from sim.llm.embedding import Embedder
from sim.llm.events import EventFanout, EventSink, LLMEvent
from sim.llm.pool import ServerReport
from sim.llm.recovery import RecoveryAdapter
from sim.llm.store import ResponseStore
from sim.llm.streaming import DeltaSink, StreamHub
from sim.llm.types import Adapter, Usage
from sim.mind.fit import fit_memory
from sim.phases import PhaseSpec, manifest, resolve_phases
from sim.phases.base import PhaseReport, TickContext
from sim.phases.templates import Prompts
from sim.policy import Approver, Policy, configured_policies, nobody
from sim.policy.forecast import plan_tick
from sim.policy.gate import TickPolicy
from sim.storage import Storage, dump_json
from sim.ticklog.format import STORE_DIR
from sim.ticklog.reader import check_log_slot
from sim.ticklog.records import EmbeddingRecord, PolicyRecord
from sim.ticklog.recovery import recover_logs
from sim.world import MAX_TICK, World

PhaseStage = Literal["start", "end"]


class _Terminated(Exception):
    """SIGTERM arrived during a run (turned into ``TickInterrupted`` by ``Runner.run``)."""


PhaseHook = Callable[[str, PhaseStage, PhaseReport | None], None]


@dataclass
class TickResult:
    """What one committed tick did."""

    tick: int
    narratives: dict[str, str]
    location_names: dict[str, str]
    reports: list[PhaseReport]
    elapsed: float
    #: (character id, from location id, to location id) for each character who moved
    moved: list[tuple[str, str, str]] = field(default_factory=list)
    #: character id -> name, as the tick left them (``location_names`` for the places)
    character_names: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    resumed_calls: int = 0
    #: how the endpoint pushed back during this tick (``EndpointStats.to_dict``), if any
    backpressure: dict[str, Any] | None = None
    #: with a pool of servers (``[llm] base_url`` a list): what each server did this tick
    servers: list[ServerReport] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.reports)

    @property
    def failures(self) -> int:
        return sum(r.failures for r in self.reports)

    @property
    def usage(self) -> Usage:
        total = Usage()
        for report in self.reports:
            total = total + report.usage
        return total

    def moves_by_name(self) -> list[tuple[str, str, str]]:
        """``moved`` with names for ids (an id without a name stays as it is)."""
        return [
            (
                self.character_names.get(cid, cid),
                self.location_names.get(a, a),
                self.location_names.get(b, b),
            )
            for cid, a, b in self.moved
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tick": self.tick,
            "narratives": self.narratives,
            "moved": [list(m) for m in self.moved],
            "moved_names": [list(m) for m in self.moves_by_name()],
            "phases": [r.to_dict() for r in self.reports],
            "calls": self.calls,
            "failures": self.failures,
            "usage": self.usage.to_dict(),
            "elapsed": self.elapsed,
            "timings": self.timings,
        }


def build_run_stack(config: Config, world: World) -> Stack:
    """The configured provider's adapter stack (recovery, rate limits, budget) for this world.

    Raises:
        LLMConfigurationError: unknown provider, missing API key.
    """
    return build_stack(config, world.seed)


class Runner:
    """Runs ticks of one world folder.

    Every tick is logged as it runs (``sim.engine.recorder``); a tick whose log exists without a
    ``commit`` record was interrupted, and the next run resumes it, answering the calls
    that log already holds from it.

    Args:
        world_dir: the world folder.
        config: the effective configuration.
        events: receives every LLM call event (progress lines, logs).
        on_phase: called at the start and end of each phase.
        on_tick: called with each tick's result once it has committed.
        adapter: use this adapter instead of the configured provider (tests, replay). It
            is wrapped in recovery as ``[llm]`` sets it (retries, fallback models,
            breakers), like the configured provider's stack, unless ``recovery`` is false.
        recovery: false: ``adapter`` is used bare, for one that serves a tick log's
            answers (``sim replay``: a recorded call already holds every attempt).
        stack: use this built stack (``sim.engine.stack.build_stack``, its adapter perhaps
            wrapped: ``sim tune``) instead of building the configured provider's; its
            budget, pool and endpoint are what the ticks report.
        seed: make this the world's seed (``world.json``) before the first tick, in a
            commit of its own, so the ticks, their logs, a resume and a replay all see it.
        on_delta: receives streamed answer text as it arrives (``[llm] stream``).
        approver: answers what a policy asks (``sim tick``: a y/N prompt, ``--yes``);
            without one every ask is refused and the tick stops uncommitted.
        decisions: reproduce these recorded policy decisions instead of consulting the
            policies or asking anyone (``sim replay``).
        on_batch: receives each poll of a Batch API batch (``[llm] batch``).
        embeddings: the embeddings requests a logged tick sent (``sim replay``): each is
            written into the tick's log again before the phase it was sent for, whose
            texts the world's cache now holds (nothing is sent), so the replayed log has
            the logged one's books.
        workers: run each tick's phases on this many shards of the world, each in a
            process of its own (``sim.engine.sharded_tick``); 1: in this process.
        executor: ``local`` (each shard a process here), or ``ray``: each shard a Ray
            actor (``ray_address``: the cluster; ``None``: ``RAY_ADDRESS``, else a local
            instance).
    """

    def __init__(
        self,
        world_dir: Path,
        config: Config,
        *,
        events: EventSink | None = None,
        on_phase: PhaseHook | None = None,
        adapter: Adapter | None = None,
        on_tick: Callable[[TickResult], None] | None = None,
        seed: int | None = None,
        on_delta: DeltaSink | None = None,
        approver: Approver | None = None,
        decisions: list[PolicyRecord] | None = None,
        on_batch: Callable[[BatchProgress], None] | None = None,
        recovery: bool = True,
        stack: Stack | None = None,
        embeddings: Sequence[EmbeddingRecord] | None = None,
        workers: int = 1,
        executor: str = "local",
        ray_address: str | None = None,
    ) -> None:
        if adapter is not None:
            if stack is not None:
                raise ValueError("a Runner takes an adapter or a stack, not both")
            embedder = adapter
            if recovery and not isinstance(adapter, RecoveryAdapter):
                adapter = with_recovery(config, adapter)
            # an adapter handed in is a stack of its own: no budget, pool or endpoint to
            # report; batch mode as ``[llm]`` sets it; embeddings if it is a provider's
            # that fetches them (and no wrapper of it)
            stack = Stack(
                adapter,
                batch=batch_transport(config),
                embedders={"": embedder} if isinstance(embedder, Embedder) else {},
            )
        self.storage = Storage(world_dir, config.limits.max_entity_bytes)
        self.seed = seed
        self.config = config
        self.events = events
        self.on_phase = on_phase
        #: the adapter stack the ticks call (built on the first tick when not handed in)
        self.stack = stack
        self.on_tick = on_tick
        self.on_delta = on_delta
        self.approver: Approver = approver or nobody
        self.decisions = decisions
        self.embeddings = embeddings
        #: the policies every call passes (``[policy]``), loaded once per run
        self.policies: list[Policy] | None = None
        self.on_batch = on_batch
        self.current_tick: int | None = None
        #: the phase list and templates, resolved once per run from the config
        self.phases: list[PhaseSpec] | None = None
        self.prompts: Prompts | None = None
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.workers = workers
        self.executor = executor
        self.ray_address = ray_address
        #: the run's worker processes (or Ray actors) when ``workers`` > 1, started with its
        #: first tick and kept for the others
        self.shards: Shards | None = None
        #: why this run's ticks run in one process although ``workers`` asked for more
        #: (a phase, ``[llm] batch``, streaming...: ``sim.engine.split.unshardable``)
        self.one_process: str | None = None

    def run(self, ticks: int = 1) -> list[TickResult]:
        """Run ``ticks`` ticks, each committed before the next starts.

        Raises:
            TickInterrupted: Ctrl-C; in-flight calls were cancelled, the running tick (if
                any) did not commit and is resumed by the next run.
        """
        try:
            return interrupts.run(self._run_until_signalled(ticks))
        except KeyboardInterrupt:
            raise TickInterrupted(
                self.storage.root, self.current_tick, self.storage.pending_journal()
            ) from None
        except _Terminated:
            raise TickInterrupted(
                self.storage.root,
                self.current_tick,
                self.storage.pending_journal(),
                signal_number=signal.SIGTERM,
            ) from None

    async def _run_until_signalled(self, ticks: int) -> list[TickResult]:
        """``run_async``, with SIGTERM (batch schedulers, ``timeout``) treated like Ctrl-C:
        the running tick's task is cancelled, which cancels its in-flight calls; a commit
        is synchronous, so it is never cut in half."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        terminated = False

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            if task is not None:
                task.cancel()

        try:
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
            handling = True
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            handling = False
        try:
            return await self.run_async(ticks)
        except asyncio.CancelledError:
            if terminated:
                raise _Terminated from None
            raise
        finally:
            if handling:
                loop.remove_signal_handler(signal.SIGTERM)

    async def run_async(self, ticks: int = 1, *, keep_workers: bool = False) -> list[TickResult]:
        """Run ``ticks`` ticks, each committed before the next starts.

        ``keep_workers``: the run's workers (``workers`` > 1) are not ended with it, and
        serve the next ``run_async`` (a caller that pauses between its runs, like ``sim
        serve``, without starting them again); ``close_workers`` ends them. They are ended
        anyway when a tick fails.
        """
        results: list[TickResult] = []
        built = self.stack is None
        failed = True
        try:
            with self.storage.lock():
                self.storage.recover()
                recover_logs(self.storage.root, self.config.history.compress_level)
                if self.seed is not None:
                    self._set_seed(self.seed)
                for _ in range(ticks):
                    with gc_paused():
                        result = await self._tick()
                    results.append(result)
                    if self.on_tick:
                        self.on_tick(result)
            failed = False
        finally:
            if self.shards is not None and (failed or not keep_workers):
                shards, self.shards = self.shards, None
                await shards.__aexit__(*sys.exc_info())
            if built and self.stack is not None:  # its HTTP client belongs to this loop
                await self.stack.aclose()
                self.stack = None
        return results

    async def close_workers(self) -> None:
        """End the workers a ``run_async(keep_workers=True)`` kept (nothing without)."""
        if self.shards is not None:
            shards, self.shards = self.shards, None
            await shards.close()

    def _set_seed(self, seed: int) -> None:
        """Write ``seed`` into ``world.json`` (nothing when it is already the seed)."""
        world = self.storage.load()
        if world.seed != seed:
            world.meta["seed"] = seed
            self.storage.commit(world)

    async def _tick(self) -> TickResult:
        started = time.perf_counter()
        if self.workers > 1:  # the workers load the world while this process does
            if self.shards is None:
                self.shards = await Shards(
                    self.storage.root,
                    self.workers - 1,
                    self.storage.max_entity_bytes,
                    self.config.llm.max_concurrency,
                    self.executor,
                    self.ray_address,
                ).__aenter__()
            self.shards.open()
        world = self.storage.load()
        check_log_slot(world.root, world.tick + 1)  # a FIFO or link there: refused
        if world.tick >= MAX_TICK:
            raise InputError(
                world.root / "world.json",
                "tick",
                f"the world is at tick {world.tick}, the last a world may reach ({MAX_TICK}); "
                "no further tick can run",
            )
        repairs = repair.inspect(world)  # damaged engine state: fixed in this tick's commit
        repair.apply(world, repairs)
        pending = load_pending(world.root, world)  # sim inject / sim set since the last tick
        if pending.raw is not None:  # part of the state: logged, consumed by the commit
            world.originals[PENDING] = pending.raw
        timings = {"load": time.perf_counter() - started}
        if self.phases is None or self.prompts is None:
            self.prompts = Prompts(world.root)
            self.phases = resolve_phases(self.config, world.root)
            for spec in self.phases:  # a template that does not parse stops the run here,
                for name in spec.templates:  # before its tick writes anything
                    required = spec.kind == "declared" or not name.endswith(".input.md")
                    self.prompts.get(name, required=required)
            if self.workers > 1:
                why = unshardable(self.phases, self.config)
                if why is not None:  # the run goes on in this process, saying why
                    self.one_process = f"--workers {self.workers}: ran in one process ({why})"
                    self.workers = 1
                    if self.shards is not None:  # started with the load: ended at once
                        shards, self.shards = self.shards, None
                        await shards.close(now=True)
        if self.policies is None:  # a custom policy that does not load stops the run here
            self.policies = [] if self.decisions is not None else configured_policies(self.config)
        if self.stack is None:  # built once per run: budget and breakers span its ticks
            self.stack = build_run_stack(self.config, world)
        self.current_tick = world.tick + 1
        recorder = TickRecorder.begin(
            self.storage,
            world,
            self.config,
            manifest(self.phases, self.prompts),
            interventions=pending.records,
            open_now=self.workers == 1,  # sharded: opened in _run_sharded
        )
        recorder.notes.extend(repairs.notes())
        partial = recorder.partial
        gate = TickPolicy(
            self.policies,
            plan_tick(world, self.config, self.phases),
            self.config.prices,
            approver=self.approver,
            record=recorder.decision,
            # a resume does not ask again what a person approved for this tick
            approved=[d.key for d in partial.decisions if d.answer == "approved" and d.key]
            if partial is not None
            else (),
            replay=self.decisions,
        )
        hub = StreamHub(self.on_delta)  # the phases' clients send each call's text to it
        failed = True
        try:
            result = await self._run_tick(
                world,
                self.stack,
                recorder,
                gate,
                hub,
                started,
                timings,
                tuple(repairs.store_deletions()),
                pending,
            )
            failed = False
        except asyncio.CancelledError:  # Ctrl-C / SIGTERM: log what the calls in flight wrote
            recorder.interrupted(hub.in_flight())
            raise
        except UserError:  # bad input before anything was paid for: its log goes too
            recorder.discard_unused()
            raise
        finally:
            recorder.close(failed=failed)
        # committed: the log, compressed while the commit ran, replaces the plain one
        del world, repairs, gate, pending, partial
        compress_started = time.perf_counter()
        recorder.compress()
        timings["commit"] += time.perf_counter() - compress_started
        result.elapsed = time.perf_counter() - started
        return result

    async def _run_sharded(
        self,
        ctx: TickContext,
        stack: Stack,
        recorder: TickRecorder,
        guard: PhaseGuard,
        timings: dict[str, float],
        gated: bool,
    ) -> Merged:
        """The tick's phases on ``self.workers`` shards (``sim.engine.sharded_tick``); their calls
        run on the workers when ``local_calls`` says so, else here."""
        assert self.phases is not None
        budget = self.config.budget
        local = local_calls(
            local_stack=stack.local,
            budget=bool(budget.max_total_tokens or budget.max_cost_usd),
            gated=gated,
            resume=recorder.partial is not None,
        )

        def log(calls: Sequence[Logged]) -> None:
            recorder.logged([(c.record, c.line, c.cost, c.instructions) for c in calls])

        started: dict[str, float] = {}

        def on_phase(name: str, starting: bool, report: PhaseReport | None) -> None:
            if starting:
                started[name] = time.perf_counter()
            else:
                timings[name] = time.perf_counter() - started[name]
            if self.on_phase:
                self.on_phase(name, "start" if starting else "end", report)

        def phase_end(name: str, results: dict[str, Any]) -> None:
            recorder.phase_end(name, ctx, results)

        async def prepare(phase: str, texts: Sequence[str]) -> None:
            await ctx.prepare_memory(phase, stack.budget, stack.embedder, recorder.embedded, texts)

        assert self.shards is not None
        if not local:  # the workers' calls are answered here, each logged as it goes
            recorder.open()
        try:
            return await run_sharded(
                ctx,
                self.phases,
                self.shards,
                recorder.names,
                stack.adapter.name,
                on_phase,
                phase_end,
                lambda report: guard.check(report, stack.budget),
                prepare,
                log if local else None,
                recorder.open,
            )
        except SimError:  # a worker died, or the tick stopped: its calls in flight were
            recorder.interrupted([])  # cancelled, and are logged as such
            raise

    def _fit_memories(self, world: World, changed: dict[str, bytes]) -> list[str]:
        """Compact the memory of each character whose file would pass ``[limits]
        max_entity_bytes`` (``sim.mind.fit``), in ``world`` and ``changed``; a note for
        each. A file that still does not fit is refused by the commit, naming it."""
        limit = self.storage.max_entity_bytes
        notes: list[str] = []
        for rel, data in changed.items():
            if len(data) <= limit or not rel.startswith("characters/"):
                continue
            # from its file: a worker's character is in ``world`` only once committed
            char = orjson.loads(data)
            trimmed = fit_memory(char, limit, lambda entity: len(dump_json(entity)))
            if trimmed is None:
                continue
            world.characters[rel.removeprefix("characters/").removesuffix(".json")] = char
            changed[rel] = world.originals[rel] = dump_json(char)
            notes.append(trimmed.note())
        return notes

    async def _run_tick(
        self,
        world: World,
        stack: Stack,
        recorder: TickRecorder,
        gate: TickPolicy,
        hub: StreamHub,
        started: float,
        timings: dict[str, float],
        dropped: tuple[str, ...] = (),
        interventions: Pending | None = None,
    ) -> TickResult:
        adapter = stack.adapter
        pool = stack.pool
        pool_before = pool.snapshot() if pool is not None else []
        endpoint = stack.endpoint if pool is None else None  # a pool: per server
        pushed_before = endpoint.stats.to_dict() if endpoint is not None else None
        store = ResponseStore(world.root, STORE_DIR)
        for rel in dropped:  # "STORE_DIR/<chain>/<id>.json", damaged: never read
            chain, _, name = rel.removeprefix(f"{STORE_DIR}/").partition("/")
            store.discard(f"{chain}:{name.removesuffix('.json')}")
        assert self.phases is not None
        config = self.config
        failure_policies = {
            spec.name: config.phase(spec.name).failure_policy(config.llm) for spec in self.phases
        }
        gated = gate.active or "fail" in failure_policies.values()

        def wrap(inner: Adapter) -> Adapter:
            """The tick's adapter: the policy gate (outermost: every call of the run passes
            it, resumed ones too) and a resume's replay (``TickRecorder.wrap``)."""
            wrapped = recorder.wrap(inner)
            return gate.wrap(wrapped) if gated else wrapped

        ctx = TickContext(world, config, wrap(adapter), store, world.tick + 1)
        ctx.namer = recorder.name_call  # each call's identity travels in its request
        ctx.stream = hub  # and so does where its streamed text goes
        ctx.prompts = self.prompts
        if interventions is not None:
            ctx.happenings = interventions.happenings()
        transport = stack.batch  # chosen when the stack was built
        if transport is not None:  # each batch is in the log as soon as it is created
            ctx.batch = BatchOptions(
                recorder, config.llm.batch_poll_seconds, self.on_batch, transport=transport
            )

        notes: list[str] = []
        # the phases' reports, not the context: a closure over ``ctx`` held in ``ctx.events``
        # would make a reference cycle, keeping the whole tick (intentions, outcomes, call
        # settings) alive until the next full collection instead of freeing it on return
        reports = ctx.reports

        def account(event: LLMEvent) -> None:
            # a provider adapter that changed how it talks to its server says so once
            # (a failed call's too: a form switch made by a call whose answer then failed)
            if event.response is not None:
                notice = event.response.notice
            else:
                notice = event.error.notice if event.error is not None else None
            for line in (notice or "").splitlines():  # one note a line
                if line not in notes:
                    notes.append(line)
            # every finished call (and, with recovery, every failed attempt) is paid for
            if event.kind != "llm_called" and reports and reports[-1].name == event.phase:
                report = reports[-1]
                report.usage = report.usage + event.usage
                if event.error_code == "timeout":  # no usage came back; may be billed
                    report.timed_out += 1
                if not event.final:
                    report.retries += 1
                elif event.response is not None and event.response.fallback_from is not None:
                    report.model_fallbacks[str(event.entity_key)] = (
                        f"{event.response.fallback_from} -> "
                        f"{event.response.fallback_to or event.model}"
                    )

        guard = PhaseGuard(
            config.llm.max_failed_fraction,
            failure_policies,
            on_stop=gate.halt,
            max_content_failed_fraction=config.llm.max_content_failed_fraction,
            min_content_failures=config.llm.min_content_failures,
        )
        ctx.events = EventFanout(
            account, recorder.on_event, guard, *([self.events] if self.events else [])
        )
        ctx.occupancy = world.characters_at()
        start_locations = {cid: c["state"]["location"] for cid, c in world.characters.items()}
        sharded: Merged | None = None
        if self.workers > 1:
            sharded = await self._run_sharded(ctx, stack, recorder, guard, timings, gated)
        for spec in self.phases if sharded is None else ():
            name, run_phase = spec.name, spec.run
            if self.on_phase:
                self.on_phase(name, "start", None)
            phase_started = time.perf_counter()
            # provider embeddings, if it needs them, from the endpoint its model runs on
            # (each request in the tick's log, for the books; a replay's, as logged)
            for logged in self.embeddings or ():
                if logged.phase == name:
                    recorder.replayed(logged)
            await ctx.prepare_memory(name, stack.budget, stack.embedder, recorder.embedded)
            await run_phase(ctx)
            recorder.phase_end(name, ctx)
            timings[name] = time.perf_counter() - phase_started
            if self.on_phase:
                self.on_phase(name, "end", ctx.reports[-1])
            guard.check(ctx.reports[-1], stack.budget)  # raises: nothing committed
        world.meta["tick"] = ctx.tick
        if ctx.vectors:  # provider embeddings were used (numpy is loaded then)
            from sim.mind.vectors import embedding_notes

            notes += embedding_notes(ctx.vectors.values())
        ctx.drop_phase_state()  # logged and applied: not held through the commit
        evicted = [pair for client in ctx.clients for pair in client.pending_deletions]
        extra = store.changes()
        if sharded is not None:  # the shards' chains: their own entity keys
            evicted += sharded.deletions
            extra.update(sharded.store)
            extra = dict(sorted(extra.items()))
        pending = deletions.merge(deletions.load(world.root), adapter.name, evicted, ctx.tick)
        if interventions is not None and interventions.raw is not None:
            extra[PENDING] = None  # applied: the log holds them now
        if evicted:
            extra[deletions.PENDING] = deletions.encode(pending)
        result = TickResult(
            tick=ctx.tick,
            narratives=dict(ctx.narratives),
            location_names={},  # as the tick left them: set once it has committed
            reports=ctx.reports,
            elapsed=0.0,
            timings=timings,
            notes=[*recorder.notes, *notes, *([self.one_process] if self.one_process else [])],
            resumed_calls=recorder.resumed_calls,
        )
        if endpoint is not None and pushed_before is not None:
            result.backpressure = endpoint.stats.since(pushed_before, endpoint.limit)
        if pool is not None:
            result.servers = pool.since(pool_before)
        totals = {
            "calls": result.calls,
            "failures": result.failures,
            "usage": result.usage.to_dict(),
            "elapsed": time.perf_counter() - started,
        }
        recorder.calls_done(totals)  # the log's compression starts
        # serialised once, for the log's digest and the commit (adopted: the loaded bytes
        # go as their new form comes)
        changed = self.storage.changed_files(
            world, adopt=True, given=sharded.files if sharded is not None else None
        )
        result.notes.extend(self._fit_memories(world, changed))
        extra.update(recorder.commit_files(self.storage, world, extra, changed))
        commit_started = time.perf_counter()
        self.storage.commit(world, extra, changed=changed, whole=True)
        del changed
        self.current_tick = None  # an interrupt from here on loses nothing
        recorder.committed()
        store.mark_committed()
        timings["commit"] = time.perf_counter() - commit_started
        for client in ctx.clients:
            client.pending_deletions.clear()  # now in the pending list, deleted below
        lost: list[str] = []
        await deletions.flush(world.root, adapter, pending, lost)
        result.notes.extend(f"deletions: {message}" for message in lost)
        ends = Ends.of(world, world.characters, world.locations)
        if sharded is not None:  # the workers' parts as they sent them: their entities
            ends.add(sharded.ends)  # here are as this process last saw them
        result.moved = [
            (cid, start_locations[cid], where)
            for cid, (_, where) in ends.characters.items()
            if where != start_locations[cid]
        ]
        result.character_names = {cid: name for cid, (name, _) in ends.characters.items()}
        result.location_names = ends.places
        result.elapsed = time.perf_counter() - started
        return result
