"""``sim sweep``: many runs of one world, the cross product of seeds and config settings.

Each run is a fork of the world's current state in its own folder, ``OUT/<run-name>/``,
named from its seed and settings (``seed-3_phase1.temperature=0.5``). The fork is a world
like any other: its ``world.json`` holds the run's seed, its ``config.toml`` the source
world's own config layer with the run's overrides (never the user's endpoints or keys, so
``sim tick --world OUT/<run-name>`` continues it under the trust rule, as for any world),
and ``sweep-run.json`` records the source world, the tick it started from, the seed and
the overrides. A run is one ``sim tick`` process on its folder: ``--jobs N`` runs N at a
time.

The run folders are untrusted input: anyone may edit them. A run's endpoints and key
variables come only from what the user trusts: the sweep's ``--config`` (else the
``./config.toml`` of the folder the sweep was started in), passed to each ``sim tick``
with the run's settings as ``--set`` flags, never ``--trust-world-config``; the child runs
in the sweep's own working folder, not in the run folder. A folder of runs that holds runs
of another world, or of other settings' keys, is refused by name before anything is
written. Each child dies with the sweep (``SIM_PARENT_PID``, ``sim.lifeline``).

Re-running a sweep skips the runs that reached their last tick (their folders are not
written to at all) and runs the others on: a run whose process was killed resumes its
interrupted tick from its log (the engine's resume), answering the calls already logged
without sending them again.

A budget (``--budget-usd``, ``--budget-tokens``) caps the whole sweep. What every run
spent is read from its tick logs (``sim.ticklog.books``: every attempt, abandoned logs
included). A run is given, as its own cap, a share of what is left when it starts: the
remainder less what runs still going were given, split among the runs that may start now
(at most ``--jobs``). The engine holds each run to its cap (each attempt reserves its
worst case before it is sent), so the sweep never spends more than its cap; what a run
did not use goes back to the pool when it ends. A run that meets its cap stops in the
middle of a tick and resumes on the next sweep; a run that cannot get a share is not
started.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import orjson
import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError

from sim.config import Config, load_config, merge_tables, redacted
from sim.errors import InputError, RunError, UserError
from sim.journal import SIM_DIR
from sim.llm.budget import Cost
from sim.llm.types import Usage
from sim.storage import Storage, dump_json
from sim.ticklog.format import is_state_file, log_path, read_state
from sim.ticklog.recovery import recover_logs
from sim.ticklog.summary import logged_books

#: the file in a run's folder that says which sweep run it is
RUN_FILE = "sweep-run.json"
#: where a run's ``sim tick`` output is appended (inside the run's folder)
OUTPUT_FILE = f"{SIM_DIR}/sweep-output.log"
_NAME_SAFE = re.compile(r"[^A-Za-z0-9._=+-]")
_MAX_NAME = 120

Status = Literal["done", "finished", "failed", "not started"]


class RunRecord(BaseModel):
    """``sweep-run.json``: what a run is (written once, when its folder is made)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    seed: int
    overrides: dict[str, Any]
    source: str
    start_tick: int
    #: what else the run is (a study's condition); absent for a sweep's runs
    design: dict[str, Any] | None = None


@dataclass(frozen=True)
class Setting:
    """One ``--set KEY=V1,V2``: a dotted config key and the values it takes."""

    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class RunSpec:
    """One run of the plan: its folder name, seed and config overrides (dotted keys)."""

    name: str
    seed: int
    overrides: dict[str, Any]


@dataclass
class Plan:
    """A sweep: the world, where runs go, the runs and how many ticks each gets."""

    world: Path
    out: Path
    runs: list[RunSpec]
    ticks: int
    config_file: Path | None = None
    #: the folder the sweep was started in: each child runs there (never in a run folder)
    cwd: Path = field(default_factory=Path.cwd)

    @property
    def trusted_config(self) -> Path | None:
        """The user's config file the children are given: ``--config``, else the
        ``./config.toml`` of the sweep's folder (both absolute), else none."""
        if self.config_file is not None:
            return (self.cwd / self.config_file).resolve()
        local = self.cwd / "config.toml"
        return local.resolve() if local.is_file() else None

    def config(self, overrides: Mapping[str, Any]) -> Config:
        """A run's effective config, from the trusted layers only (the source world's
        config under the trust rule, the user's config, the run's settings)."""
        return load_config(self.config_file, self.world, nested(overrides), cwd=self.cwd)


