"""``sim report``: one self-contained HTML page of a world's history, from its tick logs.

The page has no network dependency (inline CSS, JS and SVG). Data is collected by ``data``,
the map is laid out by ``layout`` and the page is put together by ``render`` from the
template, style and script beside them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sim.analysis.report.data import collect
from sim.analysis.report.render import embed_json, render
from sim.errors import InputError

DEFAULT_NAME = "report.html"


@dataclass(frozen=True)
class Written:
    """What ``write_report`` wrote: the file, its tick count, the logs it could not read and
    how many readable logs the world has (in the range or not)."""

    path: Path
    ticks: int
    problems: list[str]
    logged: int


def write_report(
    world_dir: Path, out: Path | None = None, first: int | None = None, last: int | None = None
) -> Written:
    """Write the report of ``world_dir`` (ticks ``first``..``last``) to ``out``.

    Args:
        world_dir: the world folder; only its tick logs and world files are read.
        out: the HTML file to write (default: ``<world>/report.html``).
        first, last: the range of ticks to include (default: every logged tick).

    Returns:
        The path written, the number of ticks shown and the unreadable logs (which the
        page lists too).

    Raises:
        InputError: the world folder does not exist, or the range is empty.
    """
    world_dir = Path(world_dir)
    if not world_dir.is_dir():
        raise InputError(world_dir, None, "world folder not found")
    if first is not None and last is not None and first > last:
        raise InputError(None, "--from", f"--from {first} is after --to {last}")
    data = collect(world_dir, first, last)
    page = render(data)
    target = Path(out) if out is not None else world_dir / DEFAULT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, target)  # a reader never sees half a page
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Written(target, len(data["ticks"]), list(data["problems"]), int(data["logged"]))


__all__ = ["DEFAULT_NAME", "Written", "collect", "embed_json", "render", "write_report"]
