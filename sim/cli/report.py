"""``sim report``: write a self-contained HTML page of a world's history.

Like ``sim log --tick all``, unreadable logs are reported on stderr (and on the page) and
the command exits 1; the page is still written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sim.cli.common import WORLD, echo, file_option
from sim.cli.jsonout import JSON_OPTION, emit, json_errors, report_document


@click.command("report")
@WORLD
@file_option(
    "--out",
    "out",
    help="The HTML file to write (default: report.html in the world folder).",
)
@click.option(
    "--from",
    "first",
    type=click.IntRange(min=1),
    help="The first tick to show (default: the first logged).",
)
@click.option(
    "--to", "last", type=click.IntRange(min=1), help="The last tick to show (default: the last)."
)
@JSON_OPTION
def report(
    world_dir: Path, out: Path | None, first: int | None, last: int | None, as_json: bool
) -> None:
    """Write one HTML page (no network needed) of the world's ticks, map and costs."""
    from sim.analysis.report import write_report

    with json_errors("report", as_json):
        done = write_report(world_dir, out, first, last)
        if as_json:
            emit(report_document(done))
            if done.problems:
                for problem in done.problems:
                    echo(f"unreadable: {problem}", err=True)
                sys.exit(1)
            return
        if done.ticks:
            what = f"{done.ticks} ticks"
        else:
            what = "no ticks in that range" if done.logged else "no tick logs yet"
        if done.detail is not None:
            what += f"; each tick's scenes in {done.detail}/, loaded by the page"
        echo(f"wrote {done.path} ({what})")
        for problem in done.problems:
            echo(f"unreadable: {problem}", err=True)
        if done.problems:
            sys.exit(1)
