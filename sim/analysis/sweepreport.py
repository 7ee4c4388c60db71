"""``sim sweep report``: one table comparing the runs of a sweep.

Per run: its seed and settings, ticks run, calls, failed calls, tokens and cost (every
attempt, from its logs, as ``sim usage`` counts them; the cost is unknown, ``None``, when
a model had no price), and for each custom state field of the characters its distribution
at the run's last committed tick, read through the tables of ``sim export``
(``sim.analysis.tables``): counts of each value for text and other values, mean, min and
max for numbers. Runs are listed in natural order (``seed-2`` before ``seed-10``). Per
setting (the runs that share their overrides, whatever their seed): the number of runs
and, over them, the mean and sample standard deviation of calls, tokens, cost and each
numeric field's per-run mean.
"""

from __future__ import annotations

import html
import os
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from sim.analysis.tables import STATE_PREFIX, build_tables
from sim.runs.fork import current_tick, read_record, require_run_folders
from sim.runs.ledger import spend


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
class Spread:
    """One quantity over the runs of a setting: how many had it, their mean and sample
    standard deviation (``None`` below two values)."""

    n: int
    mean: float
    sd: float | None

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        if not values:
            return None
        sd = statistics.stdev(values) if len(values) > 1 else None
        return cls(len(values), statistics.fmean(values), sd)

    def text(self) -> str:
        return f"{_num(self.mean)} ± {'-' if self.sd is None else _num(self.sd)}"

    def to_dict(self) -> dict[str, Any]:
        sd = None if self.sd is None else round(self.sd, 6)
        return {"n": self.n, "mean": round(self.mean, 6), "sd": sd}


