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

from sim.llm.profile import ProviderProfile
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


class SeededAdapter(OfflineAdapter):
    """The offline model under another name, with a profile: it sends nothing, takes the
    world seed (which its response ids carry) and has no Batch API."""

    profile = ProviderProfile(
        kind="seeded",
        network=False,
        takes_seed=True,
        batch_api=False,
        answers_as="offline",
        constrain_refs="schema",
    )

    async def execute(self, request):
        response = await super().execute(request)
        return replace(response, response_id=f"seeded-{self.seed}-{response.response_id}")


class BadProfile(OfflineAdapter):
    profile = {"network": False}
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


def test_an_installed_provider_declares_its_profile(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facts a package's provider declares are the ones sim acts on: the profile is
    read through the registry, the adapter gets the seed it says it takes, ``sim check``
    says it sends nothing, and a config asking it for the Batch API is refused."""
    install(tmp_path / "site", monkeypatch, "seeded = simtest_provider:SeededAdapter")
    from sim.providers import profile
    from sim.storage import Storage

    declared = profile("seeded")
    assert (declared.kind, declared.network, declared.takes_seed) == ("seeded", False, True)
    from sim.phases.refs import mode_for

    assert mode_for("auto", "seeded") == "schema"  # what auto means for it, its to say
    config = tmp_path / "user.toml"
    config.write_text('[llm]\nprovider = "seeded"\n')
    checked = CliRunner().invoke(
        main, ["check", "--world", str(demo_world), "--config", str(config)]
    )
    assert checked.exit_code == 0, checked.output
    assert "none (seeded provider: no network)" in checked.output
    result = CliRunner().invoke(main, ["tick", "--world", str(demo_world), "--config", str(config)])
    assert result.exit_code == 0, result.output
    seed = Storage(demo_world).load().seed
    calls = read_log(log_path(demo_world, 1)).calls.values()
    assert calls and all((c.response_id or "").startswith(f"seeded-{seed}-") for c in calls)
    config.write_text('[llm]\nprovider = "seeded"\nbatch = true\n')
    refused = CliRunner().invoke(
        main, ["check", "--world", str(demo_world), "--config", str(config)]
    )
    assert refused.exit_code == 2
    assert "the Batch API is not offered for provider 'seeded'" in refused.output


def test_a_profile_that_is_not_one_is_named(
    demo_world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "site", monkeypatch, "bad = simtest_provider:BadProfile")
    config = tmp_path / "user.toml"
    config.write_text('[llm]\nprovider = "bad"\n')
    result = CliRunner().invoke(
        main, ["check", "--world", str(demo_world), "--config", str(config)]
    )
    assert result.exit_code == 2, result.output
    assert "is not a sim.llm.profile.ProviderProfile" in result.output
    assert "Traceback" not in result.output
