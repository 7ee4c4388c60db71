"""Reading a file a world names (a template, a schema) without leaving the world folder.

A world is untrusted input: a path from its config or an ``{% include %}`` must stay inside
the folder it is meant for, name a regular file, and never pass through a symlink (one
could point anywhere). Every component is opened with ``O_NOFOLLOW`` relative to its parent
descriptor, so a symlink swapped in between a check and the open is refused too.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

from sim.errors import InputError

#: templates and schemas are small; a bigger file is a mistake or an attack
MAX_BYTES = 1_000_000


class MissingFile(InputError):
    """The world file does not exist (callers with a default fall back to it)."""


def check_rel(rel: str, source: Path | None, field: str | None) -> tuple[str, ...]:
    """The parts of a world-relative POSIX path; raise if it is absolute or climbs out."""
    if not rel or "\\" in rel or "\x00" in rel:
        raise InputError(source, field, f"expected a world-relative path (got {rel!r})")
    path = PurePosixPath(rel)
    if path.is_absolute() or any(part in ("..", "") for part in path.parts):
        raise InputError(source, field, f"expected a path inside the world folder (got {rel!r})")
    return tuple(part for part in path.parts if part != ".")


def read_world_file(
    root: Path, rel: str, *, field: str | None = None, source: Path | None = None
) -> bytes:
    """The bytes of ``root/rel``, refusing symlinks, non-regular files and big files.

    Raises:
        MissingFile: no such file.
        InputError: an unsafe path, a symlink, not a regular file, too big, unreadable.
    """
    parts = check_rel(rel, source, field)
    if not parts:
        raise InputError(source, field, f"expected a file path (got {rel!r})")
    where = root / rel
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise InputError(root, None, f"cannot open the world folder: {exc.strerror}") from None
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags | getattr(os, "O_DIRECTORY", 0), dir_fd=fd)
            except OSError as exc:
                raise _refusal(exc, where, field, "a folder on the way") from None
            os.close(fd)
            fd = nxt
        try:
            # O_NONBLOCK: opening a FIFO must not hang; it is refused as not regular below
            handle = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            raise _refusal(exc, where, field, "the file") from None
    finally:
        os.close(fd)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(where, field, "expected a regular file")
        if info.st_size > MAX_BYTES:
            raise InputError(where, field, f"file too big (over {MAX_BYTES} bytes)")
        with os.fdopen(handle, "rb", closefd=False) as stream:
            return stream.read(MAX_BYTES + 1)
    finally:
        os.close(handle)


def _refusal(exc: OSError, where: Path, field: str | None, what: str) -> InputError:
    if exc.errno == errno.ENOENT:
        return MissingFile(where, field, "file not found")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return InputError(where, field, f"{what} is a symlink or not a folder; refused")
    return InputError(where, field, f"cannot read: {exc.strerror}")


def read_world_text(
    root: Path, rel: str, *, field: str | None = None, source: Path | None = None
) -> str:
    """``read_world_file`` decoded as UTF-8 (an error names the file otherwise)."""
    data = read_world_file(root, rel, field=field, source=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(root / rel, field, "expected UTF-8 text") from None
