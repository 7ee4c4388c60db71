"""``sim study report``: one measure of a study, per condition and tick, with intervals.

The measure is a characters' state field (``coins``, ``state.coins``) or a survey's
answer (``survey``: the first survey; ``survey:N``: the N-th, from 1; ``survey:QUESTION``),
coded as a number: numbers as they are, ``yes``/``true`` as 1 and ``no``/``false`` as 0,
and any other value through ``FIELD=VALUE`` (1 where the value is VALUE, else 0: the share
holding it). Each run's value at a tick is the mean over its characters; each condition's
value is the mean over its runs, with a 95% t interval (runs are the units: seeds and
factor values). The difference between arms is each condition less the reference (the
study's first condition), paired by run (the arms of a seed share everything before
their fork), with its 95% t interval.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sim.analysis.studytables import StudyTables, build_study_tables, study_design
from sim.analysis.tables import STATE_PREFIX, Cell
from sim.errors import InputError, SimError
from sim.ticklog.format import list_logs
from sim.ticklog.reader import read_log

#: two-sided 95% quantiles of Student's t for 1..30 degrees of freedom
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_TRUE = frozenset({"yes", "true"})
_FALSE = frozenset({"no", "false"})


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom."""
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)  # the first Cornish-Fisher term: within 0.001 above 30


@dataclass
class Estimate:
    """A mean with its 95% interval (``None`` bounds below two runs)."""

    tick: int
    n: int
    mean: float
    low: float | None
    high: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(tick: int, values: Sequence[float]) -> Estimate:
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Estimate(tick, n, round(mean, 6), None, None)
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Estimate(tick, n, round(mean, 6), round(mean - half, 6), round(mean + half, 6))


@dataclass(frozen=True)
class Intervention:
    """A condition's scheduled intervention: ``kind`` (inject, set) at ``tick``, ``what``."""

    condition: str
    tick: int
    kind: str
    what: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DesignSummary:
    """What a reader of a report needs of the design: conditions and their interventions,
    seeds, factors, ticks (and those shared), runs begun, the provider and models called."""

    conditions: list[str]
    interventions: list[Intervention]
    seeds: list[int]
    factors: dict[str, list[Any]]
    ticks: int
    prefix_ticks: int
    runs: int
    providers: list[str]
    models: list[str]

    def lines(self) -> list[str]:
        factors = "; ".join(
            f"{k} = {', '.join(str(v) for v in vs)}" for k, vs in self.factors.items()
        )
        seeds = ", ".join(str(s) for s in self.seeds)
        canned = [p for p in self.providers if _sends_nothing(p)]
        return [
            f"conditions: {', '.join(self.conditions)}"
            + (f"; factors: {factors}" if factors else ""),
            f"seeds: {seeds}; ticks: {self.ticks} ({self.prefix_ticks} shared); "
            f"runs begun: {self.runs}",
            f"provider: {', '.join(self.providers) or 'unknown'}"
            + (f" ({', '.join(canned)}: canned answers, not a model)" if canned else "")
            + f"; model named: {', '.join(self.models) or 'none called'}",
            *(
                f"intervention: {i.condition} at tick {i.tick}: {i.kind} {i.what}"
                for i in self.interventions
            ),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "conditions": self.conditions,
            "interventions": [i.to_dict() for i in self.interventions],
            "seeds": self.seeds,
            "factors": self.factors,
            "ticks": self.ticks,
            "prefix_ticks": self.prefix_ticks,
            "runs": self.runs,
            "providers": self.providers,
            "models": self.models,
        }


