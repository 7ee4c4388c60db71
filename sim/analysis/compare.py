"""``sim study compare``: named tests between a study's arms, or against real data.

A *comparison* sets two samples of one measure at one tick side by side: each condition
against the study's first (the control), or each condition against a reference file of
real observations (``--reference``: CSV rows ``field,tick,value``, such as people's answers
to the survey the characters answered). The measure is named as ``sim study report``
names it (``coins``, ``survey:2``, ``mood=angry``; ``sim.analysis.studyreport.measure``).

Each comparison has:

- a named test: ``welch`` (Welch's t, unequal variances), ``mannwhitney`` (Mann-Whitney U),
  ``ks`` (two-sample Kolmogorov-Smirnov) on numbers, or ``chi2`` (χ² of the contingency
  table, Yates-corrected when it is 2 × 2) on categories; ``auto`` picks ``welch`` when
  every value codes as a number (yes/no as 1/0) and ``chi2`` otherwise;
- an estimate: the difference of means (``b - a``) for a numeric test, Cramér's V for
  ``chi2``, with a seeded bootstrap 95% interval (``scipy.stats.bootstrap``, BCa, or the
  percentile interval where BCa is undefined on degenerate data);
- an effect size: Cohen's d (pooled standard deviation) for numbers, Cramér's V for
  categories;
- its p value, and the p value adjusted for every comparison made at once: Holm by
  default, Benjamini-Hochberg (``scipy.stats.false_discovery_control``), or none.

The unit between arms is the run (its mean over characters, as the report takes it), or
with ``unit="answer"`` every character's value; ``chi2`` and a reference always count
answers (people are compared with characters, one answer each).

Every statistic comes from scipy (the ``analysis`` extra); only Holm's step-down, a sort
and a running maximum over scipy's p values, and Cohen's d, a mean difference over a
pooled deviation, are written here.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sim.analysis.export import MissingExtra
from sim.analysis.studyreport import code, measure
from sim.analysis.studytables import StudyTables, build_study_tables, study_design
from sim.analysis.tables import STATE_PREFIX, Cell
from sim.errors import InputError
from sim.safefs import read_capped

Test = Literal["auto", "welch", "mannwhitney", "ks", "chi2"]
TESTS: tuple[Test, ...] = ("auto", "welch", "mannwhitney", "ks", "chi2")
Correction = Literal["holm", "bh", "none"]
CORRECTIONS: tuple[Correction, ...] = ("holm", "bh", "none")
Unit = Literal["run", "answer"]
UNITS: tuple[Unit, ...] = ("run", "answer")
#: what a reference row must hold, in order
REFERENCE_COLUMNS = ("field", "tick", "value")
#: the largest reference file read
MAX_REFERENCE_BYTES = 64 * 1024 * 1024
#: bootstrap resamples: numbers (vectorised) and categories (one table per resample)
_RESAMPLES = 9999
_RESAMPLES_CATEGORIES = 1999


def _scipy() -> tuple[Any, Any]:
    """(numpy, scipy.stats), or ``MissingExtra`` naming the extra that brings scipy."""
    try:
        import numpy
        import scipy.stats
    except ImportError:
        raise MissingExtra("sim study compare", needs="scipy") from None
    return numpy, scipy.stats


@dataclass(frozen=True)
class Comparison:
    """One test between sample ``a`` (the control or the reference) and sample ``b``."""

    field: str
    tick: int
    a: str
    b: str
    test: str
    unit: str
    n_a: int
    n_b: int
    estimate: float | None
    estimate_of: str
    ci_low: float | None
    ci_high: float | None
    statistic: float | None
    p_value: float | None
    p_adjusted: float | None
    effect: float | None
    effect_size: str
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompareResult:
    """Every comparison made, and the correction applied over them."""

    correction: str
    comparisons: list[Comparison]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "correction": self.correction,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "notes": self.notes,
        }


@dataclass(frozen=True)
class ReferenceRow:
    """One real observation: ``value`` of ``field`` at ``tick`` (line ``line`` of its file)."""

    field: str
    tick: int
    value: str
    line: int


def read_reference(path: Path) -> list[ReferenceRow]:
    """The rows of a reference CSV (``field,tick,value``; a header row of those names is
    skipped).

    Raises:
        InputError: the file cannot be read, is not UTF-8, or a row is malformed: names
            the file, the line and the column.
    """
    data = read_capped(path, MAX_REFERENCE_BYTES, "cannot read the reference")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(path, f"line {line}", "not UTF-8 text") from None
    rows: list[ReferenceRow] = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if not rows and [c.strip().lower() for c in cells] == list(REFERENCE_COLUMNS):
                continue  # the header
            if len(cells) != 3:
                raise InputError(
                    path,
                    f"line {line}",
                    f"expected 3 columns (field,tick,value), found {len(cells)}",
                )
            name, tick, value = (c.strip() for c in cells)
            if not name:
                raise InputError(path, f"line {line}, column 1 (field)", "empty")
            if not tick.isdigit() or not tick.isascii():
                raise InputError(
                    path,
                    f"line {line}, column 2 (tick)",
                    f"expected a tick (0, 1, ...), got {tick!r}",
                )
            if not value:
                raise InputError(path, f"line {line}, column 3 (value)", "empty")
            rows.append(ReferenceRow(name, int(tick), value, line))
    except csv.Error as exc:
        raise InputError(path, f"line {reader.line_num}", f"not CSV: {exc}") from None
    if not rows:
        raise InputError(path, None, "no rows: expected CSV rows of field,tick,value")
    return rows


# -- the samples ---------------------------------------------------------------------------


@dataclass
class _Field:
    """One measure's values per (condition, run, tick): raw cells, one per answer."""

    label: str
    level: str | None
    values: dict[tuple[str, str, int], list[Cell]]


