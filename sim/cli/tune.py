"""``sim tune`` and ``sim usage``: what a phase's chain depth costs, and what a world used."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click
import orjson

from sim.cli.common import (
    CONFIG,
    WORLD,
    build_config,
    count_option,
    echo,
    echo_json,
    endpoint_options,
    errors,
)
from sim.errors import InputError
from sim.terminal import one_line

if TYPE_CHECKING:  # imported by the commands (`sim --help` does not load the runner)
    from sim.analysis.tune import TuneRow
    from sim.analysis.usage import By, UsageReport, UsageRow

#: ``sim.analysis.usage.BY_CHOICES``, restated for the option (a test pins them together)
BY_CHOICES = ("entity", "phase", "tick", "model", "endpoint")

TUNE_HEAD = (
    "depth  requests  failed  input tok  cached in  output tok       cost     wall  "
    "phase in tok  avg window"
)
MEMORY_HEAD = (
    "memory    requests  failed  input tok  cached in  output tok       cost     wall  "
    "phase in tok  mem lines  mean age  differs"
)
USAGE_HEAD = "requests  failed  input tok  cached in  output tok  total tok       cost"
#: the column ``sim usage`` adds when embeddings requests were sent (not in ``requests``)
EMBEDS_HEAD = "  embeds"


def parse_depths(value: str) -> list[int]:
    depths = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            raise InputError(None, "--depths", f"expected N,N,... with N >= 0 (got {value!r})")
        depths.append(int(part))
    return list(dict.fromkeys(depths))


def tune_line(row: TuneRow) -> str:
    t = row.total
    return (
        f"{row.depth:>5}  {t.calls:>8}  {t.failures:>6}  {t.usage.input_tokens:>9}  "
        f"{t.usage.cached_input_tokens:>9}  {t.usage.output_tokens:>10}  {t.cost.text():>9}  "
        f"{row.wall_seconds:>6.2f}s  {row.phase.usage.input_tokens:>12}  {row.avg_window:>10.2f}"
    )


def parse_memory(value: str | None) -> list[str]:
    if value is None:
        return []
    from sim.config import known_memory

    modes = [part.strip() for part in value.split(",")]
    if not modes or not all(known_memory(m) for m in modes):
        raise InputError(None, "--memory", f"expected window,retrieve (got {value!r})")
    return list(dict.fromkeys(modes))


def memory_line(row: TuneRow) -> str:
    t = row.total
    differs = "-" if row.differs is None else f"{row.differs:.0%}"
    return (
        f"{row.memory or '':<8}  {t.calls:>8}  {t.failures:>6}  {t.usage.input_tokens:>9}  "
        f"{t.usage.cached_input_tokens:>9}  {t.usage.output_tokens:>10}  {t.cost.text():>9}  "
        f"{row.wall_seconds:>6.2f}s  {row.phase.usage.input_tokens:>12}  {row.memory_lines:>9.2f}  "
        f"{row.mean_age:>8.1f}  {differs:>7}"
    )


def unpriced_note(models: frozenset[str]) -> str:
    names = ", ".join(one_line(model) for model in sorted(models))  # as the logs name them
    return (
        f'cost unknown: no price for {names}; add [prices."<model>"] input, cached_input '
        "and output (USD per million tokens) to config.toml"
    )


@click.command("tune")
@WORLD
@click.option("--phase", required=True, help="The phase to tune (phase1|phase2a|... or name).")
@click.option(
    "--depths", default="0,1,2,4", show_default=True, help="Chain depths to try, comma-separated."
)
@count_option(
    "--ticks",
    default=3,
    help="Ticks to run at each depth.",
)
@click.option(
    "--memory",
    "memory_modes",
    metavar="MODES",
    help="Compare memory modes instead of depths, e.g. window,retrieve: the phase's "
    "[memory] mode in each row, at its own depth.",
)
@CONFIG
@endpoint_options()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per depth (or memory mode): JSON Lines (docs/cli-json.md).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask before spending money.")
def tune_(
    world_dir: Path,
    phase: str,
    depths: str,
    ticks: int,
    memory_modes: str | None,
    config_file: Path | None,
    provider: str | None,
    model: str | None,
    base_url: str | None,
    as_json: bool,
    yes: bool,
) -> None:
    """Run TICKS ticks at each depth of one phase on scratch copies and compare the cost.

    With --memory, one row per memory mode instead: the tokens, and what the phase's calls
    were shown (memory lines per call, their mean age in ticks, and how often they differ
    from the first row's for the same character and tick).

    The live world is never touched. With a provider other than offline this spends
    money: it shows an estimate and asks first (--yes skips the question).
    """
    from sim.analysis.tune import estimate, tune
    from sim.config import phase_section, section_name
    from sim.providers import profile

    with errors(read_only=True):  # on scratch copies
        tried = parse_depths(depths)
        modes = parse_memory(memory_modes)
        source = click.get_current_context().get_parameter_source("depths")
        if modes and source is not click.core.ParameterSource.DEFAULT:
            raise InputError(None, "--memory", "compares memory modes; give it without --depths")
        config = build_config(config_file, world_dir, provider, model=model, base_url=base_url)
        section = phase_section(phase, config.tick.phases, "--phase")
        name = section_name(section)
        if not profile(config.llm.provider).sends_nothing and not yes:
            guess = estimate(world_dir, config, section, tried, ticks, memory=modes)
            variants = f"{len(modes)} memory modes" if modes else f"{len(tried)} depths"
            runs = f"{variants} x {ticks} ticks of {world_dir} on {config.llm.provider}"
            cost = guess.cost.text() if guess.cost.known else "unknown"
            echo(
                f"sim tune will run {runs}: about {guess.input_tokens:,} input and "
                f"{guess.output_tokens:,} output tokens, cost {cost}",
                err=True,
            )
            echo(f"  ({guess.method})", err=True)
            if not guess.cost.known:
                echo(f"  {unpriced_note(guess.cost.unpriced)}", err=True)
            click.confirm("Spend it?", abort=True, err=True)
        if not as_json:
            echo(
                f"tune {name} ({section}): {ticks} ticks per "
                f"{'memory mode' if modes else 'depth'} on a scratch copy of "
                f"{world_dir}; provider {config.llm.provider}"
            )
            echo(MEMORY_HEAD if modes else TUNE_HEAD)
        unpriced: set[str] = set()

        def show(row: TuneRow) -> None:
            unpriced.update(row.total.cost.unpriced)
            if as_json:
                data = {"phase": name, "provider": config.llm.provider, **row.to_dict()}
                echo_json(orjson.dumps(data).decode())
            else:
                echo(memory_line(row) if modes else tune_line(row))

        tune(world_dir, config, section, tried, ticks, on_row=show, memory=modes)
        if unpriced and not as_json:
            echo(unpriced_note(frozenset(unpriced)))


def usage_line(row: UsageRow, width: int, embeddings: bool = False) -> str:
    """One row of ``sim usage``; ``embeddings``: with the column of embeddings requests."""
    line = (
        f"{one_line(row.key):<{width}}  {row.calls:>8}  {row.failures:>6}  "
        f"{row.usage.input_tokens:>9}  {row.usage.cached_input_tokens:>9}  "
        f"{row.usage.output_tokens:>10}  {row.usage.total_tokens:>9}  {row.cost.text():>9}"
    )
    return f"{line}  {row.embedding_requests:>6}" if embeddings else line


def print_usage(report: UsageReport) -> None:
    # the keys (models, ids, endpoints) come from the logs: each on one line, shown escaped
    width = max([len(report.by), 5, *(len(one_line(r.key)) for r in report.rows)])
    # a world that fetched provider embeddings: their requests get a column of their own
    embeddings = report.total.embedding_requests > 0
    echo(f"{report.by:<{width}}  {USAGE_HEAD}{EMBEDS_HEAD if embeddings else ''}")
    for row in report.rows:
        echo(usage_line(row, width, embeddings))
    echo(usage_line(report.total, width, embeddings))
    models = {m for m in report.total.cost.unpriced if not m.startswith("(")}
    if models:
        echo(unpriced_note(frozenset(models)))
    for note in report.notes:
        echo(f"note: {note}")


@click.command("usage")
@WORLD
@click.option(
    "--by",
    type=click.Choice(BY_CHOICES),
    default="entity",
    show_default=True,
    help="Group by entity (their _openai.usage), phase, tick, provider/model (the tick "
    "logs; model: each attempt where it ran, fallbacks included) or endpoint (the server "
    "each attempt went to).",
)
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="One JSON document (docs/cli-json.md).")
def usage_(world_dir: Path, by: str, config_file: Path | None, as_json: bool) -> None:
    """Tokens, requests and cost of a world, most expensive first, with totals."""
    from sim.analysis.usage import usage_report

    with errors(read_only=True):
        config = build_config(config_file, world_dir, sends_requests=False)
        report = usage_report(world_dir, cast("By", by), config.prices)
        if as_json:
            echo_json(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
        else:
            print_usage(report)
        for problem in report.problems:
            echo(f"unreadable log (its calls are not counted): {problem}", err=True)
        if report.problems:
            sys.exit(1)
