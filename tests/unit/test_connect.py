"""``sim.connect.configured``: which config and settings it takes, and that it runs the
stack a tick uses (recovery, budget, books)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sim.config import Config
from sim.connect import ConfiguredAdapter, RunConfig, configured
from sim.llm.errors import LLMConfigurationError
from sim.testing.stub_server import StubServer

PROMPT = "Name a harbour town."


def make(*args: object, **kwargs: object) -> ConfiguredAdapter:
    adapter = configured(*args, **kwargs)  # type: ignore[arg-type]
    assert isinstance(adapter, ConfiguredAdapter)
    return adapter


def test_the_config_file_in_the_working_directory_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.toml").write_text('[phase2b]\nmodel = "from-cwd"\ntemperature = 0.3\n')
    monkeypatch.chdir(tmp_path)
    with make() as adapter:
        assert adapter.settings.model == "from-cwd" and adapter.settings.temperature == 0.3
    other = tmp_path / "other.toml"
    other.write_text('[phase1]\nmodel = "from-file"\n')
    with make(other, phase="intentions") as adapter:
        assert adapter.settings.model == "from-file"


def test_overrides_set_the_phase_and_llm(tmp_path: Path) -> None:
    with make(Config(), phase="memory", model="m", fallback_models=["n"], timeout_seconds=7) as a:
        assert a.settings.model == "m" and a.config.phase4.model == "m"
        assert [str(t) for t in a.settings.fallback_models] == ["offline/n"]
        assert a.config.llm.timeout_seconds == 7 and a.phase == "memory"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nonsense": 1}, "unknown setting"),
        ({"temperature": 5}, r"configured\(\): phase2b.temperature"),
        ({"phase": "nope"}, "no phase named 'nope'"),
        ({"provider": "carrier-pigeon"}, "unknown provider"),
        ({"seed": "x"}, "seed must be an integer"),
    ],
)
def test_bad_settings_are_configuration_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LLMConfigurationError, match=message):
        configured(Config(), **kwargs)


def test_a_file_with_a_problem_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[llm]\nmax_concurrency = 0\n")
    with pytest.raises(LLMConfigurationError, match=r"bad\.toml"):
        configured(bad)


def test_every_attempt_is_in_the_books_and_the_budget(
    stub_server: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUB_KEY", "sk-test")
    stub_server.enqueue("server_error", "rate_limit")  # two failed attempts, then an answer
    with make(
        provider="chat",
        base_url=stub_server.base_url,
        api_key_env="STUB_KEY",
        model="gpt-4.1-mini",
        backoff_base_seconds=0.0,
    ) as adapter:
        response = adapter.execute_prompt(PROMPT, RunConfig())
        assert response.metadata["attempts"] == 3 and response.metadata["provider"] == "chat"
        books = adapter.books
        assert books.calls == 1 and books.failures == 0
        assert books.tokens == response.usage["total_tokens"] == adapter.budget.spent_tokens
        assert books.cost.known and books.cost.usd > 0  # gpt-4.1-mini has a price
        stub_server.model_faults["gpt-4.1-mini"] = "auth"
        with pytest.raises(LLMConfigurationError):
            adapter.execute_prompt(PROMPT, RunConfig())
        assert adapter.books.calls == 2 and adapter.books.failures == 1
    assert stub_server.stats.requests >= 4


def test_an_explicit_model_name_is_used_and_resolved() -> None:
    with make(Config()) as adapter:
        assert adapter.execute_prompt(PROMPT, RunConfig()).metadata["endpoint"] == "offline"
        asked = RunConfig(model_name="offline/tiny")
        answer = adapter.execute_prompt(PROMPT, asked)
        assert answer.content
        with pytest.raises(LLMConfigurationError, match="not built with"):
            adapter.execute_prompt(PROMPT, RunConfig(model_name="anthropic/claude-haiku-4-5"))


def test_calls_from_several_threads_share_one_stack() -> None:
    with make(Config()) as adapter:
        answers: list[str] = []

        def ask(n: int) -> None:
            answers.append(adapter.execute_prompt(f"{PROMPT} {n}", RunConfig()).content)

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(answers) == 8 and adapter.books.calls == 8


def test_close_stops_the_loop_and_is_idempotent() -> None:
    adapter = make(Config())
    adapter.execute_prompt(PROMPT, RunConfig())
    adapter.close()
    adapter.close()
    assert not adapter._thread.is_alive() and adapter._loop.is_closed()
