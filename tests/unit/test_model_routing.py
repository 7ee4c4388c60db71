"""Where a model runs: qualified model strings, ``[providers.NAME]``, per-phase endpoints as
sugar, deduplication of candidates, and the trust rule for a world's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from sim.config import (
    Config,
    InvalidConfig,
    load_config,
    named_endpoints,
    phase_endpoints,
    resolve_model,
    routing,
)
from sim.engine.stack import build_stack
from sim.errors import InputError
from sim.llm.budget import Budget, Price, find_price
from sim.llm.errors import LLMAPIError, LLMConfigurationError
from sim.llm.ratelimit import RateLimitedAdapter
from sim.llm.recovery import RecoveryAdapter, RetryPolicy, candidates
from sim.llm.router import Router
from sim.llm.types import AdapterResponse, CallSettings, ModelRequest, ModelTarget, Usage
from sim.testing.adapters import MockAdapter


class Out(BaseModel):
    text: str = ""


LOCAL = {"kind": "chat", "base_url": "http://localhost:8000/v1", "api_key_env": "LOCAL_KEY"}


def config(**data: Any) -> Config:
    return Config.model_validate(data)


@pytest.mark.parametrize(
    ("name", "provider", "model"),
    [
        ("gpt-4.1-mini", "openai", "gpt-4.1-mini"),  # bare: [llm] provider
        ("openai/gpt-4.1-mini", "openai", "gpt-4.1-mini"),
        ("local/qwen2.5-7b", "local", "qwen2.5-7b"),  # a declared endpoint
        ("gemini/gemini-2.5-flash", "gemini", "gemini-2.5-flash"),
        ("anthropic/claude-haiku-4-5", "anthropic", "claude-haiku-4-5"),
        ("offline/any", "offline", "any"),
        # a first segment that is neither a kind nor a declared name: part of the model
        ("meta-llama/Llama-3-8B", "openai", "meta-llama/Llama-3-8B"),
        ("models/gemini-2.5-flash", "openai", "models/gemini-2.5-flash"),
        # only the first segment is read: the rest is the model, slashes and all
        ("local/meta-llama/Llama-3-8B", "local", "meta-llama/Llama-3-8B"),
        ("chat/openai/gpt-oss-20b", "chat", "openai/gpt-oss-20b"),
        # provider names are case-sensitive (lower case): not a qualifier
        ("Local/qwen", "openai", "Local/qwen"),
        ("  local/ qwen ", "local", "qwen"),  # whitespace around the parts is dropped
        ("local/", "openai", "local/"),  # nothing after the slash: not qualified
    ],
)
def test_resolve_model(name: str, provider: str, model: str) -> None:
    c = config(llm={"provider": "openai"}, providers={"local": LOCAL})
    assert resolve_model(c, name) == ModelTarget(provider, model)


def test_a_model_named_like_a_kind_needs_its_provider_written_out() -> None:
    # on a chat server (vLLM) the Hugging Face id "openai/gpt-oss-20b" reads as the kind
    # openai; writing the provider first sends it as is
    c = config(llm={"provider": "chat", "base_url": "http://localhost:8000/v1"})
    assert resolve_model(c, "openai/gpt-oss-20b") == ModelTarget("openai", "gpt-oss-20b")
    assert resolve_model(c, "chat/openai/gpt-oss-20b") == ModelTarget("chat", "openai/gpt-oss-20b")
    table = routing(
        c.model_copy(
            update={"phase1": c.phase1.model_copy(update={"model": "chat/openai/gpt-oss-20b"})}
        )
    )
    [target] = table.candidates("phase1")
    assert table.endpoints[target.provider].base_url == "http://localhost:8000/v1"


def test_kind_prefix_is_the_llm_endpoint_when_it_is_of_that_kind() -> None:
    c = config(llm={"provider": "chat", "base_url": "http://h/v1", "api_key_env": "K"})
    table = routing(
        c.model_copy(
            update={
                "phase1": c.phase1.model_copy(update={"fallback_models": ("chat/b", "openai/c")})
            }
        )
    )
    endpoints = {t.provider: table.endpoints[t.provider] for t in table.candidates("phase1")}
    assert endpoints["chat"].base_url == "http://h/v1" and endpoints["chat"].api_key_env == "K"
    # another kind: its SDK's own server and key variable, not [llm]'s
    assert (
        endpoints["openai"].base_url == "" and endpoints["openai"].api_key_env == "OPENAI_API_KEY"
    )


def test_named_endpoint_defaults_come_from_llm_and_the_kind() -> None:
    c = config(
        llm={"provider": "openai", "max_concurrency": 4, "requests_per_minute": 60},
        providers={"g": {"kind": "gemini"}, "fast": {**LOCAL, "max_concurrency": 2}},
        phase1={"model": "g/gemini-2.5-flash", "fallback_models": ["fast/qwen"]},
    )
    table = routing(c)
    g, fast = table.endpoints["g"], table.endpoints["fast"]
    assert g.kind == "gemini" and g.api_key_env == "GEMINI_API_KEY"
    assert g.max_concurrency == 4 and g.requests_per_minute == 60
    assert fast.max_concurrency == 2 and fast.api_key_env == "LOCAL_KEY"
    assert [s.name for s in table.used()] == ["openai", "g", "fast"]


def test_candidates_are_deduplicated_by_provider_and_normalised_model() -> None:
    c = config(
        llm={"provider": "openai"},
        providers={"local": LOCAL},
        phase2a={
            "model": "gpt-4.1-mini",
            "fallback_models": [
                "GPT-4.1-mini",  # the primary again (case)
                "openai/ gpt-4.1-mini ",  # and again (qualified, whitespace)
                "local/gpt-4.1-mini",  # the same model elsewhere: a candidate
                "local/Qwen",
                "local/qwen",  # the same as the one before
            ],
        },
    )
    settings = c.call_settings("resolution")
    assert (settings.provider, settings.model) == ("openai", "gpt-4.1-mini")
    assert settings.fallback_models == (
        ModelTarget("local", "gpt-4.1-mini"),
        ModelTarget("local", "Qwen"),  # the first spelling is the one sent
    )


def test_recovery_candidates_take_plain_names_on_the_request_provider() -> None:
    settings = CallSettings(
        model="A",
        provider="p",
        fallback_models=("a", " b", ModelTarget("q", "a"), ModelTarget("p", "B")),
    )
    assert candidates(settings) == [
        ModelTarget("p", "A"),
        ModelTarget("p", "b"),
        ModelTarget("q", "a"),
    ]


def test_per_phase_endpoint_is_sugar_for_an_endpoint_of_its_own() -> None:
    c = config(
        llm={"provider": "openai"},
        phase2b={"provider": "chat", "base_url": "http://localhost:11434/v1", "model": "llama3"},
        phase4={"provider": "gemini", "model": "gemini-2.5-flash"},  # the kind's default
        phase2a={"provider": "openai"},  # the same as [llm]'s: nothing changes
    )
    table = routing(c)
    [narrative] = table.candidates("narrative")
    assert narrative == ModelTarget("chat@phase2b", "llama3")
    assert table.endpoints["chat@phase2b"].base_url == "http://localhost:11434/v1"
    assert table.candidates("memory") == (ModelTarget("gemini", "gemini-2.5-flash"),)
    assert table.endpoints["gemini"].api_key_env == "GEMINI_API_KEY"
    assert table.candidates("resolution")[0].provider == "openai"
    # a kind prefix in that phase means the phase's own endpoint of that kind
    assert resolve_model(c, "chat/x", table.endpoints["chat@phase2b"]).provider == "chat@phase2b"
    assert phase_endpoints(c)["narrative"] == ("http://localhost:11434/v1", "OPENAI_API_KEY")
    assert set(named_endpoints(c)) == {"chat@phase2b", "gemini"}


def test_declared_phase_uses_a_named_endpoint() -> None:
    c = config(
        providers={"local": LOCAL},
        phases={"opinion": {"instructions": "x", "schema": "s.json", "model": "local/m"}},
    )
    assert routing(c).candidates("opinion") == (ModelTarget("local", "m"),)
    assert routing(c).candidates("phases.opinion") == (ModelTarget("local", "m"),)
    assert routing(c).candidates("phases.python_only")[0].provider == "offline"


@pytest.mark.parametrize(
    ("providers", "field", "says"),
    [
        ({"local": {"kind": "vllm"}}, "providers.local.kind", "unknown kind 'vllm'"),
        ({"openai": {"kind": "openai"}}, "providers.openai", "a provider kind"),
        ({"local": {"base_url": "x"}}, "providers.local.kind", "field required"),
        ({"Local": {"kind": "chat"}}, "providers.Local", "string should match pattern"),
        ({"local": {"kind": "chat", "api_key": "sk-x"}}, "providers.local.api_key", "unknown"),
        (
            {"local": {"kind": "chat", "api_key_env": "$KEY"}},
            "providers.local.api_key_env",
            "pattern",
        ),
    ],
)
def test_bad_providers_tables_are_named(
    tmp_path: Path, providers: dict[str, Any], field: str, says: str
) -> None:
    path = tmp_path / "c.toml"
    lines = []
    for name, table in providers.items():
        lines.append(f"[providers.{name}]")
        lines.extend(f"{k} = {v!r}".replace("'", '"') for k, v in table.items())
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidConfig) as caught:
        load_config(path, cwd=tmp_path)
    problems = [(p.field or "", p.problem) for p in caught.value.problems]
    assert any(f.startswith(field) and says in p for f, p in problems), problems


def test_llm_provider_names_are_validated_with_kinds(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[providers.local]\nkind = "chat"\n[phase1]\nmodel = "local/m"\n')
    assert routing(load_config(path, cwd=tmp_path)).candidates("phase1") == (
        ModelTarget("local", "m"),
    )


# -- the trust rule ---------------------------------------------------------------------


def world_with(tmp_path: Path, text: str) -> Path:
    world = tmp_path / "world"
    world.mkdir(exist_ok=True)
    (world / "config.toml").write_text(text)
    return world


def problems_of(tmp_path: Path, world_text: str, user_text: str = "", **kwargs: Any) -> list[str]:
    world = world_with(tmp_path, world_text)
    user = tmp_path / "user.toml"
    user.write_text(user_text)
    try:
        load_config(user, world, cwd=tmp_path, **kwargs)
    except InvalidConfig as exc:
        return [p.field or "" for p in exc.problems]
    return []


def test_world_may_not_declare_providers(tmp_path: Path) -> None:
    text = '[providers.evil]\nkind = "chat"\nbase_url = "http://evil.example/v1"\n'
    text += '[phase1]\nmodel = "evil/m"\n'
    assert problems_of(tmp_path, text, '[llm]\nprovider = "openai"\n') == ["providers"]


def test_world_may_restate_the_users_providers(tmp_path: Path) -> None:
    user = '[providers.local]\nkind = "chat"\nbase_url = "http://localhost:8000/v1"\n'
    assert problems_of(tmp_path, user + '[phase1]\nmodel = "local/other"\n', user) == []


def test_world_may_not_qualify_a_model_with_a_kind_the_user_does_not_use(tmp_path: Path) -> None:
    # the user runs a local chat server; "openai/gpt-4.1" would send OPENAI_API_KEY to OpenAI
    user = '[llm]\nprovider = "chat"\nbase_url = "http://localhost:8000/v1"\n'
    world = '[phase1]\nmodel = "openai/gpt-4.1"\n[phase2a]\nfallback_models = ["anthropic/c"]\n'
    assert problems_of(tmp_path, world, user) == ["phase1.model", "phase2a.fallback_models"]
    assert problems_of(tmp_path, world, user, trust_world_config=True) == []


def test_world_may_use_the_users_endpoints_and_bare_names(tmp_path: Path) -> None:
    user = '[llm]\nprovider = "chat"\n[providers.local]\nkind = "chat"\n'
    world = (
        '[phase1]\nmodel = "chat/m"\nfallback_models = ["local/x", "offline/any", '
        '"meta-llama/Llama-3-8B"]\n'
    )
    assert problems_of(tmp_path, world, user) == []


def test_world_model_error_names_the_file_and_says_what_to_do(tmp_path: Path) -> None:
    world = world_with(tmp_path, '[phase1]\nmodel = "gemini/gemini-2.5-pro"\n')
    with pytest.raises(InputError) as caught:
        load_config(None, world, cwd=tmp_path)
    text = str(caught.value)
    assert "config.toml" in text and "phase1.model" in text and "--trust-world-config" in text


# -- prices and breakers keyed by provider ----------------------------------------------


def test_price_for_a_model_on_its_provider_wins() -> None:
    prices = {"qwen": Price(1.0, 0.5, 2.0), "local/qwen": Price(0.0, 0.0, 0.0)}
    assert find_price(prices, "qwen", "local") == Price(0.0, 0.0, 0.0)
    assert find_price(prices, "qwen", "hosted") == Price(1.0, 0.5, 2.0)
    assert find_price(prices, "qwen") == Price(1.0, 0.5, 2.0)
    dated = {"local/gpt-4.1-mini": Price(9.0, 9.0, 9.0), "gpt-4.1-mini": Price(1.0, 1.0, 1.0)}
    assert find_price(dated, "gpt-4.1-mini-2025-04-14", "local") == Price(9.0, 9.0, 9.0)


def test_budget_names_the_provider_of_an_unpriced_model() -> None:
    budget = Budget(max_cost_usd=1.0, prices={"local/qwen": Price(1.0, 1.0, 1.0)})
    assert budget.price("qwen", "local") == Price(1.0, 1.0, 1.0)
    with pytest.raises(Exception, match="'qwen' on 'hosted'"):
        budget.price("qwen", "hosted")


# -- the router and recovery across endpoints -------------------------------------------


class Down(MockAdapter):
    """An endpoint whose every answer is a 5xx."""

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.calls.append(request)
        raise LLMAPIError("overloaded", status_code=503)


async def no_sleep(seconds: float) -> None:
    """Recovery's waits, skipped."""


