"""The tick log: one append-only JSONL file per tick inside the world folder.

``.sim/log/tick-000004.jsonl`` is tick 4's log (the tick that takes ``world.json``'s
``tick`` from 3 to 4). Every line is one JSON object with a ``type``; the first is a
``header`` carrying the format version (a log is created with its header and state
already in it, by rename, so a crash never leaves a header-less log). Record types, in the
order a tick writes them:

- ``header``: tick, format version, the config used (no secrets), world seed;
- ``state_before``: the state at the start of the tick (entity files, ``world.json`` and
  the response store) as a JSON object of their text by path (``encoding: "object"``),
  with its digest;
- ``intervention``: each ``sim inject`` / ``sim set`` made since the last tick, which this
  tick applies (the pending file, ``.sim/interventions.json``, is part of the state);
- ``instructions``: an instructions text, once per distinct digest, before its first call;
- ``call``: one completed LLM call (see ``sim.ticklog.recorder``), appended as soon as it finishes;
- ``phase``: a phase's results and report (fallbacks, errors, warnings), at its end;
- ``resume``: the tick was interrupted and is being resumed (attempt number);
- ``policy``: a policy decision that was not "allow" (deny, defer, ask), before its call;
- ``usage``: totals for the tick;
- ``commit``: the digest of the state after the tick; present iff the tick committed;
- ``compacted``: ``sim log --compact`` dropped the tick's ``call`` and ``instructions``
  records (its summary keeps the numbers; the tick can no longer be replayed).

Durability: call records are flushed as they are written and the file is fsynced at the
end of every phase. A running tick's log stays plain JSONL, so a ``kill -9`` loses nothing;
once the tick has committed the log is compressed into ``tick-000004.jsonl.zst`` (one
Zstandard frame, ``[history] compress_level``, so ``zstdcat`` reads it) by
``compress_log``. What can be rebuilt exactly is left out of a call's line, by the
recorder as it writes it (``LogWriter.append_call``) and by ``compress_log`` in a line
written otherwise: a call's final raw answer when it is byte for byte the compact JSON of
its validated ``result`` (written as ``{"derived": "result"}`` and restored on read), and
a call's ``digest`` when its own fields give it (``{"derived": "request"}``). The state
snapshot is a plain JSON object, so the one compression covers it and one parse reads it;
compression takes the snapshot and the packed call lines as they are, unparsed. Earlier
sims wrote the running log's snapshot zlib-compressed and base64-encoded (``encoding:
"zlib+base64"``) and stored the object as JSON text in a string in compressed logs
(``encoding: "json"``): both still read.

The compressed layout: the header, then a ``layout`` line (``{"type": "layout", "lines":
N, "detail": [...], "state": [...]}``: how many lines follow it, and the indices, in the
order the tick wrote them, of the call detail and of the state snapshot), then the tick's
other records in order (interventions, phases, usage, commit), then the state snapshot,
then the call detail (``call`` and ``instructions`` records). ``read_log(path,
calls=False, state=False)`` (the report, for most ticks) decompresses only up to the
snapshot, ``calls=False`` up to the end of the snapshot, and a full read restores the
order the tick wrote. Still read as before: plain logs (older sims, or a tick that
committed just before a crash) and gzip logs of earlier sims (``tick-000004.jsonl.gz``,
whose ``layout`` line has no ``state``: their snapshot is second, among the other
records); ``sim log --compact`` rewrites those in the current form.

The ``commit`` record is made atomic with the tick's commit by a small marker file
(``tick-000004.commit.json``) written through ``Storage.commit``'s journal; ``recover_logs``
copies a marker's record into its log and removes the marker, so after a
crash at any instant world files, response store and log agree.

Records are typed (``sim.ticklog.records``): ``read_log`` is the one reader, and every
view (``sim log``, ``sim usage``, the report, replay, rewind, tune) goes through it. A
format change is a numbered migration in ``MIGRATIONS`` (records of version k are upgraded
to k+1 on read, as JSON objects, before they are validated); a log the engine cannot read
raises ``LogError`` naming the file, the line and the field.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import errno
import gzip
import logging
import os
import re
import stat
import sys
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson
from pydantic import ValidationError

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # the standard library's module, for the Pythons before it
    from backports import zstd

from sim import safefs
from sim.errors import LogError
from sim.llm.calls import digest
from sim.ticklog.records import (
    BatchRecord,
    CallRecord,
    CommitRecord,
    CompactedRecord,
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


#: the suffix of a committed, compressed log (``tick-000004.jsonl.zst``: Zstandard)
ZST = ".zst"
#: the suffix of a log compressed by earlier sims (gzip): still read, no longer written
GZ = ".gz"
#: the suffixes of a compressed log, the one written first
PACKED = (ZST, GZ)
#: default Zstandard level of committed logs (``[history] compress_level``; 0 keeps them
#: plain): level 3 compresses a log ~8x faster than gzip level 6 did, and smaller
COMPRESS_LEVEL = 3
#: a committed log's final raw answer that is the compact JSON of its ``result``
DERIVED_RAW = {"derived": "result"}
#: a committed log's call digest that its own fields give (``request_digest``)
DERIVED_DIGEST = {"derived": "request"}
#: a tick log's name: ``tick-NNNNNN.jsonl``, ``.jsonl.gz``, or ``tick-NNNNNN.k.jsonl`` when
#: set aside into ``abandoned/``
_LOG_NAME = re.compile(r"tick-([0-9]{6,})(?:\.[0-9]+)?\.jsonl(?:\.gz|\.zst)?")
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: the call detail: the lines a compressed log keeps last and ``read_log(path, calls=False)``
#: leaves unread
_CALL_DETAIL = (b'{"type":"call"', b'{"type":"instructions"')
#: a compressed log's second line: where its call-detail lines were (``_order``)
_LAYOUT = b'{"type":"layout"'
_STATE = b'{"type":"state_before"'


def log_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.jsonl"


def marker_rel(tick: int) -> str:
    return f"{LOG_DIR}/tick-{tick:06d}.commit.json"


def summary_rel(tick: int) -> str:
    """A committed tick's summary (``sim.ticklog.summary``), written after its commit."""
    return f"{LOG_DIR}/tick-{tick:06d}.summary.jsonl.gz"


