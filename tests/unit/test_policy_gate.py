"""The policy gate on its own: how decisions combine, asking once under parallel calls,
counts per entity, a stop, and the plan behind the cost estimate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import BaseModel

from sim.config import Config
from sim.llm.calls import CallIdentity
from sim.llm.types import AdapterResponse, CallSettings, ModelRequest, Usage
from sim.policy import (
    Approval,
    PolicyCall,
    PolicyDecision,
    PolicyDeferred,
    PolicyDenied,
    PolicyRefused,
    TickHalted,
)
from sim.policy.forecast import PlannedPhase, TickPlan, plan_tick
from sim.policy.gate import TickPolicy
from sim.storage import Storage
from sim.ticklog.records import PolicyRecord


class Answer(BaseModel):
    text: str


class Echo:
    name = "echo"

    def __init__(self) -> None:
        self.sent = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        self.sent += 1
        return AdapterResponse(Answer(text="ok"), f"r{self.sent}", Usage(1, 1), "m")

    async def delete_response(self, response_id: str) -> None:
        return None


class Fixed:
    def __init__(self, name: str, decision: PolicyDecision) -> None:
        self.name = name
        self.decision = decision
        self.seen: list[PolicyCall] = []

    def decide(self, call: PolicyCall) -> PolicyDecision:
        self.seen.append(call)
        return self.decision


PLAN = TickPlan(1, (PlannedPhase("intentions", 10, "m", 100),))
PRICES = {"m": Config().prices["gpt-4.1"]}


async def send(gate_adapter: object, key: str, n: int = 0) -> AdapterResponse:
    call = CallIdentity(f"1:intentions:{key}:{n}", "intentions", key, n, "", "", "", "")
    request = ModelRequest("do", "x", Answer, settings=CallSettings(model="m"), call=call)
    return await gate_adapter.execute(request)  # type: ignore[attr-defined, no-any-return]


async def test_deny_wins_over_defer_and_ask_and_nothing_is_sent() -> None:
    records: list[PolicyRecord] = []
    asked: list[str] = []
    policies = [
        Fixed("asker", PolicyDecision.ask("ok?")),
        Fixed("later", PolicyDecision.defer("not now")),
        Fixed("no", PolicyDecision.deny("never")),
    ]

    def approver(question: str) -> Approval:
        asked.append(question)
        return Approval(True, "test")

    gate = TickPolicy(policies, PLAN, PRICES, approver=approver, record=records.append)
    echo = Echo()
    with pytest.raises(PolicyDenied, match="denied by no: never"):
        await send(gate.wrap(echo), "intention:ada")
    assert echo.sent == 0 and asked == []
    assert [(r.policy, r.decision) for r in records] == [("no", "deny")]
    assert gate.halted is None  # a denial is about one call


async def test_ask_is_asked_once_while_parallel_calls_wait() -> None:
    asked: list[str] = []

    def approver(question: str) -> Approval:
        asked.append(question)
        return Approval(True, "test")

    gate = TickPolicy(
        [Fixed("asker", PolicyDecision.ask("spend?", key="k"))], PLAN, PRICES, approver=approver
    )
    echo = Echo()
    adapter = gate.wrap(echo)
    await asyncio.gather(*(send(adapter, f"intention:c{i}") for i in range(8)))
    assert asked == ["spend?"] and echo.sent == 8


async def test_a_refusal_or_a_defer_stops_every_later_call() -> None:
    gate = TickPolicy(
        [Fixed("asker", PolicyDecision.ask("spend?"))],
        PLAN,
        PRICES,
        approver=lambda q: Approval(False, "test", "said no"),
    )
    adapter = gate.wrap(Echo())
    with pytest.raises(PolicyRefused, match="refused \\(test\\): spend\\?; said no"):
        await send(adapter, "intention:ada")
    with pytest.raises(PolicyRefused):
        await send(adapter, "intention:bram")
    later = TickPolicy([Fixed("night", PolicyDecision.defer("wait"))], PLAN, PRICES)
    with pytest.raises(PolicyDeferred):
        await send(later.wrap(Echo()), "intention:ada")
    assert isinstance(later.halted, PolicyDeferred)


async def test_calls_are_counted_per_entity_across_phases_and_the_estimate_is_given() -> None:
    seen = Fixed("watch", PolicyDecision.allow())
    gate = TickPolicy([seen], PLAN, PRICES)
    adapter = gate.wrap(Echo())
    await send(adapter, "intention:ada")
    await send(adapter, "memory:ada")
    await send(adapter, "resolution:quay")
    assert [c.calls_for_entity for c in seen.seen] == [0, 1, 0]
    assert [c.entity_id for c in seen.seen] == ["ada", "ada", "quay"]
    first = seen.seen[0]
    assert first.tick_calls_planned == 10
    per_call = first.estimated_usage
    assert per_call.output_tokens == CallSettings().max_output_tokens
    expected = 10 * (per_call.input_tokens * 2.0 + 100 * 8.0) / 1_000_000
    assert first.tick_cost_usd == pytest.approx(expected)


async def test_a_halt_sends_nothing_more() -> None:
    from sim.llm.errors import LLMSchemaError

    gate = TickPolicy([], PLAN, PRICES)
    echo = Echo()
    gate.halt(LLMSchemaError("bad"))
    with pytest.raises(TickHalted, match="after schema_error"):
        await send(gate.wrap(echo), "intention:ada")
    assert echo.sent == 0


def test_the_plan_counts_each_phase_ahead(demo_world: Path) -> None:
    from sim.phases import resolve_phases

    world = Storage(demo_world).load()
    config = Config()
    plan = plan_tick(world, config, resolve_phases(config, demo_world))
    calls = {p.name: p.calls for p in plan.phases}
    assert calls["intentions"] == len(world.characters)
    assert calls["resolution"] == calls["narrative"] == len(world.characters_at())
    assert "apply" not in calls and plan.unplanned == ()
