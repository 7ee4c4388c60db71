"""The tick log: one append-only JSONL file per tick inside the world folder.

``.sim/log/tick-000004.jsonl`` is tick 4's log (the tick that takes ``world.json``'s
``tick`` from 3 to 4). Every line is one JSON object with a ``type``; the first is a
``header`` carrying the format version (a log is created with its header and state
already in it, by rename, so a crash never leaves a header-less log). Record types, in the
order a tick writes them:

- ``header``: tick, format version, the config used (no secrets), world seed;
- ``state_before``: the state at the start of the tick (entity files, ``world.json`` and
  the response store), zlib-compressed and base64-encoded, with its digest;
- ``intervention``: each ``sim inject`` / ``sim set`` made since the last tick, which this
  tick applies (the pending file, ``.sim/interventions.json``, is part of the state);
- ``instructions``: an instructions text, once per distinct digest, before its first call;
- ``call``: one completed LLM call (see ``sim.ticklog.recorder``), appended as soon as it finishes;
- ``phase``: a phase's results and report (fallbacks, errors, warnings), at its end;
- ``resume``: the tick was interrupted and is being resumed (attempt number);
- ``policy``: a policy decision that was not "allow" (deny, defer, ask), before its call;
- ``usage``: totals for the tick;
- ``commit``: the digest of the state after the tick; present iff the tick committed.

Durability: call records are flushed as they are written and the file is fsynced at the
end of every phase. The ``commit`` record is made atomic with the tick's commit by a small
marker file (``tick-000004.commit.json``) written through ``Storage.commit``'s journal;
``recover_logs`` copies a marker's record into its log and removes the marker, so after a
crash at any instant world files, response store and log agree.

Records are typed (``sim.ticklog.records``): ``read_log`` is the one reader, and every
view (``sim log``, ``sim usage``, the report, replay, rewind, tune) goes through it. A
format change is a numbered migration in ``MIGRATIONS`` (records of version k are upgraded
to k+1 on read, as JSON objects, before they are validated); a log the engine cannot read
raises ``LogError`` naming the file, the line and the field.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import os
import stat
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from sim.errors import LogError
from sim.llm.calls import digest
from sim.ticklog.records import (
    BatchRecord,
    CallRecord,
    CommitRecord,
    HeaderRecord,
    LogRecord,
    PhaseRecord,
    PolicyRecord,
    ResumeRecord,
    StateRecord,
    UsageRecord,
    dump_record,
    parse_record,
    record_data,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
LOG_DIR = ".sim/log"
STATE_KINDS = ("characters", "locations")
STORE_DIR = ".sim/responses"
#: interventions made between ticks, waiting for the next (``sim.interventions``): part of
#: the state a tick starts from, so a replay, rewind or fork sees them
INTERVENTIONS = ".sim/interventions.json"

#: one record as the JSON object of its line, before validation (what migrations work on)
RawRecord = dict[str, Any]
#: version k -> function upgrading one record of version k to version k + 1
MIGRATIONS: Mapping[int, Callable[[RawRecord], RawRecord]] = {}
#: folders of ``LOG_DIR`` holding logs set aside by a tick started afresh (never deleted)
ABANDONED_DIR = "abandoned"


def log_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.jsonl"


def marker_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.commit.json"


def log_path(root: Path, tick: int) -> Path:
    return root / log_rel(tick)


def list_logs(root: Path, folder: str = LOG_DIR) -> list[tuple[int, Path]]:
    """(tick, path) of every tick log in ``folder`` of the world, oldest first.

    Logs set aside into ``abandoned/`` are named ``tick-NNNNNN.k.jsonl``; they are listed
    too when ``folder`` is that folder (their calls were sent: ``sim usage`` counts them).
    """
    where = root / folder
    out: list[tuple[int, Path]] = []
    if not where.is_dir():
        return out
    for path in where.glob("tick-*.jsonl"):
        number = path.name.removeprefix("tick-").split(".", 1)[0]
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
    pending = root / INTERVENTIONS
    if pending.is_file() and not pending.is_symlink():
        files[INTERVENTIONS] = pending.read_bytes()
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
    if rel in ("world.json", INTERVENTIONS):
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


def pack_state(files: Mapping[str, bytes]) -> StateRecord:
    payload = orjson.dumps({rel: files[rel].decode("utf-8") for rel in sorted(files)})
    return StateRecord(
        encoding="zlib+base64",
        digest=state_digest(files),
        files=len(files),
        data=base64.b64encode(zlib.compress(payload, 1)).decode("ascii"),
    )


def unpack_state(record: StateRecord) -> dict[str, bytes]:
    if record.encoding != "zlib+base64":
        raise ValueError(f"unknown state encoding {record.encoding!r}")
    payload = orjson.loads(zlib.decompress(base64.b64decode(record.data)))
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
        # never through a link planted in the world's .sim/log folder
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        self._handle = os.fdopen(fd, "ab")

    @classmethod
    def create(cls, path: Path, first: Iterable[LogRecord]) -> LogWriter:
        """Start a new log that appears with its ``first`` records already in it.

        They are written to ``<name>.tmp``, fsynced and renamed into place, so a crash at
        any instant leaves either no log or one that starts with its header, never an
        empty or header-less file (a leftover ``.tmp`` is overwritten by the next start).
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a leftover, or a link planted there: removed, never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(b"".join(dump_record(record) + b"\n" for record in first))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return cls(path)

    def append(self, record: LogRecord) -> None:
        """Write one record and hand it to the OS (it survives the process being killed)."""
        self._handle.write(dump_record(record) + b"\n")
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


