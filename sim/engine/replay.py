"""Replay and verification of logged ticks, in a scratch copy; the live world is never touched.

``replay(world, tick, to)`` rebuilds the state at the start of ``tick`` from its log in a
temporary folder (with the world's current ``prompts/``, ``schemas/`` and ``config.toml``),
then runs the ticks ``tick..to`` there with the ``replay`` provider answering every call from
the logs, each with the configuration its log recorded. What changed since is named: the
config keys that differ now, the phase list, and each template and schema whose digest
differs from the one in the log's header.
Each tick is identical when no request drifted and its state after matches the logged
digest byte for byte. A drifted request (its instructions, input, schema, model, settings
or chain differ from the recording) is reported and answered from the recording anyway, so
only the requests whose construction changed are named; with ``live`` it is sent to the
configured provider instead, and the outcome's change is shown.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim import interrupts, safefs
from sim.config import Config, loggable
from sim.engine.runner import Runner, build_run_stack
from sim.engine.stack import Stack, batch_transport
from sim.errors import InputError, LogError
from sim.llm.embedding import Embedder
from sim.llm.types import Adapter
from sim.providers.replay import Drift, ReplayAdapter
from sim.storage import Storage, normal_bytes
from sim.ticklog.format import (
    INTERVENTIONS,
    existing_log,
    log_file,
    log_path,
    read_state,
    state_digest,
)
from sim.ticklog.reader import TickLog, read_log
from sim.ticklog.records import dump_record

WORLD_INPUTS = ("prompts", "schemas", "config.toml")


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
    #: "key: logged X, now Y" for each config key that differs from the log's
    config_changes: list[str] = field(default_factory=list)
    #: the phase list, if it differs: "logged a, b; now a, b, c"
    phase_change: str = ""
    #: "name: changed" / "added" / "removed", for templates and answer schemas
    template_changes: list[str] = field(default_factory=list)
    schema_changes: list[str] = field(default_factory=list)
    #: why the logged config could not be used (the current one was, instead)
    config_note: str = ""
    #: the embeddings requests the log holds, and whether the replayed log holds the same
    #: (byte for byte: the same books); a replay sends none, its cache has their texts
    embeddings: int = 0
    embeddings_match: bool = True
    #: the live world's files that differ from what this tick (its last) wrote: edited
    #: since it committed (the replay reproduced the commit; the world does not hold it)
    edited_files: list[str] = field(default_factory=list)
    #: the files the logged tick wrote with keys out of their normal order (an earlier
    #: sim), which the replay writes in order: the same state, so ``state_matches``
    reordered_files: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.state_matches and not self.drifts and not self.edited_files


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
    path = existing_log(world_dir, tick)
    log = read_log(path)
    if not log.committed:
        raise LogError(f"{path}: tick {tick} never committed; run `sim tick` to resume it")
    if log.compacted is not None:
        raise LogError(
            f"{path}: tick {tick} cannot be replayed: `sim log --compact --before "
            f"{log.compacted.before}` dropped its {log.compacted.calls} recorded calls, which "
            "replay answers from (its summary, results and start state are kept: `sim log "
            f"--tick {tick}`, `sim rewind`, `sim fork` still work)"
        )
    return log


def write_state(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _copy_regular(source: Path, dest: Path) -> None:
    """Copy ``source`` (a file or a folder tree) without following a symlink or opening a
    special file: a world's symlinked template must not become readable content in the
    scratch copy (a live replay could send it), and a FIFO must not hang the copy."""
    try:
        info = source.lstat()
    except OSError:
        return
    if stat.S_ISREG(info.st_mode):
        shutil.copyfile(source, dest, follow_symlinks=False)
    elif stat.S_ISDIR(info.st_mode):
        dest.mkdir(exist_ok=True)
        for child in sorted(source.iterdir()):
            _copy_regular(child, dest / child.name)


def scratch_world(world_dir: Path, log: TickLog, dest: Path) -> Path:
    """A world at the start of ``log``'s tick, with the live world's prompts, schemas and
    config (regular files only)."""
    dest.mkdir(parents=True)
    for name in WORLD_INPUTS:
        _copy_regular(world_dir / name, dest / name)
    _copy_embeddings(world_dir, dest)
    write_state(dest, log.state())
    return dest


def _copy_embeddings(world_dir: Path, dest: Path) -> None:
    """The world's cached provider embeddings (``sim.mind.vectors``), so a replay scores
    with the vectors the tick used and sends no embeddings request: regular files of
    ``.sim/embeddings`` up to the size the cache reads, nothing through a link."""
    from sim.mind.vectors import FOLDER, MAX_BYTES

    parts = FOLDER.split("/")
    try:
        names = safefs.list_names(world_dir, parts, ".jsonl") or []
    except (InputError, OSError):  # .sim or its folder is a link: nothing copied
        names = []
    for name in names:
        try:
            data = safefs.read_file(world_dir, f"{FOLDER}/{name}", MAX_BYTES)
        except (InputError, OSError):  # a link, a special file, too big: not copied
            continue
        folder = dest.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: data}


def config_changes(logged: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each config key whose value now differs from the logged one, named."""
    before, after = _flatten(logged), _flatten(now)
    out = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, "(unset)"), after.get(key, "(unset)")
        if old != new:
            out.append(f"{key}: logged {old!r}, now {new!r}")
    return out


