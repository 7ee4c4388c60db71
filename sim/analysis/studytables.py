"""One set of tidy tables for a whole study (``sim study run``'s folder): every run's
tables (``sim.analysis.tables``) stacked, each row led by the run's ``condition``,
``seed``, ``run`` and one column per factor (named by its config key).

A study's arms share the ticks before their fork (``sim.study``): each arm's tables hold
them, as its history does, so a tick's row is there for every arm. The rows of the
``calls`` and ``surveys`` tables made in that shared prefix carry ``shared = true``: those
calls were made (and paid for) once per seed, not once per arm, so sum ``calls`` over
``shared == false`` plus one arm's shared rows per seed to get what the study spent.

Only the study's folder is read: its ``study.json`` (which conditions and runs, which
factors) and each run folder it names; nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sim import safefs
from sim.analysis.tables import Cell, Table, build_tables
from sim.errors import InputError, LogError
from sim.runs.fork import MAX_STUDY_RECORD_BYTES, RUN_FILE, STUDY_RECORD, read_record

#: the columns that lead every row of a study's tables (then one per factor)
KEYS = ("condition", "seed", "run")
TABLES = ("characters", "interactions", "locations", "calls", "surveys", "edges", "messages")


@dataclass
class StudyTables:
    """Every run's tables, stacked; the study's conditions and factors."""

    tables: dict[str, Table]
    conditions: list[str]
    factors: list[str]
    runs: list[str] = field(default_factory=list)
    problems: list[LogError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def all(self) -> list[Table]:
        return [self.tables[name] for name in TABLES]


def study_design(out: Path) -> dict[str, Any]:
    """The expanded design ``sim study run`` recorded in ``out/study.json``.

    Raises:
        InputError: no record (not a study's folder), or one that cannot be read.
    """
    path = out / STUDY_RECORD
    try:
        data = orjson.loads(safefs.read_file(out, STUDY_RECORD, MAX_STUDY_RECORD_BYTES))
        design = data["design"]
        if not isinstance(design, dict):
            raise TypeError("design is not an object")
        if not all(isinstance(r, str) for r in design["runs"]):
            raise TypeError("runs")
        return design
    except FileNotFoundError:
        raise InputError(path, None, "not found: is this a study's folder?") from None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(path, None, f"cannot read the study's record: {exc}") from None


def build_study_tables(out: Path, first: int | None = None, last: int | None = None) -> StudyTables:
    """The tables of every run of the study in ``out`` that has begun (ticks
    ``first``..``last``), led by ``condition``, ``seed``, ``run`` and the factors.

    Raises:
        InputError: not a study's folder, a run folder that records another run.
    """
    design = study_design(out)
    conditions = list(design.get("conditions") or {})
    factors = list(design.get("factors") or {})
    result = StudyTables(
        {name: Table(name, [*KEYS, *factors]) for name in TABLES}, conditions, factors
    )
    seen: dict[str, dict[str, None]] = {name: {} for name in TABLES}
    for rel in design["runs"]:
        condition, _, name = rel.partition("/")
        run_dir = out / condition / name
        if {condition, name} & {"", ".", ".."} or "/" in name:
            raise InputError(out / STUDY_RECORD, "design.runs", f"{rel!r} is not a run's folder")
        if condition not in conditions:
            continue  # not this study's
        for folder in (out / condition, run_dir):  # never read through a link
            problem = safefs.folder_problem(folder)
            if problem is not None:
                raise InputError(
                    folder, None, f"{problem}: a study's folders must be its own, inside {out}"
                )
        if not (run_dir / RUN_FILE).is_file():
            continue  # not begun
        record = read_record(run_dir)
        if record.name != name or (record.design or {}).get("condition") != condition:
            raise InputError(run_dir / RUN_FILE, None, f"does not record the run {rel}")
        tables = build_tables(run_dir, first, last)
        result.runs.append(rel)
        result.problems.extend(tables.problems)
        result.notes.extend(f"{rel}: {note}" for note in tables.notes)
        fork = (record.design or {}).get("fork_tick")
        lead: dict[str, Cell] = {"condition": condition, "seed": record.seed, "run": name}
        values = dict(record.overrides)
        if "network" in (record.design or {}):  # the network factor: not a config override
            values["network"] = (record.design or {})["network"]
        lead.update({key: values.get(key) for key in factors})
        for table in tables.all():
            stacked = result.tables[table.name]
            seen[table.name].update(dict.fromkeys(table.columns))
            for row in table.rows:
                full = {**lead, **row}
                if table.name in ("calls", "surveys"):
                    full["shared"] = isinstance(fork, int) and int(row["tick"]) <= fork
                stacked.rows.append(full)
    for name, table in result.tables.items():
        table.columns.extend(seen[name])
        if name in ("calls", "surveys"):
            table.columns.append("shared")
    return result


__all__ = ["KEYS", "TABLES", "StudyTables", "build_study_tables", "study_design"]
