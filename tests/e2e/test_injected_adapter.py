"""An adapter handed to ``Runner`` gets recovery like the configured provider's stack, and a
call that fails on every model of its fallback chain keeps each model's error: in the
raised error, in the tick log and in ``sim log --calls``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMFallbackExhausted,
    LLMTimeoutError,
)
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.types import AdapterResponse, CallSettings, ModelRequest
from sim.phases.intentions import Intention
from sim.testing import MockAdapter, default_instance
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log


class Note(BaseModel):
    text: str


FAST = "[llm]\nbackoff_base_seconds = 0.0\nbackoff_cap_seconds = 0.0\n"


def valid(schema: type[BaseModel], text: str) -> Any:
    """The mock's default answers, but an intention that waits: its own default (a move to
    no exit) names nothing in the world, and would fail the reference check."""
    if schema is Intention:
        return Intention(action="wait", target=None, content="", reasoning="mock")
    return default_instance(schema)


class ByModel(MockAdapter):
    """Fails every call to a model in ``failing`` with a 5xx naming it; answers the rest."""

    def __init__(self, *failing: str) -> None:
        super().__init__(default=valid)
        self.failing = failing
        self.models: list[str] = []

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        model = request.settings.model
        self.models.append(model)
        if model in self.failing:
            raise LLMAPIError(f"{model} is down", status_code=503, code="server_error", model=model)
        return await super().execute(request)


def test_an_injected_adapter_is_retried_by_recovery(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text(FAST)
    adapter = MockAdapter(default=valid)
    adapter.enqueue(LLMTimeoutError("slow"))  # the first call times out once
    config = load_config(world_dir=demo_world, cwd=demo_world)
    (result,) = Runner(demo_world, config, adapter=adapter).run(1)
    assert result.reports[0].failures == 0  # retried, not degraded
    assert result.reports[0].retries == 1
    assert adapter.call_count == sum(r.calls for r in result.reports) + 1


def test_recovery_false_leaves_the_adapter_bare(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text(FAST)
    adapter = MockAdapter(default=valid)
    adapter.enqueue(LLMTimeoutError("slow"))
    config = load_config(world_dir=demo_world, cwd=demo_world)
    (result,) = Runner(demo_world, config, adapter=adapter, recovery=False).run(1)
    assert result.reports[0].failures == 1 and result.reports[0].retries == 0


def test_every_models_error_is_logged_and_shown(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text(
        FAST + "transient_retries = 0\nmax_failed_fraction = 1.0\n"
        '[phase2b]\nmodel = "big"\nfallback_models = ["small"]\n'
    )
    adapter = ByModel("big", "small")
    config = load_config(world_dir=demo_world, cwd=demo_world)
    Runner(demo_world, config, adapter=adapter).run(1)
    assert {"big", "small"} <= set(adapter.models)
    log = read_log(log_path(demo_world, 1))
    failed = [c for c in log.call_records if c.phase == "narrative"]
    assert failed and all(c.failed for c in failed)
    errors = failed[0].model_errors
    assert errors is not None
    assert [(e.target, e.error_code) for e in errors] == [
        ("offline/big", "server_error"),
        ("offline/small", "server_error"),
    ]
    assert "big is down" in errors[0].error and "small is down" in errors[1].error
    out = CliRunner().invoke(main, ["log", "--world", str(demo_world), "--tick", "1", "--calls"])
    assert out.exit_code == 0, out.output
    assert "    offline/big: server_error: big is down" in out.output
    assert "    offline/small: server_error: small is down" in out.output
    summary = CliRunner().invoke(main, ["log", "--world", str(demo_world), "--tick", "1"])
    assert "all 2 models failed: offline/big: big is down; offline/small: small is down" in (
        summary.output
    )


def test_a_call_on_one_model_logs_no_model_errors(demo_world: Path) -> None:
    (demo_world / "config.toml").write_text(
        FAST + 'transient_retries = 0\nmax_failed_fraction = 1.0\n[phase2b]\nmodel = "big"\n'
    )
    config = load_config(world_dir=demo_world, cwd=demo_world)
    Runner(demo_world, config, adapter=ByModel("big")).run(1)
    log = read_log(log_path(demo_world, 1))
    failed = [c for c in log.call_records if c.phase == "narrative"]
    assert failed and all(c.failed and c.model_errors is None for c in failed)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", 9.0, "temperature must be between 0 and 2"),
        ("temperature", float("nan"), "temperature"),
        ("max_output_tokens", -5, "max_output_tokens must be > 0"),
        ("max_output_tokens", 0, "max_output_tokens must be > 0"),
        ("timeout_seconds", 0, "timeout_seconds must be a positive number"),
        ("idle_timeout_seconds", float("inf"), "idle_timeout_seconds"),
    ],
)
def test_call_settings_out_of_range_are_refused(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CallSettings(**{field: value})  # type: ignore[arg-type]


def test_call_settings_name_every_problem_at_once() -> None:
    with pytest.raises(ValueError) as info:
        CallSettings(temperature=9.0, max_output_tokens=-5, timeout_seconds=0)
    text = str(info.value)
    assert "temperature" in text and "max_output_tokens" in text and "timeout_seconds" in text


async def test_a_fatal_error_after_a_fallback_keeps_its_type_and_the_earlier_errors() -> None:
    adapter = MockAdapter(default=valid)
    adapter.enqueue(
        LLMAPIError("big is down", status_code=503, model="big"),
        LLMBudgetExceededError("budget spent", model="small"),
    )
    stack = RecoveryAdapter(adapter, RetryPolicy(transient_retries=0))
    request = ModelRequest(
        "Write.", "x", Note, settings=CallSettings(model="big", fallback_models=("small",))
    )
    with pytest.raises(LLMBudgetExceededError) as info:  # what stops the run, as before
        await stack.execute(request)
    first, second = info.value.model_errors
    assert first.message == "big is down" and first.context["target"] == "big"
    assert second is info.value and second.context["target"] == "small"
    assert not isinstance(info.value, LLMFallbackExhausted)


def test_the_breaker_key_is_spec_003s() -> None:
    stack = RecoveryAdapter(MockAdapter(default=valid))
    breaker = stack.breaker(" GPT-4.1 ", "local")
    assert stack.breakers == {"llm:local:gpt-4.1": breaker}
    assert stack.breaker("gpt-4.1") is stack.breakers["llm:mock:gpt-4.1"]
