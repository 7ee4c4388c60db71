"""``sim tick``'s terminal display while it runs: the progress on stderr (a live bar on a
terminal, plain lines elsewhere, the ETA, the run's total at the end) and ``--stream``'s
narratives on stdout as the model writes them.

Imported by the ``tick`` command when it runs (``sim --help`` does not load it); it draws
what the engine's callbacks report, and imports the engine's types for type checking only.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cli.common import echo, secho
from sim.terminal import one_line

if TYPE_CHECKING:
    from sim.engine.runner import Runner, TickResult
    from sim.llm.batching import BatchProgress
    from sim.llm.events import LLMEvent
    from sim.llm.streaming import StreamDelta
    from sim.phases.base import PhaseReport


def _duration(seconds: float) -> str:
    """``4.2s``, ``42s``, ``3m05s``, ``1h02m``: an ETA or a run's length."""
    if seconds < 9.95:
        return f"{max(seconds, 0.0):.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class Progress:
    """``sim tick``'s progress on stderr: tick k of N, the phase running and its calls as
    each completes, an ETA, and the run's total at the end.

    On a terminal the line being run is a live bar redrawn in place, and each phase's end
    leaves a line; otherwise each phase's end and each tick's commit is a plain line that
    names its tick (nothing is redrawn, so logs stay readable).

    Args:
        ticks: the ticks the run was asked for.
        tty: whether stderr is a terminal (default: ask it).
        clock: seconds, monotonic (tests pass their own).
    """

    BAR = 20

    def __init__(
        self,
        ticks: int = 1,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.ticks = ticks
        self.clock = clock
        self.started = clock()
        self.committed_at = self.started  # when the last tick committed
        #: the world's tick running (``Runner.current_tick``), set by ``attach``
        self.runner: Runner | None = None
        self.k = 0  # ticks committed this run
        self.phase = ""
        self.phases_done = 0
        self.phases_total = 0
        self.done = 0
        self.failed = 0
        self.calls = 0
        self.failures = 0
        self.tokens = 0
        self.first_tick: int | None = None
        self.last_tick: int | None = None
        self._batch: dict[str, tuple[str, int, int]] = {}

    def attach(self, runner: Runner) -> None:
        self.runner = runner

    @property
    def _tick(self) -> str:
        tick = self.runner.current_tick if self.runner is not None else None
        number = f"tick {tick}" if tick is not None else "tick"
        return f"{number} ({self.k + 1} of {self.ticks})" if self.ticks > 1 else number

    def eta(self) -> str | None:
        """The time left, from the ticks committed so far (``None`` before the first)."""
        if self.k == 0 or self.k >= self.ticks:
            return None
        per_tick = (self.committed_at - self.started) / self.k
        running = self.clock() - self.committed_at  # of the tick running now
        return _duration(max(per_tick * (self.ticks - self.k) - running, 0.0))

    def _live(self) -> None:
        """The live bar (terminal only): the run's share done, the phase and its calls."""
        share = float(self.k)
        if self.phases_total:
            share += self.phases_done / self.phases_total
        filled = round(self.BAR * share / self.ticks)
        bar = "#" * filled + "-" * (self.BAR - filled)
        eta = self.eta()
        line = (
            f"[{bar}] {self._tick} {self.phase}: {self.done} call{'' if self.done == 1 else 's'}"
            f"{f', {self.failed} failed' if self.failed else ''}"
            f"{f' · ETA {eta}' if eta else ''}"
        )
        echo(line, err=True, nl=False, overwrite=True)

    def on_batch(self, progress: BatchProgress) -> None:
        """A Batch API batch was polled: one line when its status or counts change."""
        seen = (progress.status, progress.completed, progress.failed)
        if self._batch.get(progress.batch_id) == seen and not self.tty:
            return
        self._batch[progress.batch_id] = seen
        line = (
            f"  {progress.phase:<11} batch {progress.batch_id}"
            f"{' (resumed)' if progress.resumed else ''}: {progress.status}, "
            f"{progress.completed}/{progress.total} done, {progress.failed} failed, "
            f"waited {progress.elapsed:.0f}s"
        )
        if self.tty:
            echo(line, err=True, nl=False, overwrite=True)
        else:  # the batch's id and status are the server's words
            echo(one_line(line), err=True)

    def on_event(self, event: LLMEvent) -> None:
        if event.kind == "llm_called" or not event.final:
            return
        self.done += 1
        if event.kind == "llm_failed":
            self.failed += 1
        if self.tty:
            self._live()

    def on_phase(self, name: str, stage: str, report: PhaseReport | None) -> None:
        if stage == "start":
            if self.runner is not None and self.runner.phases is not None:
                self.phases_total = len(self.runner.phases)
            self.phase = name
            self.done = self.failed = 0
            if self.tty:
                self._live()
            return
        assert report is not None
        self.phases_done += 1
        if report.calls == 0 and name == "apply":
            what = f"{len(report.warnings)} rule violations ignored"
        else:
            what = f"{report.calls}/{report.calls} calls, {report.failures} failed"
        echo(one_line(f"  {self._tick} {name:<11} {what}"), err=True, overwrite=self.tty)

    def on_tick(self, result: TickResult) -> None:
        """A tick committed: its line (calls, tokens, time) and the ETA."""
        self.k += 1
        self.committed_at = self.clock()
        self.phases_done = 0
        self.calls += result.calls
        self.failures += result.failures
        self.tokens += result.usage.total_tokens
        self.first_tick = result.tick if self.first_tick is None else self.first_tick
        self.last_tick = result.tick
        of = f" ({self.k} of {self.ticks})" if self.ticks > 1 else ""
        eta = self.eta()
        echo(
            f"tick {result.tick} committed{of}: {result.calls} calls, {result.failures} "
            f"failed, {result.usage.total_tokens:,} tokens, {result.elapsed:.2f}s"
            f"{f'; ETA {eta}' if eta else ''}",
            err=True,
            overwrite=self.tty,
        )

    def total(self) -> None:
        """The run's total, after a run of more than one tick."""
        if self.ticks < 2 or self.k == 0:
            return
        span = f"ticks {self.first_tick}–{self.last_tick}"
        echo(
            f"ran {self.k} of {self.ticks} ticks ({span}) in "
            f"{_duration(self.clock() - self.started)}: {self.calls} calls, "
            f"{self.failures} failed, {self.tokens:,} tokens",
            err=True,
        )


def partial_string(text: str, field: str) -> str | None:
    """The value of the string ``field`` in a JSON object that may still be arriving.

    ``None`` until the field's opening quote has arrived (or when the text is not a JSON
    object); then its characters so far, unescaped (an escape cut in half waits for the
    rest). Read by jiter's partial mode.
    """
    import jiter  # only where --stream shows text

    try:
        data = jiter.from_json(text.encode(), partial_mode="trailing-strings")
    except ValueError:
        return None
    value = data.get(field) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


class StreamView:
    """``sim tick --stream``: each place's narrative as the model writes it, place by place.

    Narrative calls run in parallel; one place is shown live while the others' text is
    kept, and shown (caught up, then live) when the current place is finished.
    """

    def __init__(self, world_dir: Path | None = None) -> None:
        self.world_dir = world_dir
        self.names: dict[str, str] = {}
        self.reset()

    def reset(self) -> None:
        """A new tick: nothing streamed yet."""
        self.raw: dict[str, list[str]] = {}
        self.shown: dict[str, int] = {}
        self.done: set[str] = set()
        self.order: list[str] = []
        self.current: str | None = None

    def name(self, key: str) -> str:
        """The place's name (its file's ``identity.name``), else its id."""
        import orjson

        from sim.world import ID_RE

        lid = key.partition(":")[2] or key
        if lid not in self.names:
            self.names[lid] = lid
            if self.world_dir is not None and ID_RE.match(lid):
                path = self.world_dir / "locations" / f"{lid}.json"
                # a missing or odd file: the id stands
                with contextlib.suppress(OSError, ValueError, LookupError, TypeError):
                    with open(path, "rb") as handle:
                        data = orjson.loads(handle.read(1 << 20))
                    self.names[lid] = str(data["identity"]["name"] or lid)
        return self.names[lid]

    @property
    def streamed(self) -> set[str]:
        """The places whose narrative was shown as it was written."""
        return {key.partition(":")[2] or key for key in self.shown}

    def _visible(self, key: str) -> str:
        return partial_string("".join(self.raw.get(key, ())), "narrative") or ""

    def _show(self, key: str) -> None:
        visible = self._visible(key)
        new = visible[self.shown.get(key, 0) :]
        if new:
            echo(new, nl=False)
            self.shown[key] = len(visible)

    def _next(self) -> None:
        """Show the next place not shown yet: what it has written so far, then live."""
        for key in self.order:
            if key in self.shown:
                continue
            self.current, self.shown[key] = key, 0
            secho(f"\n[{one_line(self.name(key))}]", fg="cyan")
            self._show(key)
            if key not in self.done:
                return
            echo()
        self.current = None

    def on_delta(self, delta: StreamDelta) -> None:
        if delta.phase != "narrative" or delta.entity_key is None:
            return
        key = delta.entity_key
        if key not in self.raw:
            self.order.append(key)
        if delta.restart:
            self.raw[key] = []
            if key == self.current and self.shown.get(key):
                echo(" [retrying]")
                self.shown[key] = 0
            return
        self.raw.setdefault(key, []).append(delta.text)
        if self.current is None:
            self._next()
        elif key == self.current:
            self._show(key)

    def on_event(self, event: LLMEvent) -> None:
        if event.phase != "narrative" or not event.final or event.kind == "llm_called":
            return
        key = event.entity_key
        if key is None or key not in self.raw:
            return
        self.done.add(key)
        if key == self.current:
            self._show(key)
            echo()
            self.current = None
            self._next()
