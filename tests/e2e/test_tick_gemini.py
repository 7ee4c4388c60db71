"""Full ``sim tick --provider gemini`` runs of a copy of the demo world through Google's SDK
against the loopback Gemini stub: faults, tools, budgets, keys, models and chain modes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import tree
from test_tick_providers import configure, summary

from sim.cli import main
from sim.storage import Storage
from sim.testing.gemini_stub import GeminiStubServer

KEY = "gemini-secret-value"


def tick(
    world: Path, stub: GeminiStubServer, *args: str, env: dict[str, Any] | None = None
) -> Result:
    return CliRunner().invoke(
        main,
        ["tick", "--world", str(world), "--provider", "gemini", "--base-url", stub.base_url, *args],
        env={"GEMINI_API_KEY": KEY, "GEMINI_MODEL": None, "OPENAI_API_KEY": None, **(env or {})},
        catch_exceptions=False,
    )


def test_tick_with_20_percent_faults_completes(
    demo_world: Path, gemini_stub: GeminiStubServer
) -> None:
    configure(demo_world, fraction=0.5)
    gemini_stub.options.fault_rate = 0.2
    result = tick(demo_world, gemini_stub, "--ticks", "2")
    assert result.exit_code == 0, result.output
    assert "== tick 2 ==" in result.output
    assert sum(gemini_stub.stats.faults.values()) > 0
    for section in result.output.split("== tick ")[1:]:
        fallbacks = [line for line in section.splitlines() if line.startswith("fallback:")]
        assert summary(section)["total"][1] == len(fallbacks)
    # phases left at the default model run on gemini-2.5-flash (GEMINI_MODEL unset); the
    # intentions phase's fallback model is used when its primary keeps failing
    assert set(gemini_stub.stats.models) <= {"gemini-2.5-flash", "backup-model"}
    assert gemini_stub.stats.models["gemini-2.5-flash"] > 0
    assert Storage(demo_world).load().tick == 2
    assert KEY not in result.output


def test_gemini_model_env_and_explicit_models(
    demo_world: Path, gemini_stub: GeminiStubServer
) -> None:
    configure(demo_world, extra='\n[phase2b]\nmodel = "gemini-2.5-pro"\n')
    result = tick(demo_world, gemini_stub, env={"GEMINI_MODEL": "gemini-2.5-flash-lite"})
    assert result.exit_code == 0, result.output
    # the narrative phase chose its model; every other phase takes $GEMINI_MODEL
    assert set(gemini_stub.stats.models) == {"gemini-2.5-flash-lite", "gemini-2.5-pro"}


def test_model_flag_wins(demo_world: Path, gemini_stub: GeminiStubServer) -> None:
    configure(demo_world)
    result = tick(
        demo_world, gemini_stub, "--model", "gemini-custom", env={"GEMINI_MODEL": "ignored"}
    )
    assert result.exit_code == 0, result.output
    assert set(gemini_stub.stats.models) == {"gemini-custom"}


def test_window_chain_is_sent_as_contents(demo_world: Path, gemini_stub: GeminiStubServer) -> None:
    configure(demo_world)  # resolution keeps a window of depth 2 by default
    result = tick(demo_world, gemini_stub, "--ticks", "3")
    assert result.exit_code == 0, result.output
    roles = [[c["role"] for c in body["contents"]] for body in gemini_stub.log]
    # by tick 3 some resolution call carries two earlier exchanges as user/model turns
    assert ["user", "model", "user", "model", "user"] in roles
    assert all(r[-1] == "user" and len(r) % 2 == 1 for r in roles)


def test_tools_mode(demo_world: Path, gemini_stub: GeminiStubServer) -> None:
    configure(demo_world, mode="tools")
    gemini_stub.enqueue("unknown_tool")
    result = tick(demo_world, gemini_stub, "--concurrency", "1")
    assert result.exit_code == 0, result.output
    first = gemini_stub.log[0]
    assert first["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"
    assert "unknown_tool" in result.output  # ignored, fallback intention, reported
    assert Storage(demo_world).load().tick == 1


def test_budget_stops_and_commits_nothing(demo_world: Path, gemini_stub: GeminiStubServer) -> None:
    configure(demo_world)
    before = tree(demo_world)
    result = tick(demo_world, gemini_stub, "--budget-tokens", "3000")
    assert result.exit_code == 1, result.output
    assert "spent" in result.output and "nothing was committed" in result.output
    assert tree(demo_world) == before


def test_budget_usd_uses_gemini_prices(demo_world: Path, gemini_stub: GeminiStubServer) -> None:
    configure(demo_world)
    result = tick(demo_world, gemini_stub, "--budget-usd", "5")
    assert result.exit_code == 0, result.output  # gemini-2.5-flash is priced: no config error


def test_missing_key_exits_2_naming_the_variable(demo_world: Path) -> None:
    before = tree(demo_world)
    result = CliRunner().invoke(
        main,
        ["tick", "--world", str(demo_world), "--provider", "gemini"],
        env={"GEMINI_API_KEY": None, "OPENAI_API_KEY": "sk-not-for-gemini"},
        catch_exceptions=False,
    )
    assert result.exit_code == 2, result.output
    assert "GEMINI_API_KEY" in result.output
    assert tree(demo_world) == before


def test_rejected_key_aborts_the_tick(demo_world: Path, gemini_stub: GeminiStubServer) -> None:
    configure(demo_world)
    before = tree(demo_world)
    gemini_stub.model_faults["gemini-2.5-flash"] = "auth"
    result = tick(demo_world, gemini_stub)
    assert result.exit_code == 2, result.output
    assert "GEMINI_API_KEY" in result.output and KEY not in result.output
    assert tree(demo_world) == before


@pytest.mark.parametrize("where", ["world", "flag"])
def test_server_chains_are_a_config_error(
    demo_world: Path, gemini_stub: GeminiStubServer, where: str
) -> None:
    if where == "world":
        (demo_world / "config.toml").write_text(
            '[llm]\nprovider = "gemini"\nchain_mode = "server"\n'
        )
        before = tree(demo_world)
        result = CliRunner().invoke(
            main,
            ["tick", "--world", str(demo_world)],
            env={"GEMINI_API_KEY": KEY},
            catch_exceptions=False,
        )
    else:  # the world's config asks for server chains, the flag for gemini
        configure(demo_world, chain_mode="server")
        before = tree(demo_world)
        result = tick(demo_world, gemini_stub)
    assert result.exit_code == 2, result.output
    assert "llm.chain_mode" in result.output and "gemini" in result.output
    assert gemini_stub.stats.requests == 0
    assert tree(demo_world) == before


def test_the_documented_snippet_works(
    demo_world: Path, gemini_stub: GeminiStubServer, tmp_path: Path
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "providers.md").read_text()
    section = doc.split("### Gemini (native", 1)[1]
    snippet = section.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "gemini.toml").write_text(snippet)
    result = CliRunner().invoke(
        main,
        [
            "tick",
            "--world",
            str(demo_world),
            "--config",
            str(tmp_path / "gemini.toml"),
            "--base-url",
            gemini_stub.base_url,
            # the free-tier pacing lifted by the user (a world's config may not loosen a
            # limit the user's sets), so the test does not wait a minute for it
            "--set",
            "llm.requests_per_minute=0",
        ],
        env={"GEMINI_API_KEY": KEY, "GEMINI_MODEL": None},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert set(gemini_stub.stats.models) == {"gemini-2.5-flash", "gemini-2.5-pro"}


def test_gemini_ticks_replay_identically_and_are_priced(
    demo_world: Path, gemini_stub: GeminiStubServer
) -> None:
    # replay compares with the world's config: the provider (and so the model) lives there
    configure(demo_world)
    text = (demo_world / "config.toml").read_text()
    (demo_world / "config.toml").write_text(text.replace("[llm]\n", '[llm]\nprovider = "gemini"\n'))
    assert tick(demo_world, gemini_stub, "--ticks", "2").exit_code == 0
    sent = gemini_stub.stats.requests
    runner = CliRunner()
    replay = runner.invoke(
        main,
        ["replay", "--world", str(demo_world), "--tick", "1", "--to", "2"],
        env={"GEMINI_API_KEY": None, "GEMINI_MODEL": None},
    )
    assert replay.exit_code == 0, replay.output
    assert gemini_stub.stats.requests == sent  # answered from the logs, nothing re-sent
    usage = runner.invoke(main, ["usage", "--world", str(demo_world), "--json"])
    assert usage.exit_code == 0, usage.output
    totals = json.loads(usage.output)["total"]
    assert totals["unpriced_models"] == [] and totals["cost_usd"] > 0  # Gemini prices apply
