"""A world's own config.toml may tighten the user's limits, never loosen them (issue 24,
item 2): a world's ``[budget]``, ``[prices]`` and ``[limits]`` against the user's config and
flags, through the CLI and a real server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import copy_demo

from sim.config import load_config
from sim.llm.budget import Price, cost_usd
from sim.llm.types import Usage
from sim.testing.stub_server import StubServer

#: the demo's first tick makes 22 calls: a cap this small stops it after a few
CAP = 0.001
MINI = Price(input=0.4, cached_input=0.1, output=1.6)  # gpt-4.1-mini's built-in price
FREE_MINI = '[prices."gpt-4.1-mini"]\ninput = 0.0\ncached_input = 0.0\noutput = 0.0\n'


def sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def user_config(tmp_path: Path, server: StubServer, extra: str = "") -> Path:
    path = tmp_path / "user.toml"
    path.write_text(
        f'[llm]\nprovider = "chat"\nbase_url = "{server.base_url}"\nmax_concurrency = 2\n' + extra
    )
    return path


def spent(server: StubServer) -> float:
    """What the stub's generations cost at the user's (built-in) price."""
    usage = Usage(
        input_tokens=server.stats.input_tokens,
        output_tokens=server.stats.output_tokens,
        cached_input_tokens=server.stats.cached_tokens,
    )
    return cost_usd(usage, MINI)


@pytest.mark.parametrize(
    ("user", "flags", "world"),
    [
        # the user's config caps the cost; the world says "no cap" and prices the model at 0
        (f"[budget]\nmax_cost_usd = {CAP}\n", (), "[budget]\nmax_cost_usd = 0.0\n" + FREE_MINI),
        # the user's flag caps the cost; the world prices the model at 0
        ("", ("--budget-usd", str(CAP)), FREE_MINI),
        # the user's config caps the tokens; the world lifts the cap
        ("[budget]\nmax_total_tokens = 3000\n", (), "[budget]\nmax_total_tokens = 0\n"),
    ],
    ids=["config-cap-and-free-price", "flag-cap-and-free-price", "token-cap"],
)
def test_a_tick_stops_at_the_users_budget_whatever_the_world_says(
    tmp_path: Path, stub_server: StubServer, user: str, flags: tuple[str, ...], world: str
) -> None:
    demo = copy_demo(tmp_path / "w")
    (demo / "config.toml").write_text(world)
    config = user_config(tmp_path, stub_server, user)
    result = sim("tick", "--world", str(demo), "--config", str(config), *flags, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "budget reached" in result.stderr
    assert "Traceback" not in result.stderr
    # a note names the world's file and the field it tried to loosen
    assert f"{demo / 'config.toml'}" in result.stderr
    assert "never loosen" in result.stderr or "never lower" in result.stderr
    assert 0 < stub_server.stats.generations < 22
    if "tokens" in user:
        sent = stub_server.stats.input_tokens + stub_server.stats.output_tokens
        assert sent <= 3000
    else:
        assert spent(stub_server) <= CAP
    assert orjson.loads((demo / "world.json").read_bytes())["tick"] == 0  # nothing committed


def test_a_world_cannot_raise_the_users_entity_size_limit(tmp_path: Path) -> None:
    demo = copy_demo(tmp_path / "w")
    ada = demo / "characters" / "ada.json"
    data = orjson.loads(ada.read_bytes())
    data["notes"] = "x" * 4096
    ada.write_bytes(orjson.dumps(data))
    (demo / "config.toml").write_text("[limits]\nmax_entity_bytes = 100000000\n")
    (tmp_path / "user.toml").write_text("[limits]\nmax_entity_bytes = 2048\n")
    result = sim(
        "check", "--world", str(demo), "--config", str(tmp_path / "user.toml"), cwd=tmp_path
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "characters/ada.json" in result.stderr
    assert "limits.max_entity_bytes" in result.stderr  # the note naming the world's field


def test_a_world_cannot_lift_the_users_pace(tmp_path: Path) -> None:
    world = tmp_path / "w"
    world.mkdir()
    (world / "config.toml").write_text("[llm]\nrequests_per_minute = 0\ntokens_per_minute = 9000\n")
    (tmp_path / "user.toml").write_text(
        "[llm]\nrequests_per_minute = 30\ntokens_per_minute = 500\n"
    )
    config = load_config(tmp_path / "user.toml", world)
    assert (config.llm.requests_per_minute, config.llm.tokens_per_minute) == (30, 500)
    assert load_config(None, world, cwd=tmp_path).llm.tokens_per_minute == 9000  # tightened


def test_a_world_may_tighten_every_limit(tmp_path: Path) -> None:
    world = tmp_path / "w"
    world.mkdir()
    (world / "config.toml").write_text(
        "[budget]\nmax_cost_usd = 0.5\nmax_total_tokens = 1000\n"
        "[limits]\nmax_entity_bytes = 4096\n"
        '[prices."gpt-4.1-mini"]\ninput = 1.0\ncached_input = 0.2\noutput = 3.0\n'
    )
    (tmp_path / "user.toml").write_text("[budget]\nmax_cost_usd = 2.0\n")
    config = load_config(tmp_path / "user.toml", world, trust_world_config=True)
    assert config.budget.max_cost_usd == 0.5
    assert config.budget.max_total_tokens == 1000
    assert config.limits.max_entity_bytes == 4096
    assert config.prices["gpt-4.1-mini"].output == 3.0


def test_a_world_lowering_part_of_a_price_keeps_the_users_part(tmp_path: Path) -> None:
    world = tmp_path / "w"
    world.mkdir()
    (world / "config.toml").write_text(
        '[prices."openai/gpt-4.1-mini"]\ninput = 9.0\ncached_input = 0.0\noutput = 0.0\n'
        '[prices."gpt-4.1-mini-2025-04-14"]\ninput = 0.0\noutput = 0.0\n'
    )
    config = load_config(None, world, cwd=tmp_path)
    # a provider-qualified or dated key stands in for the undated one: never below it
    qualified = config.prices["openai/gpt-4.1-mini"]
    assert (qualified.input, qualified.cached_input, qualified.output) == (9.0, 0.1, 1.6)
    dated = config.prices["gpt-4.1-mini-2025-04-14"]
    assert (dated.input, dated.cached_input, dated.output) == (0.4, 0.1, 1.6)


def test_a_world_pricing_an_unpriced_model_counts_only_without_a_cost_guard(
    tmp_path: Path,
) -> None:
    world = tmp_path / "w"
    world.mkdir()
    (world / "config.toml").write_text('[prices."my-model"]\ninput = 0.0\noutput = 0.0\n')
    assert "my-model" in load_config(None, world, cwd=tmp_path).prices
    (tmp_path / "user.toml").write_text("[policy]\napprove_above_usd = 0.5\n")
    guarded = load_config(tmp_path / "user.toml", world, trust_world_config=True)
    assert "my-model" not in guarded.prices  # it would make an unknown cost look free
    flagged = load_config(None, world, {"budget": {"max_cost_usd": 1.0}}, cwd=tmp_path)
    assert "my-model" not in flagged.prices
