"""Compressing a committed tick's log.

Once the tick has committed its log is compressed into ``tick-000004.jsonl.zst`` (one
Zstandard frame, ``[history] compress_level``, so ``zstdcat`` reads it) by
``compress_log``, or by ``LogCompression`` in a thread while the commit writes the world.
Each line is packed as ``sim.ticklog.format`` says (what can be rebuilt exactly left out)
and placed as ``sim.ticklog.layout`` orders them. Plain logs of older sims, and gzip logs
of earlier sims, are rewritten in the current form by ``sim log --compact``.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import orjson

if sys.version_info >= (3, 14):
    from compression import zstd
else:  # the standard library's module, for the Pythons before it
    from backports import zstd

from sim.ticklog.format import DERIVED_DIGEST, GZ, pack_raw, packed_path, request_digest
from sim.ticklog.layout import CALL_DETAIL, STATE, layout_line
from sim.ticklog.reader import open_regular, read_log_bytes
from sim.ticklog.writer import fsync_dir

#: default Zstandard level of committed logs (``[history] compress_level``; 0 keeps them
#: plain): level 3 compresses a log ~8x faster than gzip level 6 did, and smaller
COMPRESS_LEVEL = 3


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
        changed = pack_raw(data)
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
    with open_regular(path) as handle:
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
    #: the lines that follow the file's (``LogCompression``: the commit record, which may
    #: not be known yet when the compression starts: asked for once the scan reaches them)
    tail: Callable[[], Sequence[bytes]] = tuple
    #: read the file only this far (``None``: to its end)
    end: int | None = None
    #: per line: where it starts, its length without the newline, whether it goes as pieces
    spans: list[tuple[int, int, bool]] = field(default_factory=list)
    #: ``tail()``, once the scan has it
    tail_lines: Sequence[bytes] = ()

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
        self.tail_lines = self.tail()
        yield from self.tail_lines

    def pick(self, indices: Iterable[int]) -> Iterator[bytes | _Pieces]:
        seek, read, spans = self.handle.seek, self.handle.read, self.spans
        for i in indices:
            if i >= len(spans):
                yield self.tail_lines[i - len(spans)]
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
    fsync_dir(target.parent)
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
            if line.startswith(CALL_DETAIL):
                detail.append(total)
            elif line.startswith(STATE):
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
                    state = _packed_state(line) if line.startswith(STATE) else None
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
                put(layout_line(total, detail, late))
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
    """``compress_log`` of a running tick's plain log, done while the tick's files are
    committed: started once the log holds every record but the ``commit`` one, which
    ``end_with`` gives (the line the log will end with: its files' digests are made while
    the compression reads the log), finished after the commit.

    It reads the log only as far as it reached when it was started, and writes
    ``<name>.zst.tmp``; ``finish`` renames that into place and removes the plain log, once
    the log has its commit record (a ``.zst`` exists only for a committed tick), and
    ``cancel`` removes it. Compressing holds a few megabytes (``_pack_into``), so it can
    run beside the world.

    A log of ``CHILD_FROM_BYTES`` or more is compressed by a child process
    (``_ChildCompression``): its packing, a few microseconds of Python a line, then never
    waits for the interpreter lock that the commit's 16 writing threads hand to each other
    around every system call (at 40,000 characters, 437 MB of log: the commit took 3.6 s
    at the median instead of 5.3 s). A smaller log, or when no child can be started, is
    compressed by a thread.
    """

    def __init__(self, path: Path, level: int) -> None:
        self.path = path
        self.target = packed_path(path)
        self._tmp = _tmp_of(self.target)
        self._level = level
        self._tail: list[bytes] | None = None
        self._tail_given = threading.Event()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._child: _ChildCompression | None = None
        self._thread: threading.Thread | None = None
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()
        # the log is opened and its length taken here, in the caller's thread, before it
        # can append the ``tail``: measured in the thread, whenever that first ran, the
        # length could take in the commit record, which then went in twice
        handle: BinaryIO | None = None
        self._end = 0
        try:
            handle = open_regular(path)
            self._end = os.fstat(handle.fileno()).st_size
        except BaseException as exc:  # handed to the caller by ``finish``
            if handle is not None:
                handle.close()
                handle = None
            self._error = exc
        if handle is not None and self._end >= CHILD_FROM_BYTES:
            self._child = _ChildCompression.start(handle, self._end, self._tmp, level)
            if self._child is not None:
                handle.close()  # the child has its own descriptor of the log
        if self._child is None:
            # a daemon: a compression waiting for a tail that never comes (the caller
            # neither committed nor cancelled) never holds the process at its exit
            self._thread = threading.Thread(
                target=self._run,
                args=(handle, self._end),
                name="sim-log-compression",
                daemon=True,
            )
            try:
                self._thread.start()
            except BaseException:
                if handle is not None:
                    handle.close()
                raise

    def end_with(self, tail: Sequence[bytes]) -> None:
        """The lines the log will end with, after those it held when the compression
        started (once: the commit record)."""
        assert self._tail is None, "the log's tail is given once"
        self._tail = list(tail)
        if self._child is not None:
            self._child.end_with(self._tail)
        self._tail_given.set()

    def _given_tail(self) -> Sequence[bytes]:
        """The tail, once ``end_with`` gave it (``_Stopped`` when the tick is cancelled
        first)."""
        self._tail_given.wait()
        if self._stop.is_set() or self._tail is None:
            raise _Stopped
        return self._tail

    def _run(self, handle: BinaryIO | None, end: int) -> None:
        if handle is None:
            return
        try:
            with handle:
                lines = _FileLines(handle, tail=self._given_tail, end=end)
                _pack_into(self._tmp, lines, self._level, self._stop)
        except BaseException as exc:  # handed to the caller by ``finish``
            self._error = exc

    def finish(self) -> Path:
        """Wait for the compressed log and put it in place of the plain one (which must
        end with the tail by now); raises what the compression raised."""
        assert self._tail is not None, "finished before the log's tail was given"
        if self._child is not None:
            if not self._child.finished():  # the child failed or was killed: done here
                self._tmp.unlink(missing_ok=True)
                self._run(open_regular(self.path), self._end)
            self._child = None
        elif self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        os.replace(self._tmp, self.target)
        fsync_dir(self.target.parent)
        self.path.unlink()
        return self.target

    def cancel(self) -> None:
        """The tick did not commit: the compression stops at its next line, its copy
        goes, the plain log stays."""
        self._stop.set()
        self._tail_given.set()  # a compression waiting for the tail stops too
        if self._child is not None:
            self._child.kill()
            self._child = None
        elif self._thread is not None:
            self._thread.join()
        self._tmp.unlink(missing_ok=True)


#: a plain log this long or longer is compressed by a child process (``LogCompression``)
CHILD_FROM_BYTES = 32 << 20

#: what the child runs: this module's ``child_main``, if the child imports this file
_CHILD_CODE = "from sim.ticklog.compression import child_main; child_main()"


@dataclass
class _ChildCompression:
    """``python -c _CHILD_CODE``: ``_pack_into`` of a log in another process, given the
    log open (its descriptor), how far to read it, the copy to write and the level; the
    tail comes later on its standard input (``end_with``: one line, each of the tail's
    lines in hex, space-separated). Its standard input stays open until the compression is
    over: when it closes (this process is gone, even by ``kill -9``) the child stops at
    its next line and removes its copy. It is in a session of its own, so a Ctrl-C at the
    terminal reaches only this process, which decides."""

    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, handle: BinaryIO, end: int, tmp: Path, level: int) -> _ChildCompression | None:
        """The running child, or ``None`` when none can be started (compress in a thread)."""
        if not sys.executable:
            return None
        fd = handle.fileno()
        args = [__file__, str(fd), str(end), os.fspath(tmp), str(level)]
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_CODE, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(fd,),
                start_new_session=True,
            )
        except OSError:
            return None
        return cls(process)

    def end_with(self, tail: Sequence[bytes]) -> None:
        """Send the child the log's tail (a child already gone is found by ``finished``)."""
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # BrokenPipeError: it failed, or was killed
            self.process.stdin.write(b" ".join(line.hex().encode() for line in tail) + b"\n")
            self.process.stdin.flush()

    def finished(self) -> bool:
        """Wait for the child; whether it wrote the whole copy."""
        code = self.process.wait()
        self._close()
        return code == 0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._close()

    def _close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()