def routed(routes: dict[str, Any], threshold: int = 2) -> RecoveryAdapter:
    return RecoveryAdapter(
        Router(routes, "primary"),
        RetryPolicy(transient_retries=0),
        breaker_threshold=threshold,
        sleep=no_sleep,
    )


async def test_fallback_crosses_endpoints_and_breakers_are_per_provider() -> None:
    primary, local = Down(), MockAdapter()
    local.name = "chat"
    adapter = routed({"primary": primary, "local": local})
    settings = CallSettings(
        model="m", provider="primary", fallback_models=(ModelTarget("local", "m"),)
    )
    request = ModelRequest("Say.", "{}", Out, settings=settings)
    for _ in range(3):
        response = await adapter.execute(request)
        assert (response.fallback_from, response.fallback_to) == ("primary/m", "local/m")
        assert [a.provider for a in response.attempts][-1] == "local"
    # the breaker of primary:m opened after 2 failures; local:m (same model) is closed
    assert len(primary.calls) == 2
    assert adapter.breakers["llm:primary:m"].state == "open"
    assert adapter.breakers["llm:local:m"].state == "closed"
    assert [c.settings.provider for c in local.calls] == ["local"] * 3


async def test_router_applies_an_endpoints_structured_output() -> None:
    primary, local = MockAdapter(), MockAdapter()
    router = Router({"primary": primary, "local": local}, "primary", {"local": "tool"})
    settings = CallSettings(model="m", provider="local", structured_output="auto")
    await router.execute(ModelRequest("Say.", "{}", Out, settings=settings))
    assert local.calls[-1].settings.structured_output == "tool"
    # a name from another config (sim replay --live with the logged config): the default
    await router.execute(ModelRequest("Say.", "{}", Out, settings=CallSettings(provider="x")))
    assert len(primary.calls) == 1 and primary.calls[0].settings.structured_output == "auto"


