"""The ``sim`` command line: thin commands that parse, call the library and print.

Exit codes: 0 ok, 1 the run failed, 2 bad input or usage, 130 interrupted (Ctrl-C),
143 terminated (SIGTERM), 141 a read-only command's output closed by its reader
(``sim usage | head -1``: quietly, ``sim.cli.common.reader_gone``). No input makes a
command print a Python traceback: each command maps the errors it expects
(``sim.cli.common.errors``), and ``_Main`` turns anything else into one line and exit 1
(``SIM_DEBUG=1`` shows the traceback).

Each command's module is imported only when that command runs (or ``--help`` lists them
all): ``sim tick`` does not pay for the modules of ``sim report``, ``sim sweep`` or the
stub server at start-up.

Owns: the command line: parsing, calling the library, printing, exit codes.

May import: every package below it, inside the command that needs it: ``sim.analysis``,
``sim.config``, ``sim.engine``, ``sim.errors``, ``sim.interventions``, ``sim.interview``,
``sim.lifeline``, ``sim.llm``, ``sim.mind``, ``sim.network``, ``sim.phases``,
``sim.policy``, ``sim.providers`` (a kind's profile), ``sim.runs``, ``sim.serve``, ``sim.storage``,
``sim.study``, ``sim.terminal``, ``sim.testing``, ``sim.ticklog``, ``sim.version``,
``sim.world``, ``sim.worldgen``. Only ``sim.__main__`` imports it.

Next: a new command is a function in its group's module (a new group: a module of its
own), named in ``COMMANDS``.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any

import click

from sim.version import __version__

#: command name -> (module in sim.cli, attribute): the commands, loaded when used
COMMANDS: dict[str, tuple[str, str]] = {
    "tick": ("run", "tick"),
    "check": ("run", "check"),
    "log": ("history", "log_"),
    "replay": ("history", "replay_"),
    "rewind": ("history", "rewind"),
    "fork": ("history", "fork"),
    "tune": ("tune", "tune_"),
    "usage": ("tune", "usage_"),
    "report": ("report", "report"),
    "export": ("research", "export_"),
    "init": ("research", "init_"),
    "schema": ("research", "schema_"),
    "ask": ("research", "ask_"),
    "inject": ("intervene", "inject_"),
    "set": ("intervene", "set_"),
    "pack": ("forms", "pack_"),
    "unpack": ("forms", "unpack_"),
    "sweep": ("sweep", "sweep"),
    "study": ("study", "study"),
    "serve": ("serve", "serve"),
    "stub-server": ("stub", "stub_server"),
}


class _Main(click.Group):
    """The backstop: an error no command expected is one line and exit 1, not a traceback.
    Commands are looked up in ``COMMANDS`` and imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"sim.cli.{module}"), attr)
            assert isinstance(command, click.Command) and command.name == cmd_name, cmd_name
            self.add_command(command)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click's, with the nearest command named when there is no such command
        (``sim tik``: "Did you mean 'tick'?")."""
        name = click.utils.make_str(args[0])
        if self.get_command(ctx, name) is None and not name.startswith("-"):
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            if close:
                ctx.fail(f"No such command {name!r}. Did you mean {close[0]!r}?")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except OSError as exc:
            if os.environ.get("SIM_DEBUG"):
                raise
            from sim.cli.common import echo, os_error_line

            echo(os_error_line(exc), err=True)
            sys.exit(1)
        except Exception as exc:
            if os.environ.get("SIM_DEBUG"):
                raise
            from sim.cli.common import echo

            echo(
                f"internal error: {type(exc).__name__}: {exc} (this is a bug in sim; "
                "SIM_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(1)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sim")
def main() -> None:
    """sim: a tick-based engine for LLM-driven world simulations."""
    from sim.lifeline import follow_parent

    follow_parent()  # started by a sweep or study: die with it

    from sim.cli.common import echo_logging

    echo_logging()  # the library's warnings are printed as every other line


__all__ = ["main"]
