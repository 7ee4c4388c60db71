"""The runs of a study's or a sweep's folder and how far each has gone, for ``sim serve``.

Read as ``sim study`` and ``sim sweep`` read them: a study's record (``study.json``: the
runs its design names and how many ticks each gets), each run's ``sweep-run.json`` (its
seed, settings and start tick) and its ``world.json`` (its tick), all through
``sim.runs.fork``'s readers (no link followed, sizes limited). The folder is untrusted: a
run folder that is a link, a record that cannot be read or a tick that is not a number is
shown as that run's problem, never followed, and the rest are still listed. Nothing is
written and no lock is probed, so watching a study never slows or fails its runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from sim import safefs
from sim.errors import InputError
from sim.runs.fork import (
    MAX_STUDY_RECORD_BYTES,
    RUN_FILE,
    STUDY_RECORD,
    current_tick,
    finished,
    read_record,
    run_folders,
)
from sim.storage import Storage
from sim.ticklog.format import log_path

#: the most runs listed (a study's record is untrusted: its list may be long)
MAX_RUNS = 10_000

Kind = Literal["study", "sweep"]
#: ``not started``: no folder yet; ``waiting``: made, not at its last tick, no tick going;
#: ``in progress``: a tick started (its log is open) or committed and not yet in place;
#: ``finished``: at its last tick (a study's: the sweep's last tick is not recorded);
#: ``stopped``: a sweep's run with no tick going; ``unreadable``: see ``problem``
Status = Literal["not started", "waiting", "in progress", "finished", "stopped", "unreadable"]


@dataclass(frozen=True)
class RunProgress:
    """One run (a sweep's) or arm (a study's: ``group`` is its condition)."""

    name: str
    group: str | None
    status: Status
    tick: int | None = None
    start_tick: int | None = None
    #: the tick it stops at (``None``: a sweep's runs do not record it)
    target: int | None = None
    seed: int | None = None
    overrides: dict[str, Any] | None = None
    problem: str | None = None


@dataclass(frozen=True)
class RunsView:
    kind: Kind
    runs: list[RunProgress]
    #: the ticks each run gets (a study's design), ``None`` for a sweep
    ticks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        finished_runs = sum(r.status == "finished" for r in self.runs)
        going = sum(r.status == "in progress" for r in self.runs)
        return {
            "kind": self.kind,
            "ticks": self.ticks,
            "total": len(self.runs),
            "finished": finished_runs,
            "in_progress": going,
            "runs": [asdict(r) for r in self.runs],
        }


def folder_kind(folder: Path) -> Kind | None:
    """``"study"`` for a study's folder (it holds ``study.json``), ``"sweep"`` for a folder
    of sweep runs (sub-folders holding ``sweep-run.json``), else ``None`` (a world)."""
    if not folder.is_dir() or (folder / "world.json").exists():
        return None
    if (folder / STUDY_RECORD).is_file() and not (folder / STUDY_RECORD).is_symlink():
        return "study"
    try:
        return "sweep" if run_folders(folder) else None
    except (InputError, OSError):
        return None


def _going(run_dir: Path, tick: int) -> bool:
    return Storage(run_dir).pending_journal() or log_path(run_dir, tick + 1).exists()


def _run(run_dir: Path, name: str, group: str | None, ticks: int | None) -> RunProgress:
    """One run's progress; a problem with its folder is the run's ``problem``."""
    if group is not None and safefs.folder_problem(run_dir.parent) is not None:
        problem = safefs.folder_problem(run_dir.parent)
        return RunProgress(name, group, "unreadable", problem=f"{run_dir.parent}: {problem}")
    problem = safefs.folder_problem(run_dir)
    if problem is not None:
        return RunProgress(name, group, "unreadable", problem=f"{run_dir}: {problem}")
    if not (run_dir / RUN_FILE).is_file():
        return RunProgress(name, group, "not started")
    try:
        record = read_record(run_dir)
        tick = current_tick(run_dir)
        target = None if ticks is None else record.start_tick + ticks
        if target is not None and finished(run_dir, target):
            status: Status = "finished"
        elif _going(run_dir, tick):
            status = "in progress"
        else:
            status = "waiting" if target is not None else "stopped"
    except (InputError, OSError) as exc:
        return RunProgress(name, group, "unreadable", problem=str(exc))
    return RunProgress(
        name,
        group,
        status,
        tick=tick,
        start_tick=record.start_tick,
        target=target,
        seed=record.seed,
        overrides=record.overrides,
    )


def _study_design(folder: Path) -> tuple[list[str], int]:
    """The runs a study's record names (``condition/unit``) and the ticks each gets.

    Raises:
        InputError: the record cannot be read, or is not a study's record.
    """
    path = folder / STUDY_RECORD
    try:
        design = orjson.loads(safefs.read_file(folder, STUDY_RECORD, MAX_STUDY_RECORD_BYTES))[
            "design"
        ]
        runs, ticks = design["runs"], design["ticks"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(path, None, f"cannot read the study's record: {exc}") from None
    if not isinstance(runs, list) or not all(isinstance(r, str) for r in runs):
        raise InputError(path, "design.runs", "expected a list of run folders")
    if not isinstance(ticks, int) or isinstance(ticks, bool) or ticks < 0:
        raise InputError(path, "design.ticks", f"expected a whole number (got {ticks!r})")
    for rel in runs:
        parts = rel.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") or "\\" in p for p in parts):
            raise InputError(path, "design.runs", f"expected 'condition/run' (got {rel!r})")
    return runs[:MAX_RUNS], ticks


def runs_view(folder: Path) -> RunsView | None:
    """The runs of a study's or a sweep's folder and their progress; ``None`` for a world.

    Raises:
        InputError: a study whose record cannot be read.
    """
    kind = folder_kind(folder)
    if kind is None:
        return None
    if kind == "study":
        rels, ticks = _study_design(folder)
        runs = []
        for rel in rels:
            group, _, name = rel.partition("/")
            runs.append(_run(folder / group / name, name, group, ticks))
        return RunsView("study", runs, ticks)
    return RunsView(
        "sweep", [_run(d, d.name, None, None) for d in run_folders(folder)[:MAX_RUNS]], None
    )
