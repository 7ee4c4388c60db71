"""Race-free file access inside a world folder: nothing is followed out of it.

A world folder is untrusted input (people share them as repositories and archives), so a
path inside it is never opened by name from the root. Every folder on the way is opened
relative to its parent's descriptor with ``O_DIRECTORY | O_NOFOLLOW`` and the file itself
with ``O_NOFOLLOW | O_NONBLOCK``, then checked with ``fstat`` to be a regular file. A symlink
anywhere on the path, a FIFO, a device or a folder where a file is expected is refused by
name; nothing is checked first and opened later, so swapping a file for a link between the
two cannot redirect a read or a write. ``O_NONBLOCK`` makes opening a FIFO return at once
instead of waiting for a writer.

A hard link is a second name for the same file, which may sit outside the world: writing
in place through ``characters/zoe.json`` would change that outside file too. The world's
files are refused by name when they have more than one link (``one_link``: ``Storage``
loads them so), and ``write_at`` never writes through one: it removes the name and
writes a new file there, so the other name keeps its bytes.

The world folder itself is the user's choice and may be reached through a symlink.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from sim.errors import InputError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafePath(InputError, ValueError):
    """A path inside the world that is not a plain file or folder inside it (exit 2).

    Also a ``ValueError``: a path the engine itself built that fails these rules is a bug.
    """


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def split_rel(rel: str) -> list[str]:
    """The components of a relative path; refuses absolute paths, ``..``, ``.`` and empties."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in rel:
        raise UnsafePath(None, None, f"refusing a path outside the world folder: {rel!r}")
    return parts


def open_root(root: Path) -> int:
    """A descriptor for the world folder (which may itself be reached through a link)."""
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(root, None, "world folder not found") from None
    except NotADirectoryError:
        raise InputError(root, None, "not a folder") from None


