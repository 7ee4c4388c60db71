"""``sim study run`` and ``sim study report``: a designed experiment from one file."""

from __future__ import annotations

from pathlib import Path

import click

from sim.cli.common import (
    CONFIG,
    count_option,
    echo,
    file_option,
    folder_option,
)
from sim.cli.jsonout import JSON_OPTION, emit, json_errors
from sim.cli.sweep import (
    RunsOptions,
    budget_and_executor,
    finish_runs,
    note_unverified,
    outcome_line,
    print_report,
    refuse_world_trust,
    say_verified,
)
from sim.errors import InputError


@click.group("study")
def study() -> None:
    """Run a study (conditions, scheduled interventions, surveys) and report on it."""


@study.command("run")
@click.argument("study_file", type=click.Path(path_type=Path, dir_okay=False))
@folder_option("--out", required=True, help="The study's folder (one sub-folder per condition).")
@count_option("--jobs", maximum=256, default=1, help="Runs at a time (each step its own process).")
@CONFIG
@budget_and_executor("study", "step")
@click.option(
    "--trust-study",
    is_flag=True,
    help="Let the study file's factors set where requests go, which credential they "
    "carry, the program a cli provider runs or a policy gate, as your own config would "
    "(each is named in a note); its limits may still only tighten. Only for a study you "
    "trust: see docs/security.md.",
)
@JSON_OPTION
def run_(
    study_file: Path,
    out: Path,
    jobs: int,
    config_file: Path | None,
    runs: RunsOptions,
    trust_study: bool,
    as_json: bool,
) -> None:
    """Run STUDY_FILE into OUT: every seed, factor combination and condition.

    The conditions of a seed share the ticks before the first intervention: those run
    once, then each condition is forked from them. Running the same study again resumes.
    See docs/analysis.md.
    """
    from sim.study.design import read_study
    from sim.study.run import run_study

    with json_errors("study run", as_json):
        refuse_world_trust("study")
        runs.check()
        plan = read_study(study_file)
        with runs.chosen() as run:
            if not as_json:
                echo(
                    f"study: {len(plan.arms)} runs ({len(plan.spec.conditions)} conditions x "
                    f"{len(plan.units)} seeds/factor values) of {plan.world} into {out}; "
                    f"{plan.prefix} shared ticks",
                    err=True,
                )
            result = run_study(
                plan,
                out,
                jobs,
                runs.budget_usd,
                runs.budget_tokens,
                config_file,
                on_outcome=None if as_json else lambda o: echo(outcome_line(o), err=True),
                executor=run,
                on_interrupt=lambda note: echo(note, err=True),
                trust_study=trust_study,
                workers=runs.shards(),
            )
        finish_runs("study run", "study", result, out, as_json, {"prefix_ticks": plan.prefix})


@study.command("report")
@click.argument("study_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--field",
    "field_spec",
    metavar="FIELD[=VALUE]|survey[:N]",
    help="A state field of the characters (coins), a survey's answer (survey: the first; "
    "survey:N), or FIELD=VALUE for the share holding VALUE (default: the first survey).",
)
@file_option("--html", "html_out", help="Also write the report as one HTML page to this file.")
@folder_option(
    "--figures",
    "figures_dir",
    help="Also write the figures (means, differences, every condition on one page) into "
    "this folder as SVG and PNG (needs matplotlib: pip install 'sim[analysis]').",
)
@click.option(
    "--unverified",
    is_flag=True,
    help="Report on a study that does not verify (sim study verify); the report says so.",
)
@JSON_OPTION
def report_(
    study_dir: Path,
    field_spec: str | None,
    html_out: Path | None,
    figures_dir: Path | None,
    unverified: bool,
    as_json: bool,
) -> None:
    """A measure of a study per condition and tick: mean over runs with a 95% interval, and
    each condition's difference from the first, paired by run.

    A study that does not verify (sim study verify) is refused unless --unverified."""
    from sim.analysis.studyreport import report_lines, study_report, write_html
    from sim.study.verify import UNVERIFIED_STUDY, require_verified

    with json_errors("study report", as_json):
        problems = require_verified(study_dir, unverified)
        report = study_report(study_dir, field_spec)
        note_unverified(report.notes, problems, UNVERIFIED_STUDY, "study", study_dir, "reported")
        figures: list[Path] = []
        if figures_dir is not None:
            from sim.analysis.figures import write_figures

            figures = write_figures(report, figures_dir)
        if html_out is not None:
            write_html(report, html_out, f"Study {study_dir.name or study_dir}")
        if as_json:
            emit(
                {
                    "command": "study report",
                    "ok": True,
                    "verified": not problems,
                    **report.to_dict(),
                    "html": None if html_out is None else str(html_out),
                    "figures": [str(p) for p in figures],
                }
            )
            return
        print_report(report_lines(report), report.notes, problems, "study", study_dir)
        if html_out is not None:
            echo(f"wrote {html_out}", err=True)
        for path in figures:
            echo(f"wrote {path}", err=True)


