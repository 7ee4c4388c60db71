"""``sim export``: a world's history as tidy tables for analysis (the research loop)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click
import orjson

from sim.cli.common import (
    CONFIG,
    SETTINGS,
    WORLD,
    build_config,
    count_option,
    echo,
    echo_json,
    endpoint_options,
    file_option,
    folder_option,
    secho,
)
from sim.cli.jsonout import JSON_OPTION, ask_document, emit, json_errors
from sim.terminal import one_line, wrapped

if TYPE_CHECKING:
    from sim.analysis.export import Format


@click.command("export")
@folder_option("--world", "world_dir", help="The world folder.")
@folder_option(
    "--study",
    "study_dir",
    help="A study's folder (sim study run --out): every run's tables, with its condition, "
    "seed, run and factors.",
)
@folder_option(
    "--out",
    "out",
    required=True,
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
    "--csv-raw",
    is_flag=True,
    help="Write CSV text cells exactly. By default a text cell starting with = + - @, a tab "
    "or a carriage return gets a leading ' so that a spreadsheet does not run it as a formula.",
)
@click.option(
    "--unverified",
    is_flag=True,
    help="With --study: export a study that does not verify (sim study verify); the "
    "output says so.",
)
@JSON_OPTION
def export_(
    world_dir: Path | None,
    study_dir: Path | None,
    out: Path,
    fmt: str,
    first: int | None,
    last: int | None,
    csv_raw: bool,
    unverified: bool,
    as_json: bool,
) -> None:
    """Write tidy tables of the committed ticks: characters, interactions, locations, calls,
    surveys, edges, messages.

    characters has one row per tick and character (state after the tick, what it did; a
    tick-0 baseline row each); interactions one per speech, act or custom verb; locations
    one per tick and location; calls one per logged call (tokens and cost over every
    attempt; cost empty when a model has no price); surveys one per tick, character and
    question asked (sim ask); edges one per tick and relationship; messages one per message
    delivered ([messages]). With --study, every run of a study. See docs/analysis.md.
    """
    from sim.analysis.export import export, export_study
    from sim.errors import InputError

    with json_errors("export", as_json):
        if (world_dir is None) == (study_dir is None):
            raise InputError(None, "--world/--study", "expected exactly one of them")
        problems: list[str] = []
        if study_dir is not None:
            from sim.cli.sweep import note_unverified
            from sim.study.verify import UNVERIFIED_STUDY, require_verified

            problems = require_verified(study_dir, unverified)
            done = export_study(study_dir, out, cast("Format", fmt), first, last, csv_raw=csv_raw)
            note_unverified(done.notes, problems, UNVERIFIED_STUDY, "study", study_dir, "exported")
        else:
            assert world_dir is not None
            done = export(world_dir, out, cast("Format", fmt), first, last, csv_raw=csv_raw)
        if as_json:
            echo_json(
                orjson.dumps(
                    {
                        "command": "export",
                        "ok": not done.problems,
                        "out": str(out),
                        "format": fmt,
                        "verified": None if study_dir is None else not problems,
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
            echo(f"exported {span} to {out}:")
            for name, path in done.files.items():
                echo(f"  {name:<13} {done.rows[name]:>6} rows  {path}")
            for note in done.notes:
                echo(f"note: {note}")
        for problem in done.problems:
            echo(f"unreadable: {problem}", err=True)
        if done.problems:
            sys.exit(1)


@click.command("init")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@count_option("--characters", maximum=500, default=3, help="How many characters.")
@count_option(
    "--locations", maximum=500, default=2, help="How many locations (connected in a ring)."
)
@click.option(
    "--network",
    metavar="ring|small-world|star|random:p",
    help="Give the characters relationships in this network (kind acquaintance, trust "
    "0.5, both ways): a ring; Watts-Strogatz with k=4, rewire p=0.1; a star around the "
    "first; Erdos-Renyi with edge probability p. Drawn with --seed.",
)
@count_option(
    "--seed", minimum=0, maximum=2**63 - 1, default=1, help="The world's seed (and the network's)."
)
@JSON_OPTION
def init_(
    folder: Path,
    characters: int,
    locations: int,
    network: str | None,
    seed: int,
    as_json: bool,
) -> None:
    """Write a small new world into FOLDER (missing or empty) that runs at once, offline.

    It holds world.json, characters/, locations/, config.toml (offline provider),
    prompts/ (the built-in templates, to edit) and a README.
    """
    from sim.network import parse_network
    from sim.worldgen import init_world

    with json_errors("init", as_json):
        shape = parse_network(network) if network is not None else None
        made = init_world(folder, characters, locations, shape, seed)
        if as_json:
            emit(
                {
                    "command": "init",
                    "ok": True,
                    "world": str(folder),
                    "characters": list(made.characters),
                    "locations": list(made.locations),
                    "network": str(shape) if shape is not None else None,
                    "relationships": made.relationships,
                }
            )
            return
        echo(
            f"created {folder}: {len(made.characters)} characters "
            f"({', '.join(made.characters)}), {len(made.locations)} locations "
            f"({', '.join(made.locations)})"
            + (f"; network {shape}, {made.relationships} relationships" if shape else "")
        )
        echo(f"next: sim check --world {folder} && sim tick --world {folder}")


@click.command("schema")
@folder_option(
    "--out",
    "out",
    required=True,
    help="The folder to write the schemas into (created if missing).",
)
@JSON_OPTION
def schema_(out: Path, as_json: bool) -> None:
    """Write JSON Schemas of world.json, character and location files, for editors.

    See docs/world-format.md for pointing an editor at them.
    """
    from sim.worldgen import write_schemas

    with json_errors("schema", as_json):
        written = write_schemas(out)
        if as_json:
            emit({"command": "schema", "ok": True, "paths": [str(p) for p in written]})
            return
        for path in written:
            echo(f"wrote {path}")


@click.command("ask")
@WORLD
@click.argument("character", required=False)
@click.argument("question", required=False)
@click.option(
    "--all", "everyone", is_flag=True, help="Ask every character (a survey): give only QUESTION."
)
@CONFIG
@SETTINGS
@endpoint_options("Model to answer (overrides [phase1] model).")
@click.option(
    "--format",
    "answer_form",
    metavar="yesno|likert5|number|character|choice:A,B,..",
    help="Code the answer: a value of this form, validated, with a free-text reason beside it "
    "(default: free text).",
)
@file_option(
    "--schema",
    "schema_file",
    help="Code the answer as an object of this JSON Schema (the subset declared phases use).",
)
@JSON_OPTION
def ask_(
    world_dir: Path,
    character: str | None,
    question: str | None,
    everyone: bool,
    config_file: Path | None,
    settings: tuple[str, ...],
    provider: str | None,
    model: str | None,
    base_url: str | None,
    answer_form: str | None,
    schema_file: Path | None,
    as_json: bool,
) -> None:
    """Ask CHARACTER a QUESTION and get an in-character answer; the world is not changed.

    Uses the [phase1] model and the configured provider (offline works). Every question
    and answer is appended to .sim/interviews.jsonl with its tick, model and usage, and
    counted by `sim usage`. With --all, every character answers (a survey).
    """
    from sim.errors import InputError
    from sim.interview import answer_format, ask

    with json_errors("ask", as_json):
        form = answer_format(answer_form, schema_file)
        if everyone:
            if question is not None or character is None:
                raise InputError(None, "--all", 'expected one QUESTION: sim ask --all "..."')
            question, who = character, None
        else:
            if character is None or question is None:
                raise InputError(None, "CHARACTER", 'expected CHARACTER "QUESTION" (or --all)')
            who = [character]
        config = build_config(
            config_file, world_dir, provider, model=model, base_url=base_url, settings=settings
        )
        asked = ask(world_dir, config, question, who, form)
        if as_json:
            emit(ask_document(asked, config.prices))
        else:
            for interview in asked.interviews:
                name = asked.names.get(interview.character, interview.character)
                secho(f"[{one_line(name)}]", fg="cyan")
                if interview.answer is not None and interview.format is not None:
                    echo(f"answer: {interview.answer}")
                    echo(wrapped(f"reason: {interview.reason}"))
                elif interview.answer is not None:
                    echo(wrapped(interview.answer))
                else:
                    echo(f"failed: {interview.error}")
            tokens = sum(i.usage.input_tokens + i.usage.output_tokens for i in asked.interviews)
            echo(
                f"\nasked at tick {asked.tick}; recorded in "
                f"{world_dir / '.sim' / 'interviews.jsonl'} ({tokens} tokens)",
                err=True,
            )
        if asked.failures:
            echo(f"failed: {asked.failures} of {len(asked.interviews)} answers", err=True)
            sys.exit(1)