def test_stack_builds_each_used_endpoint_with_its_own_pacing(monkeypatch: Any) -> None:
    monkeypatch.setenv("LOCAL_KEY", "sk-local")
    c = config(
        llm={"provider": "offline"},
        providers={"local": {**LOCAL, "requests_per_minute": 30}, "unused": LOCAL},
        phase2a={"fallback_models": ["local/qwen"]},
    )
    stack = build_stack(c)
    router = stack.adapter.inner  # type: ignore[attr-defined]
    assert isinstance(router, Router)
    assert set(router.routes) == {"offline", "local"}  # "unused" is not built
    assert isinstance(router.routes["local"], RateLimitedAdapter)
    assert not isinstance(router.routes["offline"], RateLimitedAdapter)


def test_stack_stops_on_a_missing_key_of_a_fallback_endpoint(monkeypatch: Any) -> None:
    monkeypatch.delenv("LOCAL_KEY", raising=False)
    c = config(
        llm={"provider": "offline"},
        providers={"local": {"kind": "openai", "api_key_env": "LOCAL_KEY"}},
        phase2a={"fallback_models": ["local/qwen"]},
    )
    with pytest.raises(LLMConfigurationError, match="LOCAL_KEY"):
        build_stack(c)


def test_tune_estimate_sends_nothing_and_prices_on_the_provider(
    tmp_path: Path, stub_server: Any
) -> None:
    from conftest import copy_demo

    from sim.analysis.tune import estimate
    from sim.config import DEFAULT_PRICES, PriceConfig

    world = copy_demo(tmp_path / "w")
    c = config(
        llm={"provider": "openai", "base_url": stub_server.base_url},
        providers={"local": {"kind": "chat", "base_url": stub_server.base_url}},
        phase2a={"model": "local/qwen", "fallback_models": ["openai/gpt-4.1"]},
        prices={**DEFAULT_PRICES, "local/qwen": PriceConfig(input=1000.0, output=1000.0)},
    )
    result = estimate(world, c, "phase2a", [0], 1)
    assert stub_server.stats.requests == 0  # every phase ran offline
    # resolution's tokens priced at local/qwen's $1000 per million, not as gpt-4.1-mini
    assert result.cost.known and result.cost.usd > 1.0


