"""When a tick must not be committed: configuration errors, budget stops, policy stops,
``llm_failure_policy = "fail"``, too many failures.

``llm_failure_policy`` (``[llm]``, per phase) decides what a failed or denied call does:
``degrade`` (the default) lets it fall back for its entity, within the abort rules below;
``fail`` stops the tick at the first one of that phase: the guard tells the policy gate to
send nothing more (``on_stop``) and raises after the phase, so nothing is written.
A call a policy denied is never an infrastructure failure; a deferred or refused tick
stops like a budget stop (``sim.policy``).

Two abort rules count failures after all recovery, each over the phase's calls:

- infrastructure failures: the endpoint did not answer (timeouts, 5xx, connection errors,
  rate limits that outlasted every retry, an open breaker). More than
  ``max_failed_fraction`` of the calls, and at least ``MIN_FAILED_CALLS`` of them, abort.
- content failures: the endpoint answered, but not in the expected form (``ANSWER_FAILURES``:
  a refusal, an answer still invalid after schema feedback (wrong ids included), a cut-short
  or empty answer, a bad tool call). An occasional one falls back for its entity; more than
  ``max_content_failed_fraction`` of the calls, and at least ``min_content_failures`` of
  them, abort: a world made of fallbacks is not worth committing, and the message says the
  endpoint is not answering in the expected form.

A prompt too long for the model and a call the policy gate did not send count toward
neither rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sim.errors import RunFailed
from sim.llm.budget import Budget
from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError
from sim.llm.events import LLMEvent
from sim.phases.base import PhaseReport
from sim.policy.types import (
    GATE_CODES,
    ApprovalRefused,
    PolicyDeferred,
    PolicyRefused,
    TickDeferred,
    TickHalted,
)

#: error codes of content failures: the model answered, but not usably; and of calls the
#: policy gate did not send (a decision, not the endpoint's fault)
CONTENT_FAILURES = (
    frozenset(
        {"refusal", "schema_error", "incomplete", "context_length", "tool_error", "unknown_tool"}
    )
    | GATE_CODES
)
#: what each phase does with a failed or denied call: ``degrade`` or ``fail``
FailurePolicies = Mapping[str, str]
#: the absolute floor: fewer infrastructure failures than this never abort a phase
MIN_FAILED_CALLS = 2
#: error codes of answers that came back but not in the expected form: the content
#: failures the second abort rule counts
ANSWER_FAILURES = frozenset({"refusal", "schema_error", "incomplete", "tool_error", "unknown_tool"})


def infrastructure_failures(report: PhaseReport) -> list[str]:
    """The error codes of the phase's failures that were the infrastructure's fault."""
    codes = [reason.split(":", 1)[0] for reason in report.errors.values()]
    return [code for code in codes if code not in CONTENT_FAILURES]


def answer_failures(report: PhaseReport) -> list[str]:
    """The error codes of the phase's failures where an answer came back unusable."""
    codes = [reason.split(":", 1)[0] for reason in report.errors.values()]
    return [code for code in codes if code in ANSWER_FAILURES]