def log_path(root: Path, tick: int) -> Path:
    """Where tick ``tick``'s log is written while it runs (the plain JSONL file)."""
    return root / log_rel(tick)


def packed_path(path: Path) -> Path:
    """The compressed form of a plain log's path (``.jsonl.zst``)."""
    return path.with_name(path.name + ZST)


def gz_path(path: Path) -> Path:
    """The path an earlier sim compressed a plain log to (``.jsonl.gz``)."""
    return path.with_name(path.name + GZ)


def _on_disk(path: Path) -> Path:
    """``path``, or when it names a plain log that is no longer there, its compressed form
    (``.zst``, else an earlier sim's ``.gz``) if that is there."""
    if path.name.endswith(PACKED) or os.path.lexists(path):
        return path
    for suffix in PACKED:
        packed = path.with_name(path.name + suffix)
        if os.path.lexists(packed):
            return packed
    return path


def log_file(root: Path, tick: int) -> Path:
    """Tick ``tick``'s log as it is on disk: compressed once committed, else plain.

    A missing log gives the plain path (whose absence the caller reports).
    """
    plain = log_path(root, tick)
    for suffix in PACKED:
        packed = plain.with_name(plain.name + suffix)
        if packed.is_file():
            return packed
    return plain


def list_logs(root: Path, folder: str = LOG_DIR) -> list[tuple[int, Path]]:
    """(tick, path) of every tick log in ``folder`` of the world, oldest first.

    Logs set aside into ``abandoned/`` are named ``tick-NNNNNN.k.jsonl``; they are listed
    too when ``folder`` is that folder (their calls were sent: ``sim usage`` counts them).
    A log present both plain and compressed (a crash after compressing it) is listed once,
    compressed: a compressed log is only renamed into place complete (``.zst`` before an
    earlier sim's ``.gz``, which ``sim log --compact`` rewrote).
    """
    where = root / folder
    found: dict[str, tuple[int, int, Path]] = {}
    if not where.is_dir():
        return []
    for path in where.glob("tick-*.jsonl*"):
        match = _LOG_NAME.fullmatch(path.name)
        if match is None:
            continue
        stem = path.name.removesuffix(ZST).removesuffix(GZ)
        rank = 0 if path.name.endswith(ZST) else 1 if path.name.endswith(GZ) else 2
        if stem in found and found[stem][1] <= rank:
            continue
        found[stem] = (int(match.group(1)), rank, path)
    return sorted((tick, path) for tick, _, path in found.values())


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
    pending = safefs.read_optional(root, INTERVENTIONS)  # no link on the way is followed
    if pending is not None:
        files[INTERVENTIONS] = pending
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
    """The digest of a state: its files by relative path (``digests_state`` of theirs)."""
    return digests_state({rel: digest(data) for rel, data in files.items()})


def digests_state(digests: Mapping[str, str]) -> str:
    """``state_digest`` of files given by each one's ``digest``."""
    hasher = bytearray()
    for rel in sorted(digests):
        hasher += rel.encode() + b"\x00" + digests[rel].encode() + b"\n"
    return digest(bytes(hasher))


def _state_payload(files: Mapping[str, bytes]) -> dict[str, str]:
    return {rel: files[rel].decode("utf-8") for rel in sorted(files)}


def pack_state(
    files: Mapping[str, bytes], digest_: str | None = None, *, encoding: str = "object"
) -> StateRecord:
    """The ``state_before`` record of ``files`` (``digest_``: their ``state_digest``, when
    the caller has it already: hashing a big world's files costs), in the ``object``
    encoding a tick writes, or the ``zlib+base64`` one earlier sims wrote."""
    payload = _state_payload(files)
    found = state_digest(files) if digest_ is None else digest_
    if encoding == "object":
        return StateRecord(encoding="object", digest=found, files=len(files), data=payload)
    if encoding != "zlib+base64":
        raise ValueError(f"unknown state encoding {encoding!r}")
    data = base64.b64encode(zlib.compress(orjson.dumps(payload), 1)).decode("ascii")
    return StateRecord(encoding="zlib+base64", digest=found, files=len(files), data=data)


def state_line(files: Mapping[str, bytes], digest_: str) -> list[bytes]:
    """``pack_state(files, digest_)``'s log line (without the newline), in pieces: the
    same bytes as ``dump_record`` gives, without a typed copy of a big world's text or the
    line joined into one more copy of it."""
    head = {"type": "state_before", "encoding": "object", "digest": digest_, "files": len(files)}
    return [orjson.dumps(head)[:-1], b',"data":', orjson.dumps(_state_payload(files)), b"}"]


