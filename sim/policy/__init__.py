"""Policy gates: what decides, before each LLM call, whether it is sent (docs/policies.md).

A policy is any object with a ``name`` and ``decide(call: PolicyCall) -> PolicyDecision``
(the ``Policy`` protocol). Built-ins come from ``[policy]`` (``allowed_models``,
``approve_above_usd``, ``max_calls_per_entity_per_tick``); others from installed packages
through the ``sim.policies`` entry-point group, turned on by ``[policy] custom``. The engine
puts the gate (``sim.policy.gate``) around each tick's adapters; the LLM layer knows
nothing of it.

A custom policy::

    from sim.policy import PolicyCall, PolicyDecision

    class NoBigModels:
        name = "no_big_models"

        def decide(self, call: PolicyCall) -> PolicyDecision:
            if call.model.startswith("gpt-4.1") and "mini" not in call.model:
                return PolicyDecision.deny("the full model is not for this world")
            return PolicyDecision.allow()

Owns: the gate, the built-in policies, the ``sim.policies`` group, the tick's forecast
of its calls (``forecast``).

May import: ``sim.config``, ``sim.errors``, ``sim.llm``, ``sim.phases`` (the forecast counts
the phases' calls), ``sim.plugins``, ``sim.providers`` (a kind's profile), ``sim.ticklog``,
``sim.world``.

Next: a built-in policy is a class in ``builtin`` with its ``[policy]`` key; any other goes
in the ``sim.policies`` entry-point group.
"""

from __future__ import annotations

from sim.config import Config
from sim.policy.builtin import AllowedModels, ApproveAboveUsd, MaxCallsPerEntity, builtin_policies
from sim.policy.plugins import GROUP, load_policies
from sim.policy.types import (
    Approval,
    ApprovalRefused,
    Approver,
    Policy,
    PolicyCall,
    PolicyDecision,
    PolicyDeferred,
    PolicyDenied,
    PolicyError,
    PolicyRefused,
    TickDeferred,
    TickHalted,
    nobody,
)


def configured_policies(config: Config) -> list[Policy]:
    """The policies a config turns on: the built-ins, then ``[policy] custom`` in order.

    Raises:
        InputError: a custom policy that is not installed or does not load.
    """
    return [*builtin_policies(config.policy), *load_policies(config.policy.custom)]


__all__ = [
    "GROUP",
    "AllowedModels",
    "Approval",
    "ApprovalRefused",
    "ApproveAboveUsd",
    "Approver",
    "MaxCallsPerEntity",
    "Policy",
    "PolicyCall",
    "PolicyDecision",
    "PolicyDeferred",
    "PolicyDenied",
    "PolicyError",
    "PolicyRefused",
    "TickDeferred",
    "TickHalted",
    "configured_policies",
    "load_policies",
    "nobody",
]
