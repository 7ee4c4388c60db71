"""``sim tune --memory window,retrieve``: one row per memory mode of a phase, from scratch
copies: the tokens, and what the phase's calls were shown of memory."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from conftest import tree
from test_mind import BELL, KEY, long_memory, write_config
from test_tune import invoke

ROW = re.compile(
    r"^(window|retrieve)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+([\d.]+)s\s+(\d+)"
    r"\s+([\d.]+)\s+([\d.]+)\s+(\S+)$"
)


def town(tmp_path: Path) -> Path:
    world = tmp_path / "w"
    assert invoke("init", str(world)).exit_code == 0
    long_memory(world)
    write_config(world, "k = 3")
    # the bell rings where ada is: retrieval finds the key cell, a window does not
    assert invoke("inject", "--world", str(world), "--at", "square", BELL).exit_code == 0
    return world


def test_window_and_retrieve_rows_show_tokens_and_what_was_seen(tmp_path: Path) -> None:
    world = town(tmp_path)
    before = tree(world, logs=True)
    result = invoke(
        "tune",
        "--world",
        str(world),
        "--phase",
        "intentions",
        "--memory",
        "window,retrieve",
        "--ticks",
        "1",
    )
    assert result.exit_code == 0, result.output
    assert tree(world, logs=True) == before, "the live world is never touched"
    rows = {m.group(1): m.groups() for line in result.output.splitlines() if (m := ROW.match(line))}
    assert set(rows) == {"window", "retrieve"}, result.output
    window, retrieve = rows["window"], rows["retrieve"]
    # k = 3 lines for ada, none yet for bram and cora: 1 a call, either way
    assert float(window[9]) == float(retrieve[9]) == 1.0
    # a window shows the last ticks; retrieval reaches back to tick 5 for ada
    assert float(window[10]) < 5 < float(retrieve[10])
    assert window[11] == "-"
    assert retrieve[11] == "33%"  # ada's call of the three
    assert int(window[8]) > 0 and int(retrieve[8]) > 0

    as_json = invoke(
        "tune",
        "--world",
        str(world),
        "--phase",
        "intentions",
        "--memory",
        "window,retrieve",
        "--ticks",
        "1",
        "--json",
    )
    assert as_json.exit_code == 0, as_json.output
    docs = [orjson.loads(line) for line in as_json.output.splitlines()]
    assert [d["memory"] for d in docs] == ["window", "retrieve"]
    assert docs[0]["differs"] is None and docs[1]["differs"] == 0.333
    assert docs[1]["mean_age"] > docs[0]["mean_age"]
    assert docs[0]["phase_input_tokens"] == int(window[8])


def test_what_retrieval_showed_is_the_key(tmp_path: Path) -> None:
    from sim.analysis.tune import run_memory
    from sim.config import load_config

    world = town(tmp_path)
    config = load_config(world_dir=world, cwd=world)
    row = run_memory(world, config, "intentions", "retrieve", 1)
    (shown,) = [lines for (_, key), lines in row.seen.items() if key == "intention:ada"]
    assert f"tick 5: {KEY}" in shown
    row = run_memory(world, config, "intentions", "window", 1)
    (shown,) = [lines for (_, key), lines in row.seen.items() if key == "intention:ada"]
    assert all(KEY not in line for line in shown)


def test_bad_memory_modes_are_refused(tmp_path: Path) -> None:
    world = town(tmp_path)
    bad = invoke("tune", "--world", str(world), "--phase", "intentions", "--memory", "window,all")
    assert bad.exit_code != 0 and "--memory" in bad.output
    both = invoke(
        "tune",
        "--world",
        str(world),
        "--phase",
        "intentions",
        "--memory",
        "window",
        "--depths",
        "0,1",
    )
    assert both.exit_code != 0 and "--depths" in both.output
