"""`--json` on check, tick, replay, report, init, schema, rewind, fork, pack and unpack: one
JSON document on stdout (JSON Lines for tick), also when the command fails."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from sim.cli import main


def run(*args: str):
    """stdout and stderr apart: a script reads only stdout."""
    return CliRunner().invoke(main, list(args))


def documents(output: str) -> list[dict]:
    lines = output.splitlines()
    assert lines, "nothing on stdout"
    return [orjson.loads(line) for line in lines]


def test_check_json(demo_world: Path) -> None:
    result = run("check", "--world", str(demo_world), "--json")
    assert result.exit_code == 0, result.output
    [doc] = documents(result.stdout)
    assert doc["command"] == "check" and doc["ok"] is True
    assert doc["tick"] == 0
    assert doc["characters"] == sorted(p.stem for p in (demo_world / "characters").iterdir())
    assert doc["provider"] == "offline"
    assert doc["interrupted_tick"] is None and doc["pending_commit"] is False


def test_check_json_reports_an_invalid_world_as_a_document(demo_world: Path) -> None:
    (demo_world / "characters" / "ada.json").write_text('{"identity": {}}')
    result = run("check", "--world", str(demo_world), "--json")
    assert result.exit_code == 2
    [doc] = documents(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2
    assert doc["error"]["type"] == "InvalidWorld"
    assert "ada.json" in doc["error"]["message"]
    assert "ada.json" in result.stderr  # the human message is still there


def test_tick_json_is_one_line_per_tick(demo_world: Path) -> None:
    result = run("tick", "--world", str(demo_world), "--ticks", "2", "--json")
    assert result.exit_code == 0, result.output
    docs = documents(result.stdout)
    assert [d["tick"] for d in docs] == [1, 2]
    for doc in docs:
        assert doc["command"] == "tick" and doc["ok"] is True
        assert doc["narratives"] and doc["calls"] > 0
        assert [p["name"] for p in doc["phases"]][:3] == ["intentions", "resolution", "narrative"]
        assert doc["usage"]["input_tokens"] > 0
    assert "JSON Lines" in run("tick", "--help").stdout


def test_tick_json_failure_is_a_document(demo_world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = run("tick", "--world", str(demo_world), "--provider", "openai", "--json")
    assert result.exit_code == 2
    [doc] = documents(result.stdout)
    assert doc == {
        "command": "tick",
        "ok": False,
        "exit_code": 2,
        "error": {"type": doc["error"]["type"], "message": doc["error"]["message"]},
    }
    assert "OPENAI_API_KEY" in doc["error"]["message"]


def test_replay_json_identical_and_drifted(demo_world: Path) -> None:
    assert run("tick", "--world", str(demo_world), "--ticks", "2").exit_code == 0
    result = run("replay", "--world", str(demo_world), "--tick", "1", "--to", "2", "--json")
    assert result.exit_code == 0, result.output
    [doc] = documents(result.stdout)
    assert doc["ok"] is True and [t["tick"] for t in doc["ticks"]] == [1, 2]
    assert all(t["identical"] and t["served"] > 0 for t in doc["ticks"])

    prompts = demo_world / "prompts"
    prompts.mkdir(exist_ok=True)
    (prompts / "narrative.md").write_text("Tell it as a ballad.\n")
    result = run("replay", "--world", str(demo_world), "--tick", "1", "--json")
    assert result.exit_code == 1
    [doc] = documents(result.stdout)  # the replay's document, not an error document as well
    assert doc["command"] == "replay" and doc["ok"] is False
    assert doc["ticks"][0]["drifts"]
    assert "instructions" in doc["ticks"][0]["drifts"][0]["fields"]


def test_report_json(demo_world: Path, tmp_path: Path) -> None:
    assert run("tick", "--world", str(demo_world)).exit_code == 0
    page = tmp_path / "page.html"
    result = run("report", "--world", str(demo_world), "--out", str(page), "--json")
    assert result.exit_code == 0, result.output
    [doc] = documents(result.stdout)
    assert doc == {
        "command": "report",
        "ok": True,
        "path": str(page),
        "ticks": 1,
        "logged": 1,
        "unreadable_logs": [],
    }
    assert page.is_file()


def test_init_schema_rewind_and_fork_print_one_json_document(tmp_path: Path) -> None:
    """Every command that reports takes --json (issue 13): the last four that did not."""
    world = tmp_path / "w"
    made = orjson.loads(run("init", str(world), "--json").stdout)
    assert made == {
        "command": "init",
        "ok": True,
        "world": str(world),
        "characters": ["ada", "bram", "cora"],
        "locations": ["inn", "square"],
        "network": None,
        "relationships": 0,
    }
    schemas = orjson.loads(run("schema", "--out", str(tmp_path / "s"), "--json").stdout)
    assert schemas["ok"] and len(schemas["paths"]) == 4
    assert all(Path(p).is_file() for p in schemas["paths"])
    assert run("tick", "--world", str(world), "--ticks", "2").exit_code == 0
    fork = orjson.loads(
        run(
            "fork", "--world", str(world), "--tick", "2", "--to", str(tmp_path / "f"), "--json"
        ).stdout
    )
    assert (fork["command"], fork["tick"], fork["next_tick"], fork["seed"]) == ("fork", 1, 2, 1)
    back = orjson.loads(run("rewind", "--world", str(world), "--tick", "2", "--json").stdout)
    assert (back["command"], back["ok"], back["tick"], back["logs_moved"]) == ("rewind", True, 1, 1)
    failed = run("init", str(world), "--json")
    assert failed.exit_code == 2
    assert orjson.loads(failed.stdout)["error"]["type"] == "InputError"


def test_pack_and_unpack_print_one_json_document_and_refuse_by_name(tmp_path: Path) -> None:
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    packed = orjson.loads(run("pack", "--world", str(world), "--json").stdout)
    assert packed == {
        "command": "pack",
        "ok": True,
        "world": str(world),
        "files": 5,
        "finished_interrupted": False,
    }
    again = run("pack", "--world", str(world), "--json")
    assert again.exit_code == 2
    error = orjson.loads(again.stdout)["error"]
    assert error["type"] == "InputError"
    assert error["message"] == f"{world / 'world.pack'}: the world is packed already"
    back = orjson.loads(run("unpack", "--world", str(world), "--json").stdout)
    assert (back["command"], back["ok"], back["files"]) == ("unpack", True, 5)
    assert sorted(p.name for p in (world / "characters").iterdir()) == [
        "ada.json",
        "bram.json",
        "cora.json",
    ]
