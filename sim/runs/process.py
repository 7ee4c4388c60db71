"""A run as a child process: the ``sim tick`` that continues a run under its grant with the
user's trusted flags only, run to its end by an executor (a local process or a Ray task),
and how each run ended."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import orjson

from sim import safefs
from sim.config import Config
from sim.errors import InputError, RunError, UserError
from sim.runs.design import SweepPlan
from sim.runs.ledger import Grant
from sim.storage.journal import SIM_DIR

#: where a run's ``sim tick`` output is appended (inside the run's folder)
OUTPUT_FILE = f"{SIM_DIR}/sweep-output.log"


Status = Literal["done", "finished", "failed", "not started"]


@dataclass
class RunOutcome:
    """How one run of a sweep ended this time."""

    name: str
    seed: int
    overrides: dict[str, Any]
    status: Status
    tick: int
    target: int
    exit_code: int | None = None
    message: str = ""
    granted_usd: float | None = None
    granted_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field by its name, in declaration order (the sweep's state file row)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class SweepResult:
    """Every run's outcome, in plan order, and what the whole sweep has spent."""

    runs: list[RunOutcome]
    spent_usd: float | None
    spent_tokens: int

    @property
    def ok(self) -> bool:
        return all(run.status in ("done", "finished") for run in self.runs)


# -- running -----------------------------------------------------------------------------------


def setting_flags(overrides: Mapping[str, Any]) -> list[str]:
    """A run's settings as ``--set KEY=JSON`` flags (one value each, read back exactly)."""
    flags: list[str] = []
    for key, value in overrides.items():
        flags += ["--set", f"{key}={orjson.dumps(value).decode()}"]
    return flags


def trusted_flags(plan: SweepPlan, overrides: Mapping[str, Any]) -> list[str]:
    """What every command a sweep runs on a run folder is given so that its endpoints and
    keys come from the user, not from the folder: ``--config`` and the settings."""
    trusted = plan.trusted_config
    return (["--config", str(trusted)] if trusted else []) + setting_flags(overrides)


def tick_command(
    run_dir: Path, ticks: int, grant: Grant, config: Config, trusted: Sequence[str] = ()
) -> list[str]:
    """The ``sim tick`` that runs a run on, under its grant (never above its own config's
    cap), with the user's ``trusted`` flags (``trusted_flags``); never
    ``--trust-world-config``: the run's folder is untrusted input."""
    where = str(run_dir.resolve())
    command = [sys.executable, "-m", "sim", "tick", "--world", where, "--ticks", str(ticks)]
    command += trusted
    if grant.usd is not None:
        own = config.budget.max_cost_usd
        command += ["--budget-usd", repr(min(grant.usd, own) if own else grant.usd)]
    if grant.tokens is not None:
        own_tokens = config.budget.max_total_tokens
        command += [
            "--budget-tokens",
            str(min(grant.tokens, own_tokens) if own_tokens else grant.tokens),
        ]
    return command


#: runs one command of a run (``sim tick``, ...) to its end, in the given working folder
#: (the sweep's own); its output goes to the run's ``OUTPUT_FILE``; returns the exit code
Executor = Callable[[Path, list[str], Path], int]


def run_one(run_dir: Path | str, command: list[str], cwd: Path | str | None = None) -> int:
    """Run one command of a run to its end, in ``cwd`` (never the run's folder, whose
    ``config.toml`` must not be read as the user's); its output is appended to
    ``OUTPUT_FILE``, opened without following a link (a run's folder is untrusted: a link
    planted there must not make the sweep write outside it). The child dies with this
    process (``sim.lifeline``).

    Raises:
        UnsafePath: the output file, or a folder on its way, is a link or not a plain file.
    """
    from sim.lifeline import PARENT_ENV

    output = safefs.open_append(Path(run_dir), OUTPUT_FILE)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())}
    try:
        done = subprocess.run(
            command,
            cwd=Path.cwd() if cwd is None else Path(cwd),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        )
    finally:
        os.close(output)
    return done.returncode


#: how much of the end of a run's output ``last_line`` reads
_TAIL_BYTES = 64 * 1024


def last_line(run_dir: Path) -> str:
    """The last line of a run's output (what its ``sim tick`` said last, for a failed run's
    message): read from the end of ``OUTPUT_FILE`` only, without following a link; ``""``
    when there is none to read."""
    try:
        tail = safefs.read_tail(run_dir, OUTPUT_FILE, _TAIL_BYTES) or b""
    except (OSError, InputError):
        return ""
    lines = tail.decode("utf-8", errors="replace").splitlines()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def ray_executor(address: str | None = None) -> Executor:
    """Each run a Ray task (``pip install 'sim[ray]'``) on the cluster at ``address``.

    Without an address, Ray's own rule applies: ``RAY_ADDRESS`` if set, else a local
    instance is started. A task runs the run's ``sim tick`` on whichever node takes it, so
    on a cluster of several machines the runs' folder must be on a file system every node
    sees at the same path, with sim installed at the same path too.

    Raises:
        UserError: Ray is not installed; RunError: Ray cannot be started or reached.
    """
    try:
        ray: Any = importlib.import_module("ray")
    except ImportError:
        raise UserError(
            "--executor ray needs Ray, from the optional 'ray' extra: pip install 'sim[ray]'"
        ) from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # Ray's errors are many (connection, version, resources)
            where = address or "a local instance"
            raise RunError(f"--executor ray: cannot start or reach Ray ({where}): {exc}") from None
    task = ray.remote(num_cpus=1, max_retries=0)(run_one)

    def execute(run_dir: Path, command: list[str], cwd: Path) -> int:
        return int(ray.get(task.remote(str(run_dir.resolve()), command, str(cwd))))

    return execute


__all__ = [
    "OUTPUT_FILE",
    "Executor",
    "RunOutcome",
    "Status",
    "SweepResult",
    "last_line",
    "ray_executor",
    "run_one",
    "setting_flags",
    "tick_command",
    "trusted_flags",
]