def log_line(record: LogRecord) -> bytes:
    """A record as a running tick's log holds it (without the newline): a call record
    packed (``packed_call_line``), any other as ``dump_record`` gives it."""
    if isinstance(record, CallRecord):
        return packed_call_line(record)
    return dump_record(record)


def unpack_state(record: StateRecord) -> dict[str, bytes]:
    """The files of a state snapshot: ``zlib+base64`` as a running tick writes it,
    ``object`` (path -> text, parsed with its line) once the log is compressed as a
    whole, ``json`` (that object as JSON text) in logs compressed by earlier sims."""
    data = record.data
    if record.encoding == "object" and isinstance(data, dict):
        return {rel: text.encode("utf-8") for rel, text in data.items()}
    if record.encoding == "zlib+base64" and isinstance(data, str):
        payload = orjson.loads(zlib.decompress(base64.b64decode(data)))
    elif record.encoding == "json" and isinstance(data, str):
        payload = orjson.loads(data)
    else:
        raise ValueError(f"unknown state encoding {record.encoding!r}")
    return {rel: text.encode("utf-8") for rel, text in payload.items()}


# -- writing --------------------------------------------------------------------------------


class LogWriter:
    """Appends records to one log file; a torn last line (a crash mid-write) is cut off first.

    Args:
        path: the log file (created with its folder if missing).
    """

    def __init__(self, path: Path, *, whole: bool = False) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if not whole:  # ``whole``: just written whole, by ``create``
            _cut_torn_tail(path)
        # never through a link planted in the world's .sim/log folder
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        self._handle = os.fdopen(fd, "ab")

    @classmethod
    def create(cls, path: Path, first: Iterable[LogRecord | list[bytes]]) -> LogWriter:
        """Start a new log that appears with its ``first`` records already in it (a record,
        or a line's bytes in pieces: ``state_line``).

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
            for item in first:
                for piece in item if isinstance(item, list) else (log_line(item),):
                    handle.write(piece)
                handle.write(b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return cls(path, whole=True)

    def append(self, record: LogRecord) -> None:
        """Write one record and hand it to the OS (it survives the process being killed)."""
        self._handle.write(dump_record(record) + b"\n")
        self._handle.flush()

    def append_call(self, record: CallRecord) -> None:
        """``append`` for a call record the recorder made, packed (``packed_call_line``
        with ``own_digest``): a running tick's log is then as compact as a compressed one
        before compression, and compressing it does not parse its calls again."""
        self._handle.write(packed_call_line(record, own_digest=True) + b"\n")
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
    """Cut a last line without its newline (a crash mid-write) off the log, reading back
    from the end only as far as the line before it (a log's first lines are large)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        end = os.fstat(fd).st_size
        if end == 0 or os.pread(fd, 1, end - 1) == b"\n":
            return
        at = end
        while at > 0:
            start = max(0, at - _TAIL_STEP)
            found = os.pread(fd, at - start, start).rfind(b"\n")
            if found >= 0:
                os.ftruncate(fd, start + found + 1)
                return
            at = start
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


#: how far ``_cut_torn_tail`` reads back at a time
_TAIL_STEP = 1 << 16


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
    #: ``sim log --compact`` dropped the call detail (the tick cannot be replayed)
    compacted: CompactedRecord | None = None
    #: ``False``: read without its call records (``read_log(path, calls=False)``)
    calls_read: bool = True

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

    def written_records(self) -> list[LogRecord]:
        """The records as the running tick wrote them (``log_line`` gives each line's
        bytes): a state snapshot an earlier sim stored otherwise back in the ``object``
        encoding, every other record as read (derived fields restored)."""
        return [
            pack_state(unpack_state(r), r.digest)
            if isinstance(r, StateRecord) and r.encoding != "object"
            else r
            for r in self.records
        ]

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
        if data["type"] == "call":
            _restore_derived(data)
        try:
            records.append(parse_record(data))
        except ValidationError as exc:
            raise _invalid(path, number, data.get("type"), exc) from None
    if version is None:
        raise LogError(f"{path}: empty log (no header)")
    return records, torn


def request_digest(call: RawRecord) -> str:
    """A call's digest from the fields it is taken over (``sim.llm.calls.CallIdentity``)."""
    history = call.get("history")
    fields = {
        "instructions": call.get("instructions_digest", ""),
        "input": call.get("input", ""),
        "schema": call.get("schema_digest", ""),
        "model": call.get("model", ""),
        "settings": call.get("settings", {}),
        "history": [
            *(history if isinstance(history, list) else []),
            call.get("previous_response_id"),
        ],
    }
    return digest(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))


def _restore_derived(call: RawRecord) -> None:
    """Put back what a compressed log left out because it can be rebuilt exactly: the
    final raw answer (``DERIVED_RAW``) and the request digest (``DERIVED_DIGEST``)."""
    if call.get("digest") == DERIVED_DIGEST:
        call["digest"] = request_digest(call)
    attempts = call.get("attempts")
    if not isinstance(attempts, list) or not attempts or not isinstance(attempts[-1], dict):
        return
    if attempts[-1].get("raw") == DERIVED_RAW:
        attempts[-1]["raw"] = orjson.dumps(call.get("result")).decode()


