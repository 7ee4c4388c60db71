"""``sim sweep`` and ``sim sweep report``: many runs of a world, and one table comparing them."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sim.cli.common import (
    CONFIG,
    count_option,
    counted,
    echo,
    file_option,
    folder_option,
    shard_count,
    trusting_world_config,
)
from sim.cli.jsonout import JSON_OPTION, emit, json_errors
from sim.errors import InputError

#: a click command's function, before ``click.command`` makes it one
Command = Callable[..., Any]

if TYPE_CHECKING:
    from sim.runs.process import Executor, RunOutcome, SweepResult


def outcome_line(outcome: RunOutcome) -> str:
    line = f"{outcome.status:<11} {outcome.name}  tick {outcome.tick}/{outcome.target}"
    return line + (f"  {outcome.message}" if outcome.message else "")


def refuse_world_trust(whole: str) -> None:
    """Refuse ``--trust-world-config`` for a ``whole`` (a sweep, a study) of runs.

    Raises:
        InputError: the flag is given: the runs' folders are not the user's config.
    """
    if trusting_world_config():
        raise InputError(
            None,
            "--trust-world-config",
            f"a {whole}'s runs never trust a config inside their folders: put the "
            "endpoints in your own config (--config)",
        )


@dataclass(frozen=True, slots=True)
class RunsOptions:
    """What a sweep's or a study's shared options chose (``budget_and_executor``): the caps
    on the whole of it (``None``: none; 0 on the command line, as for ``sim tick`` and
    ``[budget]``), and where each of its runs or steps runs."""

    budget_usd: float | None
    budget_tokens: int | None
    executor: str
    ray_address: str | None
    #: ``--workers`` as given: each step's ticks on that many shards of its run's world
    #: (``sim tick --workers``; ``shards``)
    workers: str = "1"

    def check(self) -> None:
        """Raises: InputError: ``--ray-address`` without ``--executor ray``; UserError:
        ``--workers`` not a number from 1 to 1024 nor ``auto``."""
        if self.ray_address is not None and self.executor != "ray":
            raise InputError(None, "--ray-address", "goes with --executor ray")
        self.shards()

    def shards(self) -> int:
        """The shards ``--workers`` asks for each step's ticks (``auto``: one per core)."""
        return shard_count(self.workers, "local", None)

    @contextmanager
    def chosen(self) -> Iterator[Executor]:
        """The executor ``--executor`` chooses (a local one's warm workers closed after)."""
        from sim.runs.process import LocalExecutor, ray_executor

        run = ray_executor(self.ray_address) if self.executor == "ray" else LocalExecutor()
        try:
            yield run
        finally:
            if isinstance(run, LocalExecutor):
                run.close()  # its warm workers


def say_verified(
    command: str, folder: Path, problems: list[str], as_json: bool, failed: str, passed: str
) -> None:
    """Say what ``sim sweep verify`` or ``sim study verify`` found in ``folder`` (``failed``,
    ``passed``: the verdict's words), and exit 1 when anything was found."""
    if as_json:
        emit({"command": command, "ok": not problems, "problems": problems})
    else:
        for problem in problems:
            echo(f"problem: {problem}")
        echo(
            f"{folder}: {counted(len(problems), 'problem')}; {failed}"
            if problems
            else f"{folder}: verified ({passed})"
        )
    if problems:
        sys.exit(1)


def note_unverified(
    notes: list[str], problems: list[str], verdict: str, whole: str, folder: Path, done: str
) -> None:
    """Lead ``notes`` with what output made from a sweep's or a study's (the ``whole``'s)
    ``folder`` that does not verify says, when there are ``problems``: the ``verdict``,
    their count, the command that names them, and that it was ``done`` ("reported") as
    asked."""
    if problems:
        found = f"{counted(len(problems), 'problem')}: sim {whole} verify {folder}"
        notes.insert(0, f"UNVERIFIED: {verdict} ({found}); {done} as asked (--unverified)")