@study.command("compare")
@click.argument("study_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--field",
    "fields",
    multiple=True,
    metavar="FIELD[=VALUE]|survey[:N]",
    help="What to compare, named as sim study report names it; repeat for several "
    "(default: the first survey). With --reference, the file names the fields.",
)
@click.option(
    "--tick", "ticks", multiple=True, type=click.IntRange(min=0), help="Only this tick (repeat)."
)
@click.option(
    "--test",
    type=click.Choice(["auto", "welch", "mannwhitney", "ks", "chi2"]),
    default="auto",
    show_default=True,
    help="Welch's t, Mann-Whitney U or Kolmogorov-Smirnov on numbers, χ² on categories "
    "(auto: welch for numbers and yes/no, chi2 otherwise).",
)
@click.option(
    "--unit",
    type=click.Choice(["run", "answer"]),
    default="run",
    show_default=True,
    help="Between arms: each run's mean over its characters, or every character's answer.",
)
@click.option(
    "--correction",
    type=click.Choice(["holm", "bh", "none"]),
    default="holm",
    show_default=True,
    help="For the many comparisons: Holm, Benjamini-Hochberg, or none.",
)
@file_option(
    "--reference",
    help="Compare each condition with real data: a CSV of field,tick,value rows.",
)
@click.option(
    "--seed", default=0, show_default=True, type=click.IntRange(min=0), help="The bootstrap's seed."
)
@click.option(
    "--unverified",
    is_flag=True,
    help="Compare the arms of a study that does not verify (sim study verify); the output says so.",
)
@JSON_OPTION
def compare_(
    study_dir: Path,
    fields: tuple[str, ...],
    ticks: tuple[int, ...],
    test: str,
    unit: str,
    correction: str,
    reference: Path | None,
    seed: int,
    unverified: bool,
    as_json: bool,
) -> None:
    """Test each condition against the first (or against real data, --reference): a named
    test, its p value adjusted for every comparison, a bootstrap interval and an effect
    size per field and tick (needs scipy: pip install 'sim[analysis]'). See
    docs/analysis.md.

    A study that does not verify (sim study verify) is refused unless --unverified."""
    from sim.analysis.compare import compare_lines, compare_study
    from sim.study.verify import UNVERIFIED_STUDY, require_verified

    with json_errors("study compare", as_json):
        if reference is not None and fields:
            raise InputError(None, "--field", "the reference file names the fields")
        problems = require_verified(study_dir, unverified)
        result = compare_study(
            study_dir,
            fields,
            ticks=ticks,
            test=test,  # type: ignore[arg-type]
            unit=unit,  # type: ignore[arg-type]
            correction=correction,  # type: ignore[arg-type]
            reference=reference,
            seed=seed,
        )
        note_unverified(result.notes, problems, UNVERIFIED_STUDY, "study", study_dir, "compared")
        if as_json:
            emit(
                {
                    "command": "study compare",
                    "ok": True,
                    "verified": not problems,
                    **result.to_dict(),
                }
            )
            return
        print_report(compare_lines(result), result.notes, problems, "study", study_dir)


@study.command("verify")
@click.argument("study_dir", type=click.Path(path_type=Path, file_okay=False))
@JSON_OPTION
def verify_(study_dir: Path, as_json: bool) -> None:
    """Check every arm of a study against its own tick logs and answer records: a world
    file edited since its last tick, an answer edited or missing, an arm missing or not the
    study's, an arm unfinished. Exit 1 when anything is found."""
    from sim.study.verify import UNVERIFIED_STUDY, verify_study

    with json_errors("study verify", as_json):
        problems = verify_study(study_dir)
        say_verified(
            "study verify",
            study_dir,
            problems,
            as_json,
            UNVERIFIED_STUDY,
            "every arm matches its logs and answer records",
        )