def _pack_raw(call: RawRecord) -> bool:
    """Leave out the final raw answer of ``call`` (a call record's JSON object) when it is
    byte for byte the compact JSON of its ``result``; whether it did."""
    attempts = call.get("attempts")
    result = call.get("result")
    if attempts and isinstance(result, dict):
        raw = attempts[-1].get("raw")
        if isinstance(raw, str) and raw.encode() == orjson.dumps(result):
            attempts[-1]["raw"] = DERIVED_RAW
            return True
    return False


def packed_call_line(record: CallRecord, *, own_digest: bool = False) -> bytes:
    """A call record's line packed as a compressed log holds it (``compress_log`` then
    takes the line as it is, unparsed): its final raw answer and its digest left out when
    they can be rebuilt exactly.

    ``own_digest``: the caller made the record's digest from the very fields
    ``request_digest`` reads (the recorder: ``CallIdentity.digest``), so it is left out
    without computing it again.
    """
    data = record_data(record)
    _pack_raw(data)
    found = data.get("digest")
    if isinstance(found, str) and (own_digest or found == request_digest(data)):
        data["digest"] = DERIVED_DIGEST
    return orjson.dumps(data)


#: a call line written packed (``packed_call_line``): ``_pack_line`` leaves it as it is
_PACKED_CALL = b'"digest":{"derived":"request"}'
#: a state snapshot already in the compressed log's encoding
_OBJECT_STATE = b'{"type":"state_before","encoding":"object"'


def _pack_line(line: bytes) -> bytes:
    """One line of a committed log as its compressed log holds it (see the module doc)."""
    if line.startswith(b'{"type":"call"'):
        if _PACKED_CALL in line:
            # packed when written: parsing and packing it again gives the same bytes
            return line
        data = orjson.loads(line)
        changed = _pack_raw(data)
        if isinstance(data.get("digest"), str) and data["digest"] == request_digest(data):
            data["digest"] = DERIVED_DIGEST
            changed = True
        return orjson.dumps(data) if changed else line
    if line.startswith(_OBJECT_STATE):
        return line
    if line.startswith(b'{"type":"state_before"'):
        data = orjson.loads(line)
        if data.get("encoding") == "zlib+base64":
            data["encoding"] = "object"
            data["data"] = orjson.loads(zlib.decompress(base64.b64decode(data["data"])))
            return orjson.dumps(data)
    return line


def compress_log(path: Path, level: int = COMPRESS_LEVEL) -> Path:
    """Replace a committed plain log by its compressed form; returns the new path.

    The ``.gz`` is written beside it, fsynced and renamed into place before the plain log
    is removed, so a crash leaves one of them complete (``list_logs`` prefers the ``.gz``;
    ``recover_logs`` removes a plain log left beside one). Reading it back gives the same
    records (a state snapshot in its ``json`` encoding).

    The log is streamed from the file (read more than once, one line at a time) and
    compressed as it goes: a 100,000-character tick's log is gigabytes of JSON, never held
    in memory. ``path`` may also be an earlier sim's ``.gz`` log (``sim log --compact``):
    it is rewritten in the current form and layout (read whole: it was written whole).
    """
    if path.name.endswith(GZ):
        kept = [line for line in read_log_bytes(path).splitlines() if line.strip()]
        plain = path.with_name(path.name.removesuffix(GZ))
        target = _write_packed(packed_path(plain), _ListLines(kept), level)
        path.unlink()
        return target
    with _open_regular(path) as handle:
        target = _write_packed(packed_path(path), _FileLines(handle), level)
    path.unlink()
    return target


class _Lines(Protocol):
    """What ``_write_packed`` compresses: a log's non-blank lines (without newlines),
    scanned once in order (for each line its start at least: what it is), then picked by
    index (0: the header) in the stored order."""

    def scan(self) -> Iterator[bytes]: ...

    def pick(self, indices: Iterable[int]) -> Iterator[bytes | _Pieces]: ...


@dataclass
class _ListLines:
    """Lines held in memory."""

    lines: list[bytes]

    def scan(self) -> Iterator[bytes]:
        return iter(self.lines)

    def pick(self, indices: Iterable[int]) -> Iterator[bytes | _Pieces]:
        return (self.lines[i] for i in indices)