@dataclass
class Spend:
    """What a run spent, from its logs."""

    usage: Usage = field(default_factory=Usage)
    cost: Cost = field(default_factory=Cost)
    calls: int = 0
    failures: int = 0

    @property
    def tokens(self) -> int:
        return self.usage.total_tokens


@dataclass
class Outcome:
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

    runs: list[Outcome]
    spent_usd: float | None
    spent_tokens: int

    @property
    def ok(self) -> bool:
        return all(run.status in ("done", "finished") for run in self.runs)


# -- parsing the command line ------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``1-20``, ``1,4,9`` or ``1-3,7``: the seeds, in order, without repeats."""
    seeds: dict[int, None] = {}
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise InputError(None, "--seeds", f"expected N, N-M or a list of them (got {text!r})")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise InputError(None, "--seeds", f"{part}: the range ends before it starts")
        if last - first >= 100_000:
            raise InputError(None, "--seeds", f"{part}: more than 100000 seeds")
        seeds.update(dict.fromkeys(range(first, last + 1)))
    return list(seeds)


def _value(text: str) -> Any:
    """A ``--set`` value: JSON where it parses (``0.5``, ``true``, ``"x"``), else the text."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def parse_setting(text: str) -> Setting:
    """``phase1.temperature=0.5,0.9``: a dotted config key and its values."""
    key, sep, values = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or len(parts) < 2 or not all(parts) or not values.strip():
        raise InputError(None, "--set", f"expected SECTION.KEY=VALUE[,VALUE...] (got {text!r})")
    return Setting(key, tuple(_value(v.strip()) for v in values.split(",")))


def nested(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested tables: ``{"phase1.temperature": 0.5}`` -> ``{"phase1": {...}}``."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *path, last = key.split(".")
        table = out
        for part in path:
            table = table.setdefault(part, {})
        table[last] = value
    return out


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def run_name(seed: int, overrides: Mapping[str, Any]) -> str:
    """A run's folder name, from its seed and settings only (the same run, the same name).

    Characters other than letters, digits and ``._=+-`` become ``-``; a name changed that
    way, or cut to length, ends in a hash of the settings, so two runs never share one.
    """
    raw = f"seed-{seed}" + "".join(f"_{k}={_value_text(v)}" for k, v in overrides.items())
    name = _NAME_SAFE.sub("-", raw)
    if name != raw or len(name) > _MAX_NAME:
        digest = hashlib.sha256(orjson.dumps([seed, list(overrides.items())])).hexdigest()[:10]
        name = f"{name[: _MAX_NAME - 11]}-{digest}"
    return name


def make_plan(
    world: Path,
    out: Path,
    seeds: Sequence[int],
    settings: Sequence[Setting],
    ticks: int,
    config_file: Path | None = None,
) -> Plan:
    """Every combination of seed and setting values, each checked as a config now.

    Raises:
        InputError: the world has no ``world.json``, ``out`` is inside it, two settings
            name one key, or a combination is not a valid config (names the ``--set`` value).
    """
    if not (world / "world.json").is_file():
        raise InputError(world / "world.json", None, "not found: is this a world folder?")
    if out.resolve().is_relative_to(world.resolve()):
        raise InputError(out, None, "the runs' folder must be outside the world it forks")
    keys = [s.key for s in settings]
    if len(set(keys)) != len(keys):
        raise InputError(None, "--set", "each key may be set once (list its values: K=A,B)")
    combos = [
        dict(zip(keys, combo, strict=True))
        for combo in itertools.product(*(s.values for s in settings))
    ]
    cwd = Path.cwd()
    for overrides in combos:
        try:
            load_config(config_file, world, nested(overrides), cwd=cwd)
        except InputError as exc:
            shown = ", ".join(f"{k}={_value_text(v)}" for k, v in overrides.items())
            raise InputError(None, "--set", f"{shown}: {exc}") from None
    runs = [
        RunSpec(run_name(seed, overrides), seed, overrides)
        for seed in seeds
        for overrides in combos
    ]
    return Plan(world, out, runs, ticks, config_file, cwd)


# -- the config of a run, as TOML --------------------------------------------------------------


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value]
    return value


def toml_text(data: Mapping[str, Any], header: str) -> str:
    """TOML (tomli-w) that ``tomllib`` reads back to ``data``, headed by a comment.

    TOML has no null: a ``None`` value (a phase's unset ``structured_output``) is left
    out, which reads back as unset."""
    return f"# {header}\n\n" + tomli_w.dumps(_without_none(data))


def config_toml(config: Config) -> str:
    """The whole config as TOML that ``load_config`` reads back to the same config."""
    return toml_text(redacted(config), "written by `sim sweep`: this run's whole effective config")


#: the most of a world's ``config.toml`` a fork reads
_MAX_CONFIG_BYTES = 1024 * 1024


def world_layer(world: Path) -> dict[str, Any]:
    """A world's own ``config.toml`` as data (``{}`` without one): read inside the world,
    without following a link, size-limited.

    Raises:
        InputError: it cannot be read or is not TOML.
    """
    from sim import safefs

    path = world / "config.toml"
    try:
        raw = safefs.read_optional(world, "config.toml", _MAX_CONFIG_BYTES)
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    if raw is None:
        return {}
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None


def run_config_text(world: Path, overrides: Mapping[str, Any]) -> str | None:
    """A run's ``config.toml``: the source world's own layer with the run's settings on top
    (``None`` when both are empty). It holds nothing of the user's config: no endpoint, key
    variable or budget the user chose is copied into the run's folder."""
    layer = merge_tables(world_layer(world), nested(overrides))
    if not layer:
        return None
    return toml_text(
        layer, "written by `sim sweep`: the source world's config.toml with this run's settings"
    )


# -- a run's folder ----------------------------------------------------------------------------


def _copy_tree(src: Path, dest: Path, prefix: str = "") -> None:
    """Copy a world's files that are not state or ``.sim``; refuse a symlink (untrusted input).

    ``prefix``: ``src``'s path inside the world (``""`` at its top, else ending in ``/``).
    """
    with os.scandir(src) as found:
        entries = sorted(found, key=lambda e: e.name)
    for entry in entries:
        rel = prefix + entry.name
        if rel in (SIM_DIR, RUN_FILE) or is_state_file(rel):
            continue
        if entry.is_symlink():
            raise InputError(src / entry.name, None, "a symlink in a world folder cannot be forked")
        if entry.is_dir(follow_symlinks=False):
            (dest / rel).mkdir()
            _copy_tree(src / entry.name, dest, rel + "/")
        elif entry.is_file(follow_symlinks=False):
            shutil.copy2(entry.path, dest / rel)


def fork_current(world: Path, dest: Path, seed: int, overrides: Mapping[str, Any]) -> int:
    """Fork ``world``'s current state into ``dest`` (made atomically) with ``seed`` and the
    settings ``overrides`` (in its ``config.toml``: ``run_config_text``); return the tick it
    starts from. The source is only read.

    Raises:
        InputError: the source has an interrupted commit, or holds a symlink.
    """
    storage = Storage(world)
    with storage.lock():
        if storage.pending_journal():
            raise InputError(
                world, None, "an interrupted commit is pending: run 'sim tick' on it first"
            )
        state = read_state(world)
        tmp = dest.parent / f".{dest.name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        _copy_tree(world, tmp)
    meta = orjson.loads(state["world.json"])
    meta["seed"] = seed
    state["world.json"] = dump_json(meta)
    made: set[str] = set()  # each folder made once, not once per file (thousands)
    for rel, data in state.items():
        parent = os.path.dirname(rel)
        if parent and parent not in made:
            (tmp / parent).mkdir(parents=True, exist_ok=True)
            made.add(parent)
        with open(os.path.join(tmp, rel), "wb") as handle:
            handle.write(data)
    text = run_config_text(world, overrides)
    if text is not None:
        (tmp / "config.toml").write_text(text, encoding="utf-8")
    return int(meta["tick"])


def read_record(run_dir: Path) -> RunRecord:
    path = run_dir / RUN_FILE
    try:
        return RunRecord.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise InputError(path, None, "not found: this folder is not a sweep run") from None
    except ValidationError as exc:
        problem = exc.errors()[0]
        loc = ".".join(str(p) for p in problem["loc"])
        raise InputError(path, loc or None, problem["msg"]) from None


def _same_world(record: RunRecord, plan: Plan) -> bool:
    return (plan.cwd / record.source).resolve() == plan.world.resolve()


def check_out(plan: Plan, design: Mapping[str, Any] | None = None) -> None:
    """Refuse, before anything is written, a folder of runs that holds runs of another
    world, of other settings' keys or of another design (a run folder named in the plan
    that records another run is refused too).

    Raises:
        InputError: naming the run folder and what it holds.
    """
    if not plan.out.exists():
        return
    if not plan.out.is_dir():
        raise InputError(plan.out, None, "not a folder: expected the folder of the runs")
    if (plan.out / "study.json").exists():
        raise InputError(
            plan.out / "study.json",
            None,
            "this folder holds a study (sim study run): use another output folder "
            "(nothing was written)",
        )
    keys = sorted({k for spec in plan.runs for k in spec.overrides})
    wanted = {spec.name: spec for spec in plan.runs}
    now = current_tick(plan.world)
    for run_dir in run_folders(plan.out):
        record = read_record(run_dir)
        where = run_dir / RUN_FILE
        if not _same_world(record, plan):
            raise InputError(
                where,
                "source",
                f"holds a run of the world {record.source}, not of {plan.world}: "
                "use another output folder (nothing was written)",
            )
        if sorted(record.overrides) != keys or (record.design or None) != (
            dict(design) if design else None
        ):
            shown = ", ".join(sorted(record.overrides)) or "no settings"
            raise InputError(
                where,
                "overrides" if sorted(record.overrides) != keys else "design",
                f"holds a run of another design ({shown}"
                + (f"; {record.design}" if record.design else "")
                + "): use another output folder (nothing was written)",
            )
        if record.start_tick != now:
            raise InputError(
                where,
                "start_tick",
                f"holds a run forked from {plan.world} at tick {record.start_tick}, and the "
                f"world is now at tick {now}: its runs would not start from one state; use "
                "another output folder (nothing was written)",
            )
        spec = wanted.get(run_dir.name)
        if spec is not None and (record.seed, record.overrides) != (spec.seed, spec.overrides):
            raise InputError(where, None, "records another run (seed or settings differ)")
    for name in wanted:
        run_dir = plan.out / name
        if run_dir.exists() and not (run_dir / RUN_FILE).is_file():
            raise InputError(run_dir / RUN_FILE, None, "not found: this folder is not a sweep run")


def prepare(plan: Plan, spec: RunSpec, design: Mapping[str, Any] | None = None) -> RunRecord:
    """The run's folder: made (forked) the first time, checked against the plan after."""
    run_dir = plan.out / spec.name
    if run_dir.exists():
        record = read_record(run_dir)
        if record.seed != spec.seed or record.overrides != spec.overrides:
            raise InputError(
                run_dir / RUN_FILE, None, "records another run (seed or settings differ)"
            )
        return record
    plan.out.mkdir(parents=True, exist_ok=True)
    start = fork_current(plan.world, run_dir, spec.seed, spec.overrides)
    tmp = plan.out / f".{spec.name}.tmp"
    record = RunRecord(
        name=spec.name,
        seed=spec.seed,
        overrides=spec.overrides,
        source=str(plan.world.resolve()),
        start_tick=start,
        design=dict(design) if design else None,
    )
    (tmp / RUN_FILE).write_bytes(dump_json(record.model_dump(mode="json", exclude_none=True)))
    tmp.rename(run_dir)
    return record


def current_tick(run_dir: Path) -> int:
    try:
        return int(orjson.loads((run_dir / "world.json").read_bytes())["tick"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise InputError(run_dir / "world.json", "tick", "cannot read the tick") from None


def finished(run_dir: Path, target: int) -> bool:
    """At its last tick, with nothing left to complete (reads only; writes nothing)."""
    if Storage(run_dir).pending_journal():
        return False
    tick = current_tick(run_dir)
    return tick >= target and not log_path(run_dir, tick + 1).exists()


def spend(run_dir: Path) -> Spend:
    """Everything a run's logs say it sent, abandoned logs included; unreadable logs skipped
    (a log cut short by a kill is read up to its last whole line by the log reader). A
    committed tick is counted from its summary (``logged_books``), not its whole log: the
    sweep's process reads every run's books, one after another."""
    total = Spend()
    for _, aside, books in logged_books(run_dir):
        total.usage = total.usage + books.usage
        total.cost = total.cost + books.cost
        if not aside:
            total.calls += books.calls
            total.failures += books.failures
    return total


# -- the budget of a sweep ---------------------------------------------------------------------


@dataclass
class Grant:
    usd: float | None = None
    tokens: int | None = None


class Ledger:
    """The sweep's budget: what runs spent, what runs still going were given, what is left."""

    def __init__(
        self, cap_usd: float | None, cap_tokens: int | None, spent: Spend, jobs: int
    ) -> None:
        self.cap_usd = cap_usd
        self.cap_tokens = cap_tokens
        self.spent_usd = spent.cost.usd
        self.unpriced = set(spent.cost.unpriced)
        self.spent_tokens = spent.tokens
        self.jobs = jobs
        self.reserved_usd = 0.0
        self.reserved_tokens = 0
        self.lock = threading.Lock()

    def grant(self, waiting: int) -> Grant | str:
        """A share for a run about to start, or why it gets none."""
        with self.lock:
            share = max(1, min(self.jobs, waiting))
            grant = Grant()
            if self.cap_usd is not None:
                if self.unpriced:
                    return (
                        "not started: the cost of earlier runs is unknown (no price for "
                        f"{', '.join(sorted(self.unpriced))}); add [prices] to use --budget-usd"
                    )
                left = self.cap_usd - self.spent_usd - self.reserved_usd
                if left <= 1e-9:
                    return "not started: the sweep's --budget-usd is spent"
                grant.usd = left / share
            if self.cap_tokens is not None:
                left_tokens = self.cap_tokens - self.spent_tokens - self.reserved_tokens
                if left_tokens < share:
                    return "not started: the sweep's --budget-tokens is spent"
                grant.tokens = left_tokens // share
            self.reserved_usd += grant.usd or 0.0
            self.reserved_tokens += grant.tokens or 0
            return grant

    def settle(self, grant: Grant, before: Spend, after: Spend) -> None:
        """A run ended: its grant goes back, what it spent is counted."""
        with self.lock:
            self.reserved_usd -= grant.usd or 0.0
            self.reserved_tokens -= grant.tokens or 0
            self.spent_usd += after.cost.usd - before.cost.usd
            self.unpriced |= set(after.cost.unpriced)
            self.spent_tokens += after.tokens - before.tokens


# -- running -----------------------------------------------------------------------------------


def setting_flags(overrides: Mapping[str, Any]) -> list[str]:
    """A run's settings as ``--set KEY=JSON`` flags (one value each, read back exactly)."""
    flags: list[str] = []
    for key, value in overrides.items():
        flags += ["--set", f"{key}={orjson.dumps(value).decode()}"]
    return flags


def trusted_flags(plan: Plan, overrides: Mapping[str, Any]) -> list[str]:
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


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


#: runs one command of a run (``sim tick``, ...) to its end, in the given working folder
#: (the sweep's own); its output goes to the run's ``OUTPUT_FILE``; returns the exit code
Executor = Callable[[Path, list[str], Path], int]


def run_one(run_dir: Path | str, command: list[str], cwd: Path | str | None = None) -> int:
    """Run one command of a run to its end, in ``cwd`` (never the run's folder, whose
    ``config.toml`` must not be read as the user's); its output is appended to
    ``OUTPUT_FILE``. The child dies with this process (``sim.lifeline``)."""
    from sim.lifeline import PARENT_ENV

    run_dir = Path(run_dir)
    output = run_dir / OUTPUT_FILE
    output.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())}
    with output.open("ab") as handle:
        done = subprocess.run(
            command,
            cwd=Path.cwd() if cwd is None else Path(cwd),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        )
    return done.returncode


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


def run_sweep(
    plan: Plan,
    jobs: int = 1,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    executor: Executor = run_one,
) -> SweepResult:
    """Make the runs' folders, then run every unfinished run to its last tick, ``jobs`` at a
    time, each through ``executor`` (a local process by default; ``ray_executor``).

    Raises:
        InputError: a run folder holds another run, or the world cannot be forked.
    """
    check_out(plan)
    dirs = [plan.out / spec.name for spec in plan.runs]
    # the folders made before: checked now; the others are forked by the worker that runs
    # them (``prepare`` in ``work``), so a world copy overlaps the runs already going
    # instead of delaying the first one by a copy per run
    records: dict[int, RunRecord] = {
        i: prepare(plan, spec) for i, spec in enumerate(plan.runs) if dirs[i].exists()
    }
    spent = {i: spend(dirs[i]) for i in records}
    total = Spend()
    for one in spent.values():
        total.usage, total.cost = total.usage + one.usage, total.cost + one.cost
    ledger = Ledger(budget_usd, budget_tokens, total, jobs)
    outcomes: list[Outcome | None] = [None] * len(plan.runs)
    todo = [
        i
        for i in range(len(plan.runs))
        if i not in records or not finished(dirs[i], records[i].start_tick + plan.ticks)
    ]
    waiting = [len(todo)]
    count_lock = threading.Lock()
    fork_lock = threading.Lock()  # a fork holds the world's lock: one at a time

    def report(index: int, outcome: Outcome) -> None:
        outcomes[index] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    for i, r in records.items():
        if i not in todo:
            target = r.start_tick + plan.ticks
            outcome = Outcome(
                r.name, r.seed, r.overrides, "finished", current_tick(dirs[i]), target
            )
            report(i, outcome)

    def work(index: int) -> None:
        run_dir = dirs[index]
        record = records.get(index)
        if record is None:
            with fork_lock:
                record = prepare(plan, plan.runs[index])
        target = record.start_tick + plan.ticks
        with count_lock:
            left = waiting[0]
            waiting[0] -= 1
        base = Outcome(record.name, record.seed, record.overrides, "not started", 0, target)
        storage = Storage(run_dir)
        with storage.lock():  # complete a commit cut short, so the tick count is right
            storage.recover()
            recover_logs(run_dir)
        base.tick = current_tick(run_dir)
        if finished(run_dir, target):
            base.status = "done"
            report(index, base)
            return
        grant = ledger.grant(left)
        if isinstance(grant, str):
            base.message = grant
            report(index, base)
            return
        config = plan.config(record.overrides)  # the trusted layers, not the run's folder
        ticks = target - current_tick(run_dir)
        command = tick_command(run_dir, ticks, grant, config, trusted_flags(plan, record.overrides))
        code = executor(run_dir, command, plan.cwd)
        after = spend(run_dir)
        ledger.settle(grant, spent.get(index, Spend()), after)
        base.tick, base.exit_code = current_tick(run_dir), code
        base.granted_usd, base.granted_tokens = grant.usd, grant.tokens
        if code == 0 and finished(run_dir, target):
            base.status = "done"
        else:
            base.status = "failed"
            reason = f"killed by signal {-code}" if code < 0 else f"exit {code}"
            base.message = f"{reason}: {_last_line(run_dir / OUTPUT_FILE)}"
        report(index, base)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(work, i) for i in todo]:
            future.result()
    return SweepResult(
        [o for o in outcomes if o is not None],
        None if ledger.unpriced else round(ledger.spent_usd, 8),
        ledger.spent_tokens,
    )


