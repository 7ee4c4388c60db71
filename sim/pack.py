"""A packed world: its entity files held in one file, ``world.pack``, instead of one file
each in ``characters/`` and ``locations/``.

A world of many characters spends its load reading one file per entity and its commit
writing one (bench/RESULTS.md §15: at 100,000 characters, with a pack the load and the
commit each take about half the time). A packed world holds the very bytes its folders
would, by the same relative paths (``characters/<id>.json``), in a bundle
(``sim.bundle``): a tick's log, its digests, replay and every ``sim`` command see the same
files in either form. ``sim pack`` and ``sim unpack`` (``sim.storage.forms``) move a world
between the two forms; the folders stay the default and the form a person edits.

The pack is read as any world file is (``sim.safefs``: no link followed, a hard link
refused) and checked whole before any entity is: its form, each path an entity file's,
each file within the entity size limit. It is replaced, never written in place: the new
pack is written beside it, flushed and renamed over it (one file: the rename costs one
inode, not one per entity as a folder's would), inside the commit's redo journal
(``sim.storage.journal``), so a crash leaves the old pack or the new one, and the journal
finishes the commit either way.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from sim import safefs
from sim.bundle import BundleError, bundle_chunks, bundle_spans, parse_bundle
from sim.errors import InputError
from sim.world import ID_RE

#: the packed world's entity files, in the world's top folder
PACK = "world.pack"
#: the next pack while it is written (in the same folder, so its rename is one filesystem's)
PACK_TMP = ".world.pack.tmp"
#: the first line of a pack (its format's version)
PACK_MAGIC = b"sim-pack 1\n"
#: the entity folders a pack stands for
ENTITY_FOLDERS = ("characters", "locations")
#: an entity file's path inside a world: what a pack may hold
ENTITY_REL = re.compile(rf"(?:characters|locations)/{ID_RE.pattern.strip('^$')}\.json")
#: bytes gathered before each write() of a pack
_CHUNK = 1 << 20

T = TypeVar("T")


def is_packed(root: Path) -> bool:
    """Whether ``root`` holds a pack (anything by its name: a link is refused on reading)."""
    return os.path.lexists(root / PACK)


def both_forms(root: Path) -> list[str]:
    """The entity folders beside a pack (``[]``: none, or no pack): a world in both forms,
    which a load refuses rather than choose one."""
    if not is_packed(root):
        return []
    return [kind for kind in ENTITY_FOLDERS if os.path.lexists(root / kind)]


def both_forms_problem(root: Path, folders: list[str]) -> InputError:
    """The error for a world with ``folders`` beside its pack."""
    named = " and ".join(f"{kind}/" for kind in folders)
    return InputError(
        root / PACK,
        None,
        f"the world has {named} beside its pack, two forms of the same entities: an "
        "interrupted `sim pack` or `sim unpack` (run it again to finish it), or files added "
        "by hand (unpack the world to edit it)",
    )


def read_pack(root: Path, max_entity_bytes: int | None, setting: str = "") -> dict[str, bytes]:
    """A pack's entity files by path, in its order, every one checked for what a pack may
    hold (not yet for what an entity holds: ``Storage.load`` checks each as it checks a
    file).

    Raises:
        InputError: naming ``world.pack`` (and the entity file within it): not a pack, a
            path that is not an entity file's, a deletion, a file over ``max_entity_bytes``.
        UnsafePath: the pack is a link, a special file or a hard link.
        FileNotFoundError: there is none.
    """
    shown = root / PACK
    raw = safefs.read_file(root, PACK, one_link=True)
    try:
        files = parse_bundle(raw, PACK_MAGIC)
    except BundleError as exc:
        raise InputError(shown, None, f"not a pack sim wrote: {exc}") from None
    del raw
    out: dict[str, bytes] = {}
    for rel, data in files.items():
        if not ENTITY_REL.fullmatch(rel):
            raise InputError(
                shown, rel, "expected only entity files (characters/<id>.json, locations/<id>.json)"
            )
        if data is None:
            raise InputError(shown, rel, "a pack holds files, not deletions")
        if max_entity_bytes is not None and len(data) > max_entity_bytes:
            raise InputError(
                shown,
                rel,
                f"{len(data)} bytes, over the limit of {max_entity_bytes}"
                + (f" ({setting})" if setting else ""),
            )
        out[rel] = data
    return out


def write_pack(root: Path, files: Mapping[str, bytes | memoryview]) -> None:
    """Make ``files`` (entity files by path) the world's pack, in path order: written to
    ``PACK_TMP``, flushed, renamed over ``world.pack``, the folder flushed. A crash leaves
    the old pack or the new one (and at most a stale ``PACK_TMP``, removed by the next)."""
    ordered = {rel: files[rel] for rel in sorted(files)}
    with safefs.open_dir(root, []) as dir_fd:
        try:
            safefs.unlink_at(dir_fd, PACK_TMP)
            safefs.write_stream_at(
                dir_fd, PACK_TMP, root / PACK_TMP, bundle_chunks(PACK_MAGIC, ordered), _CHUNK
            )
            os.replace(PACK_TMP, PACK, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                safefs.unlink_at(dir_fd, PACK_TMP)
            raise
        os.fsync(dir_fd)


def update_pack(
    root: Path, changes: Mapping[str, bytes | None], base: Mapping[str, bytes] | None = None
) -> None:
    """The pack with ``changes`` (entity files by path, ``None``: removed) made and written
    whole (``write_pack``), from ``base`` (every entity file as the pack holds it, a whole
    world's in memory) or else from the pack read again (the files it keeps written from
    its bytes, not copied out of them first). Applying the same changes again gives the
    same pack, as a replayed journal does.

    Raises:
        InputError: the pack is not one (a commit checked it when it loaded the world).
    """
    files: dict[str, bytes | memoryview]
    if base is not None:
        files = dict(base)
    else:
        raw = safefs.read_file(root, PACK, one_link=True)
        try:
            spans = bundle_spans(raw, PACK_MAGIC)
        except BundleError as exc:
            raise InputError(root / PACK, None, f"not a pack sim wrote: {exc}") from None
        view = memoryview(raw)
        files = {rel: view[span[0] : span[1]] for rel, span in spans.items() if span is not None}
    for rel, data in changes.items():
        if data is None:
            files.pop(rel, None)
        else:
            files[rel] = data
    write_pack(root, files)


def remove_pack_tmp(root: Path) -> None:
    """Remove a ``PACK_TMP`` an interrupted commit left (never a pack: the rename had not
    happened)."""
    with contextlib.suppress(FileNotFoundError), safefs.open_dir(root, []) as dir_fd:
        safefs.unlink_at(dir_fd, PACK_TMP)


def entity_files(files: Mapping[str, T]) -> dict[str, T]:
    """The entity files among ``files`` (paths a pack holds)."""
    return {rel: data for rel, data in files.items() if ENTITY_REL.fullmatch(rel)}


def pack_entities(root: Path, files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Write the entity files among a new world's ``files`` as its pack (``write_pack``),
    and return the rest, to be written as files: a fork of a packed world is packed."""
    entities = entity_files(files)
    write_pack(root, entities)
    return {rel: data for rel, data in files.items() if rel not in entities}


__all__ = [
    "ENTITY_FOLDERS",
    "ENTITY_REL",
    "PACK",
    "PACK_MAGIC",
    "PACK_TMP",
    "both_forms",
    "both_forms_problem",
    "entity_files",
    "is_packed",
    "pack_entities",
    "read_pack",
    "remove_pack_tmp",
    "update_pack",
    "write_pack",
]