@dataclass
class _FileLines:
    """A plain log's lines on disk: the scan notes where each starts and how long it is,
    so the lines are then read again once each (seeks within the reader's buffer cost no
    system call), never the whole file once per group of lines. A line longer than
    ``_CHUNK`` (a big world's state snapshot: hundreds of megabytes) is scanned a chunk
    at a time, and its start is what the scan gives of it; a state snapshot of that size
    already in the compressed form (``encoding: "object"``) is then picked as its chunks
    (``_Pieces``), never read whole."""

    handle: BinaryIO
    #: lines that follow the file's (``LogCompression``: the commit record to come)
    tail: list[bytes] = field(default_factory=list)
    #: read the file only this far (``None``: to its end)
    end: int | None = None
    #: per line: where it starts, its length without the newline, whether it goes as pieces
    spans: list[tuple[int, int, bool]] = field(default_factory=list)

    def scan(self) -> Iterator[bytes]:
        self.spans.clear()
        at = 0
        handle_readline = self.handle.readline
        end = self.end

        def readline() -> bytes:
            return handle_readline(_CHUNK if end is None else min(_CHUNK, end - at))

        self.handle.seek(0)
        while True:
            raw = readline() if end is None or at < end else b""
            start, at = at, at + len(raw)
            head = raw
            while raw and not raw.endswith(b"\n"):
                raw = readline() if end is None or at < end else b""
                at += len(raw)
            if not raw.endswith(b"\n"):
                break  # the end; a torn tail was never part of the log
            if head.strip():
                long = head is not raw
                self.spans.append((start, at - start - 1, long and head.startswith(_OBJECT_STATE)))
                yield head if long else head[:-1]
        yield from self.tail

    def pick(self, indices: Iterable[int]) -> Iterator[bytes | _Pieces]:
        seek, read, spans = self.handle.seek, self.handle.read, self.spans
        for i in indices:
            if i >= len(spans):
                yield self.tail[i - len(spans)]
                continue
            start, length, pieces = spans[i]
            seek(start)
            if pieces:
                yield _Pieces(read, length)  # read as it is written, before the next line
            else:
                yield read(length)  # the line without its newline, in one piece


@dataclass
class _Pieces:
    """A line too long to hold whole that goes into the compressed log as it is: its
    ``length`` bytes from ``read``, a chunk at a time."""

    read: Callable[[int], bytes]
    length: int

    def __iter__(self) -> Iterator[bytes]:
        left = self.length
        while left > 0:
            chunk = self.read(min(left, _CHUNK))
            if not chunk:
                raise OSError(errno.EIO, "the log got shorter while it was being compressed")
            left -= len(chunk)
            yield chunk


def _detail_last(lines: list[bytes]) -> list[bytes]:
    """A committed log's lines (without newlines) as its compressed form orders them: the
    header, a ``layout`` line saying where the moved lines were, the other records in
    order, then the state snapshot, then the call detail. Reading the tick without its
    calls (the report, ``sim log --tick N``, rewind) then stops decompressing at the
    snapshot, or just after it when the state is wanted."""
    lines = [line for line in lines if line.strip()]
    rest = lines[1:]
    detail = [i for i, line in enumerate(rest) if line.startswith(_CALL_DETAIL)]
    late = [i for i, line in enumerate(rest) if line.startswith(_STATE)]
    if not detail and not late:
        return lines
    moved = set(detail) | set(late)
    front = [line for i, line in enumerate(rest) if i not in moved]
    return [
        lines[0],
        _layout_line(len(rest), detail, late),
        *front,
        *(rest[i] for i in late),
        *(rest[i] for i in detail),
    ]


def _layout_line(total: int, detail: list[int], late: list[int]) -> bytes:
    """A compressed log's second line: how many lines follow it and, by their index in the
    order the tick wrote them, which were moved behind the others: ``state`` (its state
    snapshot, first) and ``detail`` (its call detail, last). A log compressed before
    ``state`` was moved has no ``state`` key: its snapshot is among the others."""
    return orjson.dumps({"type": "layout", "lines": total, "detail": detail, "state": late})


@dataclass(frozen=True)
class _Layout:
    """A ``layout`` line read: ``total`` lines follow it; ``detail`` and ``state`` are the
    indices (in the order written) of the lines moved to the end, state before detail."""

    total: int
    detail: list[int]
    state: list[int]

    @property
    def front(self) -> int:
        """How many lines come before the moved ones."""
        return self.total - len(self.detail) - len(self.state)


def _indices(value: object, total: int) -> bool:
    """``value`` is a strictly increasing list of line indices below ``total``."""
    # checked by C loops: a layout lists every call of a big tick
    return (
        isinstance(value, list)
        and set(map(type, value)) <= {int}
        and value == sorted(set(value))
        and (not value or (value[0] >= 0 and value[-1] < total))
    )


def _layout(line: bytes, path: Path) -> _Layout:
    """A ``layout`` line, checked against what it may say."""
    try:
        data = orjson.loads(line)
        total, detail, state = data["lines"], data["detail"], data.get("state", [])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise LogError(f"{path}: line 2: not a valid layout record") from None
    if (
        not isinstance(total, int)
        or not _indices(detail, total)
        or not _indices(state, total)
        or set(detail) & set(state)
    ):
        raise LogError(f"{path}: line 2: the layout record does not fit the log")
    return _Layout(total, detail, state)


def _in_order(
    lines: list[bytes], path: Path, complete: bool = True, layout: _Layout | None = None
) -> list[bytes]:
    """A compressed log's lines in the order the tick wrote them (undoes ``_detail_last``).

    ``complete=False``: ``lines`` are only the first ones of the log (at least up to its
    moved lines); what was not read is left out. ``layout``: its layout line, if read.
    """
    if len(lines) < 2 or not lines[1].startswith(_LAYOUT):
        return lines
    if layout is None:
        layout = _layout(lines[1], path)
    rest = lines[2:]
    short = len(rest) < layout.front if not complete else len(rest) != layout.total
    if short:
        raise LogError(f"{path}: the log has {len(rest)} lines, its layout says {layout.total}")
    moved = [*layout.state, *layout.detail]
    if not complete and not layout.state:
        return [lines[0], *rest[: layout.front]]  # the front lines are in order already
    # each line read at the index the tick wrote it at (C loops: a big tick's log is
    # hundreds of thousands of lines)
    front_at = sorted(set(range(layout.total)).difference(moved))
    placed = [
        *zip(front_at, rest[: layout.front], strict=True),
        *zip(moved, rest[layout.front :], strict=False),  # only those read
    ]
    placed.sort(key=itemgetter(0))
    return [lines[0], *(line for _, line in placed)]