def _field(tables: StudyTables, design: dict[str, Any], spec: str) -> _Field:
    name, level = spec, None
    if "=" in spec:
        name, _, level = spec.partition("=")
    label, column, rows, _ = measure(tables, design, name)
    values: dict[tuple[str, str, int], list[Cell]] = {}
    for row in rows:
        value = row.get(column)
        if value is not None:
            key = (str(row["condition"]), str(row["run"]), int(row["tick"]))
            values.setdefault(key, []).append(value)
    if not values:
        raise InputError(None, "--field", f"{label}: no value recorded yet")
    return _Field(label + (f" = {level}" if level else ""), level, values)


def _numbers(values: Sequence[Cell], level: str | None) -> list[float] | None:
    """``values`` coded as numbers, or ``None`` if one of them is not a number."""
    out: list[float] = []
    for value in values:
        try:
            coded = code(value, level)
        except ValueError:
            return None
        if coded is not None:
            out.append(coded)
    return out


def _category(value: Cell) -> str:
    return str(value).strip().casefold()


# -- the statistics ------------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    number = float(value)
    return round(number, 10) if math.isfinite(number) else None


def _interval(
    samples: tuple[Sequence[float], Sequence[float]],
    statistic: Callable[..., Any],
    *,
    vectorized: bool,
    resamples: int,
    seed: int,
) -> tuple[float | None, float | None, str | None]:
    """The bootstrap 95% interval of ``statistic(b, a)``: BCa, else the percentile one."""
    np, stats = _scipy()
    if min(len(samples[0]), len(samples[1])) < 2:
        return None, None, "no interval: a sample of fewer than 2"
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = stats.bootstrap(
                (np.asarray(samples[0], dtype=float), np.asarray(samples[1], dtype=float)),
                statistic,
                n_resamples=resamples,
                vectorized=vectorized,
                method=method,
                rng=np.random.default_rng(seed),
            )
        low, high = (
            _finite(result.confidence_interval.low),
            _finite(result.confidence_interval.high),
        )
        if low is not None and high is not None:
            return low, high, None if method == "BCa" else "percentile interval (BCa undefined)"
    return None, None, "no interval: the resamples give no finite value"