def print_report(
    lines: Iterable[str], notes: list[str], problems: list[str], whole: str, folder: Path
) -> None:
    """A report on a sweep's or a study's (the ``whole``'s) ``folder`` on the terminal: a
    warning first when it does not verify (``problems``), its ``lines``, then its notes on
    stderr."""
    if problems:
        found = counted(len(problems), "problem")
        echo(f"UNVERIFIED {whole} ({found}: sim {whole} verify {folder})")
    for line in lines:
        echo(line)
    for note in notes:
        echo(f"note: {note}", err=True)


def finish_runs(
    command: str,
    whole: str,
    result: SweepResult,
    out: Path,
    as_json: bool,
    extra: dict[str, Any] | None = None,
) -> None:
    """Say how a sweep's or a study's runs ended (``extra`` joins the JSON after ``out``),
    and exit 130 when interrupted, 1 when a run did not finish."""
    if as_json:
        emit(
            {
                "command": command,
                "ok": result.ok,
                "interrupted": result.interrupted,
                "out": str(out),
                **(extra or {}),
                "runs": [o.to_dict() for o in result.runs],
                "spent_usd": result.spent_usd,
                "spent_tokens": result.spent_tokens,
            }
        )
    else:
        counts: dict[str, int] = {}
        for outcome in result.runs:
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in counts.items())
        spent = "unknown" if result.spent_usd is None else f"${result.spent_usd:.4f}"
        echo(f"{summary}; the {whole} has spent {result.spent_tokens} tokens, {spent}")
        if not result.ok:
            echo("run the same command again to resume the runs not finished", err=True)
    if result.interrupted:
        sys.exit(130)
    if not result.ok:
        sys.exit(1)


def budget_and_executor(whole: str, unit: str) -> Callable[[Command], Command]:
    """The options a sweep and a study share: caps for the ``whole`` of it, and where each
    ``unit`` (a run, a step) runs; the command gets them as one ``runs`` (``RunsOptions``)."""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def with_runs(
            *args: Any,
            budget_usd: float | None,
            budget_tokens: int | None,
            executor: str,
            ray_address: str | None,
            workers: str,
            **kwargs: Any,
        ) -> Any:
            runs = RunsOptions(
                budget_usd or None, budget_tokens or None, executor, ray_address, workers
            )
            return command(*args, runs=runs, **kwargs)

        for option in reversed(
            (
                click.option(
                    "--budget-usd",
                    type=click.FloatRange(min=0),
                    help=f"Cost cap for the whole {whole} (USD; 0 = none).",
                ),
                click.option(
                    "--budget-tokens",
                    type=click.IntRange(min=0),
                    help=f"Token cap for the whole {whole} (0 = none).",
                ),
                click.option(
                    "--executor",
                    type=click.Choice(["local", "ray"]),
                    default="local",
                    show_default=True,
                    help=f"local: each {unit} a process here; ray: each {unit} a Ray task "
                    "(pip install 'sim[ray]').",
                ),
                click.option(
                    "--ray-address",
                    metavar="ADDR",
                    help="The Ray cluster (default: $RAY_ADDRESS, else a local instance).",
                ),
                click.option(
                    "--workers",
                    default="1",
                    metavar="N|auto",
                    help=f"Each {unit}'s ticks on N shards of its world, each a process "
                    "(sim tick --workers; auto: one per core): the same results, sooner "
                    "for a big world. Mind --jobs: each of its runs takes N cores.",
                ),
            )
        ):
            with_runs = option(with_runs)
        return with_runs

    return decorate


