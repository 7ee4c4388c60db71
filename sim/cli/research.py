"""``sim export``: a world's history as tidy tables for analysis (the research loop)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click
import orjson

from sim.cli.common import WORLD, errors

if TYPE_CHECKING:
    from sim.analysis.export import Format


@click.command("export")
@WORLD
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The folder to write the tables into (created if missing; tables are replaced).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "jsonl", "parquet"]),
    default="csv",
    show_default=True,
    help="csv and jsonl need nothing more; parquet needs the 'analysis' extra "
    "(pip install 'sim[analysis]').",
)
@click.option("--from", "first", type=click.IntRange(min=1), help="The first tick to export.")
@click.option("--to", "last", type=click.IntRange(min=1), help="The last tick to export.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print what was written as one JSON document."
)
def export_(
    world_dir: Path, out: Path, fmt: str, first: int | None, last: int | None, as_json: bool
) -> None:
    """Write tidy tables of the committed ticks: characters, interactions, locations, calls.

    characters has one row per tick and character (state after the tick, what it did);
    interactions one per speech, act or custom verb; locations one per tick and location;
    calls one per logged call (tokens and cost over every attempt; cost empty when a
    model has no price). See docs/analysis.md.
    """
    from sim.analysis.export import export

    with errors():
        done = export(world_dir, out, cast("Format", fmt), first, last)
        if as_json:
            click.echo(
                orjson.dumps(
                    {
                        "out": str(out),
                        "format": fmt,
                        "ticks": done.ticks,
                        "tables": {
                            name: {"path": str(path), "rows": done.rows[name]}
                            for name, path in done.files.items()
                        },
                        "notes": done.notes,
                        "problems": [str(p) for p in done.problems],
                    }
                ).decode()
            )
        else:
            span = f"ticks {done.ticks[0]}-{done.ticks[-1]}" if done.ticks else "no ticks"
            click.echo(f"exported {span} to {out}:")
            for name, path in done.files.items():
                click.echo(f"  {name:<13} {done.rows[name]:>6} rows  {path}")
            for note in done.notes:
                click.echo(f"note: {note}")
        for problem in done.problems:
            click.echo(f"unreadable: {problem}", err=True)
        if done.problems:
            sys.exit(1)
