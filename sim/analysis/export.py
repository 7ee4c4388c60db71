"""``sim export`` and ``sim.analysis.load``: a world's history as tidy tables on disk or as
pandas DataFrames.

CSV and JSON Lines need nothing beyond sim (stdlib ``csv``, orjson); Parquet and DataFrames
need the optional ``sim[analysis]`` extra (pandas and pyarrow), and say so when it is
missing. Cells that hold a list or an object (``inventory``, ``occupants``, a custom field
holding a list) are JSON text in CSV, Parquet and DataFrames, and native JSON in JSON Lines.
An empty cell (unknown cost, no target) is empty in CSV, ``null`` in JSON Lines and
missing (``None``/``NaN``) in DataFrames.

A text cell is untrusted (names, speech and custom fields come from worlds and models),
and a spreadsheet runs a cell starting with ``=``, ``+``, ``-`` or ``@`` as a formula
(``=HYPERLINK(...)`` sends data away when clicked). CSV text cells starting with one of
those, a tab or a carriage return get a leading ``'``, as OWASP recommends ("CSV
Injection"); numbers are written as they are, so ``-3`` stays a number. ``raw=True``
(``sim export --csv-raw``) writes text exactly. JSON Lines and Parquet hold typed values,
never formulas, and are unchanged.
"""

from __future__ import annotations

import csv
import functools
import io
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import orjson

from sim.analysis.tables import Cell, Table, Tables, build_tables
from sim.errors import InputError, LogError, UserError

if TYPE_CHECKING:
    import pandas

Format = Literal["csv", "jsonl", "parquet"]
FORMATS: tuple[Format, ...] = ("csv", "jsonl", "parquet")


class MissingExtra(UserError):
    """An optional dependency is not installed: names the extra that brings it."""

    def __init__(
        self, what: str, extra: str = "analysis", needs: str = "pandas and pyarrow"
    ) -> None:
        super().__init__(
            f"{what} needs {needs}, from the optional '{extra}' extra: pip install 'sim[{extra}]'"
        )


def _pandas(what: str) -> Any:
    """The pandas module (and pyarrow, checked), or ``MissingExtra`` naming the extra."""
    try:
        import pandas
        import pyarrow  # noqa: F401 - Parquet's engine; checked here so the message is ours
    except ImportError:
        raise MissingExtra(what) from None
    return pandas


def _text(value: Cell) -> Cell:
    """A cell as a flat value: lists and objects become JSON text."""
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()
    return value


#: what makes a spreadsheet read a text cell as a formula (OWASP, "CSV Injection")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Cell, raw: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(_text(value))
    if not raw and text.startswith(FORMULA_STARTS):
        return "'" + text  # shown as text, never run
    return text


