"""A world's two forms: its entities as one file each in ``characters/`` and ``locations/``
(the default, the form a person edits), or in one pack (``sim.pack``). ``sim pack`` and
``sim unpack`` move a world from one to the other.

Each holds the world's lock, finishes a pending commit first, and checks the world as a load
does before it changes anything: a pack is made only of a world that loads, and unpacks only
into one. Neither loses a file if it is killed at any point. ``pack`` writes and renames the
pack before it removes a folder's file; ``unpack`` writes and flushes every file before it
removes the pack. A world left with both forms is refused by the load until the same command
runs again and finishes. ``pack`` goes on only while every entity file in the folders is
the pack's, byte for byte, so a file a person added or edited there is never removed.
``unpack`` marks the world before it writes a file (``UNPACKING``): with the mark, the
folders are its own unfinished writing (a file may be cut short) and are written again;
without it, they are refused as ``pack`` refuses them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from sim import safefs
from sim.errors import InputError
from sim.pack import (
    ENTITY_FOLDERS,
    ENTITY_REL,
    PACK,
    both_forms,
    entity_files,
    is_packed,
    read_pack,
    write_pack,
)
from sim.storage.journal import SIM_DIR, write_in_place
from sim.storage.store import ENTITY_LIMIT, MAX_ENTITY_BYTES, Storage

#: ``unpack`` is writing the folders from the pack (removed once the pack is)
UNPACKING = f"{SIM_DIR}/unpacking"


@dataclass(frozen=True)
class Moved:
    """What ``pack`` or ``unpack`` did: the entity files moved, and whether it finished
    an interrupted run of itself."""

    files: int
    finished: bool


def _folder_files(root: Path, kind: str) -> dict[str, bytes]:
    """``kind``'s folder's entity files by path (read as a load reads them); anything else
    in it, a sub-folder or a file that is not ``<id>.json``, is refused by name.

    Raises:
        InputError: naming what else the folder holds.
        UnsafePath: the folder or a file in it is a link, special or a hard link.
    """
    out: dict[str, bytes] = {}
    try:
        with safefs.open_dir(root, [kind]) as dir_fd:
            for name in sorted(os.listdir(dir_fd)):
                rel = f"{kind}/{name}"
                if not ENTITY_REL.fullmatch(rel):
                    raise InputError(
                        root / rel,
                        None,
                        "not an entity file (<id>.json): move it out of the folder first, "
                        "so that the folder holds only what the pack holds",
                    )
                out[rel] = safefs.read_at(dir_fd, name, root / rel, one_link=True)
    except FileNotFoundError:
        pass
    return out


def _same_as_pack(root: Path, folders: list[str], packed: dict[str, bytes]) -> dict[str, bytes]:
    """The entity files in ``folders``, each checked to be the pack's own.

    Raises:
        InputError: a file the pack does not hold, or holds otherwise.
    """
    found: dict[str, bytes] = {}
    for kind in folders:
        found.update(_folder_files(root, kind))
    for rel, data in found.items():
        if packed.get(rel) != data:
            held = "holds otherwise" if rel in packed else "does not hold"
            raise InputError(
                root / rel,
                None,
                f"the pack {held} this file, so it was not left by `sim pack` or `sim unpack`: "
                f"keep one form (remove {PACK} to keep the folders, or move the file out to "
                "keep the pack), then run the command again",
            )
    return found


def _remove_folders(root: Path, folders: tuple[str, ...] | list[str]) -> None:
    """Remove ``folders``' entity files, flush their names' removal, then the folders."""
    for kind in folders:
        try:
            with safefs.open_dir(root, [kind]) as dir_fd:
                for name in os.listdir(dir_fd):
                    safefs.unlink_at(dir_fd, name)
                os.fsync(dir_fd)
        except FileNotFoundError:
            continue
        with safefs.open_dir(root, []) as root_fd:
            os.rmdir(kind, dir_fd=root_fd)
            os.fsync(root_fd)


def _mark(root: Path, marked: bool) -> None:
    """Make (and flush) or remove ``UNPACKING``."""
    with safefs.open_dir(root, [SIM_DIR], create=marked) as sim_fd:
        name = UNPACKING.rsplit("/", 1)[1]
        if marked:
            safefs.unlink_at(sim_fd, name)
            safefs.write_stream_at(sim_fd, name, root / UNPACKING, [b"sim unpack\n"])
        else:
            safefs.unlink_at(sim_fd, name)
        os.fsync(sim_fd)


def _marked(root: Path) -> bool:
    return os.path.lexists(root / UNPACKING)


def pack(root: Path, max_entity_bytes: int = MAX_ENTITY_BYTES) -> Moved:
    """Move a world's entity files from its folders into its pack (``sim pack``).

    Raises:
        InputError: the world is packed already; its folders hold anything but entity
            files; a file beside an interrupted run's pack is not the pack's.
        InvalidWorld: the world does not load.
        WorldLockedError: another sim process runs it.
    """
    storage = Storage(root, max_entity_bytes)
    with storage.lock():
        if _marked(root) and not is_packed(root):
            _mark(root, False)  # an unpack that had removed the pack: it was done
        if is_packed(root):
            folders = both_forms(root)
            if not folders:
                raise InputError(root / PACK, None, "the world is packed already")
            packed = read_pack(root, max_entity_bytes, ENTITY_LIMIT)
            _same_as_pack(root, folders, packed)
            _remove_folders(root, folders)
            return Moved(len(packed), finished=True)
        storage.recover()
        world = storage.load()
        files: dict[str, bytes] = {}
        for kind in ENTITY_FOLDERS:
            files.update(_folder_files(root, kind))
        loaded = entity_files(world.originals)
        if files != loaded:  # changed since the load (the lock keeps sim out, not an editor)
            raise InputError(root, None, "an entity file changed while packing: run it again")
        write_pack(root, loaded)
        _remove_folders(root, ENTITY_FOLDERS)
        return Moved(len(loaded), finished=False)


def unpack(root: Path, max_entity_bytes: int = MAX_ENTITY_BYTES) -> Moved:
    """Move a packed world's entity files into its folders, one file each (``sim unpack``).

    Raises:
        InputError: the world is not packed; a file in an interrupted run's folders is not
            the pack's.
        InvalidWorld: the world does not load.
        WorldLockedError: another sim process runs it.
    """
    storage = Storage(root, max_entity_bytes)
    with storage.lock():
        if not is_packed(root):
            raise InputError(
                root, None, f"the world is not packed (no {PACK}): its entities are in folders"
            )
        folders = both_forms(root)
        finished = bool(folders)
        if finished:
            files = read_pack(root, max_entity_bytes, ENTITY_LIMIT)
            if not _marked(root):  # not this command's: only the pack's own files go on
                _same_as_pack(root, folders, files)
        else:
            storage.recover()
            world = storage.load()
            files = entity_files(world.originals)
        _mark(root, True)
        for kind in ENTITY_FOLDERS:  # a world with none of a kind still has its folder
            with safefs.open_dir(root, [kind], create=True):
                pass
        write_in_place(root, dict(files))
        with safefs.open_dir(root, []) as root_fd:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(PACK, dir_fd=root_fd)
            os.fsync(root_fd)
        _mark(root, False)
        return Moved(len(files), finished=finished)


__all__ = ["Moved", "pack", "unpack"]
