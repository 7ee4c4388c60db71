"""The ``sim`` command line: thin commands that parse, call the library and print.

Exit codes: 0 ok, 1 the run failed, 2 bad input or usage, 130 interrupted.
"""

from __future__ import annotations

import click

from sim import __version__
from sim.cli import history, report, research, run, stub, tune


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sim")
def main() -> None:
    """sim: a tick-based engine for LLM-driven world simulations."""


for command in (
    run.tick,
    run.check,
    history.log_,
    history.replay_,
    history.rewind,
    history.fork,
    tune.tune_,
    tune.usage_,
    report.report,
    research.export_,
    research.init_,
    research.schema_,
    research.ask_,
    stub.stub_server,
):
    main.add_command(command)

__all__ = ["main"]