def _open_dir_at(dir_fd: int, name: str, shown: Path, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
        with suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        return _open_dir_at(dir_fd, name, shown, create=False)
    except (NotADirectoryError, OSError) as exc:
        if isinstance(exc, NotADirectoryError) or exc.errno == errno.ELOOP:
            mode = os.lstat(name, dir_fd=dir_fd).st_mode
            raise UnsafePath(
                shown, None, f"is {_kind(mode)}; expected a folder inside the world"
            ) from None
        raise


@contextmanager
def open_dir(root: Path, parts: list[str], *, create: bool = False) -> Iterator[int]:
    """A descriptor for the folder ``root/parts...``, walked one component at a time.

    Raises:
        UnsafePath: a component is a symlink or not a folder.
        FileNotFoundError: a component is missing and ``create`` is false.
    """
    fd = open_root(root)
    try:
        shown = root
        for name in parts:
            shown = shown / name
            child = _open_dir_at(fd, name, shown, create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_stat_at(
    dir_fd: int, name: str, shown: Path, flags: int = _READ_FLAGS, *, one_link: bool = False
) -> tuple[int, os.stat_result]:
    """``open_file_at``, and the file's ``fstat`` (taken to check it)."""
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            mode = os.lstat(name, dir_fd=dir_fd).st_mode
            raise UnsafePath(shown, None, f"is {_kind(mode)}; expected a regular file") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafePath(shown, None, f"is {_kind(info.st_mode)}; expected a regular file")
    if one_link and info.st_nlink > 1:
        os.close(fd)
        raise UnsafePath(shown, None, hard_link_problem(info.st_nlink))
    return fd, info


def open_file_at(
    dir_fd: int, name: str, shown: Path, flags: int = _READ_FLAGS, *, one_link: bool = False
) -> int:
    """Open ``name`` in ``dir_fd`` without following a link; the result is a regular file
    (with ``one_link``, one that no other name shares: not a hard link).

    Raises:
        UnsafePath: a symlink, FIFO, device or folder; with ``one_link``, a hard link.
        FileNotFoundError: no such file.
    """
    return _open_stat_at(dir_fd, name, shown, flags, one_link=one_link)[0]


def open_regular(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor on the regular file ``path`` (opened with ``flags``), never through a
    link in its last part and never blocking on a FIFO: for a tick log's files, read by
    path. Unlike the walk above, a link in a folder on the way is followed.

    Raises:
        OSError: as ``os.open`` (``ELOOP``: a link); ``EINVAL`` "not a regular file" for a
            FIFO, a device or a folder.
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def hard_link_problem(links: int) -> str:
    """What is wrong with a world file that has ``links`` names (hard links)."""
    return (
        f"is a hard link ({links} names share this file, one may be outside the world); "
        "expected a file of its own: replace it with a copy (`cp F F.copy && mv F.copy F`)"
    )


def read_fd(
    fd: int,
    shown: Path,
    max_bytes: int | None = None,
    *,
    setting: str | None = None,
    size: int | None = None,
) -> bytes:
    """All of an open regular file, refusing one larger than ``max_bytes`` (``setting``:
    the config key that sets that limit, named in the error). ``size``: its ``st_size``
    when the caller has it (else an ``fstat``). A file no larger than that is read with
    one ``read``: a short read past its size is its end."""
    if size is None:
        size = os.fstat(fd).st_size
    if max_bytes is not None and size > max_bytes:
        where = f" ({setting} in config.toml)" if setting else ""
        raise InputError(shown, None, f"file is {size} bytes, over the limit of {max_bytes}{where}")
    chunks: list[bytes] = []
    total = 0
    while True:
        want = max(size - total, 0) + 65536
        chunk = os.read(fd, want)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise InputError(shown, None, f"file grew over the limit of {max_bytes} bytes")
        if total >= size and len(chunk) < want:
            break  # the end: no second read to be told so
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_at(
    dir_fd: int,
    name: str,
    shown: Path,
    max_bytes: int | None = None,
    *,
    one_link: bool = False,
    setting: str | None = None,
) -> bytes:
    fd, info = _open_stat_at(dir_fd, name, shown, one_link=one_link)
    try:
        return read_fd(fd, shown, max_bytes, setting=setting, size=info.st_size)
    finally:
        os.close(fd)


def read_file(
    root: Path,
    rel: str,
    max_bytes: int | None = None,
    *,
    one_link: bool = False,
    setting: str | None = None,
) -> bytes:
    """The bytes of ``root/rel``, a regular file reached without following any link.

    Raises:
        UnsafePath: see ``open_file_at``; FileNotFoundError: missing.
    """
    parts = split_rel(rel)
    with open_dir(root, parts[:-1]) as dir_fd:
        return read_at(dir_fd, parts[-1], root / rel, max_bytes, one_link=one_link, setting=setting)


def read_named(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path``, a file the user named on the command line: a link is
    followed (the user chose the path), but only a regular file is read, a FIFO without
    waiting for a writer, refused when larger than ``max_bytes``.

    Raises:
        UnsafePath: a FIFO, a device, a socket or a folder; FileNotFoundError, OSError:
            it cannot be opened; InputError: over ``max_bytes``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePath(path, None, f"is {_kind(mode)}; expected a regular file")
        return read_fd(fd, path, max_bytes)
    finally:
        os.close(fd)


def read_capped(path: Path, max_bytes: int, cannot: str = "cannot read") -> bytes:
    """The bytes of ``path``, a file the user named (a study file, a reference CSV),
    opened by name: at most ``max_bytes`` of them.

    Raises:
        InputError: naming ``path``: it cannot be read (``cannot``: how the message
            starts), or it holds more than ``max_bytes`` bytes.
    """
    try:
        # never blocking on a FIFO (opened without a writer, it would wait for one)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(path, None, f"{cannot}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InputError(path, None, f"{cannot}: it is {_kind(mode)}; expected a file")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise InputError(path, None, f"{cannot}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(path, None, f"larger than {max_bytes} bytes")
    return data


def read_optional(root: Path, rel: str, max_bytes: int | None = None) -> bytes | None:
    """``read_file``, or ``None`` when the file (or a folder on its way) does not exist."""
    try:
        return read_file(root, rel, max_bytes)
    except FileNotFoundError:
        return None


def write_at(dir_fd: int, name: str, shown: Path, data: bytes, *, sync: bool = False) -> None:
    """Replace a file's content in place (no truncate-to-zero first, no rename); with
    ``sync``, flush its data and size to the disk before returning.

    A file with other names (a hard link, perhaps to a file outside the world) is never
    written through: its name is removed and a new file is made in its place, exclusively
    (a name planted again in between is refused, not followed).
    """
    # as few system calls as the checks allow (one ``fstat``; a truncate only when the file
    # was longer): a commit makes these on 16 threads, and each call hands the interpreter
    # lock to another thread and back (at 44,000 files, 7 calls a file took 2.2-2.9 s, 5
    # took 1.6 s)
    try:
        # an existing file first, without O_CREAT: opening with it takes the folder's lock
        # exclusively (Linux 6.18), and a commit's 16 threads spun on it in the kernel
        fd, info = _open_stat_at(dir_fd, name, shown, _WRITE_FLAGS & ~os.O_CREAT)
    except FileNotFoundError:  # a new file: made here, or refused if a name came meanwhile
        fd, info = _open_stat_at(dir_fd, name, shown, _WRITE_FLAGS | os.O_EXCL)
    if info.st_nlink > 1:
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)
        fd, info = _open_stat_at(dir_fd, name, shown, _WRITE_FLAGS | os.O_EXCL)
    try:
        view = memoryview(data)
        offset = os.pwrite(fd, view, 0)
        while offset < len(view):
            offset += os.pwrite(fd, view[offset:], offset)
        if info.st_size > len(data):
            os.ftruncate(fd, len(data))
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def write_stream_at(
    dir_fd: int,
    name: str,
    shown: Path,
    chunks: Iterable[bytes | memoryview],
    buffer: int = 1 << 20,
) -> None:
    """Write ``chunks`` into a new file ``name`` (gathered into writes of about ``buffer``
    bytes), then fsync it: a large file is written without being built in memory."""
    fd = open_file_at(dir_fd, name, shown, _WRITE_FLAGS | os.O_TRUNC)
    try:
        pending: list[bytes | memoryview] = []
        size = 0
        for chunk in chunks:
            pending.append(chunk)
            size += len(chunk)
            if size >= buffer:
                _write_all(fd, b"".join(pending))
                pending, size = [], 0
        if pending:
            _write_all(fd, b"".join(pending))
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def open_append(root: Path, rel: str) -> int:
    """A blocking descriptor that appends to ``root/rel`` (created with its folders), never
    through a link; the caller closes it (a child process may write its output there).

    Raises:
        UnsafePath: a component is a symlink or not a plain folder/file, or the file is a
            hard link.
    """
    parts = split_rel(rel)
    with open_dir(root, parts[:-1], create=True) as dir_fd:
        fd = open_file_at(dir_fd, parts[-1], root / rel, _WRITE_FLAGS | os.O_APPEND, one_link=True)
    os.set_blocking(fd, True)
    return fd


def append_file(root: Path, rel: str, data: bytes) -> None:
    """Append ``data`` to ``root/rel`` (``open_append``)."""
    fd = open_append(root, rel)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def read_tail(root: Path, rel: str, max_bytes: int) -> bytes | None:
    """The last ``max_bytes`` of ``root/rel`` (a regular file reached without following a
    link), ``None`` when it or a folder on its way does not exist.

    Raises:
        UnsafePath: see ``open_file_at``.
    """
    parts = split_rel(rel)
    try:
        with open_dir(root, parts[:-1]) as dir_fd:
            fd = open_file_at(dir_fd, parts[-1], root / rel)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, max_bytes, max(0, os.fstat(fd).st_size - max_bytes))
    finally:
        os.close(fd)


def copy_file(root: Path, rel: str, dest: Path) -> None:
    """Copy ``root/rel`` (a regular file reached without following a link) to ``dest``, a
    new file (an existing name there, a link included, is refused).

    Raises:
        UnsafePath: see ``open_file_at``; FileNotFoundError: missing;
        FileExistsError: ``dest`` exists.
    """
    parts = split_rel(rel)
    with open_dir(root, parts[:-1]) as dir_fd:
        fd = open_file_at(dir_fd, parts[-1], root / rel)
    with os.fdopen(fd, "rb") as source, open(dest, "xb") as target:
        shutil.copyfileobj(source, target, 1 << 20)


def unlink_at(dir_fd: int, name: str) -> None:
    """Remove a file (a link is removed, never its target); missing is fine."""
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def symlink_on_path(root: Path, rel: str) -> str | None:
    """The first component of ``rel`` that exists and is not a plain folder/file, if any.

    Used to validate paths read from engine state (journal, logs) before anything is done
    with them; the writes themselves use the descriptor walk above regardless.
    """
    parts = split_rel(rel)
    current = root
    for i, name in enumerate(parts):
        current = current / name
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(mode):
            return "/".join(parts[: i + 1]) + " is a symlink"
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(mode):
            return "/".join(parts[: i + 1]) + " is not a folder"
        if last and not stat.S_ISREG(mode):
            return "/".join(parts) + f" is {_kind(mode)}"
    return None


def folder_problem(path: Path) -> str | None:
    """What keeps ``path`` from being a folder of its own (a run's or a study's folder a
    command makes, continues or reads in place): ``None`` for a plain folder or nothing,
    else "is a symlink", "is a named pipe (FIFO)", ... (a link is never followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return None
    return "is a file" if stat.S_ISREG(mode) else f"is {_kind(mode)}"


def list_names(root: Path, parts: list[str], suffix: str) -> list[str] | None:
    """Names ending in ``suffix`` in the folder ``root/parts`` (sorted), ``None`` if missing."""
    try:
        with open_dir(root, parts) as dir_fd:
            return sorted(n for n in os.listdir(dir_fd) if n.endswith(suffix))
    except FileNotFoundError:
        return None