def test_world_may_qualify_with_the_kind_chosen_by_flag(tmp_path: Path) -> None:
    world = world_with(tmp_path, '[phase1]\nmodel = "openai/gpt-4.1"\n')
    flags = {"llm": {"provider": "openai"}}
    config = load_config(None, world, flags, cwd=tmp_path)
    assert routing(config).candidates("phase1") == (ModelTarget("openai", "gpt-4.1"),)
    with pytest.raises(InvalidConfig):
        load_config(None, world, {"llm": {"provider": "chat"}}, cwd=tmp_path)


async def test_a_fallback_to_another_endpoint_is_sent_without_the_server_chain() -> None:
    primary, local = Down(), MockAdapter()
    adapter = routed({"primary": primary, "local": local})
    settings = CallSettings(
        model="m", provider="primary", fallback_models=("n", ModelTarget("local", "m"))
    )
    request = ModelRequest("Say.", "{}", Out, previous_response_id="resp_1", settings=settings)
    await adapter.execute(request)
    # the chain id went to the provider that made it (both models there), not to local
    assert [c.previous_response_id for c in primary.calls] == ["resp_1", "resp_1"]
    assert local.calls[0].previous_response_id is None


# -- policy gates see where each candidate runs ------------------------------------------


def test_allowed_models_takes_plain_and_qualified_entries() -> None:
    from sim.policy.builtin import AllowedModels
    from sim.policy.types import PolicyCall

    def call(*targets: ModelTarget) -> PolicyCall:
        return PolicyCall(
            tick=1,
            phase="intentions",
            entity_key=None,
            entity_id=None,
            request_id="",
            model=targets[0].model,
            fallback_models=tuple(t.model for t in targets[1:]),
            estimated_usage=Usage(),
            estimated_cost_usd=0.0,
            calls_for_entity=0,
            calls_in_tick=0,
            tick_calls_planned=1,
            tick_cost_usd=0.0,
            targets=targets,
        )

    policy = AllowedModels(frozenset({"gpt-4.1-mini", "local/qwen"}))
    allowed = call(ModelTarget("openai", "gpt-4.1-mini"), ModelTarget("local", "qwen"))
    assert policy.decide(allowed).kind == "allow"
    # qwen is allowed on local only: the same model hosted elsewhere is not
    denied = policy.decide(call(ModelTarget("openai", "gpt-4.1-mini"), ModelTarget("h", "qwen")))
    assert denied.kind == "deny" and "'h/qwen'" in (denied.reason or "")