@dataclass
class StudyReport:
    """The measure per condition per tick, and each condition's difference from the first."""

    measure: str
    coding: str
    reference: str
    conditions: dict[str, list[Estimate]]
    differences: dict[str, list[Estimate]]
    notes: list[str] = field(default_factory=list)
    design: DesignSummary | None = None
    #: each run's value per (condition, run, tick); each run's factor values (by run name)
    run_values: dict[tuple[str, str, int], float] = field(default_factory=dict)
    run_factors: dict[str, tuple[tuple[str, Any], ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "field": self.measure,
            "coding": self.coding,
            "reference": self.reference,
            "design": None if self.design is None else self.design.to_dict(),
            "conditions": {c: [e.to_dict() for e in es] for c, es in self.conditions.items()},
            "differences": {c: [e.to_dict() for e in es] for c, es in self.differences.items()},
            "notes": self.notes,
        }


def _provider(run_dir: Path) -> str | None:
    """The provider a run's latest tick log records in its config (``None``: no log)."""
    try:
        logs = list_logs(run_dir)
        header = read_log(logs[-1][1]).header if logs else None
    except (OSError, SimError):
        return None
    llm = header.config.get("llm") if header is not None else None
    provider = llm.get("provider") if isinstance(llm, dict) else None
    return provider if isinstance(provider, str) else None


def design_summary(out: Path, design: dict[str, Any], tables: StudyTables) -> DesignSummary:
    """The design of the study in ``out`` as a report prints it."""
    interventions: list[Intervention] = []
    raw = design.get("conditions") or {}
    for cond, spec in raw.items():
        if not isinstance(spec, dict):
            continue
        for item in spec.get("inject") or []:
            where = "everywhere" if item.get("everywhere") else f"at {item.get('at')}"
            interventions.append(Intervention(cond, int(item["tick"]), "inject", where))
        for item in spec.get("set") or []:
            interventions.append(Intervention(cond, int(item["tick"]), "set", str(item["path"])))
    interventions.sort(key=lambda i: (i.tick, i.condition))
    providers = sorted({p for rel in tables.runs if (p := _provider(out / rel)) is not None})
    models = sorted({str(r["model"]) for r in tables.tables["calls"].rows if r.get("model")})
    factors = design.get("factors") or {}
    return DesignSummary(
        conditions=list(raw),
        interventions=interventions,
        seeds=[int(s) for s in design.get("seeds") or []],
        factors={str(k): list(v) for k, v in factors.items()},
        ticks=int(design.get("ticks") or 0),
        prefix_ticks=int(design.get("prefix_ticks") or 0),
        runs=len(tables.runs),
        providers=providers,
        models=models,
    )


def code(value: Cell, level: str | None) -> float | None:
    """``value`` as a number (``FIELD=VALUE``'s level: 1 or 0); ``ValueError`` if it is not
    one."""
    if value is None:
        return None
    if level is not None:
        return 1.0 if str(value) == level else 0.0
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return 1.0 if value.strip().lower() in _TRUE else 0.0
    raise ValueError(str(value))


def measure(
    tables: StudyTables, design: dict[str, Any], spec: str
) -> tuple[str, str, list[dict[str, Cell]], str]:
    """(label, column, rows, what) of the measure ``spec`` names (level split off later)."""
    surveys = design.get("surveys") or []
    if spec == "survey" or spec.startswith("survey:"):
        if not surveys:
            raise InputError(None, "--field", "this study has no survey")
        which = spec.partition(":")[2]
        if not which:
            question = surveys[0]["question"]
        elif which.isdigit() and 1 <= int(which) <= len(surveys):
            question = surveys[int(which) - 1]["question"]
        else:
            found = [s["question"] for s in surveys if s["question"] == which]
            if not found:
                known = "; ".join(f"{i}: {s['question']}" for i, s in enumerate(surveys, 1))
                raise InputError(None, "--field", f"no survey {which!r} (surveys: {known})")
            question = str(found[0])
        rows = [r for r in tables.tables["surveys"].rows if r.get("question") == question]
        return f"survey: {question}", "answer", rows, "answer"
    columns = tables.tables["characters"].columns
    column = spec if spec.startswith(STATE_PREFIX) or spec in columns else STATE_PREFIX + spec
    if column not in columns or column in ("tick", "seed"):
        state = [c.removeprefix(STATE_PREFIX) for c in columns if c.startswith(STATE_PREFIX)]
        raise InputError(
            None,
            "--field",
            f"no state field {spec!r}; fields: {', '.join(state) or 'none'}"
            + ("; or survey, survey:N" if surveys else ""),
        )
    return column.removeprefix(STATE_PREFIX), column, tables.tables["characters"].rows, "field"


def study_report(out: Path, spec: str | None = None) -> StudyReport:
    """The report of the study in ``out`` for the measure ``spec`` (default: the first
    survey, else the first numeric state field).

    Raises:
        InputError: not a study's folder, no such field or survey, a value that is not a
            number (names the values to pick with FIELD=VALUE), no run begun.
    """
    design = study_design(out)
    tables = build_study_tables(out)
    if not tables.runs:
        raise InputError(out, None, "no run of this study has begun: run sim study run first")
    if spec is None:
        if design.get("surveys"):
            spec = "survey"
        else:
            numeric = [
                c
                for c in tables.tables["characters"].columns
                if c.startswith(STATE_PREFIX)
                and any(isinstance(r.get(c), int | float) for r in tables.tables["characters"].rows)
            ]
            if not numeric:
                raise InputError(None, "--field", "no survey and no numeric state field: name one")
            spec = numeric[0]
    name, level = spec, None
    if "=" in spec:
        name, _, level = spec.partition("=")
    label, column, rows, what = measure(tables, design, name)
    per_run: dict[tuple[str, str, int], list[float]] = {}
    odd: set[str] = set()
    for row in rows:
        try:
            coded = code(row.get(column), level)
        except ValueError:
            odd.add(str(row.get(column)))
            continue
        if coded is not None:
            key = (str(row["condition"]), str(row["run"]), int(row["tick"]))
            per_run.setdefault(key, []).append(coded)
    if odd:
        shown = ", ".join(sorted(odd)[:10])
        raise InputError(
            None,
            "--field",
            f"{label} holds values that are not numbers or yes/no ({shown}): "
            f"pick one with --field {name}=VALUE (the share holding it)",
        )
    if not per_run:
        raise InputError(None, "--field", f"{label}: no value recorded yet")
    conditions = [c for c in tables.conditions if any(k[0] == c for k in per_run)]
    reference = conditions[0]
    means = {key: statistics.fmean(v) for key, v in per_run.items()}
    ticks = sorted({k[2] for k in means})
    report = StudyReport(
        label,
        f"{what} {'= ' + level if level else '(numbers; yes/true = 1, no/false = 0)'}",
        reference,
        {},
        {},
        notes=tables.notes,
        design=design_summary(out, design, tables),
        run_values=means,
        run_factors=_factors(tables),
    )
    for cond in conditions:
        report.conditions[cond] = [
            estimate(t, vals)
            for t in ticks
            if (vals := [m for (c, _, tt), m in means.items() if c == cond and tt == t])
        ]
        if cond == reference:
            continue
        diffs: list[Estimate] = []
        for t in ticks:
            paired = [
                m - means[(reference, run, t)]
                for (c, run, tt), m in means.items()
                if c == cond and tt == t and (reference, run, t) in means
            ]
            if paired:
                diffs.append(estimate(t, paired))
        report.differences[cond] = diffs
    return report


def _factors(tables: StudyTables) -> dict[str, tuple[tuple[str, Any], ...]]:
    """Each run's factor values, by run name (the same in every condition)."""
    out: dict[str, tuple[tuple[str, Any], ...]] = {}
    for row in tables.tables["characters"].rows:
        out.setdefault(str(row["run"]), tuple((f, row.get(f)) for f in tables.factors))
    return out


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def report_lines(report: StudyReport) -> list[str]:
    """The report as text: one line per condition and tick, then the differences."""
    lines = [f"{report.measure}  ({report.coding})", ""]
    if report.design is not None:
        lines[1:1] = report.design.lines()
    lines.append(f"{'condition':<16} {'tick':>4} {'n':>3} {'mean':>8}  95% interval")
    for cond, estimates in report.conditions.items():
        for e in estimates:
            ci = f"[{_fmt(e.low)}, {_fmt(e.high)}]" if e.low is not None else ""
            lines.append(f"{cond:<16} {e.tick:>4} {e.n:>3} {e.mean:>8.3f}  {ci}")
    for cond, estimates in report.differences.items():
        lines.append("")
        lines.append(f"{cond} - {report.reference} (paired by run)")
        for e in estimates:
            ci = f"[{_fmt(e.low)}, {_fmt(e.high)}]" if e.low is not None else ""
            lines.append(f"{'':<16} {e.tick:>4} {e.n:>3} {e.mean:>+8.3f}  {ci}")
    return lines


_COLORS = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989")


def _chart(report: StudyReport) -> str:
    """An inline SVG of each condition's mean over ticks, its interval as a band: both
    axes with values and titles (the measure, ``tick``), the legend in rows under the
    plot, each entry as wide as its name (none is cut off)."""
    esc = html.escape
    points = [e for es in report.conditions.values() for e in es]
    ticks = sorted({e.tick for e in points})
    values = [v for e in points for v in (e.mean, e.low, e.high) if v is not None]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    # the legend: entries laid out in rows, each as wide as its name
    w, left, right, top, plot_h = 640, 64, 16, 16, 220
    rows: list[list[tuple[str, str, float]]] = [[]]
    at = left
    room = (w - left - right - 22) // 7  # characters a legend row holds
    for i, full in enumerate(report.conditions):
        cond = full if len(full) <= room else full[: room - 1] + "…"
        width = 22 + 7 * len(cond)
        if rows[-1] and at + width > w - right:
            rows.append([])
            at = left
        rows[-1].append((cond, _COLORS[i % len(_COLORS)], at))
        at += width + 14
    bottom = top + plot_h  # the x axis
    h = bottom + 44 + 18 * len(rows)
    t0, t1 = ticks[0], ticks[-1] if ticks[-1] > ticks[0] else ticks[0] + 1

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * (w - left - right)

    def y(v: float) -> float:
        return bottom - (v - lo) / (hi - lo) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" '
        f'height="{h}" role="img" aria-label="mean per condition over ticks" '
        'font-family="system-ui,sans-serif">',
    ]
    for k in range(5):  # the y axis: five values, with grid lines
        v = lo + (hi - lo) * k / 4
        parts.append(
            f'<line x1="{left}" y1="{y(v):.1f}" x2="{w - right}" y2="{y(v):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">'
            f"{v:.3g}</text>"
        )
    parts.append(
        f'<line x1="{left}" y1="{bottom}" x2="{w - right}" y2="{bottom}" stroke="#888"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#888"/>'
        f'<text x="14" y="{top + plot_h / 2:.1f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{esc(report.measure)}</text>'
        f'<text x="{(left + w - right) / 2:.1f}" y="{bottom + 34}" font-size="12" '
        'text-anchor="middle">tick</text>'
    )
    step = max(1, -(-len(ticks) // 16))
    for i, t in enumerate(ticks):
        if i % step == 0 or i == len(ticks) - 1:
            parts.append(
                f'<text x="{x(t):.1f}" y="{bottom + 16}" font-size="11" '
                f'text-anchor="middle">{t}</text>'
            )
    for i, es in enumerate(report.conditions.values()):
        color = _COLORS[i % len(_COLORS)]
        band = [e for e in es if e.low is not None and e.high is not None]
        if len(band) > 1:
            upper = " ".join(f"{x(e.tick):.1f},{y(e.high or 0):.1f}" for e in band)
            lower = " ".join(f"{x(e.tick):.1f},{y(e.low or 0):.1f}" for e in reversed(band))
            parts.append(f'<polygon points="{upper} {lower}" fill="{color}" opacity="0.15"/>')
        line = " ".join(f"{x(e.tick):.1f},{y(e.mean):.1f}" for e in es)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for e in es:
            parts.append(
                f'<circle cx="{x(e.tick):.1f}" cy="{y(e.mean):.1f}" r="3" fill="{color}"/>'
            )
    for r, row in enumerate(rows):
        ly = bottom + 52 + 18 * r
        for cond, color, lx in row:
            parts.append(
                f'<rect x="{lx}" y="{ly - 9}" width="12" height="12" fill="{color}"/>'
                f'<text x="{lx + 17}" y="{ly + 1}" font-size="12">{esc(cond)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def report_html(report: StudyReport, title: str) -> str:
    """One self-contained page: the chart and the tables (no script, every text escaped)."""
    esc = html.escape

    def rows(estimates: dict[str, list[Estimate]], signed: bool) -> str:
        out = []
        for cond, es in estimates.items():
            for e in es:
                mean = f"{e.mean:+.3f}" if signed else f"{e.mean:.3f}"
                ci = f"[{_fmt(e.low)}, {_fmt(e.high)}]" if e.low is not None else ""
                out.append(
                    f"<tr><td>{esc(cond)}</td><td>{e.tick}</td><td>{e.n}</td>"
                    f"<td>{mean}</td><td>{ci}</td></tr>"
                )
        return "".join(out)

    head = "<tr><th>condition</th><th>tick</th><th>n</th><th>mean</th><th>95% interval</th></tr>"
    diff_head = head.replace("condition", f"condition − {esc(report.reference)}")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>body{{font:14px system-ui,sans-serif;margin:2em;"
        "max-width:60em}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid "
        "#ccc;padding:.2em .6em;text-align:right}td:first-child,th:first-child{text-align:"
        "left}</style></head><body>"
        f"<h1>{esc(title)}</h1>"
        + (
            ""
            if report.design is None
            else "<p>" + "<br>".join(esc(line) for line in report.design.lines()) + "</p>"
        )
        + f"<p><b>{esc(report.measure)}</b> ({esc(report.coding)}): "
        "mean per condition per tick over runs, with a 95% t interval.</p>"
        f"{_chart(report)}<table>{head}{rows(report.conditions, False)}</table>"
        f"<h2>Difference from {esc(report.reference)}</h2><p>Paired by run (the arms of a "
        "seed share everything before their fork).</p>"
        f"<table>{diff_head}{rows(report.differences, True)}</table>"
        + "".join(f"<p class='note'>{esc(n)}</p>" for n in report.notes)
        + "</body></html>"
    )


def write_html(report: StudyReport, path: Path, title: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(report_html(report, title), encoding="utf-8")
    tmp.replace(path)
    return path


def report_json(report: StudyReport) -> bytes:
    return orjson.dumps(report.to_dict())


__all__ = [
    "DesignSummary",
    "Estimate",
    "Intervention",
    "StudyReport",
    "code",
    "design_summary",
    "estimate",
    "measure",
    "report_html",
    "report_lines",
    "study_report",
    "t975",
    "write_html",
]


def _sends_nothing(kind: str) -> bool:
    """A provider kind that answers without a model (no server, no command): the offline
    model's canned answers."""
    from sim.providers import find_profile

    found = find_profile(kind)
    return found is not None and found.sends_nothing
