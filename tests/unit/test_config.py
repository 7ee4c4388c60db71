"""Config layering and strict validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config import Config, defaults_data, load_config, phase_section
from sim.errors import InputError

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_builtin_defaults_equal_the_shipped_config_toml(tmp_path: Path) -> None:
    shipped = load_config(REPO / "config.toml", cwd=tmp_path)
    builtin = load_config(cwd=tmp_path)
    assert shipped == builtin
    assert (REPO / "config.toml").read_text() == (REPO / "sim" / "defaults.toml").read_text()
    assert builtin.llm.provider == "offline"
    depths = [
        builtin.phase(s).response_chain_depth for s in ("phase1", "phase2a", "phase2b", "phase4")
    ]
    assert depths == [0, 2, 0, 0]  # the spec's defaults


def test_pydantic_defaults_match_defaults_toml() -> None:
    assert Config.model_validate(defaults_data()) == Config()


def test_layers_world_overrides_file_and_cli_overrides_both(tmp_path: Path) -> None:
    cfg = write(tmp_path / "my.toml", "[phase1]\nresponse_chain_depth = 1\ntemperature = 0.1\n")
    world = tmp_path / "w"
    world.mkdir()
    write(world / "config.toml", "[phase1]\nresponse_chain_depth = 3\n")
    config = load_config(cfg, world, {"llm": {"max_concurrency": 7}}, cwd=tmp_path)
    assert config.phase1.response_chain_depth == 3
    assert config.phase1.temperature == 0.1
    assert config.llm.max_concurrency == 7
    over = load_config(cfg, world, {"phase1": {"response_chain_depth": 0}}, cwd=tmp_path)
    assert over.phase1.response_chain_depth == 0


def test_local_config_toml_is_used_without_flag(tmp_path: Path) -> None:
    write(tmp_path / "config.toml", "[phase2b]\nresponse_chain_depth = 4\n")
    assert load_config(cwd=tmp_path).phase2b.response_chain_depth == 4


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        ("[phase1]\ntemprature = 0.5\n", "phase1.temprature", "unknown key"),
        ("[llm]\nfoo = 1\n", "llm.foo", "unknown key"),
        ("[phase9]\nmodel = 'x'\n", "phase9", "unknown key"),
        ("[phase1]\ntemperature = 2.5\n", "phase1.temperature", "less than or equal to 2"),
        ("[phase1]\ntemperature = -0.1\n", "phase1.temperature", "greater than or equal to 0"),
        (
            "[phase2a]\nresponse_chain_depth = -1\n",
            "phase2a.response_chain_depth",
            "greater than or equal to 0",
        ),
        ("[phase4]\nmax_output_tokens = 0\n", "phase4.max_output_tokens", "greater than 0"),
        ("[llm]\nprovider = 'nope'\n", "llm.provider", "unknown provider 'nope'"),
        ("[llm]\nchain_mode = 'both'\n", "llm.chain_mode", "'window' or 'server'"),
        (
            "[llm]\nmax_failed_fraction = 1.5\n",
            "llm.max_failed_fraction",
            "less than or equal to 1",
        ),
        ("[llm]\napi_key_env = 'sk-abc def'\n", "llm.api_key_env", "should match pattern"),
        (
            "[llm]\nrequests_per_minute = -5\n",
            "llm.requests_per_minute",
            "greater than or equal to 0",
        ),
        ("[phase1]\nmode = 'magic'\n", "phase1.mode", "'schema' or 'tools'"),
        ("[phase2a]\nmode = 'tools'\n", "phase2a.mode", "unknown key"),
        ("[budget]\nmax_cost_usd = -1\n", "budget.max_cost_usd", "greater than or equal to 0"),
        ("[prices.'gpt-x']\ninput = 1\nouptut = 2\n", "prices.gpt-x.ouptut", "unknown key"),
    ],
)
def test_bad_values_name_file_field_and_expectation(
    tmp_path: Path, text: str, field: str, expected: str
) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(InputError) as info:
        load_config(path, cwd=tmp_path)
    message = str(info.value)
    assert str(path) in message
    assert f"'{field}'" in message
    assert expected in message


def test_provider_settings_reach_the_adapter_stack() -> None:
    from sim.engine.stack import build_stack, provider_options

    config = Config.model_validate(
        {
            "llm": {
                "provider": "chat",
                "base_url": "http://127.0.0.1:9/v1",
                "chain_mode": "server",
                "requests_per_minute": 60,
                "breaker_threshold": 3,
            },
            "budget": {"max_total_tokens": 1000},
            "phase2a": {"fallback_models": ["b", "c"]},
        }
    )
    options = provider_options(config, seed=1)
    assert options["base_url"] == "http://127.0.0.1:9/v1" and "store" not in options
    # only the openai provider stores responses (server chains); chat takes no such option
    openai_llm = config.llm.model_copy(update={"provider": "openai"})
    assert provider_options(config.model_copy(update={"llm": openai_llm}), 1)["store"] is True
    stack = build_stack(config)  # a local chat server needs no key
    assert stack.adapter.breaker_threshold == 3  # type: ignore[attr-defined]
    budget = stack.budget
    assert budget is not None and budget.max_total_tokens == 1000
    assert config.phase2a.settings(config.llm).fallback_models == ("b", "c")


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.toml", "[llm\nprovider=\n")
    with pytest.raises(InputError, match="not valid TOML") as info:
        load_config(path, cwd=tmp_path)
    assert str(path) in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="config file not found"):
        load_config(tmp_path / "nope.toml", cwd=tmp_path)


def test_phase_aliases() -> None:
    assert [phase_section(n) for n in ("intentions", "resolution", "narrative", "memory")] == [
        "phase1",
        "phase2a",
        "phase2b",
        "phase4",
    ]
    assert phase_section("phase2a") == "phase2a"
    with pytest.raises(InputError, match="unknown phase 'phase3'"):
        phase_section("phase3")


NUMBERED = """
[phase1]
temperature = 0.2
response_chain_depth = 1
[phase2a]
model = "offline"
max_output_tokens = 321
[phase2b]
temperature = 0.4
"""

READABLE = """
[intentions]
temperature = 0.2
response_chain_depth = 1
[resolution]
model = "offline"
max_output_tokens = 321
[narrative]
temperature = 0.4
"""


def test_readable_phase_sections_give_the_numbered_ones_config(tmp_path: Path) -> None:
    numbered = load_config(write(tmp_path / "numbered.toml", NUMBERED), cwd=tmp_path)
    readable = load_config(write(tmp_path / "readable.toml", READABLE), cwd=tmp_path)
    assert readable == numbered
    assert readable.phase2a.max_output_tokens == 321 and readable.phase1.temperature == 0.2
    assert numbered != load_config(cwd=tmp_path)  # the files did change something
    # a world's config and the command line's overrides take them too
    world = tmp_path / "w"
    world.mkdir()
    write(world / "config.toml", "[narrative]\nresponse_chain_depth = 3\n")
    layered = load_config(None, world, {"resolution": {"temperature": 0.1}}, cwd=tmp_path)
    assert layered.phase2b.response_chain_depth == 3 and layered.phase2a.temperature == 0.1
    # a readable name in one layer, the numbered one in another: one section, later wins
    over = load_config(
        write(tmp_path / "mixed.toml", NUMBERED),
        None,
        {"intentions": {"temperature": 0.9}},
        cwd=tmp_path,
    )
    assert over.phase1.temperature == 0.9 and over.phase1.response_chain_depth == 1


@pytest.mark.parametrize(
    ("readable", "numbered"),
    [("intentions", "phase1"), ("resolution", "phase2a"), ("narrative", "phase2b")],
)
def test_both_names_of_one_section_in_a_layer_is_an_error_naming_both(
    tmp_path: Path, readable: str, numbered: str
) -> None:
    path = write(
        tmp_path / "both.toml",
        f"[{numbered}]\ntemperature = 0.1\n[{readable}]\ntemperature = 0.2\n",
    )
    with pytest.raises(InputError) as caught:
        load_config(path, cwd=tmp_path)
    message = str(caught.value)
    assert str(path) in message and f"[{readable}]" in message and f"[{numbered}]" in message
    with pytest.raises(InputError, match=rf"command line.*\[{readable}\] and \[{numbered}\]"):
        load_config(
            None,
            None,
            {readable: {"temperature": 0.1}, numbered: {"temperature": 0.2}},
            cwd=tmp_path,
        )


def test_every_config_snippet_in_providers_doc_is_valid(tmp_path: Path) -> None:
    text = (REPO / "docs" / "providers.md").read_text()
    snippets = text.split("```toml\n")[1:]
    assert len(snippets) >= 6
    for i, snippet in enumerate(snippets):
        path = tmp_path / f"snippet{i}.toml"
        path.write_text(snippet.split("```", 1)[0])
        load_config(path)  # raises InputError naming the key if a snippet is wrong


def test_world_declared_sections_are_checked(tmp_path: Path) -> None:
    from sim.config import ENDPOINT_KEYS, endpoint_paths
    from sim.errors import InputError

    cases = {
        "[phases.intentions]\nmodel = 'x'\n": ("phases.intentions", "[phase1]"),
        "[phases.Bad-Name]\nper = 'character'\n": ("phases", ""),
        "[phases.opinion]\nper = 'crowd'\n": ("phases.opinion.per", ""),
        "[phases.opinion]\nprovider = 'nope'\n": ("phases.opinion.provider", "unknown provider"),
        "[actions]\nwait = 'x'\n": ("actions.wait", "built-in action"),
        "[actions]\ntrade = ''\n": ("actions.trade", ""),
        "[tick]\norder = []\n": ("tick.order", "unknown key"),
    }
    for text, (field, problem) in cases.items():
        path = write(tmp_path / "c.toml", text)
        with pytest.raises(InputError) as caught:
            load_config(path, cwd=tmp_path)
        assert caught.value.field is not None and caught.value.field.startswith(field), text
        assert problem in caught.value.problem, text
    layer = {
        "llm": {"provider": "x"},
        "phase2b": {"base_url": "u"},
        "phases": {"o": {"api_key_env": "K", "model": "m"}},
    }
    assert endpoint_paths(layer) == ["llm.provider", "phase2b.base_url", "phases.o.api_key_env"]
    assert {"provider", "base_url", "api_key_env"} <= ENDPOINT_KEYS


def test_a_declared_phase_takes_the_gemini_default_model_like_the_builtins() -> None:
    from sim.config import provider_models
    from sim.providers import profile

    gemini_default = profile("gemini").default_model

    config = load_config(
        overrides={
            "llm": {"provider": "gemini"},
            "tick": {"phases": ["intentions", "apply", "opinion", "vote"]},
            "phases": {"opinion": {"schema": "s.json"}, "vote": {"model": "mine"}},
        }
    )
    chosen = provider_models(config, {})
    assert chosen.phase("opinion").model == gemini_default == "gemini-2.5-flash"
    assert chosen.phase("vote").model == "mine"
    assert chosen.phase("phase1").model == gemini_default


def test_a_runs_config_takes_a_readable_setting_over_the_worlds_numbered_section(
    tmp_path: Path,
) -> None:
    from sim.runs.fork import run_config_text

    world = tmp_path / "w"
    world.mkdir()
    write(world / "config.toml", "[phase2a]\nmax_output_tokens = 300\ntemperature = 0.3\n")
    text = run_config_text(world, {"resolution.temperature": 0.5})
    assert text is not None and "[resolution]" not in text
    run = tmp_path / "run"
    run.mkdir()
    write(run / "config.toml", text)
    config = load_config(None, run, cwd=tmp_path)
    assert config.phase2a.temperature == 0.5 and config.phase2a.max_output_tokens == 300
