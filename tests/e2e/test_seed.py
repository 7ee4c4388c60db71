"""The world's seed: ``--seed`` on ``sim tick`` and ``sim fork``, and ``seed`` in every chat
completions request (sent through the real openai SDK to the stub server)."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
from click.testing import CliRunner

from sim.cli import main
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

KEY = {"OPENAI_API_KEY": "sk-test"}


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), env=KEY)
    assert result.exit_code == 0, result.output
    return result.output


def seed_of(world: Path) -> int:
    return int(orjson.loads((world / "world.json").read_bytes())["seed"])


def test_chat_requests_carry_the_world_seed(tmp_path: Path, stub_server: StubServer) -> None:
    world = tmp_path / "w"
    invoke("init", str(world))
    chat = ["--provider", "chat", "--base-url", stub_server.base_url]
    invoke("tick", "--world", str(world), *chat)
    bodies = list(stub_server.log)
    assert bodies and {body.get("seed") for body in bodies} == {seed_of(world)}

    stub_server.log.clear()
    invoke("tick", "--world", str(world), *chat, "--seed", "7")
    assert {body.get("seed") for body in stub_server.log} == {7}
    assert seed_of(world) == 7  # kept for later ticks
    assert read_log(log_path(world, 2)).header.seed == 7
    # the seed was set before the tick: its logged state and its replay agree
    assert '"identical":true' in invoke("replay", "--world", str(world), "--tick", "2", "--json")


def test_offline_ticks_follow_the_seed(tmp_path: Path) -> None:
    invoke("init", str(tmp_path / "w"))
    worlds = [tmp_path / name for name in ("a", "b", "c")]
    for world, seed in zip(worlds, ("3", "3", "4"), strict=True):
        shutil.copytree(tmp_path / "w", world)
        invoke("tick", "--world", str(world), "--seed", seed)
    texts = [(w / "characters" / "ada.json").read_bytes() for w in worlds]
    logs = [read_log(log_path(w, 1)).phase_results("intentions") for w in worlds]
    assert texts[0] == texts[1] and logs[0] == logs[1]
    assert logs[0] != logs[2]


def test_fork_takes_a_seed(tmp_path: Path) -> None:
    world = tmp_path / "w"
    invoke("init", str(world))
    invoke("tick", "--world", str(world))
    invoke("fork", "--world", str(world), "--tick", "1", "--to", str(tmp_path / "f"), "--seed", "9")
    invoke("fork", "--world", str(world), "--tick", "1", "--to", str(tmp_path / "g"))
    assert seed_of(tmp_path / "f") == 9 and seed_of(tmp_path / "g") == seed_of(world) != 9