def write_compressed(target: Path, lines: Iterable[bytes], level: int = COMPRESS_LEVEL) -> Path:
    """Write a compressed log from its JSONL lines (packed as the module doc says),
    atomically: to ``<name>.tmp``, fsynced, renamed over ``target``."""
    kept = [line for line in lines if line.strip()]
    return _write_packed(target, _ListLines(kept), level)


#: how much packed text ``_write_packed`` gathers before handing it to the compressor
_CHUNK = 1 << 20
#: a state snapshot line as ``pack_state`` writes it (``_packed_state`` streams its packing)
_STATE_LINE = re.compile(
    rb'\{"type":"state_before","encoding":"zlib\+base64","digest":("(?:[^"\\]|\\.)*"),'
    rb'"files":(-?[0-9]+),"data":"([A-Za-z0-9+/=]*)"\}'
)


def _packed_state(line: bytes) -> Iterator[bytes] | None:
    """``_pack_line`` of a state snapshot, in pieces: its JSON text (hundreds of megabytes
    for a big world) is inflated, decoded and escaped a chunk at a time, never whole.
    ``None`` for a line of another shape (``_pack_line`` packs it)."""
    match = _STATE_LINE.fullmatch(line)
    if match is None:
        return None

    def pieces() -> Iterator[bytes]:
        yield (
            b'{"type":"state_before","encoding":"object","digest":'
            + match[1]
            + b',"files":'
            + match[2]
            + b',"data":'
        )
        start, end = match.span(3)
        encoded = memoryview(line)[start:end]
        inflater = zlib.decompressobj()
        text = codecs.getincrementaldecoder("utf-8")()  # checked, as ``_pack_line`` does
        step = _CHUNK // 8  # a multiple of 4: each piece of base64 decodes alone
        # the payload is the compact JSON object ``pack_state`` made: it goes in as it is
        # (what ``_pack_line`` gives by parsing and writing it again, without doing so)
        first = True
        for at in range(0, len(encoded), step):
            out = inflater.decompress(base64.b64decode(encoded[at : at + step]))
            if first and out:
                if not out.startswith(b"{"):
                    raise zlib.error("the state snapshot is not a JSON object")
                first = False
            yield _one_line(out, text)
        out = inflater.flush()
        if not inflater.eof:
            raise zlib.error("incomplete or truncated stream")
        yield _one_line(out, text, final=True)
        yield b"}"

    return pieces()


def _one_line(piece: bytes, text: codecs.IncrementalDecoder, final: bool = False) -> bytes:
    """A piece of a state snapshot's JSON, checked to be UTF-8 and to keep its line one
    line (compact JSON has no raw newline)."""
    text.decode(piece, final=final)
    if b"\n" in piece:
        raise zlib.error("the state snapshot is not compact JSON")
    return piece


def _write_packed(target: Path, lines: _Lines, level: int) -> Path:
    """``write_compressed`` over a source scanned for the ``layout`` line (where the state
    snapshot and the call detail are), then read line by line in the order
    ``_detail_last`` gives, each packed and compressed (``_pack_into``)."""
    tmp = _tmp_of(target)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    _pack_into(tmp, lines, level)
    os.replace(tmp, target)
    _fsync_dir(target.parent)
    return target


def _tmp_of(target: Path) -> Path:
    return target.with_name(target.name + ".tmp")


class _Stopped(Exception):
    """``_pack_into`` was told to stop (``LogCompression.cancel``)."""


def _pack_into(tmp: Path, lines: _Lines, level: int, stop: threading.Event | None = None) -> None:
    """Write ``lines`` packed and compressed into the new file ``tmp`` and fsync it; on
    any error, or when ``stop`` is set (checked line by line: ``_Stopped``), ``tmp`` is
    removed.

    One Zstandard frame, fed a megabyte at a time: the same log always compresses to the
    same bytes (no time, no threads inside the compressor).
    """
    any_line = False
    total = 0
    detail: list[int] = []
    late: list[int] = []
    for i, line in enumerate(lines.scan()):
        any_line = True
        if i > 0:
            if line.startswith(_CALL_DETAIL):
                detail.append(total)
            elif line.startswith(_STATE):
                late.append(total)
            total += 1
    first = next(iter(lines.pick([0]))) if any_line else b""
    assert isinstance(first, bytes)  # a header is never a snapshot
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle, ThreadPoolExecutor(1) as worker:
            packer = zstd.ZstdCompressor(level)
            buffer = bytearray()
            # the compressor lets go of the GIL: one thread compresses (in order) while this
            # one packs the next lines; at most two chunks wait, so memory stays bounded
            waiting: deque[Future[int]] = deque()

            def send() -> None:
                if len(waiting) >= 2:
                    waiting.popleft().result()
                chunk = bytes(buffer)
                waiting.append(worker.submit(lambda: handle.write(packer.compress(chunk))))
                buffer.clear()

            def put(line: bytes | _Pieces) -> None:
                if stop is not None and stop.is_set():
                    raise _Stopped
                if isinstance(line, _Pieces):
                    pieces: Iterable[bytes] = line  # packed already (``_FileLines``)
                else:
                    state = _packed_state(line) if line.startswith(_STATE) else None
                    pieces = state if state is not None else (_pack_line(line),)
                for piece in pieces:
                    view = memoryview(piece)  # a big world's snapshot line: hundreds of MB
                    for at in range(0, len(view), _CHUNK):
                        buffer.extend(view[at : at + _CHUNK])
                        if len(buffer) >= _CHUNK:
                            send()
                buffer.extend(b"\n")

            if total or first:
                put(first)
            if detail or late:
                put(_layout_line(total, detail, late))
                # the other lines in order, then the state snapshot, then the call detail
                # (``_detail_last``)
                moved = set(detail).union(late)
                front = [i + 1 for i in range(total) if i not in moved]
                for group in (front, [i + 1 for i in late], [i + 1 for i in detail]):
                    for picked in lines.pick(group):
                        put(picked)
            else:
                for picked in lines.pick(range(1, total + 1)):
                    put(picked)
            while waiting:
                waiting.popleft().result()
            handle.write(packer.compress(buffer))
            handle.write(packer.flush())
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a log that cannot be packed stays plain, nothing beside it
        raise