@click.group(invoke_without_command=True)
@folder_option(
    "--world",
    "world_dir",
    help="The world every run forks from (its current state).",
)
@click.option(
    "--seeds", default="0", show_default=True, metavar="N-M|N,M,...", help="The runs' seeds."
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="SECTION.KEY=V1,V2",
    help="A config key and the values it takes (e.g. phase1.temperature=0.5,0.9); "
    "repeatable: runs are the cross product of seeds and every --set.",
)
@count_option(
    "--ticks",
    default=1,
    help="Ticks each run gets, from the tick it forked at.",
)
@folder_option(
    "--out",
    help="Folder of the runs (one sub-folder per run).",
)
@count_option("--jobs", maximum=256, default=1, help="Runs at a time (each its own process).")
@CONFIG
@budget_and_executor("sweep", "run")
@JSON_OPTION
@click.pass_context
def sweep(
    ctx: click.Context,
    world_dir: Path | None,
    seeds: str,
    settings: tuple[str, ...],
    ticks: int,
    out: Path | None,
    jobs: int,
    config_file: Path | None,
    runs: RunsOptions,
    as_json: bool,
) -> None:
    """Run a world many times: every seed with every combination of --set values.

    Each run is a fork of the world in OUT/<run-name>/ with its own tick log. Running the
    same sweep again skips finished runs and resumes interrupted ones. See docs/analysis.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    from sim.runs.design import make_plan, parse_seeds, parse_setting
    from sim.runs.sweep import run_sweep

    with json_errors("sweep", as_json):
        if world_dir is None or out is None:
            raise InputError(None, "--world/--out", "both are needed to run a sweep")
        refuse_world_trust("sweep")
        plan = make_plan(
            world_dir,
            out,
            parse_seeds(seeds),
            [parse_setting(s) for s in settings],
            ticks,
            config_file,
        )
        runs.check()
        plan.workers = runs.shards()
        with runs.chosen() as run:
            if not as_json:
                echo(f"sweep: {len(plan.runs)} runs of {world_dir} into {out}", err=True)
            result = run_sweep(
                plan,
                jobs,
                runs.budget_usd,
                runs.budget_tokens,
                on_outcome=None if as_json else lambda o: echo(outcome_line(o), err=True),
                executor=run,
                on_interrupt=lambda note: echo(note, err=True),
            )
        finish_runs("sweep", "sweep", result, out, as_json)


@sweep.command("report")
@folder_option(
    "--runs",
    "runs_dir",
    required=True,
    help="The sweep's --out folder.",
)
@file_option(
    "--html",
    "html_out",
    help="Also write the table as one HTML page (no network needed) to this file.",
)
@click.option(
    "--unverified",
    is_flag=True,
    help="Report on runs that do not verify (sim sweep verify); the report says so.",
)
@JSON_OPTION
def report_(runs_dir: Path, html_out: Path | None, unverified: bool, as_json: bool) -> None:
    """One table comparing a sweep's runs: tokens, cost, failures, state at the last tick.

    Runs that do not verify (sim sweep verify) are refused unless --unverified."""
    from sim.analysis.sweepreport import (
        REPORT_EACH,
        report_lines,
        settings_lines,
        sweep_report,
        write_html,
    )
    from sim.runs.verify import UNVERIFIED_RUNS, require_verified

    with json_errors("sweep report", as_json):
        problems = require_verified(runs_dir, unverified, REPORT_EACH)  # raises: no runs
        report = sweep_report(runs_dir)
        note_unverified(report.notes, problems, UNVERIFIED_RUNS, "sweep", runs_dir, "reported")
        if html_out is not None:
            write_html(report, html_out, runs_dir.name or str(runs_dir))
        if as_json:
            emit(
                {
                    "command": "sweep report",
                    "ok": True,
                    "verified": not problems,
                    "runs": [row.to_dict() for row in report.runs],
                    "fields": report.fields,
                    "settings": [row.to_dict() for row in report.settings],
                    "notes": report.notes,
                    "html": None if html_out is None else str(html_out),
                }
            )
            return
        lines = [
            *report_lines(report),
            "",
            "per setting, seeds pooled (mean ± sd over runs):",
            *settings_lines(report),
        ]
        print_report(lines, report.notes, problems, "sweep", runs_dir)
        if html_out is not None:
            echo(f"wrote {html_out}", err=True)


@sweep.command("verify")
@click.argument("runs_dir", type=click.Path(path_type=Path, file_okay=False))
@JSON_OPTION
def verify_(runs_dir: Path, as_json: bool) -> None:
    """Check every run of a sweep's folder against its own tick logs and answer records,
    and that all were made from the same inputs. Exit 1 when anything is found."""
    from sim.runs.verify import UNVERIFIED_RUNS, verify_runs

    with json_errors("sweep verify", as_json):
        problems = verify_runs(runs_dir)
        say_verified(
            "sweep verify",
            runs_dir,
            problems,
            as_json,
            UNVERIFIED_RUNS,
            "every run matches its logs and answer records",
        )
