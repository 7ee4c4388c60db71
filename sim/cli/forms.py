"""``sim pack`` and ``sim unpack``: a world's entities in one file, or one file each."""

from __future__ import annotations

from pathlib import Path

import click

from sim.cli.common import CONFIG, WORLD, build_config, echo
from sim.cli.jsonout import JSON_OPTION, emit, json_errors


def _done(command: str, world_dir: Path, files: int, finished: bool, as_json: bool) -> None:
    if as_json:
        emit(
            {
                "command": command,
                "ok": True,
                "world": str(world_dir),
                "files": files,
                "finished_interrupted": finished,
            }
        )
        return
    where = "into world.pack" if command == "pack" else "into characters/ and locations/"
    echo(
        f"{command}ed: {files} entity files {where}"
        + (" (an interrupted run finished)" if finished else "")
    )


@click.command("pack")
@WORLD
@CONFIG
@JSON_OPTION
def pack_(world_dir: Path, config_file: Path | None, as_json: bool) -> None:
    """Hold a world's entity files in one file, world.pack, instead of one file each.

    A big world loads and commits faster packed (one file read and one written a tick
    instead of one per entity); every sim command reads it as before. `sim unpack` gives
    the folders back, the form to edit by hand. The world must load; nothing is lost if
    this is interrupted (run it again to finish).
    """
    from sim.storage.forms import pack

    with json_errors("pack", as_json):
        config = build_config(config_file, world_dir, sends_requests=False)
        moved = pack(world_dir, config.limits.max_entity_bytes)
        _done("pack", world_dir, moved.files, moved.finished, as_json)


@click.command("unpack")
@WORLD
@CONFIG
@JSON_OPTION
def unpack_(world_dir: Path, config_file: Path | None, as_json: bool) -> None:
    """Put a packed world's entity files back in characters/ and locations/, one file each.

    The world must load; nothing is lost if this is interrupted (run it again to finish).
    """
    from sim.storage.forms import unpack

    with json_errors("unpack", as_json):
        config = build_config(config_file, world_dir, sends_requests=False)
        moved = unpack(world_dir, config.limits.max_entity_bytes)
        _done("unpack", world_dir, moved.files, moved.finished, as_json)