def _fsync_dir(path: Path) -> None:
    """Make a rename in the folder durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_tail(path: Path) -> None:
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, data.rfind(b"\n") + 1)
        finally:
            os.close(fd)


def header(
    tick: int,
    config: Mapping[str, Any],
    seed: int,
    scope: str = "",
    phases: Mapping[str, Any] | None = None,
) -> HeaderRecord:
    """The first record. ``scope`` is a nonce for this run of the tick: it keys the
    idempotency of its calls and is kept by a resume (see ``sim.llm.calls``). ``phases``
    adds ``phases`` (the list run), ``templates`` and ``schemas`` (name -> digest)."""
    extra = {k: phases[k] for k in ("phases", "templates", "schemas") if phases and k in phases}
    return HeaderRecord(
        format=FORMAT_VERSION, tick=tick, seed=seed, config=dict(config), scope=scope, **extra
    )


# -- reading --------------------------------------------------------------------------------


@dataclass
class TickLog:
    """A tick log as read back: the last record of each kind wins after a resume.

    ``calls`` holds the last record per request id (what replay and resume answer from);
    ``call_records`` holds every call record in the file, including those a resume
    superseded by sending the call again: their attempts were billed too (``books``).
    """

    path: Path
    tick: int
    header: HeaderRecord
    state_before: StateRecord | None = None
    instructions: dict[str, str] = field(default_factory=dict)
    calls: dict[str, CallRecord] = field(default_factory=dict)
    call_records: list[CallRecord] = field(default_factory=list)
    phases: dict[str, PhaseRecord] = field(default_factory=dict)
    usage: UsageRecord | None = None
    commit: CommitRecord | None = None
    #: every policy decision that was not "allow", in order (all runs of the tick)
    decisions: list[PolicyRecord] = field(default_factory=list)
    resumes: int = 0
    #: the Batch API batches the tick created (``[llm] batch``), in order
    batches: list[BatchRecord] = field(default_factory=list)
    torn: bool = False
    records: list[LogRecord] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.commit is not None

    def state(self) -> dict[str, bytes]:
        if self.state_before is None:
            raise LogError(f"{self.path}: no state_before record; the tick cannot be re-run")
        return unpack_state(self.state_before)

    def phase_results(self, name: str) -> dict[str, Any]:
        record = self.phases.get(name)
        return dict(record.results) if record else {}

    def failures(self) -> int:
        return sum(1 for call in self.calls.values() if call.failed)

    def run_decisions(self) -> list[PolicyRecord]:
        """The policy decisions of the tick's last run (after its last ``resume``): every
        call of a run passes the gates, so these are the ones its result was made with."""
        out: list[PolicyRecord] = []
        for record in self.records:
            if isinstance(record, ResumeRecord):
                out.clear()
            elif isinstance(record, PolicyRecord):
                out.append(record)
        return out

    def replay_calls(self) -> dict[str, dict[str, Any]]:
        """The last call record per request id as JSON objects: what the ``replay``
        provider (``sim.llm.adapters.replay``, below this package) answers from."""
        return {rid: record_data(call) for rid, call in self.calls.items()}


def _migrate(record: RawRecord, version: int, path: Path, line: int) -> RawRecord:
    while version < FORMAT_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise LogError(f"{path}: line {line}: no migration from log format {version}")
        record = step(record)
        version += 1
    return record


def _invalid(path: Path, line: int, kind: object, exc: ValidationError) -> LogError:
    """A record that does not fit its model, named by line, field and reason."""
    problems = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"] if p != kind)
        if error["type"] == "extra_forbidden":
            problems.append(f"unknown field '{where}' (written by a newer sim?)")
        elif error["type"] == "union_tag_invalid":
            problems.append(f"unknown record type {kind!r}")
        else:
            problems.append(f"field '{where}': {error['msg']}")
    return LogError(f"{path}: line {line}: {kind} record: {'; '.join(problems)}")


def parse_records(lines: Iterable[bytes], path: Path) -> tuple[list[LogRecord], bool]:
    """Parse JSONL lines; a torn last line is reported by the flag, any other bad line raises."""
    records: list[LogRecord] = []
    raw = list(lines)
    torn = False
    version: int | None = None
    for number, line in enumerate(raw, 1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if number == len(raw) and not line.endswith(b"\n"):
                torn = True  # a crash cut the last write short
                break
            raise LogError(f"{path}: line {number}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or "type" not in data:
            raise LogError(f"{path}: line {number}: expected an object with a 'type'")
        if version is None:
            if data["type"] != "header" or not isinstance(data.get("format"), int):
                raise LogError(
                    f"{path}: line {number}: the first record must be a header "
                    "with a format version"
                )
            version = int(data["format"])
            if version > FORMAT_VERSION:
                raise LogError(
                    f"{path}: log format {version} is newer than this sim "
                    f"(reads up to {FORMAT_VERSION}); upgrade sim"
                )
        data = _migrate(data, version, path, number)
        try:
            records.append(parse_record(data))
        except ValidationError as exc:
            raise _invalid(path, number, data.get("type"), exc) from None
    if version is None:
        raise LogError(f"{path}: empty log (no header)")
    return records, torn


def _read_regular(path: Path) -> bytes:
    """A log file's bytes: never through a link, never blocking on a FIFO (a world folder is
    untrusted input)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read()
    finally:
        os.close(fd)


