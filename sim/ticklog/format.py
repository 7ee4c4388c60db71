"""The tick log: one append-only JSONL file per tick inside the world folder.

``.sim/log/tick-000004.jsonl`` is tick 4's log (the tick that takes ``world.json``'s
``tick`` from 3 to 4). Every line is one JSON object with a ``type``; the first is a
``header`` carrying the format version. Record types, in the order a tick writes them:

- ``header``: tick, format version, the config used (no secrets), world seed;
- ``state_before``: the state at the start of the tick (entity files, ``world.json`` and
  the response store), zlib-compressed and base64-encoded, with its digest;
- ``instructions``: an instructions text, once per distinct digest, before its first call;
- ``call``: one completed LLM call (see ``sim.ticklog.recorder``), appended as soon as it finishes;
- ``phase``: a phase's results and report (fallbacks, errors, warnings), at its end;
- ``resume``: the tick was interrupted and is being resumed (attempt number);
- ``usage``: totals for the tick;
- ``commit``: the digest of the state after the tick; present iff the tick committed.

Durability: call records are flushed as they are written and the file is fsynced at the
end of every phase. The ``commit`` record is made atomic with the tick's commit by a small
marker file (``tick-000004.commit.json``) written through ``Storage.commit``'s journal;
``recover_logs`` copies a marker's record into its log and removes the marker, so after a
crash at any instant world files, response store and log agree.

A format change is a numbered migration in ``MIGRATIONS`` (records of version k are
upgraded to k+1 on read); a log the engine cannot read raises ``LogError``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sim.errors import SimError
from sim.llm.calls import digest

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
LOG_DIR = ".sim/log"
STATE_KINDS = ("characters", "locations")
STORE_DIR = ".sim/responses"

Record = dict[str, Any]
#: version k -> function upgrading one record of version k to version k + 1
MIGRATIONS: Mapping[int, Callable[[Record], Record]] = {}


class LogError(SimError):
    """A tick log the engine cannot read (named, with the line and the reason)."""

    exit_code = 1


def log_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.jsonl"


def marker_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.commit.json"


def log_path(root: Path, tick: int) -> Path:
    return root / log_rel(tick)


def list_logs(root: Path) -> list[tuple[int, Path]]:
    """(tick, path) of every tick log in the world, oldest first."""
    folder = root / LOG_DIR
    out: list[tuple[int, Path]] = []
    if not folder.is_dir():
        return out
    for path in folder.glob("tick-*.jsonl"):
        number = path.name.removeprefix("tick-").removesuffix(".jsonl")
        if number.isdigit():
            out.append((int(number), path))
    return sorted(out)


# -- state snapshots --------------------------------------------------------------------------


def read_state(root: Path) -> dict[str, bytes]:
    """The files that make a world's state, from disk: what a log snapshots and digests."""
    files: dict[str, bytes] = {}
    meta = root / "world.json"
    if meta.is_file():
        files["world.json"] = meta.read_bytes()
    for kind in STATE_KINDS:
        for path in sorted((root / kind).glob("*.json")):
            files[f"{kind}/{path.name}"] = path.read_bytes()
    files.update(read_store(root))
    return files


def read_store(root: Path) -> dict[str, bytes]:
    store = root / STORE_DIR
    if not store.is_dir():
        return {}
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(store.rglob("*.json"))
    }


def is_state_file(rel: str) -> bool:
    if rel == "world.json":
        return True
    if rel.startswith(STORE_DIR + "/"):
        return rel.endswith(".json")
    kind, _, name = rel.partition("/")
    return kind in STATE_KINDS and "/" not in name and name.endswith(".json")


def state_digest(files: Mapping[str, bytes]) -> str:
    hasher = bytearray()
    for rel in sorted(files):
        hasher += rel.encode() + b"\x00" + digest(files[rel]).encode() + b"\n"
    return digest(bytes(hasher))


def pack_state(files: Mapping[str, bytes]) -> Record:
    payload = orjson.dumps({rel: files[rel].decode("utf-8") for rel in sorted(files)})
    return {
        "type": "state_before",
        "encoding": "zlib+base64",
        "digest": state_digest(files),
        "files": len(files),
        "data": base64.b64encode(zlib.compress(payload, 1)).decode("ascii"),
    }


def unpack_state(record: Mapping[str, Any]) -> dict[str, bytes]:
    if record.get("encoding") != "zlib+base64":
        raise ValueError(f"unknown state encoding {record.get('encoding')!r}")
    payload = orjson.loads(zlib.decompress(base64.b64decode(record["data"])))
    return {rel: text.encode("utf-8") for rel, text in payload.items()}


# -- writing --------------------------------------------------------------------------------


