"""Runs ticks for the page, one run at a time, and tells every listener what happens.

A run is the library's ``Runner`` (what ``sim tick`` runs), on a thread of its own with
its own event loop, so the server answers while a tick runs; each tick takes the world's
lock as ``sim tick`` does. Its adapter stack is built once per run, so ``[budget]`` caps
the run as it caps a ``sim tick --ticks N``, and its workers (``sim serve --workers``)
are started once per run too. A pause is taken between ticks: the tick running finishes
and commits. The runner's event sink, phase hook and tick hook report progress; they run
on the tick's thread and hand each event to the server's loop.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sim.config import Config
from sim.llm.budget import price_usage
from sim.llm.redact import redact_text

Publish = Callable[[str, dict[str, Any]], None]


@dataclass
class RunState:
    """What the page shows of the run: whether one runs, its ticks, the phase running."""

    running: bool = False
    pausing: bool = False
    ticks: int = 0
    done: int = 0
    #: the tick running (``None`` between ticks)
    tick: int | None = None
    phase: str | None = None
    #: the phase running's calls answered and failed so far
    phase_calls: int = 0
    phase_failed: int = 0
    #: the run's calls, tokens and cost so far (cost ``None``: a model has no price)
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = 0.0
    error: str | None = None
    #: the processes the tick running is sharded over (``sim serve --workers``), and why
    #: a run asked for more runs in one process (a phase, `[llm] batch`...), if it does
    workers: int = 1
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The state as the page reads it, with ``order``: this snapshot's place among all
        of them. An answer to ``/api/pause`` can reach the page after the event of the run
        ending; the page shows no snapshot older than one it has shown."""
        with _SNAPSHOT_LOCK:  # numbered as taken, whichever thread takes it
            data = asdict(self)
            data["order"] = next(_SNAPSHOTS)
        return data


_SNAPSHOTS = itertools.count(1)
_SNAPSHOT_LOCK = threading.Lock()


class Busy(Exception):
    """A run is already going."""


class Driver:
    """Starts runs and pauses them; ``publish`` is called on the server's loop.

    Args:
        world_dir: the world folder.
        config: the configuration every run uses.
        publish: receives ``(kind, data)`` for each event, on ``loop``.
        loop: the server's event loop (set when the server starts).
        workers: run each tick on this many shards of the world (``sim serve
            --workers``), as ``sim tick --workers`` does; the workers are started with a
            run's first tick and serve its others (the world's lock is let go between
            them, for the page's changes).
        executor, ray_address: ``local`` or ``ray``, and the Ray cluster (``Runner``).
    """

    def __init__(
        self,
        world_dir: Path,
        config: Config,
        publish: Publish,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        workers: int = 1,
        executor: str = "local",
        ray_address: str | None = None,
    ) -> None:
        self.world_dir = world_dir
        self.config = config
        self.workers = workers
        self.executor = executor
        self.ray_address = ray_address
        self.publish = publish
        self.loop = loop
        self.state = RunState()
        self._pause = threading.Event()
        self._thread: threading.Thread | None = None
        self._prices: dict[str, Any] = {}

    def _send(self, kind: str, data: dict[str, Any]) -> None:
        """From the tick's thread: publish on the server's loop."""
        assert self.loop is not None, "the server's loop is set before a run starts"
        self.loop.call_soon_threadsafe(self.publish, kind, data)

    def start(self, ticks: int) -> None:
        """Run ``ticks`` ticks on a thread of their own.

        Raises:
            Busy: a run is going.
        """
        if self.state.running:
            raise Busy("a run is going; pause it or wait for it to end")
        self._pause.clear()
        self.state = RunState(running=True, ticks=ticks)
        self.publish("run", self.state.to_dict())
        self._thread = threading.Thread(
            target=self._run, args=(ticks,), name="sim-serve-run", daemon=True
        )
        self._thread.start()

    def pause(self) -> bool:
        """Stop after the tick running; whether a run was going."""
        if not self.state.running:
            return False
        self._pause.set()
        self.state.pausing = True
        self.publish("run", self.state.to_dict())
        return True

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- on the tick's thread ---------------------------------------------------------

    def _run(self, ticks: int) -> None:
        from sim import interrupts

        error: str | None = None
        try:
            interrupts.run(self._ticks(ticks))
        except Exception as exc:  # the run stops; the page says why
            error = redact_text(f"{type(exc).__name__}: {exc}")
        finally:
            state = self.state
            state.running = state.pausing = False
            state.phase = state.tick = None
            state.error = error
            self._send("run", state.to_dict())

    async def _ticks(self, ticks: int) -> None:
        from sim.engine.runner import Runner, TickResult, build_run_stack
        from sim.llm.events import LLMEvent
        from sim.llm.streaming import StreamDelta
        from sim.phases.base import PhaseReport
        from sim.storage import Storage

        state = self.state

        def on_event(event: LLMEvent) -> None:
            if event.kind == "llm_called":
                return
            state.input_tokens += event.usage.input_tokens
            state.output_tokens += event.usage.output_tokens
            if state.cost is not None and event.usage.total_tokens:
                cost = price_usage(event.usage, event.model, self.config.prices, self._prices)
                state.cost = state.cost + cost.usd if cost.known else None
            if not event.final:
                return
            state.calls += 1
            state.phase_calls += 1
            if event.kind == "llm_failed":
                state.phase_failed += 1
            self._send("progress", state.to_dict())

        def on_phase(name: str, stage: str, report: PhaseReport | None) -> None:
            state.tick = runner.current_tick
            state.workers = runner.workers  # decided before a tick's first phase: 1 when
            state.note = runner.one_process  # the run cannot shard, and this says why
            state.phase = name if stage == "start" else None
            if stage == "start":
                state.phase_calls = state.phase_failed = 0
            self._send("phase", {"name": name, "stage": stage, **state.to_dict()})

        def on_tick(result: TickResult) -> None:
            state.done += 1
            state.tick = None
            self._send(
                "tick",
                {
                    **state.to_dict(),
                    "tick": result.tick,
                    "tick_calls": result.calls,
                    "tick_failures": result.failures,
                    "elapsed": result.elapsed,
                },
            )

        def on_delta(delta: StreamDelta) -> None:
            """Streamed narrative text (``[llm] stream``), as the model writes it: the page
            shows each place's scene being written."""
            if delta.phase != "narrative" or delta.entity_key is None:
                return
            place = delta.entity_key.partition(":")[2]
            self._send(
                "text",
                {
                    "tick": runner.current_tick,
                    "place": place,
                    "text": delta.text,
                    "restart": delta.restart,
                },
            )

        runner = Runner(
            self.world_dir,
            self.config,
            events=on_event,
            on_phase=on_phase,
            on_tick=on_tick,
            on_delta=on_delta,  # deltas come only when [llm] stream is on
            workers=self.workers,
            executor=self.executor,
            ray_address=self.ray_address,
        )
        world = Storage(self.world_dir, self.config.limits.max_entity_bytes).load()
        runner.stack = build_run_stack(self.config, world)  # one per run: [budget] spans it
        del world
        try:
            # one tick a run_async, so a pause (and the page's changes, which take the
            # world's lock) come between ticks; the workers are kept across them
            for _ in range(ticks):
                if self._pause.is_set():
                    break
                await runner.run_async(1, keep_workers=True)
        finally:
            try:
                await runner.close_workers()
            finally:
                await runner.stack.aclose()
