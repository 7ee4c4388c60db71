"""What policies decide with and what they decide: ``PolicyCall`` in, ``PolicyDecision`` out.

Also the errors a gated call fails with (``LLMError`` subclasses, so a phase handles a
denial like any failed call), the run errors a stopped tick ends with, and the ``Approver``
a person answers an ``ask`` through.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol, runtime_checkable

from sim.errors import RunError, RunFailed
from sim.llm.errors import LLMError
from sim.llm.types import ModelTarget, Usage

DecisionKind = Literal["allow", "deny", "defer", "ask"]


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """One policy's answer about one call. Build it with the class methods.

    Attributes:
        kind: ``allow``; ``deny`` (this call is not sent); ``defer`` (not now: the tick
            stops uncommitted and resumes on the next ``sim tick``); ``ask`` (a person
            approves or refuses; refused, the tick stops uncommitted).
        reason: why, for a person (``deny``, ``defer``).
        until: ``defer``: when the tick may run again, if the policy knows (a naive
            datetime is taken as UTC).
        question: ``ask``: what the person is asked (a y/N question).
        key: ``ask``: the answer is remembered under this key for the rest of the tick,
            and across its resumes (default: the question), so a person is asked once.
    """

    kind: DecisionKind = "allow"
    reason: str = ""
    until: datetime | None = None
    question: str = ""
    key: str = ""

    @classmethod
    def allow(cls) -> PolicyDecision:
        return ALLOW

    @classmethod
    def deny(cls, reason: str) -> PolicyDecision:
        return cls("deny", reason=reason)

    @classmethod
    def defer(cls, reason: str, until: datetime | None = None) -> PolicyDecision:
        return cls("defer", reason=reason, until=until)

    @classmethod
    def ask(cls, question: str, key: str = "") -> PolicyDecision:
        return cls("ask", question=question, key=key or question)

    def until_text(self) -> str | None:
        """``until`` as ISO 8601 in UTC, to the second (what the log and messages show)."""
        return iso_utc(self.until) if self.until is not None else None


ALLOW = PolicyDecision()


def iso_utc(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class PolicyCall:
    """Everything a policy may decide one call by, as the gate sees it before sending.

    Attributes:
        tick: the tick the call belongs to.
        phase: the phase making it (``intentions``, a declared phase's name...).
        entity_key: its chain key (``intention:ada``), ``None`` for an independent call.
        entity_id: the character or location it is about (``ada``), if any.
        request_id: ``{tick}:{phase}:{entity_key}:{n}``, as the tick log names it.
        model: the model asked for.
        fallback_models: the models recovery may try after it (the call may use any).
        targets: the model, then each fallback model, with the endpoint each runs on
            (``ModelTarget``: ``openai/gpt-4.1-mini``, ``local/qwen``).
        estimated_usage: this call's worst case: estimated input, all its output tokens.
        estimated_cost_usd: that worst case at the configured prices (``None``: a model
            has no price).
        calls_for_entity: calls already let through this tick about the same entity, in
            every phase (``intention:ada`` and ``memory:ada`` are both Ada's).
        calls_in_tick: calls already let through this tick.
        tick_calls_planned: the most calls the tick's phases will make (counted ahead from
            the world; phases from packages are not counted).
        tick_cost_usd: the tick's estimated worst-case cost (``None``: unknown, a model
            has no price): each planned call at its phase's model and
            ``max_output_tokens``, with this call's estimated input.
        tick_unpriced: the models the estimate could not price.
    """

    tick: int
    phase: str
    entity_key: str | None
    entity_id: str | None
    request_id: str
    model: str
    fallback_models: tuple[str, ...]
    estimated_usage: Usage
    estimated_cost_usd: float | None
    calls_for_entity: int
    calls_in_tick: int
    tick_calls_planned: int
    tick_cost_usd: float | None
    tick_unpriced: tuple[str, ...] = ()
    targets: tuple[ModelTarget, ...] = ()

    @property
    def models(self) -> tuple[str, ...]:
        """Every model the call may use: its own, then its fallbacks (no repeats)."""
        return tuple(dict.fromkeys((self.model, *self.fallback_models)))


@runtime_checkable
class Policy(Protocol):
    """A gate every LLM call passes before it is sent (docs/policies.md).

    ``decide`` is called once per call, before it is sent, with the call's facts; it must
    be quick and must not block (it runs on the engine's event loop) and should decide
    the same way for the same facts, so a resumed tick decides as the interrupted one did.
    It keeps no per-tick state of its own: counts and estimates come in ``PolicyCall``.
    """

    @property
    def name(self) -> str:
        """The policy's name (the log and messages say which policy decided)."""
        ...

    def decide(self, call: PolicyCall) -> PolicyDecision: ...


@dataclass(frozen=True, slots=True)
class Approval:
    """A person's answer to an ``ask``: approved or not, by whom or what (``terminal``,
    ``--yes``, ``no terminal``), and for a refusal what to do about it."""

    approved: bool
    by: str
    note: str = ""


class Approver(Protocol):
    """Asks a person a y/N question (``sim tick``: a prompt on a terminal, ``--yes``)."""

    def __call__(self, question: str) -> Approval: ...


def nobody(question: str) -> Approval:
    """The approver when none is given: every ask is refused (a library run has no one
    to ask)."""
    return Approval(False, "no approver", "no one to ask; pass an approver (sim tick --yes)")


# -- what a gated call fails with ------------------------------------------------------------


class PolicyError(LLMError):
    """Base of the failures the gate makes: the call was not sent.

    Args:
        policy: the policy that decided (``allowed_models``, an entry point's name).
    """

    default_code = "policy"

    def __init__(self, message: str, *, policy: str = "", **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.policy = policy


class PolicyDenied(PolicyError):
    """A policy denied the call: it was not sent (its entity falls back, or with
    ``llm_failure_policy = "fail"`` the tick stops)."""

    default_code = "policy_denied"


class PolicyDeferred(PolicyError):
    """A policy deferred the call: the tick stops uncommitted, resumable after ``until``."""

    default_code = "policy_deferred"

    def __init__(self, message: str, *, until: str | None = None, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.until = until


class PolicyRefused(PolicyError):
    """A person refused (or could not be asked) what a policy asked: the tick stops."""

    default_code = "policy_refused"


class TickHalted(PolicyError):
    """The tick is stopping (``llm_failure_policy = "fail"`` after a failed call): this
    call was not sent."""

    default_code = "tick_halted"


#: error codes of calls the gate did not send (never an infrastructure failure)
GATE_CODES = frozenset(
    {
        PolicyDenied.default_code,
        PolicyDeferred.default_code,
        PolicyRefused.default_code,
        TickHalted.default_code,
    }
)


# -- how a stopped tick ends -----------------------------------------------------------------


class TickDeferred(RunError):
    """A policy deferred the tick: nothing was committed; the next ``sim tick`` resumes it
    (calls already made are taken from its log). Exit code 75 (``EX_TEMPFAIL``: try later).
    """

    exit_code = 75

    def __init__(self, message: str, until: str | None = None) -> None:
        super().__init__(message)
        self.until = until


class ApprovalRefused(RunFailed):
    """A policy asked a person and the answer was no (or nobody could answer)."""
