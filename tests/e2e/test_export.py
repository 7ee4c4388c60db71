"""`sim export` and `sim.analysis.load`: tidy tables from the tick logs, through the CLI."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import copy_demo

from sim.cli import main
from sim.testing.stub_server import StubServer
from sim.ticklog.books import tick_books
from sim.ticklog.format import log_path, unpack_state
from sim.ticklog.reader import read_log, read_logs

TICKS = 3


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def add_custom_state(world: Path) -> None:
    """Give every character custom state: a number, a nested object, a list; one odd type."""
    for n, path in enumerate(sorted((world / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["state"]["health"] = "full" if n == 0 else 10 - n
        data["state"]["relations"] = {"trust": {"ada": n}, "rival": "pell"}
        data["state"]["flags"] = ["a", n]
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world with custom state, after TICKS offline ticks (read-only)."""
    root = copy_demo(tmp_path_factory.mktemp("export") / "demo")
    add_custom_state(root)
    result = invoke("tick", "--world", str(root), "--ticks", str(TICKS))
    assert result.exit_code == 0, result.output
    return root


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def characters_of(world: Path) -> list[str]:
    return sorted(p.stem for p in (world / "characters").glob("*.json"))


def test_csv_tables_have_a_row_per_tick_and_character(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    result = invoke("export", "--world", str(world), "--out", str(out))
    assert result.exit_code == 0, result.output
    chars = characters_of(world)
    locations = sorted(p.stem for p in (world / "locations").glob("*.json"))

    columns, rows = read_csv(out / "characters.csv")
    assert columns[:11] == [
        "tick",
        "character",
        "location",
        "mood",
        "inventory",
        "action",
        "target",
        "content",
        "reasoning",
        "outcome",
        "memory_summary",
    ]
    # every custom state field, flattened
    assert {
        "state.health",
        "state.relations.trust.ada",
        "state.relations.rival",
        "state.flags",
    } <= set(columns)
    # a tick-0 baseline row per character, then a row per tick and character
    assert len(rows) == (TICKS + 1) * len(chars)
    assert [(int(r["tick"]), r["character"]) for r in rows] == [
        (t, c) for t in range(TICKS + 1) for c in chars
    ]
    baseline, rows = rows[: len(chars)], rows[len(chars) :]
    start = unpack_state(read_log(log_path(world, 1)).state_before)  # type: ignore[arg-type]
    for row in baseline:  # the state before tick 1, and no intention or outcome
        data = orjson.loads(start[f"characters/{row['character']}.json"])
        assert (row["location"], row["mood"]) == (data["state"]["location"], data["state"]["mood"])
        assert row["state.health"] == str(data["state"]["health"])
        assert row["identity.name"] == data["identity"]["name"]
        assert row["action"] == row["outcome"] == row["content"] == ""
    # the last tick's state is the world folder's; tick 1's is tick 2's start snapshot
    for row in rows[-len(chars) :]:
        data = orjson.loads((world / "characters" / f"{row['character']}.json").read_bytes())
        assert row["location"] == data["state"]["location"]
        assert row["mood"] == data["state"]["mood"]
        assert orjson.loads(row["inventory"]) == data["state"]["inventory"]
        assert row["memory_summary"] == data["memory"]["summary"]
        assert row["state.relations.trust.ada"] == str(data["state"]["relations"]["trust"]["ada"])
    snapshot = unpack_state(read_log(log_path(world, 2)).state_before)  # type: ignore[arg-type]
    for row in rows[: len(chars)]:
        data = orjson.loads(snapshot[f"characters/{row['character']}.json"])
        assert row["location"] == data["state"]["location"]
        assert row["mood"] == data["state"]["mood"]
    # what each did, from the intentions phase
    log = read_log(log_path(world, 1))
    intentions = log.phase_results("intentions")
    for row in rows[: len(chars)]:
        said = intentions[row["character"]]
        assert (row["action"], row["content"], row["reasoning"]) == (
            said["action"],
            said["content"],
            said["reasoning"],
        )
        assert row["target"] == (said["target"] or "")
    assert all(row["outcome"] for row in rows)  # the offline resolver rules on everyone

    _, places = read_csv(out / "locations.csv")
    assert len(places) == TICKS * len(locations)
    last = [p for p in places if p["tick"] == str(TICKS)]
    occupied = {p["location"]: orjson.loads(p["occupants"]) for p in last}
    for cid in chars:
        data = orjson.loads((world / "characters" / f"{cid}.json").read_bytes())
        assert cid in occupied[data["state"]["location"]]
    narratives = read_log(log_path(world, TICKS)).phase_results("narrative")
    assert {p["location"]: p["narrative"] for p in last if p["narrative"]} == narratives


def test_interactions_list_every_speech_and_act(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    assert invoke("export", "--world", str(world), "--out", str(out)).exit_code == 0
    _, rows = read_csv(out / "interactions.csv")
    expected = []
    for log in read_logs(world)[0]:
        start = unpack_state(log.state_before)  # type: ignore[arg-type]
        for cid, said in sorted(log.phase_results("intentions").items()):
            if said["action"] in ("speak", "act"):
                where = orjson.loads(start[f"characters/{cid}.json"])["state"]["location"]
                kind = "speech" if said["action"] == "speak" else "act"
                expected.append((str(log.tick), where, cid, said["target"] or "", kind))
    assert expected, "the offline world should speak and act"
    assert [(r["tick"], r["location"], r["from"], r["to"], r["kind"]) for r in rows] == expected


def test_calls_carry_every_attempts_tokens_and_cost(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    assert invoke("export", "--world", str(world), "--out", str(out)).exit_code == 0
    columns, rows = read_csv(out / "calls.csv")
    assert columns[:11] == [
        "tick",
        "phase",
        "entity",
        "model",
        "attempts",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "cost_usd",
        "latency",
        "error",
    ]
    logs = read_logs(world)[0]
    assert len(rows) == sum(len(log.call_records) for log in logs)
    for log in logs:
        books = tick_books(log)
        mine = [r for r in rows if r["tick"] == str(log.tick)]
        assert sum(int(r["input_tokens"]) for r in mine) == books.usage.input_tokens
        assert sum(int(r["output_tokens"]) for r in mine) == books.usage.output_tokens
        assert books.cost.value is not None
        assert sum(float(r["cost_usd"]) for r in mine) == pytest.approx(books.cost.value)
    assert {r["entity"] for r in rows if r["phase"] == "intentions"} == set(characters_of(world))


def test_cost_is_empty_when_the_model_has_no_price(
    demo_world: Path, tmp_path: Path, stub_server: StubServer
) -> None:
    args = ("--provider", "chat", "--base-url", stub_server.base_url, "--model", "unpriced-model")
    ran = invoke("tick", "--world", str(demo_world), *args)
    assert ran.exit_code == 0, ran.output
    out = tmp_path / "tables"
    assert invoke("export", "--world", str(demo_world), "--out", str(out)).exit_code == 0
    _, rows = read_csv(out / "calls.csv")
    assert rows and all(r["cost_usd"] == "" and int(r["input_tokens"]) > 0 for r in rows)
    # where it ran, as `sim usage --by model` names it
    assert {r["model"] for r in rows} == {"chat/unpriced-model"}


def test_jsonl_keeps_lists_and_a_tick_window(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    result = invoke(
        "export", "--world", str(world), "--out", str(out), "--format", "jsonl", "--from", "2"
    )
    assert result.exit_code == 0, result.output
    rows = [orjson.loads(line) for line in (out / "characters.jsonl").read_bytes().splitlines()]
    assert len(rows) == (TICKS - 1) * len(characters_of(world))
    assert {r["tick"] for r in rows} == set(range(2, TICKS + 1))
    assert all(isinstance(r["inventory"], list) for r in rows)
    assert all(isinstance(r["state.flags"], list) for r in rows)
    calls = [orjson.loads(line) for line in (out / "calls.jsonl").read_bytes().splitlines()]
    assert {c["tick"] for c in calls} == set(range(2, TICKS + 1))

    only = tmp_path / "one"
    args = ["--world", str(world), "--out", str(only), "--format", "jsonl", "--json"]
    result = invoke("export", *args, "--from", "2", "--to", "2")
    report = orjson.loads(result.output)
    assert report["ticks"] == [2]
    assert report["tables"]["characters"]["rows"] == len(characters_of(world))


def test_bad_input_is_refused_without_writing(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    result = CliRunner().invoke(
        main, ["export", "--world", str(world), "--out", str(out), "--from", "3", "--to", "2"]
    )
    assert result.exit_code == 2
    assert "--from 3 is after --to 2" in result.output
    result = CliRunner().invoke(main, ["export", "--world", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2
    assert "world.json" in result.output
    assert not out.exists()


def test_parquet_without_the_extra_names_it(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    out = tmp_path / "tables"
    args = ["export", "--world", str(world), "--out", str(out), "--format", "parquet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "pip install 'sim[analysis]'" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()
    # csv needs no pandas
    assert invoke("export", "--world", str(world), "--out", str(out)).exit_code == 0
    from sim.analysis import load
    from sim.analysis.export import MissingExtra

    with pytest.raises(MissingExtra, match=r"sim\[analysis\]"):
        load(world)


def test_parquet_round_trips_to_the_same_frames(world: Path, tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas", reason="the analysis extra (pandas) is not installed")
    pytest.importorskip("pyarrow", reason="the analysis extra (pyarrow) is not installed")
    from sim.analysis import load

    out = tmp_path / "tables"
    result = invoke("export", "--world", str(world), "--out", str(out), "--format", "parquet")
    assert result.exit_code == 0, result.output
    frames = load(world)
    chars = characters_of(world)
    assert frames.characters.shape[0] == (TICKS + 1) * len(chars)
    for name in ("characters", "interactions", "locations", "calls", "edges"):
        back = pd.read_parquet(out / f"{name}.parquet")
        mine = getattr(frames, name)
        assert list(back.columns) == list(mine.columns)
        pd.testing.assert_frame_equal(back, mine, check_dtype=False)
    # a column mixing a string with numbers is typed as strings, not refused
    assert set(frames.characters["state.health"]) >= {"full", "9"}
    # csv and DataFrames agree
    assert invoke("export", "--world", str(world), "--out", str(out)).exit_code == 0
    _, rows = read_csv(out / "characters.csv")
    assert list(frames.characters["mood"]) == [r["mood"] for r in rows]
