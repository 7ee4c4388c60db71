"""Config rules of the gemini provider: default models, the key variable, chain modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config import PHASE_SECTIONS, Config, load_config, provider_models
from sim.engine.stack import provider_options
from sim.errors import InputError
from sim.llm.budget import find_price


def gemini(**llm: object) -> Config:
    return Config.model_validate({"llm": {"provider": "gemini", **llm}})


def test_phases_left_at_the_default_take_gemini_model() -> None:
    config = provider_models(gemini(), {"GEMINI_MODEL": " gemini-2.5-pro "})
    assert [config.phase(s).model for s in PHASE_SECTIONS] == ["gemini-2.5-pro"] * len(
        PHASE_SECTIONS
    )


def test_without_gemini_model_the_default_is_flash() -> None:
    for environ in ({}, {"GEMINI_MODEL": ""}):
        config = provider_models(gemini(), environ)
        assert {config.phase(s).model for s in PHASE_SECTIONS} == {"gemini-2.5-flash"}


def test_a_chosen_model_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_MODEL", "gemini-2.0-flash")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[llm]\nprovider = "gemini"\n[phase2a]\nmodel = "gemini-2.5-pro"\n'
        'fallback_models = ["gemini-2.5-flash-lite"]\n'
    )
    config = load_config(cfg, cwd=tmp_path)
    assert config.phase2a.model == "gemini-2.5-pro"
    assert config.phase2a.fallback_models == ("gemini-2.5-flash-lite",)
    assert config.phase1.model == config.phase2b.model == "gemini-2.0-flash"


def test_other_providers_ignore_gemini_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEMINI_MODEL", "gemini-2.0-flash")
    config = load_config(cwd=tmp_path, overrides={"llm": {"provider": "openai"}})
    assert config.phase1.model == "gpt-4.1-mini"


def test_server_chains_are_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"llm\.chain_mode.*gemini"):
        load_config(cwd=tmp_path, overrides={"llm": {"provider": "gemini", "chain_mode": "server"}})


def test_key_variable_defaults_to_gemini_api_key() -> None:
    assert provider_options(gemini(), 0)["api_key_env"] == "GEMINI_API_KEY"
    assert provider_options(gemini(api_key_env="MY_KEY"), 0)["api_key_env"] == "MY_KEY"
    openai = Config.model_validate({"llm": {"provider": "openai"}})
    assert provider_options(openai, 0)["api_key_env"] == "OPENAI_API_KEY"
    assert "store" not in provider_options(gemini(), 0)


def test_current_gemini_models_are_priced() -> None:
    prices = Config().prices
    for model in (
        "gemini-2.5-pro",
        "gemini-2.5-flash",
        "gemini-2.5-flash-lite",
        "gemini-2.0-flash",
    ):
        price = find_price(prices, model)
        assert price is not None and price.input > 0 and 0 < price.cached_input < price.input
        assert price.output > price.input
