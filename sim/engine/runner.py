"""The runner: one tick = load, phases in order, atomic commit, then post-commit cleanup."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sim.config import Config
from sim.engine import deletions
from sim.engine.guard import PhaseGuard
from sim.errors import TickInterrupted
from sim.llm.events import EventFanout, EventSink, LLMEvent
from sim.llm.stack import build_stack, close_stack, find_budget
from sim.llm.store import ResponseStore
from sim.llm.streaming import DeltaSink, StreamHub, installed
from sim.llm.types import Adapter, Usage
from sim.phases import PhaseSpec, manifest, resolve_phases
from sim.phases.base import PhaseReport, TickContext
from sim.phases.templates import Prompts
from sim.storage import Storage
from sim.ticklog.format import recover_logs
from sim.ticklog.recorder import TickRecorder
from sim.world import World

PhaseStage = Literal["start", "end"]
PhaseHook = Callable[[str, PhaseStage, PhaseReport | None], None]


@dataclass
class TickResult:
    """What one committed tick did."""

    tick: int
    narratives: dict[str, str]
    location_names: dict[str, str]
    reports: list[PhaseReport]
    elapsed: float
    moved: list[tuple[str, str, str]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    resumed_calls: int = 0

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "tick": self.tick,
            "narratives": self.narratives,
            "moved": [list(m) for m in self.moved],
            "phases": [r.to_dict() for r in self.reports],
            "calls": self.calls,
            "failures": self.failures,
            "usage": self.usage.to_dict(),
            "elapsed": self.elapsed,
            "timings": self.timings,
        }


def build_adapter(config: Config, world: World) -> Adapter:
    """The configured provider's adapter stack (recovery, rate limits, budget) for this world.

    Raises:
        LLMConfigurationError: unknown provider, missing API key.
    """
    return build_stack(config, world.seed)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one tick.

    A tick allocates the whole world as plain dicts and makes little cyclic garbage; with
    the collector on, its full collections rescan the growing heap again and again, which
    made load and phases super-linear in the world size (measured: +40% at 10,000
    characters). Reference counting still frees everything acyclic at once; cycles left
    by the tick are collected when the collector resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Runner:
    """Runs ticks of one world folder.

    Every tick is logged as it runs (``sim.ticklog.recorder``); a tick whose log exists without a
    ``commit`` record was interrupted, and the next run resumes it, answering the calls
    that log already holds from it.

    Args:
        world_dir: the world folder.
        config: the effective configuration.
        events: receives every LLM call event (progress lines, logs).
        on_phase: called at the start and end of each phase.
        on_tick: called with each tick's result once it has committed.
        adapter: use this adapter instead of the configured provider (tests, replay).
        on_delta: receives streamed answer text as it arrives (``[llm] stream``).
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
        on_delta: DeltaSink | None = None,
    ) -> None:
        self.storage = Storage(world_dir)
        self.config = config
        self.events = events
        self.on_phase = on_phase
        self.adapter = adapter
        self.on_tick = on_tick
        self.on_delta = on_delta
        self.current_tick: int | None = None
        #: the phase list and templates, resolved once per run from the config
        self.phases: list[PhaseSpec] | None = None
        self.prompts: Prompts | None = None
        #: adapters of phases with their own provider/base_url (built like ``adapter``)
        self.endpoint_adapters: dict[tuple[str, str, str], Adapter] = {}

    def run(self, ticks: int = 1) -> list[TickResult]:
        """Run ``ticks`` ticks, each committed before the next starts.

        Raises:
            TickInterrupted: Ctrl-C; in-flight calls were cancelled, the running tick (if
                any) did not commit and is resumed by the next run.
        """
        try:
            return asyncio.run(self.run_async(ticks))
        except KeyboardInterrupt:
            raise TickInterrupted(
                self.storage.root, self.current_tick, self.storage.pending_journal()
            ) from None

    async def run_async(self, ticks: int = 1) -> list[TickResult]:
        results: list[TickResult] = []
        built = self.adapter is None
        try:
            with self.storage.lock():
                self.storage.recover()
                recover_logs(self.storage.root)
                for _ in range(ticks):
                    with _gc_paused():
                        result = await self._tick()
                    results.append(result)
                    if self.on_tick:
                        self.on_tick(result)
        finally:
            if built and self.adapter is not None:  # its HTTP client belongs to this loop
                await close_stack(self.adapter)
                self.adapter = None
            for extra in self.endpoint_adapters.values():
                await close_stack(extra)
            self.endpoint_adapters.clear()
        return results

    def _endpoints(self, world: World, phases: list[PhaseSpec]) -> None:
        """Build an adapter stack for each other (provider, base_url) a phase sets, sharing
        the run's budget. An injected adapter (tests, replay) serves every phase instead."""
        llm = self.config.llm
        budget = find_budget(self.adapter)
        for spec in phases:
            endpoint = self.config.phase(spec.name).endpoint(llm)
            if endpoint == (llm.provider, llm.base_url, llm.api_key_env):
                continue
            if endpoint in self.endpoint_adapters:
                continue
            provider, base_url, key = endpoint
            changed = {"provider": provider, "base_url": base_url, "api_key_env": key}
            config = self.config.model_copy(update={"llm": llm.model_copy(update=changed)})
            self.endpoint_adapters[endpoint] = build_stack(config, world.seed, budget=budget)

    async def _tick(self) -> TickResult:
        started = time.perf_counter()
        world = self.storage.load()
        timings = {"load": time.perf_counter() - started}
        if self.phases is None or self.prompts is None:
            self.prompts = Prompts(world.root)
            self.phases = resolve_phases(self.config, world.root)
            for spec in self.phases:  # a template that does not parse stops the run here,
                for name in spec.templates:  # before its tick writes anything
                    required = spec.kind == "declared" or not name.endswith(".input.md")
                    self.prompts.get(name, required=required)
        if self.adapter is None:  # built once per run: budget and breakers span its ticks
            self.adapter = build_adapter(self.config, world)
            self._endpoints(world, self.phases)
        self.current_tick = world.tick + 1
        recorder = TickRecorder.begin(
            self.storage, world, self.config, manifest(self.phases, self.prompts)
        )
        hub = StreamHub(self.on_delta)
        try:
            with installed(hub):
                return await self._run_tick(world, self.adapter, recorder, started, timings)
        except asyncio.CancelledError:  # Ctrl-C: log what the calls in flight had written
            recorder.interrupted(hub.in_flight())
            raise
        finally:
            recorder.close()

    async def _run_tick(
        self,
        world: World,
        adapter: Adapter,
        recorder: TickRecorder,
        started: float,
        timings: dict[str, float],
    ) -> TickResult:
        store = ResponseStore(world.root)
        ctx = TickContext(world, self.config, recorder.wrap(adapter), store, world.tick + 1)
        ctx.prompts = self.prompts
        ctx.endpoint_adapters = {k: recorder.wrap(a) for k, a in self.endpoint_adapters.items()}
        assert self.phases is not None

        notes: list[str] = []

        def account(event: LLMEvent) -> None:
            # a provider adapter that changed how it talks to its server says so once
            notice = event.response.notice if event.response is not None else None
            if notice and notice not in notes:
                notes.append(notice)
            # every finished call (and, with recovery, every failed attempt) is paid for
            if event.kind != "llm_called" and ctx.reports and ctx.reports[-1].name == event.phase:
                report = ctx.reports[-1]
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

        guard = PhaseGuard(self.config.llm.max_failed_fraction)
        ctx.events = EventFanout(
            account, recorder.on_event, guard, *([self.events] if self.events else [])
        )
        ctx.occupancy = world.characters_at()
        start_locations = {cid: c["state"]["location"] for cid, c in world.characters.items()}
        for spec in self.phases:
            name, run_phase = spec.name, spec.run
            if self.on_phase:
                self.on_phase(name, "start", None)
            phase_started = time.perf_counter()
            await run_phase(ctx)
            recorder.phase_end(name, ctx)
            timings[name] = time.perf_counter() - phase_started
            if self.on_phase:
                self.on_phase(name, "end", ctx.reports[-1])
            guard.check(ctx.reports[-1], find_budget(adapter))  # raises: nothing committed
        world.meta["tick"] = ctx.tick
        evicted = [pair for client in ctx.clients for pair in client.pending_deletions]
        pending = deletions.merge(deletions.load(world.root), adapter.name, evicted, ctx.tick)
        extra = store.changes()
        if evicted:
            extra[deletions.PENDING] = deletions.encode(pending)
        result = TickResult(
            tick=ctx.tick,
            narratives=dict(ctx.narratives),
            location_names={lid: loc["identity"]["name"] for lid, loc in world.locations.items()},
            reports=ctx.reports,
            elapsed=0.0,
            timings=timings,
            notes=[*recorder.notes, *notes],
            resumed_calls=recorder.resumed_calls,
        )
        totals = {
            "calls": result.calls,
            "failures": result.failures,
            "usage": result.usage.to_dict(),
            "elapsed": time.perf_counter() - started,
        }
        extra.update(recorder.commit_files(self.storage, world, extra, totals))
        commit_started = time.perf_counter()
        self.storage.commit(world, extra)
        self.current_tick = None  # an interrupt from here on loses nothing
        recorder.committed()
        store.mark_committed()
        timings["commit"] = time.perf_counter() - commit_started
        for client in ctx.clients:
            client.pending_deletions.clear()  # now in the pending list, deleted below
        await deletions.flush(world.root, adapter, pending)
        result.moved = [
            (cid, start_locations[cid], c["state"]["location"])
            for cid, c in world.characters.items()
            if c["state"]["location"] != start_locations[cid]
        ]
        result.elapsed = time.perf_counter() - started
        return result
