"""The config.toml a sweep or study writes into a run's folder reads back to what it was
made from (``tomllib``), whatever the keys and values; an unset value is left out."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from sim.config import load_config, redacted
from sim.runs.fork import config_toml, toml_text


def test_a_run_config_reads_back_to_its_data() -> None:
    data = {
        "seed": 3,
        "llm": {"model": "gpt-x", "temperature": 0.5, "structured_output": None},
        "phases": {"phase.one": {"depth": 2, "weird key": 'a "quoted" \\ value\n'}},
        "memory": {"rules": [{"contains": "key", "importance": 9, "unset": None}]},
        "limits": {"ratio": math.inf, "list": [1, 2, 3], "empty": {}},
    }
    text = toml_text(data, "written by a test")
    assert text.startswith("# written by a test\n")
    back = tomllib.loads(text)
    assert back["llm"] == {"model": "gpt-x", "temperature": 0.5}  # None left out
    assert back["phases"] == data["phases"]
    assert back["memory"] == {"rules": [{"contains": "key", "importance": 9}]}
    assert back["limits"] == data["limits"]
    assert back["seed"] == 3
    assert math.isnan(tomllib.loads(toml_text({"x": {"v": math.nan}}, "h"))["x"]["v"])


def test_the_whole_config_reads_back_to_the_same_config(tmp_path: Path) -> None:
    config = load_config(cwd=tmp_path)
    (tmp_path / "config.toml").write_text(config_toml(config))
    assert redacted(load_config(cwd=tmp_path)) == redacted(config)
