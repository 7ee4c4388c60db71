"""``sim log``, ``sim replay``, ``sim rewind``, ``sim fork``: a world's history."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from sim.cli.common import (
    CONFIG,
    WORLD,
    build_config,
    echo,
    echo_json,
    errors,
    folder_option,
    tick_option,
)
from sim.cli.jsonout import JSON_OPTION, emit, json_errors, replay_document
from sim.errors import InputError


def tick_arg(value: str) -> int | None:
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise InputError(None, "--tick", f"expected a tick number >= 1 or 'all' (got {value!r})")
    return int(value)


@click.command("log")
@WORLD
@click.option(
    "--tick",
    "tick_",
    default=None,
    metavar="N|all",
    help="The tick to show (default: the last), or 'all' for one line per tick.",
)
@click.option(
    "--calls", is_flag=True, help="One line per call: model, depth, window sent, tokens, cost."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON Lines: a tick's records as logged, or with --tick all one object per tick "
    "(docs/cli-json.md).",
)
@click.option(
    "--compact",
    is_flag=True,
    help="Compress the committed logs still plain (or gzip, from an older sim) and give each "
    "a summary; with --before N, "
    "also drop the call detail of ticks before N (their summaries, results and start "
    "states stay; they can no longer be replayed).",
)
@click.option(
    "--before",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --compact: drop the call detail of ticks before N.",
)
def log_(
    world_dir: Path,
    tick_: str | None,
    calls: bool,
    as_json: bool,
    compact: bool,
    before: int | None,
) -> None:
    """Show what happened in a tick, from its log (or compact old logs)."""
    from sim.analysis import logview

    with errors(read_only=True):  # --compact's work is done before it prints
        if compact:
            from sim.engine.compact import compact_history  # loads the world's storage

            if tick_ is not None or calls or as_json:
                raise InputError(None, "--compact", "takes only --world and --before")
            done = compact_history(world_dir, before)
            for line in logview.compact_lines(done):
                echo(line)
            return
        if before is not None:
            raise InputError(None, "--before", "only with --compact")
        if tick_ == "all":
            from sim.ticklog.summary import heads, summary_numbers

            # each tick's summary (written at its commit), not its whole log
            problems = []
            if not as_json:
                echo(logview.SUMMARY_HEAD)
            for item in heads(world_dir):
                if item.head is None:
                    problems.append(item.problem)
                    continue
                data = summary_numbers(item.head)
                if as_json:
                    echo_json(orjson.dumps(data).decode())
                else:
                    echo(logview.summary_line(data))
            for problem in problems:
                echo(f"unreadable: {problem}", err=True)
            if problems:
                sys.exit(1)
            return
        from sim.ticklog.format import existing_log
        from sim.ticklog.reader import read_log
        from sim.ticklog.records import dump_record

        number = tick_arg(tick_) if tick_ is not None else None
        log = (
            read_log(existing_log(world_dir, number))
            if number is not None
            else logview.last_log(world_dir)
        )
        if as_json:
            for record in log.written_records():
                echo_json(dump_record(record).decode())
        elif calls:
            for line in logview.call_lines(log):
                echo(line)
        else:
            for line in logview.tick_lines(log):
                echo(line)


@click.command("replay")
@WORLD
@click.option(
    "--tick", "tick_", required=True, type=click.IntRange(min=1), help="The first tick to replay."
)
@click.option("--to", "to", type=click.IntRange(min=1), help="The last tick (default: --tick).")
@click.option(
    "--live",
    is_flag=True,
    help="Send drifted requests to the configured provider and show the change.",
)
@CONFIG
@JSON_OPTION
def replay_(
    world_dir: Path,
    tick_: int,
    to: int | None,
    live: bool,
    config_file: Path | None,
    as_json: bool,
) -> None:
    """Re-run logged ticks from their recorded responses in a scratch copy and compare."""
    from sim.analysis import logview
    from sim.engine.replay import replay

    with json_errors("replay", as_json, read_only=True):  # in a scratch copy
        config = build_config(config_file, world_dir, sends_requests=live)
        report = replay(world_dir, tick_, to, config=config, live=live)
        if as_json:
            emit(replay_document(report))
        for line in () if as_json else logview.replay_lines(report, live):
            echo(line)
        if not report.identical:
            sys.exit(1)


@click.command()
@WORLD
@tick_option("Go back to the state at the start of this tick.")
@JSON_OPTION
def rewind(world_dir: Path, tick_: int, as_json: bool) -> None:
    """Put a world back to its state at the start of a tick; later logs are moved aside."""
    from sim.engine import rewind as history

    with json_errors("rewind", as_json):
        done = history.rewind(world_dir, tick_)
        if as_json:
            emit(
                {
                    "command": "rewind",
                    "ok": True,
                    "world": str(world_dir),
                    "tick": tick_ - 1,
                    "next_tick": tick_,
                    "logs_moved": done.logs_moved,
                    "moved_to": str(done.moved_to) if done.moved_to is not None else None,
                }
            )
            return
        echo(f"rewound: the world is at tick {tick_ - 1}, ready to run tick {tick_}")
        if done.moved_to is not None:
            echo(f"{done.logs_moved} later logs moved to {done.moved_to}")


@click.command()
@WORLD
@tick_option(
    "Start the new world from the state at the start of this tick (the current tick + 1:"
    " the world as it is now)."
)
@folder_option(
    "--to",
    "dest",
    required=True,
    help="The new world's folder (must not exist yet, nor be inside the world).",
)
@click.option(
    "--seed", type=click.IntRange(min=0), help="The new world's seed (default: the original's)."
)
@JSON_OPTION
def fork(world_dir: Path, tick_: int, dest: Path, seed: int | None, as_json: bool) -> None:
    """Start a new world from a world's state at the start of a tick."""
    from sim.engine import rewind as history

    with json_errors("fork", as_json):
        history.fork(world_dir, tick_, dest, seed)
        if as_json:
            emit(
                {
                    "command": "fork",
                    "ok": True,
                    "world": str(dest),
                    "source": str(world_dir),
                    "tick": tick_ - 1,
                    "next_tick": tick_,
                    "seed": orjson.loads((dest / "world.json").read_bytes()).get("seed"),
                }
            )
            return
        echo(f"forked: {dest} is at tick {tick_ - 1}, ready to run tick {tick_}")
