"""A phase whose calls mostly came back unusable is not committed (issue 25): an endpoint
answering ``200 {}``, only malformed answers or only refusals leaves the world untouched
and the tick exits non-zero, naming the failures; an occasional one still falls back."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import tree

from sim.cli import main
from sim.config import Config
from sim.engine.guard import PhaseGuard
from sim.errors import RunFailed
from sim.phases.base import PhaseReport
from sim.storage import Storage
from sim.testing.stub_server import StubServer

CONFIG = """
[llm]
timeout_seconds = 5
backoff_base_seconds = 0.01
backoff_cap_seconds = 0.05
"""


@pytest.fixture
def demo(demo_world: Path) -> Path:
    (demo_world / "config.toml").write_text(CONFIG)
    return demo_world


def tick(world: Path, base_url: str, provider: str = "chat") -> Result:
    return CliRunner().invoke(
        main,
        ["tick", "--world", str(world), "--provider", provider, "--base-url", base_url],
        env={"OPENAI_API_KEY": "sk-test"},
        catch_exceptions=False,
    )


@pytest.mark.parametrize(
    ("fault", "code"),
    [("empty", "incomplete"), ("malformed", "schema_error"), ("refusal", "refusal")],
)
def test_an_endpoint_answering_only_unusable_answers_commits_nothing(
    demo: Path, stub_server: StubServer, fault: str, code: str
) -> None:
    before = tree(demo)
    stub_server.model_faults["gpt-4.1-mini"] = fault
    result = tick(demo, stub_server.base_url)
    assert result.exit_code == 1, result.output
    assert "not answering in the expected form" in result.output
    assert f"10 {code}" in result.output and "phase intentions" in result.output
    assert tree(demo) == before
    assert stub_server.stats.faults[fault] >= 10


def test_an_empty_body_on_the_responses_api_commits_nothing(
    demo: Path, stub_server: StubServer
) -> None:
    before = tree(demo)
    stub_server.model_faults["gpt-4.1-mini"] = "empty"
    result = tick(demo, stub_server.base_url, provider="openai")
    assert result.exit_code == 1, result.output
    assert "not answering in the expected form" in result.output
    assert tree(demo) == before


def test_occasional_content_failures_still_fall_back(demo: Path, stub_server: StubServer) -> None:
    stub_server.enqueue("refusal", "refusal")  # 2 of the 10 intentions
    result = tick(demo, stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert Storage(demo).load().tick == 1
    assert result.output.count("fallback:") == 2


def _report(calls: int, failures: dict[str, str]) -> PhaseReport:
    report = PhaseReport("resolution", calls=calls)
    for key, code in failures.items():
        report.errors[key] = f"{code}: bad"
    report.failures = len(failures)
    return report


def test_the_share_and_the_floor_are_configurable() -> None:
    config = Config()
    assert config.llm.max_content_failed_fraction == 0.5 and config.llm.min_content_failures == 3
    guard = PhaseGuard(0.25)
    # 2 of 2 failed: below the floor of 3
    guard.check(_report(2, {"a": "refusal", "b": "schema_error"}))
    # 3 of 6: not more than half
    guard.check(_report(6, {"a": "refusal", "b": "schema_error", "c": "incomplete"}))
    with pytest.raises(RunFailed, match=r"3 of 5 calls came back unusable \(1 incomplete, 1 "):
        guard.check(_report(5, {"a": "refusal", "b": "schema_error", "c": "incomplete"}))
    # a prompt too long and a call the policy did not send are neither rule's
    guard.check(_report(3, {"a": "context_length", "b": "policy_denied", "c": "refusal"}))
    strict = PhaseGuard(0.25, max_content_failed_fraction=0.1, min_content_failures=1)
    with pytest.raises(RunFailed, match=r"max_content_failed_fraction = 0\.1"):
        strict.check(_report(5, {"a": "refusal"}))