def _numeric(
    test: Test, a: Sequence[float], b: Sequence[float], seed: int
) -> tuple[float | None, float | None, float | None, float | None, float | None, str | None]:
    """(estimate, low, high, statistic, p, note) of ``test`` between numbers ``a``, ``b``."""
    np, stats = _scipy()
    x, y = np.asarray(b, dtype=float), np.asarray(a, dtype=float)
    estimate = _finite(x.mean() - y.mean())
    statistic: float | None = None
    p: float | None = None
    note: str | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if len(x) < 2 or len(y) < 2:
            note = "no test: a sample of fewer than 2"
        elif test == "welch":
            result = stats.ttest_ind(x, y, equal_var=False)
            statistic, p = _finite(result.statistic), _finite(result.pvalue)
        elif test == "mannwhitney":
            result = stats.mannwhitneyu(x, y, alternative="two-sided")
            statistic, p = _finite(result.statistic), _finite(result.pvalue)
        else:
            result = stats.ks_2samp(x, y)
            statistic, p = _finite(result.statistic), _finite(result.pvalue)
    if note is None and p is None:
        note = "no test: both samples constant"

    def difference(x: Any, y: Any, axis: int = -1) -> Any:
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    low, high, why = _interval((b, a), difference, vectorized=True, resamples=_RESAMPLES, seed=seed)
    return estimate, low, high, statistic, p, note or why


