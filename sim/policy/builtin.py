"""The built-in policies, configured under ``[policy]``.

Each is a ``Policy`` (``sim.policy.types``) made from its config value; ``builtin_policies``
returns those a config turns on, in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import PolicyConfig
from sim.policy.types import ALLOW, Policy, PolicyCall, PolicyDecision


@dataclass(frozen=True, slots=True)
class AllowedModels:
    """``allowed_models``: a call whose model, or any of its fallback models, is not in
    the list is denied (names are compared exactly as configured). An entry may name a
    model anywhere (``gpt-4.1-mini``) or on one endpoint (``local/qwen``)."""

    models: frozenset[str]
    name: str = "allowed_models"

    def decide(self, call: PolicyCall) -> PolicyDecision:
        if call.targets:
            outside = [
                str(t)
                for t in call.targets
                if t.model not in self.models and str(t) not in self.models
            ]
        else:
            outside = [model for model in call.models if model not in self.models]
        if not outside:
            return ALLOW
        listed = ", ".join(repr(m) for m in sorted(self.models))
        which = "model" if len(outside) == 1 else "models"
        return PolicyDecision.deny(
            f"{which} {', '.join(repr(m) for m in outside)} not in [policy] allowed_models "
            f"({listed})"
        )


@dataclass(frozen=True, slots=True)
class ApproveAboveUsd:
    """``approve_above_usd``: a tick whose estimated cost exceeds it (or cannot be
    estimated: a model has no price) asks a person once, before its first call."""

    limit_usd: float
    name: str = "approve_above_usd"

    def decide(self, call: PolicyCall) -> PolicyDecision:
        estimate = call.tick_cost_usd
        if estimate is not None and estimate <= self.limit_usd:
            return ALLOW
        if estimate is None:
            cost = f"an unknown cost (no price for {', '.join(call.tick_unpriced)})"
        else:
            cost = f"up to ${estimate:.4f}"
        return PolicyDecision.ask(
            f"Tick {call.tick} may cost {cost} for at most {call.tick_calls_planned} calls, "
            f"above [policy] approve_above_usd = ${self.limit_usd:g}. Run it?",
            key=self.name,
        )


@dataclass(frozen=True, slots=True)
class MaxCallsPerEntity:
    """``max_calls_per_entity_per_tick``: calls about one character or location in one
    tick (all phases together) beyond the limit are denied."""

    limit: int
    name: str = "max_calls_per_entity_per_tick"

    def decide(self, call: PolicyCall) -> PolicyDecision:
        if call.entity_id is None or call.calls_for_entity < self.limit:
            return ALLOW
        return PolicyDecision.deny(
            f"{call.entity_id} reached [policy] max_calls_per_entity_per_tick = {self.limit} "
            "this tick"
        )


def builtin_policies(config: PolicyConfig) -> list[Policy]:
    """The built-in policies ``[policy]`` turns on: allowed models, the per-entity call
    limit, then the cost approval (a person is asked only about calls the others let by)."""
    out: list[Policy] = []
    if config.allowed_models:
        out.append(AllowedModels(frozenset(config.allowed_models)))
    if config.max_calls_per_entity_per_tick:
        out.append(MaxCallsPerEntity(config.max_calls_per_entity_per_tick))
    if config.approve_above_usd:
        out.append(ApproveAboveUsd(config.approve_above_usd))
    return out
