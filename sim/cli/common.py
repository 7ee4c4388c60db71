"""What every command shares: the --world and --config options, config building, and the
mapping of library errors to messages and exit codes (0 ok, 1 the run failed, 2 bad input).

The config's models are imported by ``build_config``, when a command builds its config:
``sim log`` and ``sim report`` read a history without one and do not load them.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from sim.errors import InputError, RunFailed, SimError, TickInterrupted, UserError
from sim.llm.redact import redact_text
from sim.terminal import BIDI_CONTROLS, one_line, printable

if TYPE_CHECKING:
    from sim.config import Config

_F = TypeVar("_F", bound=Callable[..., Any])

#: what JSON may hold raw inside a string and a terminal acts on (orjson escapes C0)
_JSON_CONTROL = re.compile(rf"[\x7f-\x9f{BIDI_CONTROLS}]")


def echo(
    message: object = None, *, err: bool = False, nl: bool = True, overwrite: bool = False
) -> None:
    """Every line of human output goes through here, its control characters shown, never
    sent (``printable``). ``overwrite``: a status line that replaces the one before it on a
    terminal (carriage return before, clear-to-end-of-line after), so one line: its line
    breaks are shown too (``one_line``).

    Names and ids printed inside a line are passed through ``one_line`` before they are put
    in it: a line break in a name would start a line the world wrote."""
    text = "" if message is None else (one_line if overwrite else printable)(str(message))
    if overwrite:
        text = f"\r{text}\x1b[K"
    click.echo(text, err=err, nl=nl)


def secho(message: object, *, err: bool = False, nl: bool = True, **styles: Any) -> None:
    """``echo`` in a colour or weight (``fg="cyan"``, ``bold=True``): the styles are added
    to the made-printable text, so only sim's own escapes reach the terminal."""
    click.echo(styled(message, **styles), err=err, nl=nl)


def styled(message: object, **styles: Any) -> str:
    """``message`` made printable, in a colour or weight: a line for ``echo_lines``."""
    return click.style(printable(str(message)), **styles)


def echo_lines(lines: list[str]) -> None:
    """Lines to stdout in one write, each already made printable (``printable``,
    ``styled``): a big tick's thousands of narratives, not two writes a place."""
    if lines:
        click.echo("\n".join(lines))


