"""Full ``sim tick`` runs of a copy of the demo world through real HTTP: the openai and chat
providers against the stub server, with injected faults, budgets and bad keys."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import tree

from sim.cli import main
from sim.storage import Storage
from sim.testing.stub_server import StubServer

FAST = """
[llm]
timeout_seconds = 0.5
backoff_base_seconds = 0.01
backoff_cap_seconds = 0.05
max_failed_fraction = {fraction}
chain_mode = "{chain_mode}"

[phase1]
mode = "{mode}"
fallback_models = ["backup-model"]
"""


def configure(
    world: Path,
    *,
    fraction: float = 0.25,
    chain_mode: str = "window",
    mode: str = "schema",
    extra: str = "",
) -> Path:
    (world / "config.toml").write_text(
        FAST.format(fraction=fraction, chain_mode=chain_mode, mode=mode) + extra
    )
    return world


def tick(world: Path, *args: str, env: dict[str, Any] | None = None) -> Result:
    return CliRunner().invoke(
        main,
        ["tick", "--world", str(world), *args],
        env={"OPENAI_API_KEY": "sk-test", **(env or {})},
        catch_exceptions=False,
    )


def summary(output: str) -> dict[str, list[int]]:
    rows = {}
    for line in output.splitlines():
        match = re.match(r"^(intentions|resolution|narrative|memory|total)\s+([\d\s]+)", line)
        if match:
            rows[match.group(1)] = [int(n) for n in match.group(2).split()]
    return rows


@pytest.mark.parametrize(("provider", "ticks"), [("openai", 2), ("chat", 1)])
def test_tick_with_20_percent_faults_completes(
    demo_world: Path, stub_server: StubServer, provider: str, ticks: int
) -> None:
    # a 6-call phase can lose 2 calls to random non-retryable faults (refusal, incomplete):
    # allow that here; the abort itself is tested below
    configure(demo_world, fraction=0.5)
    stub_server.options.fault_rate = 0.2
    result = tick(
        demo_world,
        "--provider",
        provider,
        "--base-url",
        stub_server.base_url,
        "--ticks",
        str(ticks),
    )
    assert result.exit_code == 0, result.output
    assert f"== tick {ticks} ==" in result.output
    assert sum(stub_server.stats.faults.values()) > 0
    # every failure is in the summary, with its entity's fallback
    for section in result.output.split("== tick ")[1:]:
        fallbacks = [line for line in section.splitlines() if line.startswith("fallback:")]
        rows = summary(section)
        assert rows["total"][1] == len(fallbacks)
        assert sum(row[1] for name, row in rows.items() if name != "total") == len(fallbacks)
    # the world on disk is valid and at the new tick
    world = Storage(demo_world).load()
    assert world.tick == ticks


def test_tick_with_budget_stops_and_commits_nothing(
    demo_world: Path, stub_server: StubServer
) -> None:
    configure(demo_world)
    before = tree(demo_world)
    result = tick(
        demo_world,
        "--provider",
        "openai",
        "--base-url",
        stub_server.base_url,
        "--budget-tokens",
        "3000",
    )
    assert result.exit_code == 1, result.output
    assert "spent" in result.output and "nothing was committed" in result.output
    assert tree(demo_world) == before


def test_budget_usd_flag_needs_prices(demo_world: Path, stub_server: StubServer) -> None:
    configure(demo_world)
    before = tree(demo_world)
    result = tick(
        demo_world,
        "--provider",
        "openai",
        "--base-url",
        stub_server.base_url,
        "--model",
        "unpriced-model",
        "--budget-usd",
        "1",
    )
    assert result.exit_code == 2, result.output
    assert "prices" in result.output
    assert tree(demo_world) == before


def test_missing_key_exits_2_naming_the_variable(demo_world: Path) -> None:
    before = tree(demo_world)
    result = CliRunner().invoke(
        main,
        ["tick", "--world", str(demo_world), "--provider", "openai"],
        env={"OPENAI_API_KEY": None},
        catch_exceptions=False,
    )
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in result.output
    assert tree(demo_world) == before


def test_rejected_key_aborts_the_tick(demo_world: Path, stub_server: StubServer) -> None:
    configure(demo_world)
    before = tree(demo_world)
    stub_server.model_faults["gpt-4.1-mini"] = "auth"
    result = tick(
        demo_world,
        "--provider",
        "openai",
        "--base-url",
        stub_server.base_url,
        env={"OPENAI_API_KEY": "sk-secret-value"},
    )
    assert result.exit_code == 2, result.output
    assert "OPENAI_API_KEY" in result.output and "sk-secret-value" not in result.output
    assert tree(demo_world) == before


def test_too_many_failures_abort_uncommitted(demo_world: Path, stub_server: StubServer) -> None:
    configure(demo_world)
    before = tree(demo_world)
    stub_server.options.fault_rate = 1.0
    stub_server.options.faults = ("server_error",)
    result = tick(demo_world, "--provider", "chat", "--base-url", stub_server.base_url)
    assert result.exit_code == 1, result.output
    assert "max_failed_fraction" in result.output and "intentions" in result.output
    assert tree(demo_world) == before


def test_fallback_model_is_reported(demo_world: Path, stub_server: StubServer) -> None:
    extra = "".join(
        f'\n[{s}]\nfallback_models = ["backup-model"]\n' for s in ("phase2a", "phase2b", "phase4")
    )
    configure(demo_world, extra=extra)
    stub_server.model_faults["gpt-4.1-mini"] = "server_error"
    result = tick(demo_world, "--provider", "openai", "--base-url", stub_server.base_url)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("fallback model:")]
    assert len(lines) == stub_server.stats.models["backup-model"] >= 10
    assert "openai/gpt-4.1-mini -> openai/backup-model" in lines[0]
    # the primary's breaker opened after 5 consecutive 5xx: the later phases skip it
    # (without a breaker: 3 attempts x every call, 30+). Bound: the 10 first attempts, all
    # in flight at once, plus one retry for each of the 4 failures before the breaker
    # opened whose jittered backoff (unseeded, in [0, 0.5 s]) fired before it did
    assert stub_server.stats.models["gpt-4.1-mini"] <= 10 + 4


def test_model_flag_and_server_chains(demo_world: Path, stub_server: StubServer) -> None:
    configure(demo_world, chain_mode="server")
    result = tick(
        demo_world,
        "--provider",
        "openai",
        "--base-url",
        stub_server.base_url,
        "--model",
        "custom-model",
        "--ticks",
        "3",
    )
    assert result.exit_code == 0, result.output
    assert set(stub_server.stats.models) == {"custom-model"}
    # resolution chains at depth 2: evicted responses deleted after commit
    assert stub_server.stats.by_route["DELETE /v1/responses"] > 0
    world = Storage(demo_world).load()
    for location in world.locations.values():
        for rid in location.get("_openai", {}).get("resolution_chain", []):
            assert rid in stub_server.responses


@pytest.mark.parametrize("provider", ["offline", "openai"])
def test_tools_mode(demo_world: Path, stub_server: StubServer, provider: str) -> None:
    configure(demo_world, mode="tools")
    stub_server.enqueue("unknown_tool")
    args = ["--provider", provider]
    if provider == "openai":
        args += ["--base-url", stub_server.base_url, "--concurrency", "1"]
    result = tick(demo_world, *args)
    assert result.exit_code == 0, result.output
    if provider == "openai":
        assert stub_server.log[0]["tool_choice"] == "required"
        assert "unknown_tool" in result.output  # ignored, fallback intention, reported
    assert Storage(demo_world).load().tick == 1


def test_out_of_quota_stops_the_run(demo_world: Path, stub_server: StubServer) -> None:
    configure(demo_world)
    before = tree(demo_world)
    stub_server.enqueue("insufficient_quota")
    result = tick(demo_world, "--provider", "openai", "--base-url", stub_server.base_url)
    assert result.exit_code == 1, result.output
    assert "out of quota" in result.output and "nothing was committed" in result.output
    assert tree(demo_world) == before
