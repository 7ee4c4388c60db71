"""Writing a running tick's log (``sim.ticklog.format`` describes its records).

Durability: call records are flushed as they are written and the file is fsynced at the
end of every phase. A running tick's log stays plain JSONL, so a ``kill -9`` loses nothing;
once the tick has committed the log is compressed (``sim.ticklog.compression``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel

from sim import safefs
from sim.ticklog.format import log_line, packed_call_line
from sim.ticklog.records import CallRecord, LogRecord, dump_record


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
    def create(cls, path: Path, first: Iterable[LogRecord | Iterable[bytes]]) -> LogWriter:
        """Start a new log that appears with its ``first`` records already in it (a record,
        or a line's bytes in pieces, written as they come: ``state_line``).

        They are written to ``<name>.tmp``, fsynced and renamed into place, so a crash at
        any instant leaves either no log or one that starts with its header, never an
        empty or header-less file (a leftover ``.tmp`` is overwritten by the next start).
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a leftover, or a link planted there: removed, never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "wb") as handle:
                for item in first:
                    for piece in (log_line(item),) if isinstance(item, BaseModel) else item:
                        handle.write(piece)
                    handle.write(b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:  # a record that cannot be written: no temporary file left
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_dir(path.parent)
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

    def append_lines(self, lines: Iterable[bytes]) -> None:
        """Call lines another process packed (``packed_call_line``: a sharded tick's
        workers), written and flushed together."""
        self._handle.write(b"".join(line + b"\n" for line in lines))
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


def fsync_dir(path: Path) -> None:
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
        fd = safefs.open_regular(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
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


__all__ = [
    "LogWriter",
    "fsync_dir",
]