def run_folders(out: Path) -> list[Path]:
    """The sweep runs under ``out`` (folders holding ``sweep-run.json``), by name."""
    if not out.is_dir():
        raise InputError(out, None, "not found: expected the folder of a sweep's runs")
    return sorted(
        p for p in out.iterdir() if p.is_dir() and not p.is_symlink() and (p / RUN_FILE).is_file()
    )


def nested_run_folders(out: Path) -> list[Path]:
    """The sub-folders of ``out`` that hold sweep runs themselves (``out/control/seed-1``):
    what a report of ``out`` names when ``out`` holds no run of its own."""
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if p.is_dir() and not p.is_symlink() and run_folders(p))


__all__ = [
    "OUTPUT_FILE",
    "RUN_FILE",
    "Executor",
    "Grant",
    "Ledger",
    "Outcome",
    "Plan",
    "RunRecord",
    "RunSpec",
    "Setting",
    "Spend",
    "Status",
    "SweepResult",
    "check_out",
    "config_toml",
    "current_tick",
    "finished",
    "fork_current",
    "make_plan",
    "nested",
    "nested_run_folders",
    "parse_seeds",
    "parse_setting",
    "prepare",
    "ray_executor",
    "read_record",
    "run_config_text",
    "run_folders",
    "run_name",
    "run_one",
    "run_sweep",
    "setting_flags",
    "spend",
    "toml_text",
    "trusted_flags",
    "world_layer",
]