def read_log(path: Path) -> TickLog:
    """Read one tick log: the one reader of the format.

    Raises:
        LogError: the file is missing, malformed, or of an unknown format.
    """
    try:
        data = _read_regular(path)
    except OSError as exc:
        raise LogError(f"{path}: cannot read the tick log: {exc.strerror}") from None
    records, torn = parse_records(data.splitlines(keepends=True), path)
    head = records[0]
    assert isinstance(head, HeaderRecord)  # parse_records checks the first record
    log = TickLog(path, head.tick, head, torn=torn, records=records)
    for record in records[1:]:
        if isinstance(record, StateRecord):
            log.state_before = record
        elif record.type == "instructions":
            log.instructions[record.digest] = record.text
        elif isinstance(record, CallRecord):
            log.calls.pop(record.request_id, None)
            log.calls[record.request_id] = record
            log.call_records.append(record)
        elif isinstance(record, PhaseRecord):
            log.phases[record.name] = record
        elif isinstance(record, BatchRecord):
            log.batches.append(record)
        elif isinstance(record, UsageRecord):
            log.usage = record
        elif isinstance(record, CommitRecord):
            log.commit = record
        elif isinstance(record, PolicyRecord):
            log.decisions.append(record)
        elif record.type == "resume":
            log.resumes += 1
    return log


def read_logs(root: Path, folder: str = LOG_DIR) -> tuple[list[TickLog], list[LogError]]:
    """Every readable log of a world (in ``folder``), and a problem for each one that is not."""
    logs: list[TickLog] = []
    problems: list[LogError] = []
    for _, path in list_logs(root, folder):
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
        try:
            record = CommitRecord.model_validate_json(_read_regular(marker))
        except (OSError, ValidationError) as exc:
            # the world files of that tick committed; only the log's copy of the record is
            # lost, so the marker is set aside (never applied, never a traceback)
            logger.warning("%s: unreadable commit marker set aside (%s)", marker, exc)
            os.replace(marker, marker.with_name(marker.name + ".bad"))
            continue
        path = log_path(root, record.tick)
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
                done.append(record.tick)
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


__all__ = [
    "ABANDONED_DIR",
    "FORMAT_VERSION",
    "INTERVENTIONS",
    "LOG_DIR",
    "MIGRATIONS",
    "STATE_KINDS",
    "STORE_DIR",
    "LogError",
    "LogWriter",
    "RawRecord",
    "TickLog",
    "header",
    "is_state_file",
    "list_logs",
    "log_path",
    "log_rel",
    "marker_rel",
    "pack_state",
    "parse_records",
    "prune",
    "read_log",
    "read_logs",
    "read_state",
    "read_store",
    "recover_logs",
    "state_digest",
    "unpack_state",
]
