"""Full ``sim tick --provider anthropic`` runs of a copy of the demo world through Anthropic's
SDK against the loopback Messages API stub: faults, tools, chains, budgets, keys, prices."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import tree
from test_tick_providers import configure, summary

from sim.cli import main
from sim.storage import Storage
from sim.testing.anthropic_stub import AnthropicStubServer
from sim.testing.stub_server import RANDOM_FAULTS

KEY = "sk-ant-secret-value"
MODEL = "claude-haiku-4-5"


def tick(
    world: Path, stub: AnthropicStubServer, *args: str, env: dict[str, Any] | None = None
) -> Result:
    return CliRunner().invoke(
        main,
        [
            "tick",
            "--world",
            str(world),
            "--provider",
            "anthropic",
            "--base-url",
            stub.base_url,
            "--model",
            MODEL,
            *args,
        ],
        env={"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": None, **(env or {})},
        catch_exceptions=False,
    )


def test_tick_with_20_percent_faults_completes(
    demo_world: Path, anthropic_stub: AnthropicStubServer
) -> None:
    configure(demo_world, fraction=0.5)
    anthropic_stub.options.fault_rate = 0.2
    anthropic_stub.options.faults = (*RANDOM_FAULTS, "overloaded")
    result = tick(demo_world, anthropic_stub, "--ticks", "2")
    assert result.exit_code == 0, result.output
    assert "== tick 2 ==" in result.output
    assert sum(anthropic_stub.stats.faults.values()) > 0
    for section in result.output.split("== tick ")[1:]:
        fallbacks = [line for line in section.splitlines() if line.startswith("fallback:")]
        assert summary(section)["total"][1] == len(fallbacks)
    assert set(anthropic_stub.stats.models) <= {MODEL, "backup-model"}
    assert Storage(demo_world).load().tick == 2
    assert KEY not in result.output


def test_window_chain_is_sent_as_turns(
    demo_world: Path, anthropic_stub: AnthropicStubServer
) -> None:
    configure(demo_world)  # resolution keeps a window of depth 2 by default
    result = tick(demo_world, anthropic_stub, "--ticks", "3")
    assert result.exit_code == 0, result.output
    roles = [[m["role"] for m in body["messages"]] for body in anthropic_stub.log]
    # by tick 3 some resolution call carries two earlier exchanges as user/assistant turns
    assert ["user", "assistant", "user", "assistant", "user"] in roles
    assert all(r[-1] == "user" and len(r) % 2 == 1 for r in roles)
    assert all(body["tool_choice"]["type"] == "tool" for body in anthropic_stub.log)


def test_tools_mode(demo_world: Path, anthropic_stub: AnthropicStubServer) -> None:
    configure(demo_world, mode="tools")
    anthropic_stub.enqueue("unknown_tool")
    result = tick(demo_world, anthropic_stub, "--concurrency", "1")
    assert result.exit_code == 0, result.output
    assert anthropic_stub.log[0]["tool_choice"] == {"type": "any"}
    assert "unknown_tool" in result.output  # ignored, fallback intention, reported
    assert Storage(demo_world).load().tick == 1


def test_overloaded_primary_falls_back(
    demo_world: Path, anthropic_stub: AnthropicStubServer
) -> None:
    extra = "".join(
        f'\n[{s}]\nfallback_models = ["backup-model"]\n' for s in ("phase2a", "phase2b", "phase4")
    )
    configure(demo_world, extra=extra)
    anthropic_stub.model_faults[MODEL] = "overloaded"
    result = tick(demo_world, anthropic_stub)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("fallback model:")]
    assert len(lines) == anthropic_stub.stats.models["backup-model"] >= 10
    assert f"anthropic/{MODEL} -> anthropic/backup-model" in lines[0]
    # 529s count for the breaker like 5xx: after 5 in a row the later phases skip the
    # primary (bound as in test_tick_providers: the 10 first attempts, all in flight at
    # once, plus a retry for each of the 4 failures before the breaker opened)
    assert anthropic_stub.stats.faults["overloaded"] == anthropic_stub.stats.models[MODEL]
    assert 10 <= anthropic_stub.stats.models[MODEL] <= 10 + 4


def test_budget_stops_and_commits_nothing(
    demo_world: Path, anthropic_stub: AnthropicStubServer
) -> None:
    configure(demo_world)
    before = tree(demo_world)
    result = tick(demo_world, anthropic_stub, "--budget-tokens", "3000")
    assert result.exit_code == 1, result.output
    assert "spent" in result.output and "nothing was committed" in result.output
    assert tree(demo_world) == before


def test_out_of_credit_stops_the_run(demo_world: Path, anthropic_stub: AnthropicStubServer) -> None:
    configure(demo_world)
    before = tree(demo_world)
    anthropic_stub.enqueue("insufficient_quota")
    result = tick(demo_world, anthropic_stub)
    assert result.exit_code == 1, result.output
    assert "out of credit" in result.output and "nothing was committed" in result.output
    assert tree(demo_world) == before


def test_missing_key_exits_2_naming_the_variable(demo_world: Path) -> None:
    before = tree(demo_world)
    result = CliRunner().invoke(
        main,
        ["tick", "--world", str(demo_world), "--provider", "anthropic"],
        env={"ANTHROPIC_API_KEY": None, "OPENAI_API_KEY": "sk-not-for-anthropic"},
        catch_exceptions=False,
    )
    assert result.exit_code == 2, result.output
    assert "ANTHROPIC_API_KEY" in result.output
    assert tree(demo_world) == before


def test_rejected_key_aborts_the_tick(
    demo_world: Path, anthropic_stub: AnthropicStubServer
) -> None:
    configure(demo_world)
    before = tree(demo_world)
    anthropic_stub.model_faults[MODEL] = "auth"
    result = tick(demo_world, anthropic_stub)
    assert result.exit_code == 2, result.output
    assert "ANTHROPIC_API_KEY" in result.output and KEY not in result.output
    assert tree(demo_world) == before


@pytest.mark.parametrize("where", ["world", "flag"])
def test_server_chains_are_a_config_error(
    demo_world: Path, anthropic_stub: AnthropicStubServer, where: str
) -> None:
    if where == "world":
        (demo_world / "config.toml").write_text(
            '[llm]\nprovider = "anthropic"\nchain_mode = "server"\n'
        )
        before = tree(demo_world)
        result = CliRunner().invoke(
            main,
            ["tick", "--world", str(demo_world)],
            env={"ANTHROPIC_API_KEY": KEY},
            catch_exceptions=False,
        )
    else:  # the world's config asks for server chains, the flag for anthropic
        configure(demo_world, chain_mode="server")
        before = tree(demo_world)
        result = tick(demo_world, anthropic_stub)
    assert result.exit_code == 2, result.output
    assert "llm.chain_mode" in result.output and "anthropic" in result.output
    assert anthropic_stub.stats.requests == 0
    assert tree(demo_world) == before


def test_the_documented_snippet_works(
    demo_world: Path, anthropic_stub: AnthropicStubServer, tmp_path: Path
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "providers.md").read_text()
    section = doc.split("### Anthropic (native", 1)[1]
    snippet = section.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "anthropic.toml").write_text(snippet)
    result = CliRunner().invoke(
        main,
        [
            "tick",
            "--world",
            str(demo_world),
            "--config",
            str(tmp_path / "anthropic.toml"),
            "--base-url",
            anthropic_stub.base_url,
        ],
        env={"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": None},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert set(anthropic_stub.stats.models) == {"claude-haiku-4-5", "claude-opus-4-5"}


def test_anthropic_ticks_replay_without_requests_and_are_priced(
    demo_world: Path, anthropic_stub: AnthropicStubServer
) -> None:
    # replay compares with the world's config: the provider and models live there
    configure(demo_world)
    text = (demo_world / "config.toml").read_text()
    models = "".join(f'\n[{s}]\nmodel = "{MODEL}"\n' for s in ("phase2a", "phase2b", "phase4"))
    text = text.replace("[llm]\n", '[llm]\nprovider = "anthropic"\n')
    text = text.replace("[phase1]\n", f'[phase1]\nmodel = "{MODEL}"\n') + models
    (demo_world / "config.toml").write_text(text)
    first = CliRunner().invoke(
        main,
        [
            "tick",
            "--world",
            str(demo_world),
            "--base-url",
            anthropic_stub.base_url,
            "--ticks",
            "2",
            "--trust-world-config",  # the world's config chooses the provider
        ],
        env={"ANTHROPIC_API_KEY": KEY},
        catch_exceptions=False,
    )
    assert first.exit_code == 0, first.output
    sent = anthropic_stub.stats.requests
    runner = CliRunner()
    replay = runner.invoke(
        main,
        ["replay", "--world", str(demo_world), "--tick", "1", "--to", "2"],
        env={"ANTHROPIC_API_KEY": None},
    )
    assert replay.exit_code == 0, replay.output
    assert anthropic_stub.stats.requests == sent  # answered from the logs, nothing re-sent
    usage = runner.invoke(main, ["usage", "--world", str(demo_world), "--json"])
    assert usage.exit_code == 0, usage.output
    totals = json.loads(usage.output)["total"]
    assert totals["unpriced_models"] == [] and totals["cost_usd"] > 0  # Claude prices apply
    assert totals["input_tokens"] == anthropic_stub.stats.input_tokens


def test_missing_sdk_exits_2_naming_the_extra(
    demo_world: Path, anthropic_stub: AnthropicStubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(demo_world)
    before = tree(demo_world)
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic -> ImportError
    result = tick(demo_world, anthropic_stub)
    assert result.exit_code == 2, result.output
    assert "pip install 'sim[anthropic]'" in result.output
    assert anthropic_stub.stats.requests == 0
    assert tree(demo_world) == before
