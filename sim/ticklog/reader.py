"""Reading tick logs: ``read_log`` is the one reader of the format.

Records are typed (``sim.ticklog.records``): ``read_log`` is the one reader, and every
view (``sim log``, ``sim usage``, the report, replay, rewind, tune) goes through it.
Records of an older format version are upgraded by ``sim.ticklog.format.MIGRATIONS``
before they are validated; a log the engine cannot read raises ``LogError`` naming the
file, the line and the field. Still read as before: plain logs (older sims, or a tick
that committed just before a crash) and gzip logs of earlier sims
(``tick-000004.jsonl.gz``).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import mmap
import os
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
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
from sim.ticklog.format import (
    FORMAT_VERSION,
    LOG_DIR,
    MIGRATIONS,
    PACKED,
    ZST,
    RawRecord,
    list_logs,
    log_rel,
    marker_rel,
    pack_state,
    restore_derived,
    unpack_state,
)
from sim.ticklog.layout import CALL_DETAIL, LAYOUT, STATE, in_order, parse_layout
from sim.ticklog.records import (
    BatchRecord,
    CallRecord,
    CommitRecord,
    CompactedRecord,
    EmbeddingRecord,
    HeaderRecord,
    LogRecord,
    PhaseRecord,
    PolicyRecord,
    ResumeRecord,
    StateRecord,
    UsageRecord,
    parse_record,
    record_data,
)

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


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
    #: every embeddings request the tick sent (all runs of it), in order
    embeddings: list[EmbeddingRecord] = field(default_factory=list)
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

    def billed(self) -> list[CallRecord | EmbeddingRecord]:
        """Every call record and embeddings request, in the order the log holds them: what
        the books and the summary count (``sim.ticklog.books``)."""
        if not self.embeddings:
            return list(self.call_records)
        return [r for r in self.records if isinstance(r, CallRecord | EmbeddingRecord)]

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
        provider (``sim.providers.replay``, below this package) answers from."""
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
            restore_derived(data)
        try:
            records.append(parse_record(data))
        except ValidationError as exc:
            raise _invalid(path, number, data.get("type"), exc) from None
    if version is None:
        raise LogError(f"{path}: empty log (no header)")
    return records, torn


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


def open_regular(path: Path) -> BinaryIO:
    """A log file opened for reading: never through a link, never blocking on a FIFO."""
    return os.fdopen(safefs.open_regular(path), "rb")


def read_regular(path: Path) -> bytes:
    """A log file's bytes: never through a link, never blocking on a FIFO (a world folder is
    untrusted input)."""
    fd = safefs.open_regular(path)
    try:
        return safefs.read_fd(fd, path)
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
        data = read_regular(path)
    except OSError as exc:
        raise LogError(f"{path}: cannot read the tick log: {exc.strerror}") from None
    if data.startswith((_ZSTD_MAGIC, _GZIP_MAGIC)):
        try:
            data = zstd.decompress(data) if data.startswith(_ZSTD_MAGIC) else gzip.decompress(data)
        except (OSError, EOFError, zlib.error, zstd.ZstdError) as exc:
            raise LogError(f"{path}: damaged compressed tick log ({exc})") from None
        if data.startswith(LAYOUT, data.find(b"\n") + 1):
            data = b"".join(in_order(data.splitlines(keepends=True), path))
    return data


class _Inflater(Protocol):
    """What ``_front_lines`` streams a log through: zlib's or Zstandard's decompressor."""

    def decompress(self, data: bytes, /) -> bytes: ...


def _front_lines(path: Path, state: bool) -> list[bytes]:
    """A log's lines without its call detail (and without its state snapshot unless
    ``state``), in the order written; of a compressed log only as much is decompressed as
    holds them (its ``layout`` line says how many lines come first)."""
    try:
        fd = safefs.open_regular(path)
    except OSError as exc:
        raise LogError(f"{path}: cannot read the tick log: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        magic = handle.read(4)
        if not magic.startswith((_ZSTD_MAGIC, _GZIP_MAGIC)):
            handle.seek(0)
            lines = handle.read().splitlines(keepends=True)
            return [line for line in lines if not line.startswith(CALL_DETAIL)]
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
                    first = out.find(b"\n") + 1
                    second = bytes(out[first : out.find(b"\n", first)])
                    if not second.startswith(LAYOUT):
                        break  # no layout: read it all
                    layout = parse_layout(second, path)
                    # the snapshot comes right after the front lines (``_detail_last``)
                    wanted = 2 + layout.front + (len(layout.state) if state else 0)
                if wanted is not None and newlines >= wanted:
                    end = 0  # past the wanted-th newline: only those lines are split
                    for _ in range(wanted):
                        end = out.find(b"\n", end) + 1
                    lines = bytes(memoryview(out)[:end]).splitlines(keepends=True)[:wanted]
                    return in_order(lines, path, complete=False, layout=layout)
        except (EOFError, zlib.error, zstd.ZstdError) as exc:
            raise LogError(f"{path}: damaged compressed tick log ({exc})") from None
    lines = read_log_bytes(path).splitlines(keepends=True)
    return [line for line in lines if not line.startswith(CALL_DETAIL)]


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
        lines = [line for line in lines if not line.startswith(STATE)]
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
        elif isinstance(record, EmbeddingRecord):
            log.embeddings.append(record)
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


def packed_damage(path: Path) -> str | None:
    """Why a compressed (``.zst``) log is not whole: truncated, or bytes after its frames;
    ``None`` when it is whole, or not a ``.zst`` log.

    Only the frames' block headers are read (the file is mapped, and the library walks
    from header to header without decompressing), so ``sim check`` can afford it for every
    log of a long history.
    """
    if not path.name.endswith(ZST):
        return None
    try:
        fd = safefs.open_regular(path)
    except OSError as exc:
        return exc.strerror if exc.errno == errno.EINVAL else f"cannot be read ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if info.st_size == 0:
            return "empty"
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                at = 0
                while at < info.st_size:
                    at += zstd.get_frame_size(view[at:])
            except zstd.ZstdError:
                return (
                    f"truncated or damaged: the Zstandard frame at byte {at} does not end "
                    f"within the file's {info.st_size} bytes"
                )
            finally:
                view.release()
    finally:
        os.close(fd)
    return None


def check_log_slot(root: Path, tick: int) -> None:
    """Refuse something that is not a regular file of its own where tick ``tick`` writes
    its log or its commit marker (a FIFO, a link, a folder, a hard link: a resumed tick
    appends to its log in place): the tick would not write there.

    Raises:
        UnsafePath: naming it, with the command that removes it.
    """
    for rel in (log_rel(tick), marker_rel(tick)):
        path = root / rel
        problem = safefs.symlink_on_path(root, rel)
        if problem is None:
            with contextlib.suppress(FileNotFoundError):
                links = os.lstat(path).st_nlink
                if links > 1:
                    raise safefs.UnsafePath(path, None, safefs.hard_link_problem(links))
        if problem is not None:
            what = problem.removeprefix(rel).strip() if problem.startswith(rel) else problem
            raise safefs.UnsafePath(
                path,
                None,
                f"{what}; expected tick {tick}'s log (a regular file) or nothing there: "
                f"refused; remove it (`rm {path}`)",
            )


__all__ = [
    "TickLog",
    "check_log_slot",
    "open_regular",
    "packed_damage",
    "parse_records",
    "read_log",
    "read_log_bytes",
    "read_logs",
    "read_regular",
]
