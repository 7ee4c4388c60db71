"""The report page: data from ``sim.analysis.report.data`` embedded in an HTML file.

The page's template, style and script are package data beside this module. The data goes
into a ``<script type="application/json">`` block with ``<``, ``>``, ``&`` and the line
separators U+2028/U+2029 escaped, so no text from a world (names, narratives, ids) can end
the block or be read as markup; the script builds the page with ``textContent`` only.

A long history's tick detail (scenes and declared phases: most of the data) can go into
side files instead, one per tick (``detail_files``): ``tick-NNNNNN.js`` in a folder beside
the page, each a single call ``simReportTick(token, tick, detail)`` with the same escaped
JSON. The page loads one with a ``<script src>`` when its tick is shown: a page opened from
disk cannot ``fetch`` JSON in Chromium, but it can load a script from its own folder. The
token (a digest of every tick's detail) ties the files to the page that was written with
them: a file left by another run is not shown.
"""

from __future__ import annotations

import hashlib
import html
from importlib import resources
from typing import Any

import orjson

from sim.analysis.report.layout import layout

#: escaped in the UTF-8 bytes orjson writes (the line separators as their encodings)
_ESCAPES = {
    b"<": b"\\u003c",
    b">": b"\\u003e",
    b"&": b"\\u0026",
    "\u2028".encode(): b"\\u2028",
    "\u2029".encode(): b"\\u2029",
}


def embed_json_bytes(data: Any) -> bytes:
    """``embed_json``'s text as UTF-8, escaped in bytes (a third of the time on a long
    history's report: no decoding, and no scans of wide strings)."""
    text = orjson.dumps(data)
    for raw, escaped in _ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def embed_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (and still parses to ``data``)."""
    return embed_json_bytes(data).decode("utf-8")


def _asset(name: str) -> str:
    return (resources.files("sim.analysis.report") / name).read_text(encoding="utf-8")


#: what a tick's side file holds: the keys moved out of the page
DETAIL_KEYS = ("scenes", "phases")
#: the side file of every character's memory summaries over time
MEMORY_FILE = "memory.js"


def detail_name(tick: int) -> str:
    """The side file of a tick's detail, in the page's detail folder."""
    return f"tick-{tick:06d}.js"


def detail_files(data: dict[str, Any], folder: str) -> dict[str, bytes]:
    """Move each tick's detail and the characters' memory summaries out of ``data`` into
    side-file contents (name -> bytes).

    The page then says where they are (``data["detail"]``: the folder, relative to the
    page, and the token); each tick keeps ``"d": 1``.
    """
    blobs: dict[int, bytes] = {}
    hasher = hashlib.sha256()
    for tick in data["ticks"]:
        detail = {key: tick.pop(key) for key in DETAIL_KEYS}
        tick["d"] = 1
        blob = blobs[tick["t"]] = embed_json_bytes(detail)
        hasher.update(b"%d\n%b\n" % (tick["t"], blob))
    memory = embed_json_bytes([char.pop("memory") for char in data["chars"]])
    hasher.update(memory)
    token = hasher.hexdigest()[:16]
    data["detail"] = {"dir": folder, "token": token}
    files = {
        detail_name(t): b'simReportTick("%b", %d, %b);\n' % (token.encode(), t, blob)
        for t, blob in blobs.items()
    }
    files[MEMORY_FILE] = b'simReportMemory("%b", %b);\n' % (token.encode(), memory)
    return files


def render(data: dict[str, Any]) -> str:
    """The whole page for ``data`` (as made by ``sim.analysis.report.data.collect``, its
    detail moved out by ``detail_files`` or not)."""
    positions = layout([loc["id"] for loc in data["locs"]], [(a, b) for a, b, _ in data["edges"]])
    for loc, (x, y) in zip(data["locs"], positions, strict=True):
        loc["x"], loc["y"] = x, y
    page = _asset("template.html")
    # Replaced in this order so no inserted text is scanned for a later placeholder.
    head, _, tail = page.partition("@@DATA@@")
    head = head.replace("@@TITLE@@", html.escape(f"{data['world']} — sim report"))
    head = head.replace("@@CSS@@", _asset("report.css"))
    tail = tail.replace("@@JS@@", _asset("report.js"))
    return head + embed_json(data) + tail
