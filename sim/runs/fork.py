"""A run's folder: a fork of the world's current state with the run's seed and settings,
made once (atomically), with ``sweep-run.json`` saying which run it is; checked against the
plan each time the runs go on, and read back (its record, its tick, whether it is done).

The folder is untrusted input: its ``config.toml`` holds the source world's own layer with
the run's settings, never the user's endpoints or keys."""

from __future__ import annotations

import os
import shutil
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError

from sim import safefs
from sim.config import Config, merge_tables, numbered_sections, redacted
from sim.errors import InputError
from sim.pack import PACK, PACK_TMP, is_packed, pack_entities
from sim.runs.design import RunSpec, SweepPlan, nested
from sim.runs.inputs import Inputs, changed
from sim.storage import MAX_ENTITY_BYTES, Storage, dump_json
from sim.storage.journal import SIM_DIR
from sim.ticklog.format import is_state_file, log_path, read_state

#: the file in a run's folder that says which sweep run it is
RUN_FILE = "sweep-run.json"
#: the file in a study's folder that records the study (``sim study run`` writes it,
#: ``sim study report`` reads it)
STUDY_RECORD = "study.json"
#: the most of it read (a study's folder is untrusted: no link followed, size-limited)
MAX_STUDY_RECORD_BYTES = 16 * 1024 * 1024


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
    #: the digests of what the run was made from (``sim.runs.inputs``); absent in the
    #: records of earlier sims
    inputs: Inputs | None = None


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
    path = world / "config.toml"
    layer = merge_tables(
        numbered_sections(world_layer(world), path), numbered_sections(nested(overrides), None)
    )
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
        if rel in (SIM_DIR, RUN_FILE, PACK, PACK_TMP) or is_state_file(rel):
            continue  # a packed world's entities are its state, written below
        if entry.is_symlink():
            raise InputError(src / entry.name, None, "a symlink in a world folder cannot be forked")
        if entry.is_dir(follow_symlinks=False):
            (dest / rel).mkdir()
            _copy_tree(src / entry.name, dest, rel + "/")
        elif entry.is_file(follow_symlinks=False):
            shutil.copy2(entry.path, dest / rel)


#: held while a fork reads its source under the source's lock: the world's ``flock`` admits
#: one holder, so a second thread of this process forking at once would be refused; the
#: forks' files are written after, by each thread at once (file creation is the kernel's
#: time, not the interpreter's: two jobs fork on two cores)
_READING = threading.Lock()


def fork_current(world: Path, dest: Path, seed: int, overrides: Mapping[str, Any]) -> int:
    """Fork ``world``'s current state into ``dest`` (made atomically) with ``seed`` and the
    settings ``overrides`` (in its ``config.toml``: ``run_config_text``); return the tick it
    starts from. The source is only read, and by one thread of this process at a time.

    Raises:
        InputError: the source has an interrupted commit, or holds a symlink.
    """
    storage = Storage(world)
    with _READING, storage.lock():
        if storage.pending_journal():
            raise InputError(
                world, None, "an interrupted commit is pending: run 'sim tick' on it first"
            )
        state = read_state(world)
        packed = is_packed(world)
        tmp = dest.parent / f".{dest.name}.tmp"
        if tmp.is_symlink() or (os.path.lexists(tmp) and not tmp.is_dir()):
            # not a fork an interrupted run left: sim's scratch name, planted
            raise InputError(tmp, None, "is a link or a file, not a fork sim left: remove it")
        if tmp.exists():  # an interrupted run's fork
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        _copy_tree(world, tmp)
    meta = orjson.loads(state["world.json"])
    meta["seed"] = seed
    state["world.json"] = dump_json(meta)
    if packed:  # the fork keeps the source's form
        state = pack_entities(tmp, state)
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


#: the most of a run's ``sweep-run.json`` and ``world.json`` read (a run's folder is untrusted)
_MAX_RECORD_BYTES = 1024 * 1024
_MAX_WORLD_BYTES = MAX_ENTITY_BYTES