def cohen_d(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Cohen's d of ``b`` over ``a``: the difference of means over the pooled standard
    deviation (``None`` below 2 values a side or with no spread)."""
    np, _ = _scipy()
    if len(a) < 2 or len(b) < 2:
        return None
    x, y = np.asarray(b, dtype=float), np.asarray(a, dtype=float)
    pooled = ((len(x) - 1) * x.var(ddof=1) + (len(y) - 1) * y.var(ddof=1)) / (len(x) + len(y) - 2)
    if not pooled > 0:
        return None
    return _finite((x.mean() - y.mean()) / math.sqrt(pooled))


def _table(np: Any, x: Any, y: Any, k: int) -> Any:
    """The 2 × categories table of codes ``x`` and ``y``, empty categories dropped."""
    table = np.stack(
        [np.bincount(x.astype(int), minlength=k), np.bincount(y.astype(int), minlength=k)]
    )
    return table[:, table.sum(axis=0) > 0]


def _categories(
    a: Sequence[str], b: Sequence[str], seed: int
) -> tuple[float | None, float | None, float | None, float | None, float | None, str | None]:
    """(Cramér's V, low, high, χ², p, note) between the categories ``a`` and ``b``."""
    np, stats = _scipy()
    levels = sorted(set(a) | set(b))
    index = {level: i for i, level in enumerate(levels)}
    codes_a = [float(index[v]) for v in a]
    codes_b = [float(index[v]) for v in b]
    k = len(levels)
    if not a or not b:
        return None, None, None, None, None, "no test: an empty sample"
    table = _table(np, np.asarray(codes_b), np.asarray(codes_a), k)
    if table.shape[1] < 2:
        return 0.0, None, None, None, None, f"no test: one category only ({levels[0]})"
    chi2 = stats.chi2_contingency(table)
    v = _finite(stats.contingency.association(table, method="cramer"))

    def cramer(x: Any, y: Any) -> float:
        t = _table(np, x, y, k)
        if t.shape[1] < 2:
            return 0.0
        return float(stats.contingency.association(t, method="cramer"))

    low, high, why = _interval(
        (codes_b, codes_a), cramer, vectorized=False, resamples=_RESAMPLES_CATEGORIES, seed=seed
    )
    return v, low, high, _finite(chi2.statistic), _finite(chi2.pvalue), why


def adjust(p_values: Sequence[float | None], correction: Correction) -> list[float | None]:
    """The p values adjusted for their multiplicity (``None`` stays ``None``, and is not
    counted): Holm's step-down, Benjamini-Hochberg (scipy), or as they are."""
    known = [(i, p) for i, p in enumerate(p_values) if p is not None]
    out: list[float | None] = [None] * len(p_values)
    if not known:
        return out
    if correction == "none":
        for i, p in known:
            out[i] = p
    elif correction == "bh":
        _, stats = _scipy()
        adjusted = stats.false_discovery_control([p for _, p in known], method="bh")
        for (i, _), q in zip(known, adjusted, strict=True):
            out[i] = _finite(q)
    else:
        m, running = len(known), 0.0
        for rank, (i, p) in enumerate(sorted(known, key=lambda item: item[1])):
            running = max(running, min(1.0, (m - rank) * p))
            out[i] = _finite(running)
    return out


def compare_samples(
    label: str,
    tick: int,
    names: tuple[str, str],
    samples: tuple[Sequence[Cell], Sequence[Cell]],
    level: str | None,
    test: Test,
    unit: str,
    seed: int = 0,
) -> Comparison:
    """One comparison of ``samples`` (``a``, ``b``: raw cells, coded with ``level`` as
    ``FIELD=VALUE`` codes them) by ``test`` (``auto``: welch on numbers, else chi2).

    Raises:
        InputError: a numeric test on values that are not numbers.
    """
    a_name, b_name = names
    a, b = samples
    num_a, num_b = _numbers(a, level), _numbers(b, level)
    numeric = num_a is not None and num_b is not None
    chosen: Test = test if test != "auto" else ("welch" if numeric else "chi2")
    if chosen == "chi2":
        cats_a = [str(code(v, level)) if level else _category(v) for v in a]
        cats_b = [str(code(v, level)) if level else _category(v) for v in b]
        v, low, high, stat, p, note = _categories(cats_a, cats_b, seed)
        return Comparison(
            label, tick, a_name, b_name, "chi2", "answer", len(a), len(b),
            v, "cramer_v", low, high, stat, p, None, v, "cramer_v", note,
        )  # fmt: skip
    if num_a is None or num_b is None:
        raise InputError(
            None,
            "--test",
            f"{chosen} needs numbers, and {label} holds other values: "
            "use --test chi2, or FIELD=VALUE for the share holding VALUE",
        )
    estimate, low, high, stat, p, note = _numeric(chosen, num_a, num_b, seed)
    return Comparison(
        label, tick, a_name, b_name, chosen, unit, len(num_a), len(num_b),
        estimate, "difference_of_means", low, high, stat, p, None,
        cohen_d(num_a, num_b), "cohen_d", note,
    )  # fmt: skip


def _run_means(values: Sequence[Cell], level: str | None) -> Cell:
    numbers = _numbers(values, level)
    if numbers is None or not numbers:
        return None
    return sum(numbers) / len(numbers)


def compare_study(
    out: Path,
    fields: Sequence[str] = (),
    *,
    ticks: Sequence[int] = (),
    test: Test = "auto",
    unit: Unit = "run",
    correction: Correction = "holm",
    reference: Path | None = None,
    seed: int = 0,
) -> CompareResult:
    """Compare the arms of the study in ``out`` (each condition against the first) on each
    of ``fields`` (default: the first survey, else the first numeric state field) at each
    of ``ticks`` (default: every tick the field holds) — or, given ``reference``, each
    condition against the reference file's rows at their field and tick.

    Raises:
        InputError: not a study, an unknown field, a numeric test on categories, a
            malformed reference (file, line, column), or a reference tick the study lacks.
        MissingExtra: scipy is not installed.
    """
    _scipy()
    design = study_design(out)
    tables = build_study_tables(out)
    if not tables.runs:
        raise InputError(out, None, "no run of this study has begun: run sim study run first")
    result = CompareResult(correction, [], notes=list(tables.notes))
    conditions = [c for c in tables.conditions if any(r.startswith(c + "/") for r in tables.runs)]
    if reference is not None:
        rows = read_reference(reference)
        specs: dict[str, list[ReferenceRow]] = {}
        for row in rows:
            specs.setdefault(row.field, []).append(row)
        for spec, refs in specs.items():
            try:
                measured = _field(tables, design, spec)
            except InputError as exc:
                raise InputError(
                    reference, f"line {refs[0].line}, column 1 (field)", exc.problem
                ) from None
            by_tick: dict[int, list[ReferenceRow]] = {}
            for row in refs:
                by_tick.setdefault(row.tick, []).append(row)
            held = sorted({k[2] for k in measured.values})
            for tick, group in sorted(by_tick.items()):
                if ticks and tick not in ticks:
                    continue
                if tick not in held:
                    raise InputError(
                        reference,
                        f"line {group[0].line}, column 2 (tick)",
                        f"the study holds no {measured.label} at tick {tick} "
                        f"(ticks: {', '.join(map(str, held))})",
                    )
                real: list[Cell] = [r.value for r in group]
                for cond in conditions:
                    simulated = [
                        v for (c, _, t), vs in measured.values.items() if c == cond and t == tick
                        for v in vs
                    ]  # fmt: skip
                    if simulated:
                        result.comparisons.append(
                            compare_samples(
                                measured.label,
                                tick,
                                ("reference", cond),
                                (real, simulated),
                                measured.level,
                                test,
                                "answer",
                                seed,
                            )
                        )
    else:
        if len(conditions) < 2:
            raise InputError(
                out, None, "one condition has runs: nothing to compare (or use --reference)"
            )
        chosen = list(fields) or [_default_field(tables, design)]
        control = conditions[0]
        for spec in chosen:
            measured = _field(tables, design, spec)
            held = sorted({k[2] for k in measured.values})
            for tick in [t for t in held if not ticks or t in ticks]:
                for cond in conditions[1:]:
                    sides = [
                        [
                            vs
                            for (c, _, t), vs in sorted(measured.values.items())
                            if c == side and t == tick
                        ]
                        for side in (control, cond)
                    ]
                    means = [[_run_means(vs, measured.level) for vs in runs] for runs in sides]
                    level: str | None = measured.level
                    if unit == "run" and test != "chi2" and None not in means[0] + means[1]:
                        # each run's mean over its characters, already coded: no level
                        pair: list[list[Cell]] = [list(m) for m in means]
                        level = None
                    else:
                        pair = [[v for vs in runs for v in vs] for runs in sides]
                    result.comparisons.append(
                        compare_samples(
                            measured.label,
                            tick,
                            (control, cond),
                            (pair[0], pair[1]),
                            level,
                            test,
                            unit,
                            seed,
                        )
                    )
    if not result.comparisons:
        raise InputError(None, "--tick", "no comparison: no tick holds values on both sides")
    adjusted = adjust([c.p_value for c in result.comparisons], correction)
    result.comparisons = [
        Comparison(**{**c.__dict__, "p_adjusted": q})
        for c, q in zip(result.comparisons, adjusted, strict=True)
    ]
    return result


def _default_field(tables: StudyTables, design: dict[str, Any]) -> str:
    if design.get("surveys"):
        return "survey"
    for column in tables.tables["characters"].columns:
        if column.startswith(STATE_PREFIX) and any(
            isinstance(r.get(column), int | float) and not isinstance(r.get(column), bool)
            for r in tables.tables["characters"].rows
        ):
            return column
    raise InputError(None, "--field", "no survey and no numeric state field: name one")


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    if signed:
        return f"{value:+.3f}"
    return f"{value:.3g}" if abs(value) < 0.001 and value != 0 else f"{value:.3f}"


def compare_lines(result: CompareResult) -> list[str]:
    """The comparisons as text: one line each, then what the columns mean."""
    lines = [
        f"{'field':<28} {'tick':>4} {'b - a':<24} {'test':<11} {'n_a':>4} {'n_b':>4} "
        f"{'estimate':>9}  {'95% bootstrap':<18} {'p':>7} {'p_adj':>7} effect"
    ]
    for c in result.comparisons:
        label = c.field if len(c.field) <= 28 else c.field[:27] + "…"
        pair = f"{c.b} vs {c.a}"
        ci = f"[{_fmt(c.ci_low)}, {_fmt(c.ci_high)}]" if c.ci_low is not None else ""
        effect = f"{c.effect_size}={_fmt(c.effect)}" if c.effect is not None else ""
        lines.append(
            f"{label:<28} {c.tick:>4} {pair:<24} {c.test:<11} {c.n_a:>4} {c.n_b:>4} "
            f"{_fmt(c.estimate, c.estimate_of == 'difference_of_means'):>9}  {ci:<18} "
            f"{_fmt(c.p_value):>7} {_fmt(c.p_adjusted):>7} {effect}"
            + (f"  ({c.note})" if c.note else "")
        )
    lines.append("")
    lines.append(
        "estimate: the difference of means b - a (welch, mannwhitney, ks) or Cramér's V (chi2); "
        f"p_adj: {_CORRECTION_NAMES[result.correction]} over the {len(result.comparisons)} "
        "comparisons"
    )
    return lines


_CORRECTION_NAMES = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no correction"}


__all__ = [
    "CORRECTIONS",
    "REFERENCE_COLUMNS",
    "TESTS",
    "UNITS",
    "CompareResult",
    "Comparison",
    "ReferenceRow",
    "adjust",
    "cohen_d",
    "compare_lines",
    "compare_samples",
    "compare_study",
    "read_reference",
]
