"""The ``sim`` command line: parse, call the library, print. Exit codes: 0 ok, 1 the run
failed, 2 bad input or usage."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from sim import __version__
from sim.config import Config, load_config, phase_section
from sim.errors import InputError, RunFailed, SimError
from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError
from sim.llm.events import LLMEvent
from sim.phases.base import PhaseReport
from sim.runner import Runner, TickResult
from sim.storage import Storage

WORLD = click.option(
    "--world",
    "world_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The world folder.",
)
CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Config file (default: ./config.toml, else built-in defaults).",
)


@contextmanager
def _errors() -> Iterator[None]:
    """Map library errors to a message on stderr and an exit code."""
    try:
        yield
    except SimError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except LLMConfigurationError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except LLMBudgetExceededError as exc:
        click.echo(f"stopped: {exc} (nothing was committed for this tick)", err=True)
        sys.exit(1)
    except (RunFailed, LLMError) as exc:
        click.echo(f"failed: {exc}", err=True)
        sys.exit(1)


def _depth_overrides(values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not number.strip().lstrip("-").isdigit():
            raise InputError(None, "--depth", f"expected PHASE=N (got {value!r})")
        depth = int(number)
        if depth < 0:
            raise InputError(None, "--depth", f"depth must be >= 0 (got {depth})")
        out[phase_section(name.strip())] = {"response_chain_depth": depth}
    return out


def _config(
    config_file: Path | None,
    world_dir: Path,
    provider: str | None = None,
    depth: tuple[str, ...] = (),
    concurrency: int | None = None,
) -> Config:
    overrides: dict[str, Any] = _depth_overrides(depth)
    llm: dict[str, Any] = {}
    if provider is not None:
        llm["provider"] = provider
    if concurrency is not None:
        llm["max_concurrency"] = concurrency
    if llm:
        overrides["llm"] = llm
    return load_config(config_file, world_dir if world_dir.is_dir() else None, overrides)


class Progress:
    """One line per phase on stderr: calls done, failures; redrawn in place on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.done = 0
        self.failed = 0

    def on_event(self, event: LLMEvent) -> None:
        if event.kind == "llm_called":
            return
        self.done += 1
        if event.kind == "llm_failed":
            self.failed += 1
        if self.tty and self.done % 25 == 0:
            click.echo(
                f"\r  {event.phase:<11} {self.done} calls, {self.failed} failed", err=True, nl=False
            )

    def on_phase(self, name: str, stage: str, report: PhaseReport | None) -> None:
        if stage == "start":
            self.done = self.failed = 0
            return
        assert report is not None
        if report.calls == 0 and name == "apply":
            line = f"  {name:<11} {len(report.warnings)} rule violations ignored"
        else:
            line = f"  {name:<11} {report.calls}/{report.calls} calls, {report.failures} failed"
        click.echo(("\r" if self.tty else "") + line + "\x1b[K" * self.tty, err=True)


def _print_tick(result: TickResult) -> None:
    click.secho(f"\n== tick {result.tick} ==", bold=True)
    for lid, text in result.narratives.items():
        click.secho(f"\n[{result.location_names.get(lid, lid)}]", fg="cyan")
        click.echo(textwrap.fill(text, width=88))
    if result.moved:
        moves = ", ".join(f"{cid} {a}→{b}" for cid, a, b in result.moved)
        click.echo(f"\nmoved: {moves}")
    for report in result.reports:
        for entity_key, reason in report.errors.items():
            click.echo(f"fallback: {report.name} {entity_key}: {reason}")
        for warning in report.warnings:
            click.echo(f"ignored: {warning}")
    click.echo("\nphase        calls  failed  input tok  output tok")
    for report in result.reports:
        if report.name == "apply":
            continue
        click.echo(
            f"{report.name:<12} {report.calls:>5}  {report.failures:>6}  "
            f"{report.usage.input_tokens:>9}  {report.usage.output_tokens:>10}"
        )
    usage = result.usage
    click.echo(
        f"{'total':<12} {result.calls:>5}  {result.failures:>6}  {usage.input_tokens:>9}  "
        f"{usage.output_tokens:>10}   wall {result.elapsed:.2f}s"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sim")
def main() -> None:
    """sim: a tick-based engine for LLM-driven world simulations."""


@main.command()
@WORLD
@click.option(
    "--ticks",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="How many ticks to run.",
)
@CONFIG
@click.option("--provider", help="LLM provider (overrides [llm] provider).")
@click.option(
    "--depth",
    multiple=True,
    metavar="PHASE=N",
    help="Chain depth for a phase (phase1|phase2a|phase2b|phase4 or "
    "intentions|resolution|narrative|memory); repeatable.",
)
@click.option("--concurrency", type=click.IntRange(min=1), help="Max calls in flight.")
def tick(
    world_dir: Path,
    ticks: int,
    config_file: Path | None,
    provider: str | None,
    depth: tuple[str, ...],
    concurrency: int | None,
) -> None:
    """Run TICKS ticks of a world, committing each."""
    with _errors():
        config = _config(config_file, world_dir, provider, depth, concurrency)
        progress = Progress()
        runner = Runner(
            world_dir,
            config,
            events=progress.on_event,
            on_phase=progress.on_phase,
            on_tick=_print_tick,
        )
        runner.run(ticks)


@main.command()
@WORLD
@CONFIG
def check(world_dir: Path, config_file: Path | None) -> None:
    """Validate a world and its config; call nothing, write nothing."""
    with _errors():
        config = _config(config_file, world_dir)
        storage = Storage(world_dir)
        world = storage.load()
        click.echo(
            f"ok: {world.meta['name']!r} at tick {world.tick}: {len(world.characters)} "
            f"characters, {len(world.locations)} locations; provider {config.llm.provider}"
        )
        if storage.pending_journal():
            click.echo("note: an interrupted commit is pending; the next 'sim tick' completes it")
