"""Files in one stream: the form of a commit's journal and of a packed world.

A bundle is a magic line naming what it holds, then, per file, a JSON header line
``{"path": rel, "size": n}`` (``"size": null``: the file is deleted) followed by its ``n``
bytes and a newline, then ``{"end": count}``. Each file's bytes go in as they are, never
re-encoded, so a bundle is written without a second copy of its files in memory, and read
back by slicing.

``sim.storage.journal`` writes a tick's changed files as one (the commit point) and
``sim.pack`` a world's entity files. A bundle is read from untrusted folders: anything short
of its end line, or not of this shape, is refused with where it went wrong.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import orjson


class BundleError(ValueError):
    """A bundle that is not of this form: the message says where and what."""


def bundle_chunks(
    magic: bytes, files: Mapping[str, bytes | memoryview | None]
) -> Iterator[bytes | memoryview]:
    """The bundle of ``files`` (in their order) after the line ``magic``."""
    yield magic
    for rel, data in files.items():
        size = None if data is None else len(data)
        yield orjson.dumps({"path": rel, "size": size}) + b"\n"
        if data is not None:
            yield data
            yield b"\n"
    yield orjson.dumps({"end": len(files)}) + b"\n"


def parse_bundle(raw: bytes, magic: bytes) -> dict[str, bytes | None]:
    """The files of a bundle that starts with ``magic``, in its order.

    Raises:
        BundleError: see ``bundle_spans``.
    """
    return {
        rel: None if span is None else raw[span[0] : span[1]]
        for rel, span in bundle_spans(raw, magic).items()
    }


def bundle_spans(raw: bytes, magic: bytes) -> dict[str, tuple[int, int] | None]:
    """Where each file of a bundle that starts with ``magic`` is in ``raw`` (its bytes are
    ``raw[start:stop]``; ``None``: deleted), in its order: a bundle's files are taken
    without a copy of each (``sim.pack.update_pack``).

    Raises:
        BundleError: it does not start with ``magic``, a record is malformed, a path
            repeats, a file is cut short, or the end line is missing or does not count
            the files.
    """
    if not raw.startswith(magic):
        raise BundleError(f"does not start with {magic.decode('ascii', 'replace').strip()!r}")
    out: dict[str, tuple[int, int] | None] = {}
    pos = len(magic)
    while True:
        end = raw.find(b"\n", pos)
        if end < 0:
            raise BundleError("truncated (no end record)")
        try:
            head = orjson.loads(raw[pos:end])
        except orjson.JSONDecodeError as exc:
            raise BundleError(f"bad record at byte {pos} ({exc})") from None
        if not isinstance(head, dict):
            raise BundleError(f"bad record at byte {pos}: expected an object")
        if "end" in head:
            if head["end"] != len(out) or end + 1 != len(raw):
                raise BundleError("the end record does not match its files")
            return out
        rel, size = head.get("path"), head.get("size")
        if not isinstance(rel, str) or rel in out:
            raise BundleError(f"bad record at byte {pos}: path {rel!r}")
        if size is None:
            out[rel] = None
            pos = end + 1
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BundleError(f"{rel!r}: expected a size in bytes or null")
        start, stop = end + 1, end + 1 + size
        if raw[stop : stop + 1] != b"\n":
            raise BundleError(f"{rel!r}: truncated ({size} bytes expected)")
        out[rel] = (start, stop)
        pos = stop + 1


__all__ = ["BundleError", "bundle_chunks", "bundle_spans", "parse_bundle"]
