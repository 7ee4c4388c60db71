"""The ``sim`` command line: thin commands that parse, call the library and print.

Exit codes: 0 ok, 1 the run failed, 2 bad input or usage, 130 interrupted (Ctrl-C),
143 terminated (SIGTERM). No input makes a command print a Python traceback: each command
maps the errors it expects (``sim.cli.common.errors``), and ``_Main`` turns anything else
into one line and exit 1 (``SIM_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from sim import __version__
from sim.cli import history, intervene, report, research, run, stub, sweep, tune
from sim.cli.common import os_error_line


class _Main(click.Group):
    """The backstop: an error no command expected is one line and exit 1, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except OSError as exc:
            if os.environ.get("SIM_DEBUG"):
                raise
            click.echo(os_error_line(exc), err=True)
            sys.exit(1)
        except Exception as exc:
            if os.environ.get("SIM_DEBUG"):
                raise
            click.echo(
                f"internal error: {type(exc).__name__}: {exc} (this is a bug in sim; "
                "SIM_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(1)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
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
    intervene.inject_,
    intervene.set_,
    sweep.sweep,
    stub.stub_server,
):
    main.add_command(command)

__all__ = ["main"]
