"""``sim inject`` and ``sim set``: interventions between ticks, recorded in the next tick's log."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sim.cli.common import CONFIG, WORLD, build_config, echo
from sim.cli.jsonout import JSON_OPTION, emit, json_errors

if TYPE_CHECKING:
    from sim.interventions import Made


def _document(command: str, world_dir: Path, made: Made) -> dict[str, Any]:
    from sim.ticklog.records import record_data

    return {
        "command": command,
        "ok": True,
        "world": str(world_dir),
        "tick": made.tick,
        "applies_at_tick": made.applies_at,
        "intervention": record_data(made.record),
        "pending": len(made.pending),
    }


def _report(world_dir: Path, made: Made) -> None:
    from sim.interventions import describe

    echo(f"recorded: {describe(made.record)}")
    waiting = len(made.pending)
    echo(
        f"applies at tick {made.applies_at} (the next `sim tick --world {world_dir}`); "
        f"{waiting} intervention{'s' if waiting != 1 else ''} pending",
        err=True,
    )


@click.command("inject")
@WORLD
@click.argument("text")
@click.option("--at", "at", metavar="LOCATION", help="The location id where it happens.")
@click.option("--everywhere", is_flag=True, help="It happens at every location.")
@JSON_OPTION
def inject_(world_dir: Path, text: str, at: str | None, everywhere: bool, as_json: bool) -> None:
    """Make TEXT happen in the next tick, at one location (--at) or everywhere.

    Everyone there sees it in the next tick's inputs (intentions, resolution, narrative
    and declared phases, as "happenings"); the tick records it in its log, and replay
    reproduces it. It waits in .sim/interventions.json until a tick commits.
    """
    from sim.errors import InputError
    from sim.interventions import inject

    with json_errors("inject", as_json):
        if (at is None) == (not everywhere):
            raise InputError(None, "--at/--everywhere", "expected exactly one of them")
        made = inject(world_dir, text, at)
        if as_json:
            emit(_document("inject", world_dir, made))
        else:
            _report(world_dir, made)


@click.command("set")
@WORLD
@click.argument("assignment", metavar="ENTITY.FIELD.PATH=JSON_VALUE")
@CONFIG
@JSON_OPTION
def set_(world_dir: Path, assignment: str, config_file: Path | None, as_json: bool) -> None:
    """Change a field of a character or location now, e.g. ada.state.mood='"angry"'.

    The value is JSON (a string needs its quotes). The edit is checked as a world file
    would be (and against the answer schema of a declared phase that writes the field);
    a bad one names file, field and what was expected, and writes nothing. It goes into
    the entity file at once; the next tick's log records it (who, what, before, after).
    """
    from sim.interventions import set_field

    with json_errors("set", as_json):
        config = build_config(config_file, world_dir, sends_requests=False)
        made = set_field(world_dir, assignment, config)
        if as_json:
            emit(_document("set", world_dir, made))
        else:
            _report(world_dir, made)