def read_record(run_dir: Path) -> RunRecord:
    """A run's record, read without following a link and size-limited.

    Raises:
        InputError: missing, unreadable, a link, or not a run record (field named).
    """
    path = run_dir / RUN_FILE
    try:
        return RunRecord.model_validate_json(safefs.read_file(run_dir, RUN_FILE, _MAX_RECORD_BYTES))
    except FileNotFoundError:
        raise InputError(path, None, "not found: this folder is not a sweep run") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    except ValidationError as exc:
        problem = exc.errors()[0]
        loc = ".".join(str(p) for p in problem["loc"])
        raise InputError(path, loc or None, problem["msg"]) from None


def _same_world(record: RunRecord, plan: SweepPlan) -> bool:
    return (plan.cwd / record.source).resolve() == plan.world.resolve()


def check_out(
    plan: SweepPlan, design: Mapping[str, Any] | None = None, inputs: Inputs | None = None
) -> None:
    """Refuse, before anything is written, a folder of runs that holds runs of another
    world, of other settings' keys or of another design, or runs made from other
    ``inputs`` (the world's files, the user's config, sim's version: each named); a run
    folder named in the plan that records another run is refused too.

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
        differ = [] if inputs is None else changed(record.inputs, inputs)
        if differ:
            raise InputError(
                where,
                "inputs",
                f"holds a run made from other inputs; changed: {'; '.join(differ)}: use "
                "another output folder (nothing was written)",
            )
        spec = wanted.get(run_dir.name)
        if spec is not None and (record.seed, record.overrides) != (spec.seed, spec.overrides):
            raise InputError(where, None, "records another run (seed or settings differ)")
    for name in wanted:
        run_dir = plan.out / name
        problem = safefs.folder_problem(run_dir)
        if problem is not None:  # a link would put the run outside the runs' folder
            raise InputError(
                run_dir,
                None,
                f"{problem}: a run's folder must be its own, inside {plan.out}; remove it or "
                "use another output folder (nothing was written)",
            )
        if run_dir.exists() and not (run_dir / RUN_FILE).is_file():
            raise InputError(run_dir / RUN_FILE, None, "not found: this folder is not a sweep run")


def prepare(
    plan: SweepPlan,
    spec: RunSpec,
    design: Mapping[str, Any] | None = None,
    inputs: Inputs | None = None,
) -> RunRecord:
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
        inputs=inputs,
    )
    (tmp / RUN_FILE).write_bytes(dump_json(record.model_dump(mode="json", exclude_none=True)))
    tmp.rename(run_dir)
    return record


def current_tick(run_dir: Path) -> int:
    """A run's tick, from its ``world.json`` (read without following a link, size-limited).

    Raises:
        InputError: it cannot be read, or holds no whole-number tick.
    """
    try:
        tick = orjson.loads(safefs.read_file(run_dir, "world.json", _MAX_WORLD_BYTES))["tick"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        raise InputError(run_dir / "world.json", "tick", "cannot read the tick") from None
    if not isinstance(tick, int) or isinstance(tick, bool) or tick < 0:
        raise InputError(run_dir / "world.json", "tick", f"expected a whole number, got {tick!r}")
    return tick


def finished(run_dir: Path, target: int) -> bool:
    """At its last tick, with nothing left to complete (reads only; writes nothing)."""
    if Storage(run_dir).pending_journal():
        return False
    tick = current_tick(run_dir)
    return tick >= target and not log_path(run_dir, tick + 1).exists()


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


def require_run_folders(out: Path, each: str) -> list[Path]:
    """The sweep runs under ``out``, which must hold some.

    Raises:
        InputError: ``out`` is not a folder or holds no run, naming its sub-folders that
            hold runs (a study's arms) and what to do with each (``each``, its
            ``{folder}`` the first of them: "report each (--runs {folder})").
    """
    folders = run_folders(out)
    if not folders:
        inner = nested_run_folders(out)
        hint = ""
        if inner:
            names = ", ".join(p.name for p in inner)
            hint = f"; its sub-folders {names} hold runs: {each.format(folder=inner[0])}"
        raise InputError(out, None, f"holds no sweep run (no */{RUN_FILE}){hint}")
    return folders


__all__ = [
    "RUN_FILE",
    "RunRecord",
    "check_out",
    "config_toml",
    "current_tick",
    "finished",
    "fork_current",
    "nested_run_folders",
    "prepare",
    "read_record",
    "require_run_folders",
    "run_config_text",
    "run_folders",
    "toml_text",
    "world_layer",
]
