"""``sim report``: an HTML page of a world's history, from its tick logs.

The page has no network dependency (inline CSS, JS and SVG). Data is collected by ``data``,
the map is laid out by ``layout`` and the page is put together by ``render`` from the
template, style and script beside them.

A page inside the world folder (the default, ``report.html``) keeps each tick's scenes in a
side file, ``<page name>-ticks/tick-NNNNNN.js`` beside it, loaded when the tick is shown, so
a long history's page stays small. A page written outside the world (``--out``) is one
self-contained file: nothing is written outside the world but the file asked for.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sim import safefs
from sim.analysis.report.data import collect
from sim.analysis.report.render import detail_files, embed_json, render
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
    #: the folder of the ticks' detail files (``None``: the page holds the detail)
    detail: Path | None = None


#: a detail file's name (anything else in the folder is left alone)
_DETAIL_FILE = re.compile(r"tick-\d{6,}\.js|memory\.js")


def detail_folder(page: Path) -> str:
    """The name of the folder beside ``page`` that holds its ticks' detail."""
    return f"{page.stem}-ticks"


def _inside(world_dir: Path, target: Path) -> list[str] | None:
    """The components of ``target``'s folder inside the world, or ``None`` if outside."""
    try:
        rel = target.parent.resolve().relative_to(world_dir.resolve())
    except ValueError:
        return None
    return list(rel.parts)


def _write_detail(world_dir: Path, parts: list[str], files: dict[str, bytes]) -> None:
    """Write the detail files into ``world/parts...``, each replaced whole, never through
    a link (``sim.safefs``), and remove detail files of ticks no longer shown."""
    shown = world_dir.joinpath(*parts)
    with safefs.open_dir(world_dir, parts, create=True) as fd:
        for name, data in files.items():
            tmp = f".{name}.{os.getpid()}.tmp"
            safefs.unlink_at(fd, tmp)
            safefs.write_at(fd, tmp, shown / tmp, data)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        for name in os.listdir(fd):
            if _DETAIL_FILE.fullmatch(name) and name not in files:
                safefs.unlink_at(fd, name)


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
    target = Path(out) if out is not None else world_dir / DEFAULT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    inside = _inside(world_dir, target)
    detail: Path | None = None
    if inside is not None and data["ticks"]:
        folder = detail_folder(target)
        files = detail_files(data, folder)
        _write_detail(world_dir, [*inside, folder], files)  # first: the page names them
        detail = target.parent / folder
    page = render(data)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, target)  # a reader never sees half a page
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Written(target, len(data["ticks"]), list(data["problems"]), int(data["logged"]), detail)


__all__ = [
    "DEFAULT_NAME",
    "Written",
    "collect",
    "detail_folder",
    "embed_json",
    "render",
    "write_report",
]