class LogCompression:
    """``compress_log`` of a running tick's plain log, done in a thread while the tick's
    files are committed: started once the log holds every record but the ``commit`` one
    (given as ``tail``, the line the log will end with), finished after the commit.

    The thread reads the log only as far as it reached when it started, and writes
    ``<name>.zst.tmp``; ``finish`` renames that into place and removes the plain log, once
    the log has its commit record (a ``.zst`` exists only for a committed tick), and
    ``cancel`` removes it. Compressing holds a few megabytes (``_pack_into``), so it can
    run beside the world; the commit's writes mostly wait on the disk, which leaves the
    interpreter to this thread.
    """

    def __init__(self, path: Path, level: int, tail: Sequence[bytes]) -> None:
        self.path = path
        self.target = packed_path(path)
        self._tmp = _tmp_of(self.target)
        self._level = level
        self._tail = list(tail)
        self._error: BaseException | None = None
        self._stop = threading.Event()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()
        self._thread = threading.Thread(target=self._run, name="sim-log-compression")
        self._thread.start()

    def _run(self) -> None:
        try:
            with _open_regular(self.path) as handle:
                end = os.fstat(handle.fileno()).st_size
                lines = _FileLines(handle, tail=self._tail, end=end)
                _pack_into(self._tmp, lines, self._level, self._stop)
        except BaseException as exc:  # handed to the caller by ``finish``
            self._error = exc

    def finish(self) -> Path:
        """Wait for the compressed log and put it in place of the plain one (which must
        end with the ``tail`` by now); raises what the compression raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        os.replace(self._tmp, self.target)
        _fsync_dir(self.target.parent)
        self.path.unlink()
        return self.target

    def cancel(self) -> None:
        """The tick did not commit: the compression stops at its next line, its copy
        goes, the plain log stays."""
        self._stop.set()
        self._thread.join()
        self._tmp.unlink(missing_ok=True)


def _open_regular(path: Path) -> BinaryIO:
    """A log file opened for reading: never through a link, never blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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


def read_log_bytes(path: Path) -> bytes:
    """A log file's JSONL bytes, decompressed if it is a compressed log.

    ``path`` may name the plain log of a tick whose log is now compressed.

    Raises:
        LogError: the file is missing, unreadable, or a damaged compressed log.
    """
    path = _on_disk(path)
    try:
        data = _read_regular(path)
    except OSError as exc:
        raise LogError(f"{path}: cannot read the tick log: {exc.strerror}") from None
    if data.startswith((_ZSTD_MAGIC, _GZIP_MAGIC)):
        try:
            data = zstd.decompress(data) if data.startswith(_ZSTD_MAGIC) else gzip.decompress(data)
        except (OSError, EOFError, zlib.error, zstd.ZstdError) as exc:
            raise LogError(f"{path}: damaged compressed tick log ({exc})") from None
        if data.startswith(_LAYOUT, data.find(b"\n") + 1):
            data = b"".join(_in_order(data.splitlines(keepends=True), path))
    return data


class _Inflater(Protocol):
    """What ``_front_lines`` streams a log through: zlib's or Zstandard's decompressor."""

    def decompress(self, data: bytes, /) -> bytes: ...


