"""A provider offered by an installed package (the ``sim.providers`` entry-point group)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import install_distribution

from sim.cli import main
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

PLUGIN = '''
from dataclasses import replace

from sim.offline.adapter import OfflineAdapter


class CountingAdapter(OfflineAdapter):
    """The offline model under another name; its response ids say who answered and the
    timeout sim passed it (an option it declares)."""

    def __init__(self, timeout_seconds: float = 0.0) -> None:
        super().__init__(seed=7)
        self.timeout_seconds = timeout_seconds

    async def execute(self, request):
        response = await super().execute(request)
        tag = f"counting-{self.timeout_seconds:g}-{response.response_id}"
        return replace(response, response_id=tag)


class NotAnAdapter:
    pass
'''


def install(folder: Path, monkeypatch: pytest.MonkeyPatch, entries: str) -> None:
    install_distribution(folder, monkeypatch, "simtest_provider", PLUGIN, "sim.providers", entries)
    from sim.providers import _registry

    _registry.cache_clear()
    monkeypatch.setattr("sim.providers._registry", _registry)


@pytest.fixture(autouse=True)
def fresh_registry() -> object:
    from sim.providers import _registry

    _registry.cache_clear()
    yield
    _registry.cache_clear()


def test_an_installed_provider_runs_a_tick(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "counting = simtest_provider:CountingAdapter")
    config = tmp_path / "user.toml"
    config.write_text('[llm]\nprovider = "counting"\n')
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world), "--config", str(config)])
    assert result.exit_code == 0, result.output
    log = read_log(log_path(demo_world, 1))
    assert log.calls and all(not c.error for c in log.calls.values())
    # the plugin answered every call, and got the [llm] timeout it declares it takes
    assert all(c.response_id.startswith("counting-600-") for c in log.calls.values())


def test_a_provider_that_is_not_an_adapter_is_named(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "broken = simtest_provider:NotAnAdapter")
    config = tmp_path / "user.toml"
    config.write_text('[llm]\nprovider = "broken"\n')
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world), "--config", str(config)])
    assert result.exit_code != 0
    assert "simtest_provider:NotAnAdapter" in result.output
    assert "async def execute" in result.output
    assert not log_path(demo_world, 1).exists()


def test_an_unknown_provider_is_still_refused_and_a_builtin_name_cannot_be_taken(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "openai = simtest_provider:NotAnAdapter")
    from sim.providers import plugin_providers, providers

    assert "openai" in providers() and "openai" not in plugin_providers()
    config = tmp_path / "user.toml"
    config.write_text('[llm]\nprovider = "nosuch"\n')
    result = CliRunner().invoke(
        main, ["check", "--world", str(demo_world), "--config", str(config)]
    )
    assert result.exit_code == 2
    assert "unknown provider 'nosuch'" in result.output