@contextmanager
def _atomic(path: Path, mode: Literal["w", "wb"]) -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path`` and rename it over ``path`` when done."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if mode == "w":
            with open(fd, "w", encoding="utf-8", newline="") as handle:
                yield handle
        else:
            with open(fd, "wb") as handle:
                yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv(table: Table, path: Path, *, raw: bool = False) -> None:
    """A table as CSV, text cells a spreadsheet would run as formulas neutralised (a
    leading ``'``) unless ``raw``. The header row is neutralised like the rows: a column
    can be named by the world (a relationship's attribute, an entity's own field)."""
    # Rows end in "\n"; the writer is told "\r\n" so that it quotes a cell holding a
    # carriage return too (it quotes only the characters of its line terminator), which
    # a reader would otherwise take for the end of the row.
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")

    def line(cells: list[str]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(cells)
        return buffer.getvalue()[:-2] + "\n"

    with _atomic(path, "w") as handle:
        handle.write(line([_csv_cell(c, raw) for c in table.columns]))
        for row in table.records():
            handle.write(line([_csv_cell(row[c], raw) for c in table.columns]))


def write_jsonl(table: Table, path: Path) -> None:
    with _atomic(path, "wb") as handle:
        for row in table.records():
            handle.write(orjson.dumps(row) + b"\n")


def frame(table: Table) -> pandas.DataFrame:
    """A table as a DataFrame (columns in order; lists and objects as JSON text; a column
    whose values mix strings with numbers as strings, so Parquet can type it)."""
    pd = _pandas("a DataFrame")
    records = table.records()
    for column in table.columns:
        kinds = {type(_text(r[column])) for r in records if r[column] is not None}
        mixed = str in kinds and len(kinds) > 1
        for r in records:
            value = _text(r[column])
            r[column] = str(value) if mixed and value is not None else value
    return pd.DataFrame.from_records(records, columns=table.columns)


def write_parquet(table: Table, path: Path) -> None:
    data = frame(table)
    with _atomic(path, "wb") as handle:
        data.to_parquet(handle, engine="pyarrow", index=False)


WRITERS: dict[Format, Callable[[Table, Path], None]] = {
    "csv": write_csv,
    "jsonl": write_jsonl,
    "parquet": write_parquet,
}


@dataclass
class Exported:
    """What ``export`` wrote: a file and a row count per table, and what it could not read."""

    files: dict[str, Path] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    ticks: list[int] = field(default_factory=list)
    problems: list[LogError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _writer(fmt: str, csv_raw: bool) -> Callable[[Table, Path], None]:
    """The writer of ``fmt`` (CSV cells exact with ``csv_raw``), checked before any work so
    that nothing is half written."""
    if fmt not in WRITERS:
        raise InputError(None, "--format", f"expected one of {', '.join(FORMATS)} (got {fmt!r})")
    if csv_raw and fmt != "csv":
        raise InputError(None, "--csv-raw", f"applies to --format csv only (got {fmt})")
    if fmt == "parquet":
        _pandas("--format parquet")
    return functools.partial(write_csv, raw=True) if csv_raw else WRITERS[fmt]


def export(
    root: Path,
    out: Path,
    fmt: Format = "csv",
    first: int | None = None,
    last: int | None = None,
    *,
    csv_raw: bool = False,
) -> Exported:
    """Write the ``characters``, ``interactions``, ``locations``, ``calls``, ``surveys``,
    ``edges`` and ``messages`` tables of a world's committed ticks ``first``..``last``
    into ``out`` (created if missing) as ``<table>.<fmt>``.

    ``csv_raw`` writes CSV text cells exactly, formulas included (see the module's note).

    Raises:
        InputError: an unknown format, a bad range, ``csv_raw`` with another format, or
            not a world folder.
        MissingExtra: Parquet without pandas and pyarrow.
    """
    write = _writer(fmt, csv_raw)
    tables = build_tables(root, first, last)
    done = Exported(ticks=tables.ticks, problems=tables.problems, notes=tables.notes)
    return _write_all(tables.all(), out, fmt, write, done)


def _write_all(
    tables: Iterable[Table],
    out: Path,
    fmt: str,
    write: Callable[[Table, Path], None],
    done: Exported,
) -> Exported:
    """Each table into ``out`` (created if missing) as ``<table>.<fmt>``, counted in ``done``."""
    if out.exists() and not out.is_dir():
        raise InputError(out, None, "exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for table in tables:
        path = out / f"{table.name}.{fmt}"
        write(table, path)
        done.files[table.name] = path
        done.rows[table.name] = len(table.rows)
    return done


@dataclass
class Frames:
    """The tables of ``sim export`` as pandas DataFrames (``sim.analysis.load``)."""

    characters: pandas.DataFrame
    interactions: pandas.DataFrame
    locations: pandas.DataFrame
    calls: pandas.DataFrame
    #: the relationships, one row per tick and tie (``nx.from_pandas_edgelist(..., "from",
    #: "to", edge_attr=True, create_using=nx.DiGraph)`` for one tick's network)
    edges: pandas.DataFrame
    #: logs that could not be read (their ticks are missing from the tables)
    problems: list[LogError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the answers of ``sim ask`` (a study's surveys): tick, character, question, answer
    surveys: pandas.DataFrame | None = None
    #: the messages delivered (``[messages]``): tick, from, to, text
    messages: pandas.DataFrame | None = None


def export_study(
    study: Path,
    out: Path,
    fmt: Format = "csv",
    first: int | None = None,
    last: int | None = None,
    *,
    csv_raw: bool = False,
) -> Exported:
    """Write a study's tables (``sim.analysis.studytables``) into ``out`` as
    ``<table>.<fmt>``: every run's rows, led by condition, seed, run and the factors.

    Raises:
        InputError: an unknown format, ``csv_raw`` with another format, not a study's
            folder; MissingExtra: as ``export``.
    """
    from sim.analysis.studytables import build_study_tables

    write = _writer(fmt, csv_raw)
    tables = build_study_tables(study, first, last)
    ticks = sorted({int(r["tick"]) for r in tables.tables["characters"].rows})
    done = Exported(ticks=ticks, problems=tables.problems, notes=tables.notes)
    return _write_all(tables.all(), out, fmt, write, done)


@dataclass
class StudyFrames:
    """A study's tables as pandas DataFrames (``sim.analysis.load_study``)."""

    characters: pandas.DataFrame
    interactions: pandas.DataFrame
    locations: pandas.DataFrame
    calls: pandas.DataFrame
    surveys: pandas.DataFrame
    #: every run's relationships, one row per tick and tie (see ``Frames.edges``)
    edges: pandas.DataFrame
    conditions: list[str] = field(default_factory=list)
    factors: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    problems: list[LogError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: every run's delivered messages (``[messages]``): tick, from, to, text
    messages: pandas.DataFrame | None = None


def load_study(study: Path | str, first: int | None = None, last: int | None = None) -> StudyFrames:
    """A study's tables as DataFrames (``sim.analysis.studytables``).

    Raises:
        MissingExtra: pandas or pyarrow is not installed; InputError: not a study's folder.
    """
    from sim.analysis.studytables import build_study_tables

    _pandas("sim.analysis.load_study")
    tables = build_study_tables(Path(study), first, last)
    t = tables.tables
    return StudyFrames(
        frame(t["characters"]),
        frame(t["interactions"]),
        frame(t["locations"]),
        frame(t["calls"]),
        frame(t["surveys"]),
        frame(t["edges"]),
        conditions=tables.conditions,
        factors=tables.factors,
        runs=tables.runs,
        problems=tables.problems,
        notes=tables.notes,
        messages=frame(t["messages"]),
    )


def load(world: Path | str, first: int | None = None, last: int | None = None) -> Frames:
    """A world's history as DataFrames: ``characters``, ``interactions``, ``locations``,
    ``calls``, ``edges`` (see ``sim.analysis.tables`` for what each row is).

    Raises:
        MissingExtra: pandas or pyarrow is not installed (``pip install 'sim[analysis]'``).
        InputError: not a world folder, or a bad tick range.
    """
    _pandas("sim.analysis.load")
    tables: Tables = build_tables(Path(world), first, last)
    return Frames(
        frame(tables.characters),
        frame(tables.interactions),
        frame(tables.locations),
        frame(tables.calls),
        frame(tables.edges),
        problems=tables.problems,
        notes=tables.notes,
        surveys=frame(tables.surveys),
        messages=frame(tables.messages),
    )


__all__ = [
    "FORMATS",
    "Exported",
    "Format",
    "Frames",
    "MissingExtra",
    "StudyFrames",
    "export",
    "export_study",
    "frame",
    "load",
    "load_study",
    "write_csv",
    "write_jsonl",
    "write_parquet",
]