def echo_json(text: str) -> None:
    """One JSON document or line to stdout. JSON escapes C0 controls already; DEL, C1 and
    the bidirectional controls, which it may hold raw, are written as ``\\uNNNN`` escapes:
    the same JSON value."""
    click.echo(_JSON_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


class _EchoHandler(logging.Handler):
    """The library's warnings, printed as every other line (``echo``) to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            echo(self.format(record), err=True)
        except Exception:
            self.handleError(record)


def echo_logging() -> None:
    """Send the ``sim`` loggers' warnings through ``echo`` (once per process), instead of
    Python's last-resort handler, which would write their text raw."""
    logger = logging.getLogger("sim")
    if not any(isinstance(h, _EchoHandler) for h in logger.handlers):
        handler = _EchoHandler(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)


def folder_option(*decls: str, **attrs: Any) -> Callable[[_F], _F]:
    """An option naming a folder (never a file), given to the command as a ``Path``."""
    return click.option(*decls, type=click.Path(path_type=Path, file_okay=False), **attrs)


def file_option(*decls: str, **attrs: Any) -> Callable[[_F], _F]:
    """An option naming a file (never a folder), given to the command as a ``Path``."""
    return click.option(*decls, type=click.Path(path_type=Path, dir_okay=False), **attrs)


def count_option(
    *decls: str, minimum: int = 1, maximum: int | None = None, **attrs: Any
) -> Callable[[_F], _F]:
    """A whole number from ``minimum`` (to ``maximum``), its default shown in ``--help``."""
    return click.option(
        *decls, show_default=True, type=click.IntRange(min=minimum, max=maximum), **attrs
    )


def port_option(default: int, help: str) -> Callable[[_F], _F]:
    """``--port``: a TCP port to listen on (0: a free one), its default shown."""
    return count_option("--port", minimum=0, maximum=65535, default=default, help=help)


def seconds_option(*decls: str, **attrs: Any) -> Callable[[_F], _F]:
    """A non-negative number of seconds (or a rate), its default shown in ``--help``."""
    return click.option(*decls, show_default=True, type=click.FloatRange(min=0), **attrs)


def tick_option(help: str) -> Callable[[_F], _F]:
    """The required ``--tick N`` (from 1) of the commands that go back to a tick."""
    return click.option("--tick", "tick_", required=True, type=click.IntRange(min=1), help=help)


def present(**values: Any) -> dict[str, Any]:
    """The given values that are set (not ``None``), in order: the overrides of a flag set."""
    return {key: value for key, value in values.items() if value is not None}


WORLD = folder_option("--world", "world_dir", required=True, help="The world folder.")
_CONFIG_FILE = file_option(
    "--config",
    "config_file",
    help="Config file (default: ./config.toml, else built-in defaults).",
)
TRUST_KEY = "sim.trust_world_config"


def _remember_trust(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[TRUST_KEY] = value
    return value


_TRUST = click.option(
    "--trust-world-config",
    is_flag=True,
    expose_value=False,
    callback=_remember_trust,
    help="Let the world's config.toml choose where requests go and which API key variable "
    "they use (base_url, api_key_env); off by default, since worlds are shared.",
)


def CONFIG(command: Any) -> Any:
    """``--config FILE`` and ``--trust-world-config``."""
    return _CONFIG_FILE(_TRUST(command))


SETTINGS = click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="A config key for this command (JSON where it parses, else text), over every "
    "config file; repeatable. sim sweep and sim study pass each run's settings this way.",
)


PROVIDER = click.option("--provider", help="LLM provider (overrides [llm] provider).")
#: ``--model``'s help where it overrides every phase's model
EVERY_PHASE_MODEL = "Model for every phase (overrides each [phaseN] model)."


def endpoint_options(model_help: str = EVERY_PHASE_MODEL) -> Callable[[_F], _F]:
    """``--provider``, ``--model`` (``model_help``: whose model it overrides) and
    ``--base-url`` (one server), in that order."""
    model = click.option("--model", help=model_help)
    base_url = click.option("--base-url", help="Provider base URL, e.g. http://127.0.0.1:8000/v1.")

    def options(command: _F) -> _F:
        return PROVIDER(model(base_url(command)))

    return options


def workers_options(command: _F) -> _F:
    """``--workers N|auto``, ``--executor local|ray`` and ``--ray-address`` (a sharded
    tick: ``sim tick`` and ``sim serve``'s runs); ``shard_count`` reads them."""
    workers = click.option(
        "--workers",
        default="1",
        metavar="N|auto",
        help="Run each tick's phases on N shards of the world (split by place), each in a "
        "process of its own; auto: one per core. Same result as 1 (the default).",
    )
    executor = click.option(
        "--executor",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="With --workers: local, each shard a process here; ray, a Ray actor "
        "(pip install 'sim[ray]').",
    )
    ray_address = click.option(
        "--ray-address",
        metavar="ADDR",
        help="With --executor ray: the Ray cluster (default: $RAY_ADDRESS, else a local instance).",
    )
    return workers(executor(ray_address(command)))


def shard_count(workers: str, executor: str, ray_address: str | None) -> int:
    """The number of shards ``--workers`` asks for (``auto``: the cores this process may
    use).

    Raises:
        UserError: not a number from 1 to 1024 nor ``auto``, or ``--ray-address``
            without ``--executor ray``.
    """
    from sim.engine.shard_processes import auto_workers

    if workers == "auto":
        count = auto_workers()
    elif workers.isdigit() and 1 <= int(workers) <= 1024:
        count = int(workers)
    else:
        raise UserError(f"--workers: expected a number from 1 to 1024 or auto, got {workers!r}")
    if ray_address is not None and executor != "ray":
        raise UserError("--ray-address is for --executor ray")
    return count


def setting_overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """``--set SECTION.KEY=VALUE`` flags as nested overrides (one value each: JSON where it
    parses, else the text).

    Raises:
        InputError: a flag is not ``SECTION.KEY=VALUE``.
    """
    import orjson

    out: dict[str, Any] = {}
    for text in values:
        key, sep, raw = text.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise InputError(None, "--set", f"expected SECTION.KEY=VALUE (got {text!r})")
        try:
            value: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw
        table = out
        for part in parts[:-1]:
            nested = table.setdefault(part, {})
            if not isinstance(nested, dict):
                raise InputError(None, "--set", f"{key} is inside a value set by another --set")
            table = nested
        table[parts[-1]] = value
    return out


def trusting_world_config() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(TRUST_KEY))


#: errors of the disk or its permissions: the user fixes the cause, then runs again
OS_CAUSES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "input/output error",
}


def os_error_line(exc: OSError) -> str:
    """One line for an OS error: what, where, and that nothing is torn."""
    cause = OS_CAUSES.get(exc.errno or 0, exc.strerror or str(exc))
    where = f" ({exc.filename})" if exc.filename else ""
    return (
        f"failed: {cause}{where}. Nothing was torn: the world is at its last committed "
        "tick; fix the cause and run the command again (an interrupted tick resumes)"
    )


def deferred(exc: SimError) -> bool:
    """Whether ``exc`` is a policy's deferral (``sim.policy.TickDeferred``). Told apart
    without importing the policy package (and the config with it) into every command: only
    a command that loaded its module can have raised one."""
    types = sys.modules.get("sim.policy.types")
    return types is not None and isinstance(exc, types.TickDeferred)


def _told(exc: BaseException) -> str:
    """An error's message as printed: any URL in it without its credentials (a server
    named with ``user:pw@`` or ``?api-key=``)."""
    return redact_text(str(exc))


#: the exit code of a command whose output's reader went away: a shell's for SIGPIPE
CLOSED_PIPE_EXIT = 128 + 13


