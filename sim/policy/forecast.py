"""A tick's calls counted ahead, for the estimate ``approve_above_usd`` asks about.

Counted from the world at the start of the tick: intentions one call per character (tools
mode: up to ``max_tool_steps + 1``), resolution and narrative one per occupied location,
memory one per character whose memory will overflow, reflection and planning at most one
per character, conversation ``max_turns`` per conversation (at most one per pair of
characters, and ``max_conversations_per_tick``), a declared phase one per subject.
Phases from packages cannot be counted ahead and are named as not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sim.config import Config, routing
from sim.llm.budget import Cost, price_usage, priced_model
from sim.llm.types import Usage
from sim.phases import PhaseSpec
from sim.providers import find_profile
from sim.world import World


@dataclass(frozen=True, slots=True)
class PlannedPhase:
    """One LLM phase of the tick: the most calls it will make, on which model."""

    name: str
    calls: int
    model: str
    max_output_tokens: int
    #: the endpoint the model runs on (for prices keyed by provider)
    provider: str = ""


@dataclass(frozen=True, slots=True)
class TickPlan:
    """The tick's LLM calls counted ahead (``unplanned``: phases that could not be)."""

    tick: int
    phases: tuple[PlannedPhase, ...] = ()
    unplanned: tuple[str, ...] = ()
    #: (endpoint name, kind) of every endpoint the phases' models run on
    kinds: tuple[tuple[str, str], ...] = ()

    def priced_model(self, model: str, provider: str) -> str:
        """The model a call to ``model`` on endpoint ``provider`` is priced as: the offline
        provider's calls as the model it answers as (``offline``, $0 by default), any
        other by its own name (``sim.llm.budget.priced_model``)."""
        kind = find_profile(dict(self.kinds).get(provider, ""))
        return priced_model(kind.answers_as if kind is not None else "", model)

    @property
    def calls(self) -> int:
        return sum(p.calls for p in self.phases)

    def estimate(self, input_tokens: int, prices: Mapping[str, Any]) -> Cost:
        """The worst case: every planned call with ``input_tokens`` of input and all its
        phase's ``max_output_tokens``, at ``prices`` (unknown where a model has none)."""
        total = Cost()
        for phase in self.phases:
            usage = Usage(
                input_tokens=input_tokens * phase.calls,
                output_tokens=phase.max_output_tokens * phase.calls,
            )
            model = self.priced_model(phase.model, phase.provider)
            total = total + price_usage(usage, model, prices, provider=phase.provider)
        return total


def _overflowing(world: World) -> int:
    """Characters whose memory will overflow once this tick's apply adds a cell."""
    count = 0
    for char in world.characters.values():
        memory = char.get("memory") or {}
        if len(memory.get("cells") or ()) + 1 > int(memory.get("capacity") or 0):
            count += 1
    return count


def plan_tick(world: World, config: Config, phases: Sequence[PhaseSpec]) -> TickPlan:
    """Count the calls each phase of the next tick will make at most."""
    characters = len(world.characters)
    planned: list[PlannedPhase] = []
    unplanned: list[str] = []
    for spec in phases:
        name = spec.name
        if name == "apply":
            continue
        if name == "intentions":
            steps = config.phase1.max_tool_steps + 1 if config.phase1.mode == "tools" else 1
            calls = characters * steps
        elif name in ("resolution", "narrative"):
            calls = len(world.characters_at())
        elif name == "memory":
            calls = _overflowing(world)
        elif name in ("reflection", "planning"):
            calls = characters  # at most each character once
        elif name == "conversation":
            talks = min(config.conversation.max_conversations_per_tick, characters // 2)
            calls = talks * config.conversation.max_turns
        elif spec.declared is not None:
            per = spec.declared.per
            calls = characters if per == "character" else 1
            if per == "location":
                calls = len(world.locations)
        else:
            unplanned.append(name)
            continue
        settings = config.call_settings(name)  # the model as it runs: "local/qwen" -> qwen
        planned.append(
            PlannedPhase(name, calls, settings.model, settings.max_output_tokens, settings.provider)
        )
    kinds = tuple((name, spec.kind) for name, spec in routing(config).endpoints.items())
    return TickPlan(world.tick + 1, tuple(planned), tuple(unplanned), kinds)
