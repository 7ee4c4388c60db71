"""The gate: every call of a tick passes its policies before it is sent.

``TickPolicy`` holds one tick's state (calls let through per entity, the cost estimate,
answers a person gave, a stop) and decides each call; ``PolicyGate`` is the adapter
wrapper the runner puts outermost around the tick's adapters (one per endpoint, one
shared ``TickPolicy``). It sits above the resume replay the tick recorder adds,
so every call of a run passes it, including calls a resume answers from the log, and a
denied call is logged as a failed call with the decision before it.

What the decisions do:

- allow: the call is sent;
- deny: the call fails with ``PolicyDenied`` (not sent); the phase falls back for its
  entity, or with ``llm_failure_policy = "fail"`` the tick stops (``sim.engine.guard``);
- defer: the call fails with ``PolicyDeferred`` and so does every later call of the tick
  (not sent); the tick stops uncommitted and the next run resumes it;
- ask: the approver is asked once per key (under a lock, so parallel calls wait for the
  one answer); approved, the call is sent; refused, as defer but ``PolicyRefused``.

Several policies: any deny wins, then any defer, then every ask must be approved.
Only decisions that are not "allow" are recorded. In replay (``sim replay``) no policy is
consulted and no one is asked: the denials the log recorded are reproduced by request id.

The LLM layer knows nothing of this: the gate is an ordinary ``AdapterWrapper`` that the
engine adds, and reads the call's name from the request (``ModelRequest.call``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sim.llm.budget import estimate_usage, price_usage
from sim.llm.errors import LLMConfigurationError, LLMError
from sim.llm.recovery import candidates
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.llm.wrapper import AdapterWrapper
from sim.policy.forecast import TickPlan
from sim.policy.types import (
    Approver,
    Policy,
    PolicyCall,
    PolicyDecision,
    PolicyDeferred,
    PolicyDenied,
    PolicyError,
    PolicyRefused,
    TickHalted,
    nobody,
)
from sim.ticklog.records import PolicyRecord

DecisionSink = Callable[[PolicyRecord], None]


class TickPolicy:
    """One tick's gate state and decisions.

    Args:
        policies: asked in order for every call.
        plan: the tick's calls counted ahead (for the cost estimate).
        prices: the price table (``[prices]``).
        approver: asks a person (default: nobody, so every ask is refused).
        record: receives each decision that is not "allow" (the tick log).
        approved: ask keys already approved in an earlier run of this tick (a resume
            does not ask again).
        replay: reproduce these recorded decisions instead of deciding (``sim replay``).
    """

    def __init__(
        self,
        policies: Sequence[Policy],
        plan: TickPlan,
        prices: Mapping[str, Any],
        *,
        approver: Approver = nobody,
        record: DecisionSink | None = None,
        approved: Iterable[str] = (),
        replay: Sequence[PolicyRecord] | None = None,
    ) -> None:
        self.policies = list(policies)
        self.plan = plan
        self.prices = prices
        self.approver = approver
        self.record = record or (lambda _record: None)
        self.answers: dict[str, bool] = dict.fromkeys(approved, True)
        self.replay = (
            None if replay is None else {r.request_id: r for r in replay if r.decision == "deny"}
        )
        self.per_entity: dict[str, int] = {}
        self.calls = 0
        self.halted: PolicyError | None = None
        self._tick_cost: tuple[float | None, tuple[str, ...]] | None = None
        self._price_cache: dict[str, Any] = {}
        self._lock: asyncio.Lock | None = None

    @property
    def active(self) -> bool:
        """Whether any call could be stopped (else the runner leaves the gate out)."""
        return bool(self.policies) or self.replay is not None

    def wrap(self, adapter: Adapter) -> Adapter:
        return PolicyGate(adapter, self)

    def halt(self, cause: LLMError) -> None:
        """Stop the tick: every later call fails without being sent (the first cause wins)."""
        if self.halted is not None:
            return
        if isinstance(cause, (PolicyDeferred, PolicyRefused, TickHalted)):
            self.halted = cause
        else:
            self.halted = TickHalted(f"not sent: the tick is stopping after {cause.code}: {cause}")

    # -- deciding --------------------------------------------------------------------------

    async def admit(self, request: ModelRequest) -> None:
        """Let the call through, or raise why not.

        Raises:
            PolicyDenied, PolicyDeferred, PolicyRefused, TickHalted: not sent.
            LLMConfigurationError: a policy raised or answered something else than a
                ``PolicyDecision`` (the tick stops: a broken gate fails closed).
        """
        if self.halted is not None:
            raise _again(self.halted)
        call = self._call(request)
        if self.replay is not None:
            recorded = self.replay.get(call.request_id)
            if recorded is not None:
                self.record(recorded)
                raise PolicyDenied(
                    f"denied by {recorded.policy}: {recorded.reason}", policy=recorded.policy
                )
            return
        decisions = [(policy.name, self._decide(policy, call)) for policy in self.policies]
        for name, decision in decisions:
            if decision.kind == "deny":
                self._note(call, name, decision)
                raise PolicyDenied(f"denied by {name}: {decision.reason}", policy=name)
        for name, decision in decisions:
            if decision.kind == "defer":
                until = decision.until_text()
                self._note(call, name, decision, until=until)
                when = f" until {until}" if until else ""
                error = PolicyDeferred(
                    f"deferred by {name}{when}: {decision.reason}", policy=name, until=until
                )
                self.halt(error)
                raise error
        for name, decision in decisions:
            if decision.kind == "ask":
                await self._ask(call, name, decision)
        self.calls += 1
        if call.entity_id is not None:
            self.per_entity[call.entity_id] = call.calls_for_entity + 1

    def _decide(self, policy: Policy, call: PolicyCall) -> PolicyDecision:
        try:
            decision = policy.decide(call)
        except Exception as exc:  # a broken plugin stops the tick, by name
            error = LLMConfigurationError(f"policy {policy.name!r} failed deciding: {exc!r}")
        else:
            if isinstance(decision, PolicyDecision):
                return decision
            error = LLMConfigurationError(
                f"policy {policy.name!r} answered {decision!r}, not a PolicyDecision"
            )
        self.halt(TickHalted(str(error)))
        raise error

    async def _ask(self, call: PolicyCall, name: str, decision: PolicyDecision) -> None:
        key = decision.key or decision.question
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # parallel calls wait for the one answer
            if self.halted is not None:
                raise _again(self.halted)
            if key not in self.answers:
                answer = self.approver(decision.question)
                self.answers[key] = answer.approved
                self._note(
                    call,
                    name,
                    decision,
                    key=key,
                    answer="approved" if answer.approved else "refused",
                    by=answer.by,
                )
                if not answer.approved:
                    note = f"; {answer.note}" if answer.note else ""
                    self.halt(
                        PolicyRefused(
                            f"{name} asked and was refused ({answer.by}): "
                            f"{decision.question}{note}",
                            policy=name,
                        )
                    )
        if not self.answers[key]:
            assert self.halted is not None
            raise _again(self.halted)

    def _note(self, call: PolicyCall, name: str, decision: PolicyDecision, **fields: Any) -> None:
        self.record(
            PolicyRecord(
                request_id=call.request_id,
                phase=call.phase,
                entity_key=call.entity_key,
                policy=name,
                decision=decision.kind,  # never "allow" here
                reason=decision.reason or decision.question,
                **fields,
            )
        )

    def _call(self, request: ModelRequest) -> PolicyCall:
        ident = request.call
        phase = ident.phase if ident is not None else ""
        key = ident.entity_key if ident is not None else None
        entity = key.partition(":")[2] or None if key else None
        settings = request.settings
        usage = estimate_usage(request)
        priced = self.plan.priced_model(settings.model, settings.provider)
        cost = price_usage(
            usage, priced, self.prices, self._price_cache, provider=settings.provider
        )
        targets = tuple(candidates(settings))
        if self._tick_cost is None:  # the first call's input stands for every call's
            estimate = self.plan.estimate(usage.input_tokens, self.prices)
            self._tick_cost = (estimate.value, tuple(sorted(estimate.unpriced)))
        return PolicyCall(
            tick=self.plan.tick,
            phase=phase,
            entity_key=key,
            entity_id=entity,
            request_id=ident.request_id if ident is not None else "",
            model=settings.model,
            fallback_models=tuple(t.model for t in targets[1:]),
            estimated_usage=usage,
            estimated_cost_usd=cost.value,
            calls_for_entity=self.per_entity.get(entity, 0) if entity else 0,
            calls_in_tick=self.calls,
            tick_calls_planned=self.plan.calls,
            tick_cost_usd=self._tick_cost[0],
            tick_unpriced=self._tick_cost[1],
            targets=targets,
        )


def _again(halted: PolicyError) -> PolicyError:
    """A fresh error like the one that halted the tick, for a later call."""
    if isinstance(halted, PolicyDeferred):
        return PolicyDeferred(halted.message, policy=halted.policy, until=halted.until)
    return type(halted)(halted.message, policy=halted.policy)


class PolicyGate(AdapterWrapper):
    """The adapter wrapper: ``TickPolicy.admit`` before every call."""

    def __init__(self, inner: Adapter, policy: TickPolicy) -> None:
        super().__init__(inner)
        self.policy = policy

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        await self.policy.admit(request)
        return await self.inner.execute(request)