def child_main() -> None:
    """The child's side of ``_ChildCompression`` (its arguments in ``sys.argv``, the tail
    on its standard input); exits 0 once the copy is written and flushed, 1 when it failed
    or was stopped (the copy removed), 2 when it imported another sim than its parent (the
    parent then compresses the log itself)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    expected, fd, end, tmp, level = sys.argv[1:]
    if os.path.realpath(expected) != os.path.realpath(__file__):
        os._exit(2)
    stop = threading.Event()
    given = threading.Event()
    tail: list[bytes] = []

    def watch() -> None:
        """The tail, from the first line of standard input; then its end (the parent gone,
        or cancelling): stop, and remove the copy."""
        line = sys.stdin.buffer.readline()
        if line.endswith(b"\n"):
            tail.extend(bytes.fromhex(piece.decode()) for piece in line.split())
            given.set()
            while os.read(0, 4096):
                pass
        stop.set()
        given.set()

    def wait_for_tail() -> list[bytes]:
        given.wait()
        if stop.is_set():
            raise _Stopped
        return tail

    threading.Thread(target=watch, daemon=True).start()
    code = 0
    try:
        with os.fdopen(int(fd), "rb") as handle:
            lines = _FileLines(handle, tail=wait_for_tail, end=int(end))
            _pack_into(Path(tmp), lines, int(level), stop)
    except BaseException:  # the parent compresses the log itself, and raises what it finds
        code = 1
    os._exit(code)  # not waiting on the thread that watches standard input


__all__ = [
    "COMPRESS_LEVEL",
    "LogCompression",
    "compress_log",
    "write_compressed",
]