class LogWriter:
    """Appends records to one log file; a torn last line (a crash mid-write) is cut off first.

    Args:
        path: the log file (created with its folder if missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(path)
        self._handle = open(path, "ab")  # noqa: SIM115 - held for the tick, closed by close()

    def append(self, record: Record) -> None:
        """Write one record and hand it to the OS (it survives the process being killed)."""
        self._handle.write(orjson.dumps(record) + b"\n")
        self._handle.flush()

    def sync(self) -> None:
        """Make everything written so far durable (survives power loss)."""
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if not self._handle.closed:
            with contextlib.suppress(OSError):
                self.sync()
            self._handle.close()


def _cut_torn_tail(path: Path) -> None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def header(
    tick: int,
    config: Mapping[str, Any],
    seed: int,
    scope: str = "",
    phases: Mapping[str, Any] | None = None,
) -> Record:
    """The first record. ``scope`` is a nonce for this run of the tick: it keys the
    idempotency of its calls and is kept by a resume (see ``sim.llm.calls``). ``phases``
    adds ``phases`` (the list run), ``templates`` and ``schemas`` (name -> digest)."""
    record: Record = {
        "type": "header",
        "format": FORMAT_VERSION,
        "tick": tick,
        "seed": seed,
        "config": dict(config),
        "scope": scope,
    }
    for key in ("phases", "templates", "schemas"):
        if phases is not None and key in phases:
            record[key] = phases[key]
    return record


# -- reading --------------------------------------------------------------------------------


@dataclass
class TickLog:
    """A tick log as read back: the last record of each kind wins after a resume."""

    path: Path
    tick: int
    header: Record
    state_before: Record | None = None
    instructions: dict[str, str] = field(default_factory=dict)
    calls: dict[str, Record] = field(default_factory=dict)
    phases: dict[str, Record] = field(default_factory=dict)
    usage: Record | None = None
    commit: Record | None = None
    resumes: int = 0
    torn: bool = False
    records: list[Record] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.commit is not None

    def state(self) -> dict[str, bytes]:
        if self.state_before is None:
            raise LogError(f"{self.path}: no state_before record; the tick cannot be re-run")
        return unpack_state(self.state_before)

    def phase_results(self, name: str) -> dict[str, Any]:
        record = self.phases.get(name)
        return dict(record.get("results") or {}) if record else {}

    def failures(self) -> int:
        return sum(1 for call in self.calls.values() if call.get("error_code"))


def _migrate(record: Record, version: int, path: Path, line: int) -> Record:
    while version < FORMAT_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise LogError(f"{path}: line {line}: no migration from log format {version}")
        record = step(record)
        version += 1
    return record


def parse_records(lines: Iterable[bytes], path: Path) -> tuple[list[Record], bool]:
    """Parse JSONL lines; a torn last line is reported by the flag, any other bad line raises."""
    records: list[Record] = []
    raw = list(lines)
    torn = False
    version: int | None = None
    for number, line in enumerate(raw, 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if number == len(raw) and not line.endswith(b"\n"):
                torn = True  # a crash cut the last write short
                break
            raise LogError(f"{path}: line {number}: not valid JSON ({exc})") from None
        if not isinstance(record, dict) or "type" not in record:
            raise LogError(f"{path}: line {number}: expected an object with a 'type'")
        if version is None:
            if record["type"] != "header" or not isinstance(record.get("format"), int):
                raise LogError(
                    f"{path}: line {number}: the first record must be a header "
                    "with a format version"
                )
            version = record["format"]
            if version > FORMAT_VERSION:
                raise LogError(
                    f"{path}: log format {version} is newer than this sim "
                    f"(reads up to {FORMAT_VERSION}); upgrade sim"
                )
        records.append(_migrate(record, version, path, number))
    if version is None:
        raise LogError(f"{path}: empty log (no header)")
    return records, torn


def read_log(path: Path) -> TickLog:
    """Read one tick log.

    Raises:
        LogError: the file is missing, malformed, or of an unknown format.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LogError(f"{path}: cannot read the tick log: {exc.strerror}") from None
    records, torn = parse_records(data.splitlines(keepends=True), path)
    head = records[0]
    log = TickLog(path, int(head.get("tick", 0)), head, torn=torn, records=records)
    for record in records[1:]:
        kind = record["type"]
        if kind == "state_before":
            log.state_before = record
        elif kind == "instructions":
            log.instructions[record["digest"]] = record["text"]
        elif kind == "call":
            log.calls.pop(record["request_id"], None)
            log.calls[record["request_id"]] = record
        elif kind == "phase":
            log.phases[record["name"]] = record
        elif kind == "usage":
            log.usage = record
        elif kind == "commit":
            log.commit = record
        elif kind == "resume":
            log.resumes += 1
    return log


def read_logs(root: Path) -> tuple[list[TickLog], list[LogError]]:
    """Every readable log of a world, and a problem for each one that is not."""
    logs: list[TickLog] = []
    problems: list[LogError] = []
    for _, path in list_logs(root):
        try:
            logs.append(read_log(path))
        except LogError as exc:
            problems.append(exc)
    return logs, problems


# -- commit markers and retention ----------------------------------------------------------


def recover_logs(root: Path) -> list[int]:
    """Complete the logs of ticks that committed: copy each marker's record into its log.

    Run under the world lock after ``Storage.recover()``. Returns the ticks completed.
    """
    folder = root / LOG_DIR
    done: list[int] = []
    if not folder.is_dir():
        return done
    for marker in sorted(folder.glob("tick-*.commit.json")):
        record = orjson.loads(marker.read_bytes())
        path = log_path(root, int(record["tick"]))
        if path.is_file():
            try:
                complete = read_log(path).commit is not None
            except LogError as exc:  # still completed; `sim log` and `sim check` report it
                logger.warning("completing an unreadable tick log: %s", exc)
                complete = False
            if not complete:
                writer = LogWriter(path)
                writer.append(record)
                writer.close()
                done.append(int(record["tick"]))
        marker.unlink()
    return done


def prune(root: Path, current_tick: int, keep_ticks: int) -> list[Path]:
    """Delete the logs of ticks older than the last ``keep_ticks`` (0 keeps all)."""
    if keep_ticks <= 0:
        return []
    removed: list[Path] = []
    for tick, path in list_logs(root):
        if tick <= current_tick - keep_ticks:
            path.unlink()
            removed.append(path)
    return removed
