"""The ``sim`` command line: parse, call the library, print. Exit codes: 0 ok, 1 the run
failed, 2 bad input or usage."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import orjson

from sim import __version__, history, logview
from sim.config import PHASE_SECTIONS, Config, load_config, phase_section
from sim.errors import InputError, RunFailed, SimError, TickInterrupted
from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError
from sim.llm.events import LLMEvent
from sim.log import log_path, read_log, read_logs
from sim.phases.base import PhaseReport
from sim.replay import replay
from sim.runner import Runner, TickResult
from sim.storage import Storage
from sim.testing.stub_server import FAULTS, RANDOM_FAULTS, StubOptions, StubServer

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
    except TickInterrupted as exc:
        click.echo(f"\n{exc}", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("\ninterrupted: nothing was committed", err=True)
        sys.exit(130)
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
    *,
    model: str | None = None,
    base_url: str | None = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
) -> Config:
    overrides: dict[str, Any] = _depth_overrides(depth)
    llm: dict[str, Any] = {}
    if provider is not None:
        llm["provider"] = provider
    if concurrency is not None:
        llm["max_concurrency"] = concurrency
    if base_url is not None:
        llm["base_url"] = base_url
    if llm:
        overrides["llm"] = llm
    if model is not None:
        for section in PHASE_SECTIONS:
            overrides.setdefault(section, {})["model"] = model
    budget: dict[str, Any] = {}
    if budget_usd is not None:
        budget["max_cost_usd"] = budget_usd
    if budget_tokens is not None:
        budget["max_total_tokens"] = budget_tokens
    if budget:
        overrides["budget"] = budget
    return load_config(config_file, world_dir if world_dir.is_dir() else None, overrides)


class Progress:
    """One line per phase on stderr: calls done, failures; redrawn in place on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.done = 0
        self.failed = 0

    def on_event(self, event: LLMEvent) -> None:
        if event.kind == "llm_called" or not event.final:
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
    for note in result.notes:
        click.echo(f"note: {note}")
    if result.resumed_calls:
        click.echo(
            f"resumed: {result.resumed_calls} calls taken from the interrupted tick's "
            "log, not sent again"
        )
    for lid, text in result.narratives.items():
        click.secho(f"\n[{result.location_names.get(lid, lid)}]", fg="cyan")
        click.echo(textwrap.fill(text, width=88))
    if result.moved:
        moves = ", ".join(f"{cid} {a}→{b}" for cid, a, b in result.moved)
        click.echo(f"\nmoved: {moves}")
    for report in result.reports:
        for entity_key, reason in report.errors.items():
            click.echo(f"fallback: {report.name} {entity_key}: {reason}")
        for entity_key, models in report.model_fallbacks.items():
            click.echo(f"fallback model: {report.name} {entity_key}: {models}")
        for warning in report.warnings:
            click.echo(f"ignored: {warning}")
    click.echo("\nphase        calls  failed  retries  input tok  output tok")
    for report in result.reports:
        if report.name == "apply":
            continue
        click.echo(
            f"{report.name:<12} {report.calls:>5}  {report.failures:>6}  {report.retries:>7}  "
            f"{report.usage.input_tokens:>9}  {report.usage.output_tokens:>10}"
        )
    usage = result.usage
    retries = sum(r.retries for r in result.reports)
    click.echo(
        f"{'total':<12} {result.calls:>5}  {result.failures:>6}  {retries:>7}  "
        f"{usage.input_tokens:>9}  {usage.output_tokens:>10}   wall {result.elapsed:.2f}s"
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
@click.option("--model", help="Model for every phase (overrides each [phaseN] model).")
@click.option("--base-url", help="Provider base URL, e.g. http://127.0.0.1:8000/v1.")
@click.option("--budget-usd", type=click.FloatRange(min=0), help="Cost cap for this run (USD).")
@click.option("--budget-tokens", type=click.IntRange(min=0), help="Token cap for this run.")
def tick(
    world_dir: Path,
    ticks: int,
    config_file: Path | None,
    provider: str | None,
    depth: tuple[str, ...],
    concurrency: int | None,
    model: str | None,
    base_url: str | None,
    budget_usd: float | None,
    budget_tokens: int | None,
) -> None:
    """Run TICKS ticks of a world, committing each."""
    with _errors():
        config = _config(
            config_file,
            world_dir,
            provider,
            depth,
            concurrency,
            model=model,
            base_url=base_url,
            budget_usd=budget_usd,
            budget_tokens=budget_tokens,
        )
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
        logs, problems = read_logs(world_dir)
        if logs and not logs[-1].committed and logs[-1].tick == world.tick + 1:
            click.echo(
                f"note: tick {logs[-1].tick} was interrupted; the next 'sim tick' "
                f"resumes it ({len(logs[-1].calls)} calls already logged)"
            )
        for problem in problems:
            click.echo(f"warning: unreadable log: {problem}")


def _tick_arg(value: str) -> int | None:
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise InputError(None, "--tick", f"expected a tick number >= 1 or 'all' (got {value!r})")
    return int(value)


@main.command("log")
@WORLD
@click.option(
    "--tick",
    "tick_",
    default=None,
    metavar="N|all",
    help="The tick to show (default: the last), or 'all' for one line per tick.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable records.")
def log_(world_dir: Path, tick_: str | None, as_json: bool) -> None:
    """Show what happened in a tick, from its log."""
    with _errors():
        if tick_ == "all":
            logs, problems = read_logs(world_dir)
            if not as_json:
                click.echo(logview.SUMMARY_HEAD)
            for log in logs:
                data = logview.summary(log)
                click.echo(orjson.dumps(data).decode() if as_json else logview.summary_line(data))
            for problem in problems:
                click.echo(f"unreadable: {problem}", err=True)
            if problems:
                sys.exit(1)
            return
        number = _tick_arg(tick_) if tick_ is not None else None
        log = (
            read_log(log_path(world_dir, number))
            if number is not None
            else logview.last_log(world_dir)
        )
        if as_json:
            for record in log.records:
                click.echo(orjson.dumps(record).decode())
        else:
            for line in logview.tick_lines(log):
                click.echo(line)


@main.command("replay")
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
def replay_(
    world_dir: Path, tick_: int, to: int | None, live: bool, config_file: Path | None
) -> None:
    """Re-run logged ticks from their recorded responses in a scratch copy and compare."""
    with _errors():
        config = _config(config_file, world_dir)
        report = replay(world_dir, tick_, to, config=config, live=live)
        for line in logview.replay_lines(report, live):
            click.echo(line)
        if not report.identical:
            sys.exit(1)


@main.command()
@WORLD
@click.option(
    "--tick",
    "tick_",
    required=True,
    type=click.IntRange(min=1),
    help="Go back to the state at the start of this tick.",
)
def rewind(world_dir: Path, tick_: int) -> None:
    """Put a world back to its state at the start of a tick; later logs are moved aside."""
    with _errors():
        done = history.rewind(world_dir, tick_)
        click.echo(f"rewound: the world is at tick {tick_ - 1}, ready to run tick {tick_}")
        if done.moved_to is not None:
            click.echo(f"{done.logs_moved} later logs moved to {done.moved_to}")


@main.command()
@WORLD
@click.option(
    "--tick",
    "tick_",
    required=True,
    type=click.IntRange(min=1),
    help="Start the new world from the state at the start of this tick.",
)
@click.option(
    "--to",
    "dest",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The new world's folder (must not exist yet).",
)
def fork(world_dir: Path, tick_: int, dest: Path) -> None:
    """Start a new world from a world's state at the start of a tick."""
    with _errors():
        history.fork(world_dir, tick_, dest)
        click.echo(f"forked: {dest} is at tick {tick_ - 1}, ready to run tick {tick_}")


@main.command("stub-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=8765,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port (0: any free port).",
)
@click.option(
    "--latency",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds before each answer.",
)
@click.option(
    "--latency-jitter",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Extra uniform random latency, up to this many seconds.",
)
@click.option(
    "--fault-rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Probability of a random fault per generation request.",
)
@click.option(
    "--faults",
    default=",".join(RANDOM_FAULTS),
    show_default=True,
    help="Comma-separated faults the fault rate draws from.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Randomness seed.")
def stub_server(
    host: str,
    port: int,
    latency: float,
    latency_jitter: float,
    fault_rate: float,
    faults: str,
    seed: int,
) -> None:
    """Serve a loopback OpenAI-compatible API answered by the offline model.

    Rehearse a large run for free: point --base-url at it with --provider openai or chat.
    GET /stub/stats reports requests and tokens served.
    """
    kinds = tuple(f.strip() for f in faults.split(",") if f.strip())
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        click.echo(
            f"error: unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}",
            err=True,
        )
        sys.exit(2)
    options = StubOptions(
        latency=latency,
        latency_jitter=latency_jitter,
        fault_rate=fault_rate,
        faults=kinds,
        seed=seed,
    )
    server = StubServer(options)

    async def serve() -> None:
        await server.start(host, port)
        click.echo(f"stub server on http://{host}:{server.port}/v1 (Ctrl-C to stop)", err=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