def reader_gone() -> NoReturn:
    """End a read-only command whose stdout's reader went away (``sim usage | head -1``):
    quietly, as ``cat`` does, since nothing failed. What is still to be written (and
    the interpreter's flush at exit) goes to ``/dev/null``."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no descriptor behind stdout (a test's runner)
        pass
    sys.exit(CLOSED_PIPE_EXIT)


@contextmanager
def errors(*, read_only: bool = False) -> Iterator[None]:
    """Map library errors to a message on stderr and an exit code.

    Args:
        read_only: the command changes nothing, so a closed output pipe (its reader went
            away) ends it quietly (``reader_gone``) rather than as a failed run.
    """
    try:
        yield
    except (Exception, KeyboardInterrupt) as exc:
        if read_only and isinstance(exc, BrokenPipeError):
            reader_gone()
        told = _failure(exc)
        if told is None:
            raise
        echo(told[0], err=True)
        sys.exit(told[1])


def _failure(exc: BaseException) -> tuple[str, int] | None:
    """The line on stderr and the exit code of a command that ended on ``exc``; ``None``
    for an exception that is none of the library's (a bug: its traceback is shown)."""
    if isinstance(exc, TickInterrupted):
        return f"\n{_told(exc)}", exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return "\ninterrupted: nothing was committed", 130
    if isinstance(exc, RunFailed):
        return f"failed: {_told(exc)}", exc.exit_code
    if isinstance(exc, SimError):  # a policy's "not now" (exit 75, resumable) says so
        return f"{'deferred' if deferred(exc) else 'error'}: {_told(exc)}", exc.exit_code
    if isinstance(exc, RecursionError):
        return "error: input nested too deeply to process", 2
    if isinstance(exc, OSError):
        return redact_text(os_error_line(exc)), 1
    return _llm_failure(exc)


def _llm_failure(exc: BaseException) -> tuple[str, int] | None:
    """An LLM error's line and exit code; ``None`` for any other exception. The LLM layer's
    errors are imported here, when one may have been raised, not with this module: ``sim
    --help`` loads every command's module, and they would bring the LLM layer's types
    (pydantic) with them."""
    from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError

    if isinstance(exc, LLMConfigurationError):
        return f"error: {_told(exc)}", 2
    if isinstance(exc, LLMBudgetExceededError):
        return f"stopped: {_told(exc)} (nothing was committed for this tick)", 1
    if isinstance(exc, LLMError):
        return f"failed: {_told(exc)}", 1
    return None


def depth_overrides(values: tuple[str, ...]) -> dict[str, Any]:
    from sim.config import BUILTIN_PHASES, PHASE_ALIASES, PHASE_SECTIONS, phase_section

    out: dict[str, Any] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not number.strip().lstrip("-").isdigit():
            raise InputError(None, "--depth", f"expected PHASE=N (got {value!r})")
        depth = int(number)
        if depth < 0:
            raise InputError(None, "--depth", f"depth must be >= 0 (got {depth})")
        name = name.strip()
        if name in PHASE_ALIASES or name in PHASE_SECTIONS or name in BUILTIN_PHASES:
            out[phase_section(name)] = {"response_chain_depth": depth}
        else:  # a declared phase: checked against [tick] phases once the config is built
            bare = name.removeprefix("phases.")
            out.setdefault("phases", {})[bare] = {"response_chain_depth": depth}
    return out


def build_config(
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
    sends_requests: bool = True,
    stream: bool | None = None,
    batch: bool | None = None,
    settings: tuple[str, ...] = (),
) -> Config:
    from sim.config import PHASE_SECTIONS, load_config, merge_tables, phase_section

    overrides: dict[str, Any] = merge_tables(setting_overrides(settings), depth_overrides(depth))
    # several servers (a pool) on the command line: comma-separated URLs
    urls: str | list[str] | None = (
        [url.strip() for url in base_url.split(",")] if base_url and "," in base_url else base_url
    )
    llm = present(
        provider=provider,
        max_concurrency=concurrency,
        base_url=urls,
        stream=stream,
        batch=batch,
    )
    if llm:
        overrides = merge_tables(overrides, {"llm": llm})
    if model is not None:
        for section in PHASE_SECTIONS:
            overrides = merge_tables(overrides, {section: {"model": model}})
    budget = present(max_cost_usd=budget_usd, max_total_tokens=budget_tokens)
    if budget:
        overrides = merge_tables(overrides, {"budget": budget})
    config = load_config(
        config_file,
        world_dir if world_dir.is_dir() else None,
        overrides,
        # a command that sends nothing (usage, an offline replay) cannot misroute a key
        trust_world_config=trusting_world_config() or not sends_requests,
    )
    for name in depth_overrides(depth).get("phases", {}):
        phase_section(name, config.tick.phases)  # raises: --depth for an unknown phase
    if model is not None:
        for name in config.phases:
            config = config.with_phase(f"phases.{name}", model=model)
    return config


def counted(n: int, noun: str) -> str:
    """``1 problem``, ``2 problems``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