def digest_changes(logged: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Names whose digest changed, was added or removed."""
    out = []
    for name in sorted(set(logged) | set(now)):
        if name not in now:
            out.append(f"{name}: removed")
        elif name not in logged:
            out.append(f"{name}: added")
        elif logged[name] != now[name]:
            out.append(f"{name}: changed")
    return out


def logged_config(log: TickLog, current: Config) -> tuple[Config, str]:
    """The config ``log``'s tick ran with, or the current one and why it could not be."""
    data = log.header.config
    if not data:
        return current, "the log records no config; replayed with the current one"
    try:
        return Config.model_validate(data), ""
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return current, (
            f"the logged config is not valid for this sim ({where}: {err['msg'].lower()}); "
            "replayed with the current one"
        )


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
        config: the effective config now. Each tick is re-run with the config its log
            recorded; the keys that differ now are named in the report.
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
        return interrupts.run(_replay(world_dir, scratch, logs, config, live, live_adapter))


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
    live_stack: Stack | None = None
    try:
        for log in logs:
            used, note = logged_config(log, config)
            if live and sender is None:  # live calls go where the user now points them
                live_stack = build_run_stack(config, Storage(scratch).load())
                sender = live_stack.adapter
            adapter = ReplayAdapter(
                log.replay_calls(),
                instructions=log.instructions,
                live=sender if live else None,
            )
            # the policy decisions the log recorded are reproduced: no policy is consulted
            # (a custom one need not be installed), no one is asked
            # (as logged: no recovery around it); embeddings a cache lacks come from the
            # live stack's endpoints, with --live only
            replayed = Stack(
                adapter,
                batch=batch_transport(used),
                embedders=(
                    live_stack.embedders
                    if live_stack is not None
                    else {"": sender}
                    if live and isinstance(sender, Embedder)
                    else {}
                ),
            )
            runner = Runner(
                scratch,
                used,
                stack=replayed,
                decisions=log.run_decisions(),
                embeddings=log.embeddings,
            )
            result = (await runner.run_async(1))[0]
            tick = _compare(world_dir, scratch, log, adapter, result.narratives)
            rerun = read_log(log_path(scratch, log.tick))
            _explain(tick, log, rerun, config)
            tick.embeddings = len(log.embeddings)
            tick.embeddings_match = _embedding_lines(rerun) == _embedding_lines(log)
            tick.config_note = note
            report.ticks.append(tick)
    finally:
        if live_stack is not None:  # built here: its clients are this loop's
            await live_stack.aclose()
    return report


def _embedding_lines(log: TickLog) -> list[bytes]:
    """A log's embeddings requests as its lines hold them."""
    return [dump_record(record) for record in log.embeddings]


def _explain(tick: TickReplay, log: TickLog, rerun: TickLog, current: Config) -> None:
    """Name what changed since ``log`` was written: config keys, phases, templates, schemas."""
    head, now = log.header, rerun.header
    if head.config:
        try:  # normalised, so keys a newer sim added with their defaults are not "changes"
            logged = loggable(Config.model_validate(head.config))
        except ValidationError:
            logged = head.config
        tick.config_changes = config_changes(logged, loggable(current))
    if head.phases is not None and list(current.tick.phases) != head.phases:
        tick.phase_change = f"logged {', '.join(head.phases)}; now {', '.join(current.tick.phases)}"
    if head.templates is not None:
        tick.template_changes = digest_changes(head.templates, now.templates or {})
    if head.schemas is not None:
        tick.schema_changes = digest_changes(head.schemas, now.schemas or {})


def _compare(
    world_dir: Path, scratch: Path, log: TickLog, adapter: ReplayAdapter, narratives: dict[str, str]
) -> TickReplay:
    after = read_state(scratch)
    assert log.commit is not None
    matches = state_digest(after) == log.commit.state_after
    differing: list[str] = []
    reordered: list[str] = []
    following = log_file(world_dir, log.tick + 1)
    committed: dict[str, bytes] | None = None  # what the tick wrote, where it is kept
    if not matches and following.is_file():
        try:
            committed = read_log(following).state()
        except LogError:
            committed = None
        differing = [] if committed is None else _differing(after, committed)
    elif not matches and not os.path.lexists(following):  # the world's last tick: its files
        committed = _live_state(world_dir)
    if committed is not None and state_digest(committed) == log.commit.state_after:
        changed = differing or _differing(after, committed)
        if all(_same_state(rel, after.get(rel), committed.get(rel)) for rel in changed):
            matches, differing, reordered = True, [], changed
    edited: list[str] = []
    if matches and not os.path.lexists(following):  # the world's last tick: its files now
        edited = _edited(world_dir, after, log.commit.state_after)
    replayed = TickReplay(
        log.tick,
        adapter.drifts,
        matches,
        differing,
        adapter.served,
        adapter.sent,
        {k: str(v) for k, v in log.phase_results("narrative").items()},
        narratives,
    )
    replayed.edited_files = edited
    replayed.reordered_files = reordered
    return replayed


def _same_state(rel: str, replayed: bytes | None, logged: bytes | None) -> bool:
    """Whether two versions of a world file hold the same state: the same normal form
    (``world.json`` and entity files), which an older sim wrote with keys out of order."""
    if replayed is None or logged is None:
        return False
    normal = normal_bytes(rel, logged)
    return normal is not None and normal == normal_bytes(rel, replayed)


def _live_state(world_dir: Path) -> dict[str, bytes] | None:
    """The live world's state files, less an intervention queued since (the next tick's
    input); ``None`` when they cannot be read."""
    try:
        live = read_state(world_dir)
    except (OSError, InputError):
        return None
    live.pop(INTERVENTIONS, None)
    return live


def _edited(world_dir: Path, after: dict[str, bytes], committed: str) -> list[str]:
    """The live world's state files that differ from ``after`` (what its last tick wrote,
    replayed), when its state is not the ``committed`` one; an intervention queued since
    is the next tick's input, not an edit."""
    live = _live_state(world_dir)
    if live is None:
        return []
    if state_digest(live) == committed:
        return []
    return _differing({k: v for k, v in after.items() if k != INTERVENTIONS}, live)


__all__ = ["ReplayReport", "TickReplay", "committed_log", "replay", "scratch_world", "write_state"]
