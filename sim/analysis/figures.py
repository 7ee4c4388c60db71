"""``sim study report --figures DIR``: a study's report as figures fit for a paper.

Three figures, each written as SVG (text kept as text, so a journal's editor can restyle
it) and PNG (300 dpi), drawn with matplotlib (the ``analysis`` extra) on its Agg canvas:

- ``means``: each condition's mean per tick with its 95% interval as a band;
- ``differences``: each condition less the reference, paired by run, with its interval;
- ``panels``: every cell of the design on one page, one panel per condition (columns)
  and factor combination (rows), the reference condition drawn faint in each for
  comparison: a 2 × 2 design is four panels.

Every figure has axis titles and tick values, a legend placed outside the axes (never
clipped: the page grows to hold it), each intervention marked as a dotted line at the tick
whose inputs hold it, and the design (conditions, seeds, ticks, provider and model)
printed beneath it. The files are the same bytes for the same report: no dates, and the
SVG's ids are salted with a constant.
"""

from __future__ import annotations

import io
import itertools
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.analysis.export import MissingExtra
from sim.analysis.studyreport import Estimate, StudyReport, estimate
from sim.errors import InputError

#: the figures written, by file stem
FIGURES = ("means", "differences", "panels")
FORMATS = ("svg", "png")
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")
_RC = {
    "svg.fonttype": "none",  # text as text: searchable, editable
    "svg.hashsalt": "sim",  # the same ids in every file
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def _matplotlib() -> tuple[Any, Any]:
    """(matplotlib, Figure), or ``MissingExtra`` naming the extra that brings it."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra("sim study report --figures", needs="matplotlib") from None
    return matplotlib, Figure


def _wrap(text: str, width: int = 48) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _ylabel(report: StudyReport) -> str:
    if "yes/true = 1" in report.coding and report.measure.startswith("survey"):
        return "share answering yes"
    if "= " in report.coding and not report.coding.endswith(")"):
        return _wrap(f"share with {report.coding.partition('= ')[2]}", 40)
    return _wrap(f"mean {report.measure}", 40)


def _mark_interventions(ax: Any, report: StudyReport, conditions: Sequence[str]) -> None:
    if report.design is None:
        return
    colors = _colors(report)
    for item in report.design.interventions:
        if item.condition in conditions:
            ax.axvline(
                item.tick, color=colors.get(item.condition, "#555"), linestyle=":", linewidth=1.2
            )


def _intervention_handles(report: StudyReport, conditions: Sequence[str]) -> list[Any]:
    from matplotlib.lines import Line2D

    if report.design is None:
        return []
    colors = _colors(report)
    seen: dict[tuple[str, int, str], None] = {}
    for item in report.design.interventions:
        if item.condition in conditions:
            seen[(item.condition, item.tick, f"{item.kind} {item.what}")] = None
    return [
        Line2D(
            [],
            [],
            color=colors.get(cond, "#555"),
            linestyle=":",
            label=_wrap(f"{cond}: {what} (tick {tick})", 44),
        )
        for cond, tick, what in seen
    ]


def _colors(report: StudyReport) -> dict[str, str]:
    return {c: _COLORS[i % len(_COLORS)] for i, c in enumerate(report.conditions)}


def _band(ax: Any, es: Sequence[Estimate], color: str, label: str | None, **line: Any) -> None:
    ticks = [e.tick for e in es]
    ax.plot(ticks, [e.mean for e in es], marker="o", markersize=3, color=color, label=label, **line)
    band = [e for e in es if e.low is not None and e.high is not None]
    if band:
        ax.fill_between(
            [e.tick for e in band],
            [e.low for e in band],
            [e.high for e in band],
            color=color,
            alpha=0.15,
            linewidth=0,
        )


def _finish(fig: Any, report: StudyReport, handles: list[Any], title: str, note: str) -> None:
    """The title above, the legend right of the axes, the design and ``note`` beneath."""
    fig.suptitle(_wrap(title, 64))
    fig.legend(handles=handles, loc="outside right center", frameon=False)
    lines = [] if report.design is None else report.design.lines()
    if report.design is not None and report.design.interventions:
        note += "; dotted: the tick whose inputs hold an intervention"
    lines.append(note)
    fig.text(
        0.0,
        0.0,
        "\n".join(_wrap(line, 110) for line in lines),
        ha="left",
        va="top",
        fontsize=7,
        color="#333",
        transform=fig.transFigure,
    )


def _ticks_axis(ax: Any, ticks: Sequence[int], report: StudyReport) -> None:
    """``tick`` as the x title, the ticks measured (and those of interventions) as values."""
    ax.set_xlabel("tick")
    from matplotlib.ticker import MaxNLocator

    marked = [i.tick for i in report.design.interventions] if report.design else []
    held = sorted({*ticks, *marked})
    if held and len(held) <= 12:
        ax.set_xticks(held)  # the ticks measured
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, axis="y", color="#ddd", linewidth=0.6)


def _over_ticks(
    fig: Any,
    ax: Any,
    report: StudyReport,
    series: dict[str, list[Estimate]],
    ylabel: str,
    title: str,
    note: str,
) -> None:
    """How a figure of a ``series`` per condition over the ticks ends: the interventions
    marked, the ticks axis, ``ylabel``, and ``_finish`` with the series' legend, then the
    interventions'."""
    _mark_interventions(ax, report, list(series))
    _ticks_axis(ax, [e.tick for es in series.values() for e in es], report)
    ax.set_ylabel(ylabel)
    handles, _ = ax.get_legend_handles_labels()
    handles += _intervention_handles(report, list(series))
    _finish(fig, report, handles, title, note)


def _means(Figure: Any, report: StudyReport) -> Any:
    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.add_subplot()
    colors = _colors(report)
    for cond, es in report.conditions.items():
        _band(ax, es, colors[cond], cond)
    _over_ticks(
        fig,
        ax,
        report,
        report.conditions,
        _ylabel(report),
        f"{report.measure}: mean per condition",
        "bands: 95% t intervals over runs",
    )
    return fig


def _differences(Figure: Any, report: StudyReport) -> Any:
    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.add_subplot()
    colors = _colors(report)
    ax.axhline(0, color="#888", linewidth=0.8)
    for i, (cond, es) in enumerate(report.differences.items()):
        shift = 0.06 * (i - (len(report.differences) - 1) / 2)
        xs = [e.tick + shift for e in es]
        low = [e.mean - e.low if e.low is not None else 0.0 for e in es]
        high = [e.high - e.mean if e.high is not None else 0.0 for e in es]
        ax.errorbar(
            xs,
            [e.mean for e in es],
            yerr=[low, high],
            color=colors[cond],
            marker="o",
            markersize=4,
            capsize=3,
            label=f"{cond} − {report.reference}",
        )
    _over_ticks(
        fig,
        ax,
        report,
        report.differences,
        _wrap(f"difference from {report.reference} (paired by run)", 40),
        f"{report.measure}: difference from {report.reference}",
        "bars: 95% t intervals of the paired differences over runs",
    )
    return fig


def _cells(report: StudyReport) -> list[tuple[tuple[str, Any], ...]]:
    combos = sorted(set(report.run_factors.values()), key=lambda c: [str(v) for _, v in c])
    return combos or [()]


def _cell_estimates(
    report: StudyReport, cond: str, combo: tuple[tuple[str, Any], ...]
) -> list[Estimate]:
    runs = {r for r, c in report.run_factors.items() if c == combo} if combo else None
    by_tick: dict[int, list[float]] = {}
    for (c, run, tick), value in report.run_values.items():
        if c == cond and (runs is None or run in runs):
            by_tick.setdefault(tick, []).append(value)
    return [estimate(t, vs) for t, vs in sorted(by_tick.items())]


def _panels(Figure: Any, report: StudyReport) -> Any:
    conditions = list(report.conditions)
    combos = _cells(report)
    cells: list[list[tuple[str, tuple[tuple[str, Any], ...]]]]
    if combos == [()] and len(conditions) > 3:
        # no factor: the conditions in a grid (a 2 x 2 of four conditions: 2 x 2 panels)
        cols = 2 if len(conditions) == 4 else 3
        cells = [
            [(cond, ()) for cond in conditions[i : i + cols]]
            for i in range(0, len(conditions), cols)
        ]
    else:
        cells = [[(cond, combo) for cond in conditions] for combo in combos]
    rows, cols = len(cells), max(len(r) for r in cells)
    fig = Figure(figsize=(3.3 * cols + 2.2, 2.4 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    colors = _colors(report)
    values: list[float] = []
    for r, c in itertools.product(range(rows), range(cols)):
        ax = axes[r][c]
        if c >= len(cells[r]):
            ax.set_visible(False)
            continue
        cond, combo = cells[r][c]
        if cond != report.reference:
            _band(
                ax,
                _cell_estimates(report, report.reference, combo),
                "#999",
                f"{report.reference} (reference)",
                linestyle="--",
                linewidth=1,
            )
        own = _cell_estimates(report, cond, combo)
        _band(ax, own, colors[cond], cond)
        values += [v for e in own for v in (e.mean, e.low, e.high) if v is not None]
        _mark_interventions(ax, report, [cond])
        title = cond + "".join(f"\n{_wrap(f'{k} = {v}', 30)}" for k, v in combo)
        ax.set_title(title, fontsize=9)
        _ticks_axis(ax, [k[2] for k in report.run_values], report)
        if not ax.get_subplotspec().is_last_row():
            ax.set_xlabel("")
    fig.supylabel(_ylabel(report))
    if values:
        spread = max(values) - min(values) or 1.0
        axes[0][0].set_ylim(min(values) - 0.05 * spread, max(values) + 0.05 * spread)
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    legend = list(handles.values()) + _intervention_handles(report, conditions)
    _finish(
        fig,
        report,
        legend,
        f"{report.measure}: every condition",
        "bands: 95% t intervals over the runs of each cell; dashed grey: the reference "
        "condition in the same cell",
    )
    return fig


def _save(fig: Any, path: Path, fmt: str) -> None:
    buffer = io.BytesIO()
    metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {"Software": None}
    fig.savefig(buffer, format=fmt, dpi=300, bbox_inches="tight", pad_inches=0.1, metadata=metadata)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(path)


def write_figures(report: StudyReport, out: Path) -> list[Path]:
    """Write the report's figures into the folder ``out`` (made if missing) as SVG and
    PNG; the paths written.

    Raises:
        MissingExtra: matplotlib is not installed.
        InputError: ``out`` is not a folder and cannot be made one.
    """
    matplotlib, Figure = _matplotlib()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(out, None, f"cannot make the figures' folder: {exc.strerror}") from None
    written: list[Path] = []
    with matplotlib.rc_context(_RC):
        for name, draw in (("means", _means), ("differences", _differences), ("panels", _panels)):
            if name == "differences" and not report.differences:
                continue
            fig = draw(Figure, report)
            for fmt in FORMATS:
                path = out / f"{name}.{fmt}"
                _save(fig, path, fmt)
                written.append(path)
    return written


__all__ = ["FIGURES", "FORMATS", "write_figures"]