class PhaseGuard:
    """An event sink that remembers stopping errors, and the check run after each phase.

    A configuration error or a budget stop aborts the tick; so does a phase that lost more
    than ``max_failed_fraction`` of its calls to infrastructure failures after all recovery
    (rather than saving a world made of fallbacks), and at least ``MIN_FAILED_CALLS`` of
    them; and one where more than ``max_content_failed_fraction`` of the calls, and at
    least ``min_content_failures``, came back unusable (``ANSWER_FAILURES``). The runner
    raises before committing, so nothing is written.
    """

    def __init__(
        self,
        max_failed_fraction: float,
        failure_policies: FailurePolicies | None = None,
        on_stop: Callable[[LLMError], None] | None = None,
        *,
        max_content_failed_fraction: float = 0.5,
        min_content_failures: int = 3,
    ) -> None:
        self.max_failed_fraction = max_failed_fraction
        self.max_content_failed_fraction = max_content_failed_fraction
        self.min_content_failures = max(1, min_content_failures)
        self.failure_policies = dict(failure_policies or {})
        self.on_stop = on_stop
        self.fatal: LLMError | None = None
        #: the first failed or denied call of a phase whose policy is ``fail``
        self.failed: tuple[str, str | None, LLMError] | None = None

    def __call__(self, event: LLMEvent) -> None:
        if not event.final or event.kind != "llm_failed" or event.error is None:
            return
        error = event.error
        if self.fatal is None and isinstance(
            error,
            (LLMConfigurationError, LLMBudgetExceededError, PolicyDeferred, PolicyRefused),
        ):
            self.fatal = error
        elif (
            self.failed is None
            and not isinstance(error, TickHalted)
            and self.failure_policies.get(event.phase) == "fail"
        ):
            self.failed = (event.phase, event.entity_key, error)
            if self.on_stop is not None:
                self.on_stop(error)  # nothing more is sent this tick

    def check(self, report: PhaseReport, budget: Budget | None = None) -> None:
        """Raise if the tick must stop after this phase.

        Raises:
            LLMConfigurationError: a call was rejected for a setting the user must fix.
            LLMBudgetExceededError: a budget cap was reached (message says what was spent).
            TickDeferred: a policy deferred the tick (resumable; says until when).
            ApprovalRefused: a policy asked a person, who refused or could not be asked.
            RunFailed: a call of a ``fail`` phase failed, or too many of the phase's
                calls failed (on the infrastructure, or on content).
        """
        resume = "calls already made are kept in its log and not paid for again"
        if isinstance(self.fatal, PolicyDeferred):
            after = f" after {self.fatal.until}" if self.fatal.until else ""
            raise TickDeferred(
                f"{self.fatal}. Nothing was committed; run `sim tick` again{after} to resume "
                f"the tick ({resume})",
                self.fatal.until,
            )
        if isinstance(self.fatal, PolicyRefused):
            raise ApprovalRefused(
                f"{self.fatal}. Nothing was committed; the next `sim tick` resumes the tick "
                f"and asks again ({resume})"
            )
        if self.fatal is not None:
            if self.fatal.code == LLMBudgetExceededError.default_code and budget is not None:
                raise LLMBudgetExceededError(
                    f"budget reached in phase {report.name}: {budget.summary()}",
                    cause=self.fatal,
                )
            raise self.fatal
        if self.failed is not None:
            phase, key, error = self.failed
            raise RunFailed(
                f"phase {phase}: the call for {key or 'the phase'} failed ({error.code}: "
                f'{error}) and llm_failure_policy = "fail"; the tick was not committed '
                f"and can be re-run ({resume})"
            )
        failed = infrastructure_failures(report)
        first = next(
            (
                reason
                for reason in report.errors.values()
                if reason.split(":", 1)[0] not in CONTENT_FAILURES
            ),
            "",
        )
        # a phase with several calls per entity fails by entity, not by call
        total, unit = (report.entities, "entities") if report.entities else (report.calls, "calls")
        if (
            total
            and len(failed) >= MIN_FAILED_CALLS
            and len(failed) / total > self.max_failed_fraction
        ):
            reasons = sorted(set(failed))
            raise RunFailed(
                f"phase {report.name}: {len(failed)} of {total} {unit} failed "
                f"after recovery ({', '.join(reasons)}), more than max_failed_fraction = "
                f"{self.max_failed_fraction}; the tick was not committed and can be re-run. "
                f"First: {first.split(': ', 1)[-1]}"
            )
        self._check_content(report, total, unit)

    def _check_content(self, report: PhaseReport, total: int, unit: str) -> None:
        """Raise when most of the phase's answers came back unusable."""
        failed = answer_failures(report)
        if (
            not total
            or len(failed) < self.min_content_failures
            or len(failed) / total <= self.max_content_failed_fraction
        ):
            return
        counts: dict[str, int] = {}
        for code in failed:
            counts[code] = counts.get(code, 0) + 1
        named = ", ".join(f"{n} {code}" for code, n in sorted(counts.items()))
        first = next(
            reason
            for reason in report.errors.values()
            if reason.split(":", 1)[0] in ANSWER_FAILURES
        )
        raise RunFailed(
            f"phase {report.name}: the endpoint is not answering in the expected form: "
            f"{len(failed)} of {total} {unit} came back unusable ({named}), more than "
            f"max_content_failed_fraction = {self.max_content_failed_fraction}; the tick was "
            f"not committed. Check the model and its structured-output setting "
            f"([llm] structured_output, docs/providers.md). First: {first}"
        )