def _num(value: float) -> str:
    """A mean or sd for the table: whole above 100 (tokens), else three digits."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


@dataclass
class SettingRow:
    """The runs of one setting (the same overrides), seeds pooled."""

    setting: str
    overrides: dict[str, Any]
    runs: int
    #: "calls", "tokens", "cost_usd", then each numeric state field -> its spread
    spreads: dict[str, Spread]

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "overrides": self.overrides,
            "runs": self.runs,
            **{name: spread.to_dict() for name, spread in self.spreads.items()},
        }


#: What a report of a folder of folders of runs says to do with each (``require_run_folders``).
REPORT_EACH = "report each (--runs {folder})"


@dataclass
class SweepReport:
    runs: list[RunRow]
    fields: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def settings(self) -> list[SettingRow]:
        """The runs grouped by setting, in the order each first appears."""
        groups: dict[str, list[RunRow]] = {}
        for row in self.runs:
            groups.setdefault(setting_name(row.overrides), []).append(row)
        out = []
        for name, rows in groups.items():
            spreads: dict[str, Spread] = {}
            costs = [r.cost_usd for r in rows]
            columns: list[tuple[str, list[float]]] = [
                ("calls", [float(r.calls) for r in rows]),
                ("tokens", [float(r.tokens) for r in rows]),
                # an unknown cost in any run: the setting's cost is unknown too
                ("cost_usd", [] if None in costs else [float(c or 0.0) for c in costs]),
            ]
            for fname in self.fields:
                means = [
                    statistics.fmean(r.fields[fname].numbers)
                    for r in rows
                    if fname in r.fields and r.fields[fname].numbers
                ]
                columns.append((fname, means))
            for key, values in columns:
                spread = Spread.of(values)
                if spread is not None:
                    spreads[key] = spread
            out.append(SettingRow(name, rows[0].overrides, len(rows), spreads))
        return out


def setting_name(overrides: dict[str, Any]) -> str:
    """A run's setting as the sweep names it: ``phase1.temperature=0.5`` (``,`` between
    several); ``(defaults)`` when it overrides nothing."""
    return ",".join(f"{k}={v}" for k, v in sorted(overrides.items())) or "(defaults)"


def natural_key(name: str) -> list[tuple[int, int | str]]:
    """``seed-2`` before ``seed-10``: digit runs compared as numbers."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)]


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
        InputError: ``out`` is not a folder or holds no run (naming its sub-folders that
            hold runs, a study's arms), a run's ``sweep-run.json`` or ``world.json`` cannot
            be read.
    """
    notes: list[str] = []
    folders = require_run_folders(out, REPORT_EACH)
    rows = sorted(
        (run_row(run_dir, notes) for run_dir in folders), key=lambda r: natural_key(r.name)
    )
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
    return _table(head, body, right={1, 2, 3, 4, 5})


def settings_lines(report: SweepReport) -> list[str]:
    """Per setting, seeds pooled: runs, then mean ± sd of calls, tokens, cost and each
    numeric field's per-run mean (``-`` for the sd of one run)."""
    settings = report.settings
    numeric = [f for f in report.fields if any(f in s.spreads for s in settings)]
    head = ["setting", "runs", "calls", "tokens", "cost", *numeric]
    body = []
    for row in settings:
        cells = [row.setting, str(row.runs)]
        for key in ("calls", "tokens", "cost_usd", *numeric):
            spread = row.spreads.get(key)
            if spread is None:
                cells.append("unknown" if key == "cost_usd" else "-")
            elif key == "cost_usd":
                sd = "-" if spread.sd is None else f"${spread.sd:.4f}"
                cells.append(f"${spread.mean:.4f} ± {sd}")
            else:
                cells.append(spread.text())
        body.append(cells)
    return _table(head, body, right=set(range(1, len(head))))


def _table(head: list[str], body: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return [
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()
        for line in [head, *body]
    ]


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{title}</title>
<style>
{css}
table.sweep {{ border-collapse: collapse; width: 100%; }}
table.sweep th, table.sweep td {{ border-bottom: 1px solid var(--line); padding: 5px 8px;
  text-align: left; vertical-align: top; }}
table.sweep td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.bar {{ display: block; height: 6px; background: var(--accent); border-radius: 3px; }}
</style>
</head>
<body>
<header><h1>{heading}</h1><p class="muted">{subtitle}</p></header>
<main>
<section class="card"><table class="sweep">
<thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody></table></section>
{notes}
</main>
</body>
</html>
"""


def _cell(text: str, numeric: bool = False, bar: float | None = None) -> str:
    inner = html.escape(text)
    if bar is not None:  # a bar of the mean, scaled over every run's [min..max]
        inner += f'<span class="bar" style="width:{max(2.0, bar * 100):.1f}%"></span>'
    return f'<td class="num">{inner}</td>' if numeric else f"<td>{inner}</td>"


def report_html(report: SweepReport, title: str) -> str:
    """The report as one self-contained HTML page (no script, no network), styled as
    ``sim report``; every text from the runs is escaped."""
    css = (resources.files("sim.analysis.report") / "report.css").read_text(encoding="utf-8")
    ranges: dict[str, tuple[float, float]] = {}
    for name in report.fields:
        values = [v for r in report.runs if name in r.fields for v in r.fields[name].numbers]
        if values:
            ranges[name] = (min(values), max(values))
    head = ["run", "seed", "settings", "ticks", "calls", "failed", "tokens", "cost"]
    rows: list[str] = []
    for row in report.runs:
        cells = [
            _cell(row.name),
            _cell(str(row.seed), numeric=True),
            _cell(", ".join(f"{k}={v}" for k, v in row.overrides.items()) or "-"),
            _cell(str(row.tick - row.start_tick), numeric=True),
            _cell(str(row.calls), numeric=True),
            _cell(str(row.failures), numeric=True),
            _cell(str(row.tokens), numeric=True),
            _cell("unknown" if row.cost_usd is None else f"${row.cost_usd:.4f}", numeric=True),
        ]
        for name in report.fields:
            dist = row.fields.get(name)
            bar = None
            if dist is not None and dist.numbers and name in ranges:
                low, high = ranges[name]
                mean = sum(dist.numbers) / len(dist.numbers)
                bar = (mean - low) / (high - low) if high > low else 1.0
            cells.append(_cell(dist.text() if dist is not None else "-", bar=bar))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    return _PAGE.format(
        title=html.escape(f"{title} — sim sweep report"),
        css=css,
        heading=html.escape(title),
        subtitle=html.escape(
            f"{len(report.runs)} runs; state fields at each run's last tick: "
            "mean [min..max] for numbers, counts for other values"
        ),
        head="".join(f"<th>{html.escape(h)}</th>" for h in [*head, *report.fields]),
        body="\n".join(rows),
        notes=f'<section class="card"><h2>Notes</h2><ul>{notes}</ul></section>' if notes else "",
    )


def write_html(report: SweepReport, path: Path, title: str) -> Path:
    """Write the page to ``path`` (through a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(report_html(report, title), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


__all__ = [
    "Distribution",
    "RunRow",
    "SettingRow",
    "Spread",
    "SweepReport",
    "report_html",
    "report_lines",
    "run_row",
    "setting_name",
    "settings_lines",
    "sweep_report",
    "write_html",
]
