"""Retrieval, reflection and time over real HTTP: the openai, chat, gemini and anthropic
providers against their stub servers (the offline provider: tests/e2e/test_mind.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import WORLDS

from sim.cli import main
from sim.sections import loads as read_sections
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

#: worlds/minds' config without its [llm] provider (the command line chooses it)
MIND = """
[time]
start = "1340-05-01T06:00"
tick = "1h"

[tick]
phases = ["intentions", "resolution", "narrative", "apply", "reflection", "memory"]

[memory]
mode = "retrieve"
k = 3

[reflection]
threshold = 8
"""


def read_input(text: str) -> dict[str, Any]:
    """A call's input as its phase wrote it (labelled sections, or JSON)."""
    doc = read_sections(text)
    assert doc is not None, text
    return doc


def minds(tmp_path: Path) -> Path:
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world, ignore=shutil.ignore_patterns(".sim"))
    (world / "config.toml").write_text(MIND)
    return world


def run_ticks(world: Path, provider: str, base_url: str, env: dict[str, Any]) -> None:
    args = ["tick", "--world", str(world), "--provider", provider, "--base-url", base_url]
    if provider == "anthropic":
        args += ["--model", "claude-haiku-4-5"]
    result = CliRunner().invoke(main, [*args, "--ticks", "3"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output


def check(world: Path) -> None:
    calls = [c for t in (1, 2, 3) for c in read_log(log_path(world, t)).calls.values()]
    assert any(c.phase == "reflection" for c in calls)
    intention = next(c for c in calls if c.phase == "intentions")
    doc = read_input(intention.input)
    assert "recall" in doc["memory"] and doc["world"]["time"]["date"] == "1340-05-01"
    for path in (world / "characters").glob("*.json"):
        cells = orjson.loads(path.read_bytes())["memory"]["cells"]
        # every cell a tick wrote is rated (the world's own tick-0 cells may not be)
        assert all(1 <= c["importance"] <= 10 for c in cells if c["tick"] > 0)


@pytest.mark.parametrize("provider", ["openai", "chat"])
def test_openai_wire(tmp_path: Path, stub_server: Any, provider: str) -> None:
    world = minds(tmp_path)
    run_ticks(world, provider, stub_server.base_url, {"OPENAI_API_KEY": "sk-test"})
    check(world)


def test_gemini(tmp_path: Path, gemini_stub: Any) -> None:
    world = minds(tmp_path)
    env = {"GEMINI_API_KEY": "gemini-test", "GEMINI_MODEL": None, "OPENAI_API_KEY": None}
    run_ticks(world, "gemini", gemini_stub.base_url, env)
    check(world)


def test_anthropic(tmp_path: Path, anthropic_stub: Any) -> None:
    world = minds(tmp_path)
    env = {"ANTHROPIC_API_KEY": "sk-ant-test", "OPENAI_API_KEY": None}
    run_ticks(world, "anthropic", anthropic_stub.base_url, env)
    check(world)


#: retrieval and reflection scored with the provider's embeddings, where it has them
EMBEDDINGS = '\nembeddings = "provider"\nembedding_model = "{model}"\n'


@pytest.mark.parametrize("provider", ["openai", "chat", "gemini"])
def test_provider_embeddings(
    tmp_path: Path, stub_server: Any, gemini_stub: Any, provider: str
) -> None:
    """The providers with embeddings (``[memory] embeddings = "provider"``): three ticks
    of retrieval and reflection fetch the vectors from the provider's stub once per text
    and keep them in the world's cache."""
    world = minds(tmp_path)
    model = "gemini-embedding-001" if provider == "gemini" else "text-embedding-3-small"
    config = MIND.replace("k = 3\n", "k = 3" + EMBEDDINGS.format(model=model))
    (world / "config.toml").write_text(config)
    if provider == "gemini":
        stub = gemini_stub
        env = {"GEMINI_API_KEY": "gemini-test", "GEMINI_MODEL": None, "OPENAI_API_KEY": None}
    else:
        stub, env = stub_server, {"OPENAI_API_KEY": "sk-test"}
    run_ticks(world, provider, stub.base_url, env)
    check(world)
    texts = [
        r["content"]["parts"][0]["text"] if provider == "gemini" else r
        for body in stub.embedding_log
        for r in body.get("requests", body.get("input"))
    ]
    assert texts and len(texts) == len(set(texts)), "a text was embedded twice"
    assert len(list((world / ".sim" / "embeddings").glob("*.jsonl"))) == 1
