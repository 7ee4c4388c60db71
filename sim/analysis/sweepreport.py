"""``sim sweep report``: one table comparing the runs of a sweep.

Per run: its seed and settings, ticks run, calls, failed calls, tokens and cost (every
attempt, from its logs, as ``sim usage`` counts them; the cost is unknown, ``None``, when
a model had no price), and for each custom state field of the characters its distribution
at the run's last committed tick, read through the tables of ``sim export``
(``sim.analysis.tables``): counts of each value for text and other values, mean, min and
max for numbers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sim.analysis.sweep import current_tick, read_record, run_folders, spend
from sim.analysis.tables import STATE_PREFIX, build_tables


@dataclass
class Distribution:
    """One state field over the characters of a run at its last tick."""

    numbers: list[float] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    missing: int = 0

    def add(self, value: Any) -> None:
        if value is None:
            self.missing += 1
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self.numbers.append(float(value))
        else:
            text = value if isinstance(value, str) else orjson.dumps(value).decode()
            self.counts[text] += 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.numbers:
            out.update(
                n=len(self.numbers),
                mean=round(sum(self.numbers) / len(self.numbers), 6),
                min=min(self.numbers),
                max=max(self.numbers),
            )
        if self.counts:
            out["counts"] = dict(sorted(self.counts.items()))
        if self.missing:
            out["missing"] = self.missing
        return out

    def text(self) -> str:
        parts: list[str] = []
        if self.numbers:
            mean = sum(self.numbers) / len(self.numbers)
            parts.append(f"{mean:.3g} [{min(self.numbers):g}..{max(self.numbers):g}]")
        parts.extend(f"{k}:{n}" for k, n in sorted(self.counts.items()))
        if self.missing:
            parts.append(f"-:{self.missing}")
        return " ".join(parts) or "-"


@dataclass
class RunRow:
    name: str
    seed: int
    overrides: dict[str, Any]
    start_tick: int
    tick: int
    last_tick: int | None
    calls: int
    failures: int
    tokens: int
    cost_usd: float | None
    fields: dict[str, Distribution]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "overrides": self.overrides,
            "start_tick": self.start_tick,
            "tick": self.tick,
            "ticks_run": self.tick - self.start_tick,
            "last_tick": self.last_tick,
            "calls": self.calls,
            "failures": self.failures,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "fields": {name: dist.to_dict() for name, dist in self.fields.items()},
        }


@dataclass
class SweepReport:
    runs: list[RunRow]
    fields: list[str]
    notes: list[str] = field(default_factory=list)


def run_row(run_dir: Path, notes: list[str]) -> RunRow:
    record = read_record(run_dir)
    spent = spend(run_dir)
    tables = build_tables(run_dir)
    notes.extend(f"{record.name}: {note}" for note in tables.notes)
    notes.extend(f"{record.name}: unreadable log: {problem}" for problem in tables.problems)
    last = tables.ticks[-1] if tables.ticks else None
    fields: dict[str, Distribution] = {}
    for row in tables.characters.rows:
        if row["tick"] != last:
            continue
        for column in tables.characters.columns:
            if column.startswith(STATE_PREFIX):
                name = column.removeprefix(STATE_PREFIX)
                fields.setdefault(name, Distribution()).add(row.get(column))
    return RunRow(
        name=record.name,
        seed=record.seed,
        overrides=record.overrides,
        start_tick=record.start_tick,
        tick=current_tick(run_dir),
        last_tick=last,
        calls=spent.calls,
        failures=spent.failures,
        tokens=spent.tokens,
        cost_usd=spent.cost.value,
        fields=fields,
    )


def sweep_report(out: Path) -> SweepReport:
    """Every run under ``out``, by name.

    Raises:
        InputError: ``out`` is not a folder, a run's ``sweep-run.json`` or ``world.json``
            cannot be read.
    """
    notes: list[str] = []
    rows = [run_row(run_dir, notes) for run_dir in run_folders(out)]
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.fields))
    return SweepReport(rows, list(names), notes)


def report_lines(report: SweepReport) -> list[str]:
    """The report as a text table, one line per run."""
    head = ["run", "ticks", "calls", "failed", "tokens", "cost", *report.fields]
    body = [
        [
            row.name,
            str(row.tick - row.start_tick),
            str(row.calls),
            str(row.failures),
            str(row.tokens),
            "unknown" if row.cost_usd is None else f"${row.cost_usd:.4f}",
            *(row.fields[f].text() if f in row.fields else "-" for f in report.fields),
        ]
        for row in report.runs
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    right = {1, 2, 3, 4, 5}
    return [
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()
        for line in [head, *body]
    ]


__all__ = ["Distribution", "RunRow", "SweepReport", "report_lines", "run_row", "sweep_report"]