def test_tick_plan_prices_each_phase_on_its_provider(tmp_path: Path) -> None:
    from conftest import copy_demo

    from sim.config import DEFAULT_PRICES, PriceConfig
    from sim.phases import resolve_phases
    from sim.policy.forecast import plan_tick
    from sim.storage import Storage

    world_dir = copy_demo(tmp_path / "w")
    c = config(
        providers={"local": LOCAL},
        phase1={"model": "local/qwen"},
        prices={**DEFAULT_PRICES, "local/qwen": PriceConfig(input=1.0, output=1.0)},
    )
    plan = plan_tick(Storage(world_dir).load(), c, resolve_phases(c, world_dir))
    intentions = next(p for p in plan.phases if p.name == "intentions")
    assert (intentions.provider, intentions.model) == ("local", "qwen")
    assert plan.estimate(100, c.prices).known


def test_an_undeclared_endpoint_prefix_on_the_offline_provider_is_an_error(
    tmp_path: Path,
) -> None:
    # the offline model answers any name: "local/qwen" would quietly run offline
    world = '[phase1]\nmodel = "local/qwen2.5-7b"\n[phase2a]\nfallback_models = ["x/y"]\n'
    assert problems_of(tmp_path, "", world) == ["phase1.model", "phase2a.fallback_models"]
    # declared, or a kind, or a bare name on a server: no problem
    declared = '[providers.local]\nkind = "chat"\n[phase1]\nmodel = "local/qwen2.5-7b"\n'
    assert problems_of(tmp_path, "", declared) == []
    assert problems_of(tmp_path, "", '[phase1]\nmodel = "offline/any"\n') == []
    server = '[llm]\nprovider = "chat"\n[phase1]\nmodel = "meta-llama/Llama-3-8B"\n'
    assert problems_of(tmp_path, "", server) == []
