"""Replay and verification of logged ticks, in a scratch copy; the live world is never touched.

``replay(world, tick, to)`` rebuilds the state at the start of ``tick`` from its log in a
temporary folder (with the world's current ``prompts/`` and ``config.toml``), then runs the
ticks ``tick..to`` there with the ``replay`` provider answering every call from the logs.
Each tick is identical when no request drifted and its state after matches the logged
digest byte for byte. A drifted request (its instructions, input, schema, model, settings
or chain differ from the recording) is reported and answered from the recording anyway, so
only the requests whose construction changed are named; with ``live`` it is sent to the
configured provider instead, and the outcome's change is shown.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sim.config import Config
from sim.engine.runner import Runner, build_adapter
from sim.errors import InputError, LogError
from sim.llm.adapters.replay import Drift, ReplayAdapter
from sim.llm.stack import close_stack
from sim.llm.types import Adapter
from sim.storage import Storage
from sim.ticklog.format import TickLog, log_path, read_log, read_state, state_digest

WORLD_INPUTS = ("prompts", "config.toml")


@dataclass
class TickReplay:
    """How one replayed tick compares with its log."""

    tick: int
    drifts: list[Drift]
    state_matches: bool
    differing_files: list[str] = field(default_factory=list)
    served: int = 0
    sent: int = 0
    recorded_narratives: dict[str, str] = field(default_factory=dict)
    narratives: dict[str, str] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return self.state_matches and not self.drifts


@dataclass
class ReplayReport:
    ticks: list[TickReplay]

    @property
    def identical(self) -> bool:
        return all(t.identical for t in self.ticks)

    @property
    def drifts(self) -> list[Drift]:
        return [d for t in self.ticks for d in t.drifts]


def committed_log(world_dir: Path, tick: int) -> TickLog:
    """The committed log of ``tick``, or an error saying why it cannot be used."""
    path = log_path(world_dir, tick)
    if not path.is_file():
        raise InputError(path, None, f"no log for tick {tick} (see `sim log --tick all`)")
    log = read_log(path)
    if not log.committed:
        raise LogError(f"{path}: tick {tick} never committed; run `sim tick` to resume it")
    return log


def write_state(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def scratch_world(world_dir: Path, log: TickLog, dest: Path) -> Path:
    """A world at the start of ``log``'s tick, with the live world's prompts and config."""
    dest.mkdir(parents=True)
    for name in WORLD_INPUTS:
        source = world_dir / name
        if source.is_dir():
            shutil.copytree(source, dest / name)
        elif source.is_file():
            shutil.copy2(source, dest / name)
    write_state(dest, log.state())
    return dest


def _differing(after: dict[str, bytes], expected: dict[str, bytes]) -> list[str]:
    return sorted(rel for rel in set(after) | set(expected) if after.get(rel) != expected.get(rel))


def replay(
    world_dir: Path,
    tick: int,
    to: int | None = None,
    *,
    config: Config,
    live: bool = False,
    live_adapter: Adapter | None = None,
) -> ReplayReport:
    """Re-run the logged ticks ``tick..to`` from their recordings and compare.

    Args:
        world_dir: the live world (read only).
        tick, to: the first and last tick to replay (``to`` defaults to ``tick``).
        config: the effective config now (drift in it is reported).
        live: send drifted requests to the configured provider.
        live_adapter: the adapter for ``live`` (default: the configured provider's).

    Raises:
        InputError: no log for a tick in the range; LogError: a log is unreadable or
        its tick never committed.
    """
    last = tick if to is None else to
    if tick < 1 or last < tick:
        raise InputError(None, "--tick/--to", f"expected 1 <= tick <= to (got {tick}..{last})")
    logs = [committed_log(world_dir, t) for t in range(tick, last + 1)]
    with tempfile.TemporaryDirectory(prefix="sim-replay-") as tmp:
        scratch = scratch_world(world_dir, logs[0], Path(tmp) / "world")
        return asyncio.run(_replay(world_dir, scratch, logs, config, live, live_adapter))


async def _replay(
    world_dir: Path,
    scratch: Path,
    logs: list[TickLog],
    config: Config,
    live: bool,
    live_adapter: Adapter | None,
) -> ReplayReport:
    """All ticks on one event loop, so a live provider's HTTP client lives and dies on it."""
    report = ReplayReport([])
    sender = live_adapter
    try:
        for log in logs:
            if live and sender is None:
                sender = build_adapter(config, Storage(scratch).load())
            adapter = ReplayAdapter(
                log.replay_calls(),
                instructions=log.instructions,
                live=sender if live else None,
            )
            result = (await Runner(scratch, config, adapter=adapter).run_async(1))[0]
            report.ticks.append(_compare(world_dir, scratch, log, adapter, result.narratives))
    finally:
        if sender is not None and live_adapter is None:
            await close_stack(sender)
    return report


def _compare(
    world_dir: Path, scratch: Path, log: TickLog, adapter: ReplayAdapter, narratives: dict[str, str]
) -> TickReplay:
    after = read_state(scratch)
    assert log.commit is not None
    matches = state_digest(after) == log.commit.state_after
    differing: list[str] = []
    following = log_path(world_dir, log.tick + 1)
    if not matches and following.is_file():
        try:
            differing = _differing(after, read_log(following).state())
        except LogError:
            differing = []
    return TickReplay(
        log.tick,
        adapter.drifts,
        matches,
        differing,
        adapter.served,
        adapter.sent,
        {k: str(v) for k, v in log.phase_results("narrative").items()},
        narratives,
    )


__all__ = ["ReplayReport", "TickReplay", "committed_log", "replay", "scratch_world", "write_state"]
