"""The report page: data from ``sim.analysis.report.data`` embedded in a self-contained HTML file.

The page's template, style and script are package data beside this module. The data goes
into a ``<script type="application/json">`` block with ``<``, ``>``, ``&`` and the line
separators U+2028/U+2029 escaped, so no text from a world (names, narratives, ids) can end
the block or be read as markup; the script builds the page with ``textContent`` only.
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

import orjson

from sim.analysis.report.layout import layout

_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def embed_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (and still parses to ``data``)."""
    text = orjson.dumps(data).decode("utf-8")
    for raw, escaped in _ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def _asset(name: str) -> str:
    return (resources.files("sim.analysis.report") / name).read_text(encoding="utf-8")


def render(data: dict[str, Any]) -> str:
    """The whole page for ``data`` (as made by ``sim.analysis.report.data.collect``)."""
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