def _front_lines(path: Path, state: bool) -> list[bytes]:
    """A log's lines without its call detail (and without its state snapshot unless
    ``state``), in the order written; of a compressed log only as much is decompressed as
    holds them (its ``layout`` line says how many lines come first)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LogError(f"{path}: cannot read the tick log: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise LogError(f"{path}: cannot read the tick log: not a regular file")
        magic = handle.read(4)
        if not magic.startswith((_ZSTD_MAGIC, _GZIP_MAGIC)):
            handle.seek(0)
            lines = handle.read().splitlines(keepends=True)
            return [line for line in lines if not line.startswith(_CALL_DETAIL)]
        handle.seek(0)
        inflate: _Inflater = (
            zstd.ZstdDecompressor() if magic == _ZSTD_MAGIC else zlib.decompressobj(wbits=31)
        )
        out = bytearray()
        wanted: int | None = None
        newlines = 0  # counted in each new piece only: the buffer grows to megabytes
        try:
            while chunk := handle.read(1 << 16):
                piece = inflate.decompress(chunk)
                out += piece
                newlines += piece.count(b"\n")
                if wanted is None and newlines >= 2:
                    second = bytes(out).split(b"\n", 2)[1]
                    if not second.startswith(_LAYOUT):
                        break  # no layout: read it all
                    layout = _layout(second, path)
                    # the snapshot comes right after the front lines (``_detail_last``)
                    wanted = 2 + layout.front + (len(layout.state) if state else 0)
                if wanted is not None and newlines >= wanted:
                    lines = bytes(out).splitlines(keepends=True)[:wanted]
                    return _in_order(lines, path, complete=False, layout=layout)
        except (EOFError, zlib.error, zstd.ZstdError) as exc:
            raise LogError(f"{path}: damaged compressed tick log ({exc})") from None
    lines = read_log_bytes(path).splitlines(keepends=True)
    return [line for line in lines if not line.startswith(_CALL_DETAIL)]


def read_log(path: Path, calls: bool = True, state: bool = True) -> TickLog:
    """Read one tick log, plain or compressed: the one reader of the format.

    Args:
        calls: ``False`` skips the ``call`` and ``instructions`` records unparsed (the
            report, which takes its numbers from the tick's summary); ``calls_read`` then
            says so and the log's call views are empty.
        state: ``False`` skips the state snapshot unparsed (``state_before`` is then
            ``None``): the report, when the tick's summary says where characters were.

    Raises:
        LogError: the file is missing, malformed, or of an unknown format.
    """
    path = _on_disk(path)
    lines = read_log_bytes(path).splitlines(keepends=True) if calls else _front_lines(path, state)
    if not state:
        lines = [line for line in lines if not line.startswith(_STATE)]
    records, torn = parse_records(lines, path)
    head = records[0]
    assert isinstance(head, HeaderRecord)  # parse_records checks the first record
    log = TickLog(path, head.tick, head, torn=torn, records=records, calls_read=calls)
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
        elif isinstance(record, CompactedRecord):
            log.compacted = record
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


def recover_logs(root: Path, level: int = COMPRESS_LEVEL) -> list[int]:
    """Complete the logs of ticks that committed: copy each marker's record into its log,
    and compress what a crash left plain (``level`` 0 leaves plain logs plain).

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
    _finish_compression(root, level)
    return done


def _finish_compression(root: Path, level: int) -> None:
    """What a crash between a commit and the end of ``TickRecorder.committed`` left undone:
    a plain log beside its complete ``.gz`` is removed, and the newest log, if plain and
    committed, gets its summary (rebuilt from it: one left by an earlier run of that tick
    number may be stale) and is compressed. Older plain logs (an older sim's) are left as
    they are: ``sim log --compact`` converts them."""
    folder = root / LOG_DIR
    plain: list[tuple[int, Path]] = []
    for path in folder.glob("tick-*.jsonl"):
        match = _LOG_NAME.fullmatch(path.name)
        if match is None or path.is_symlink():
            continue
        if any(path.with_name(path.name + suffix).is_file() for suffix in PACKED):
            path.unlink()
        else:
            plain.append((int(match.group(1)), path))
    listed = list_logs(root)
    if not plain or not listed or max(plain)[1] != listed[-1][1]:
        return
    tick, path = max(plain)
    from sim.ticklog.summary import summarize, write_summary  # it builds on this module

    try:
        log = read_log(path)
        if not log.committed:
            return
        write_summary(root, summarize(log, places=True))
        if level > 0:
            compress_log(path, level)
    except (LogError, OSError) as exc:  # left plain; `sim log` and `sim check` report it
        logger.warning("tick log %d left as it is: %s", tick, exc)


def prune(root: Path, current_tick: int, keep_ticks: int) -> list[Path]:
    """Delete the logs (and summaries) of ticks older than the last ``keep_ticks``
    (0 keeps all)."""
    if keep_ticks <= 0:
        return []
    removed: list[Path] = []
    for tick, path in list_logs(root):
        if tick <= current_tick - keep_ticks:
            path.unlink()
            removed.append(path)
            with contextlib.suppress(FileNotFoundError):
                (root / summary_rel(tick)).unlink()
    return removed


__all__ = [
    "ABANDONED_DIR",
    "COMPRESS_LEVEL",
    "DERIVED_DIGEST",
    "DERIVED_RAW",
    "FORMAT_VERSION",
    "GZ",
    "INTERVENTIONS",
    "LOG_DIR",
    "MIGRATIONS",
    "PACKED",
    "STATE_KINDS",
    "STORE_DIR",
    "ZST",
    "LogCompression",
    "LogError",
    "LogWriter",
    "RawRecord",
    "TickLog",
    "compress_log",
    "digests_state",
    "gz_path",
    "header",
    "is_state_file",
    "list_logs",
    "log_file",
    "log_path",
    "log_rel",
    "marker_rel",
    "pack_state",
    "packed_path",
    "parse_records",
    "prune",
    "read_log",
    "read_log_bytes",
    "read_logs",
    "read_state",
    "read_store",
    "recover_logs",
    "state_digest",
    "summary_rel",
    "unpack_state",
    "write_compressed",
]
