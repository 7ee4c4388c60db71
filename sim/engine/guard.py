"""When a tick must not be committed: configuration errors, budget stops, too many failures.

Only infrastructure failures count toward aborting a tick: the endpoint did not answer
(timeouts, 5xx, connection errors, rate limits that outlasted every retry, an open
breaker). Content failures (a refusal, an answer still invalid after schema feedback, a
truncated answer, a prompt too long) fall back for their entity and never abort: re-running
the tick would mostly ask the same model the same thing. And a phase aborts only when at
least ``MIN_FAILED_CALLS`` calls failed, so one failure in a two-call phase does not.
"""

from __future__ import annotations

from sim.errors import RunFailed
from sim.llm.budget import Budget
from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError
from sim.llm.events import LLMEvent
from sim.phases.base import PhaseReport

#: error codes of content failures: the model answered, but not usably
CONTENT_FAILURES = frozenset(
    {"refusal", "schema_error", "incomplete", "context_length", "tool_error", "unknown_tool"}
)
#: the absolute floor: fewer infrastructure failures than this never abort a phase
MIN_FAILED_CALLS = 2


def infrastructure_failures(report: PhaseReport) -> list[str]:
    """The error codes of the phase's failures that were the infrastructure's fault."""
    codes = [reason.split(":", 1)[0] for reason in report.errors.values()]
    return [code for code in codes if code not in CONTENT_FAILURES]


class PhaseGuard:
    """An event sink that remembers stopping errors, and the check run after each phase.

    A configuration error or a budget stop aborts the tick; so does a phase that lost more
    than ``max_failed_fraction`` of its calls to infrastructure failures after all recovery
    (rather than saving a world made of fallbacks), and at least ``MIN_FAILED_CALLS`` of
    them. The runner raises before committing, so nothing is written.
    """

    def __init__(self, max_failed_fraction: float) -> None:
        self.max_failed_fraction = max_failed_fraction
        self.fatal: LLMError | None = None

    def __call__(self, event: LLMEvent) -> None:
        if (
            event.final
            and event.kind == "llm_failed"
            and self.fatal is None
            and isinstance(event.error, (LLMConfigurationError, LLMBudgetExceededError))
        ):
            self.fatal = event.error

    def check(self, report: PhaseReport, budget: Budget | None = None) -> None:
        """Raise if the tick must stop after this phase.

        Raises:
            LLMConfigurationError: a call was rejected for a setting the user must fix.
            LLMBudgetExceededError: a budget cap was reached (message says what was spent).
            RunFailed: too many of the phase's calls failed.
        """
        if self.fatal is not None:
            if self.fatal.code == LLMBudgetExceededError.default_code and budget is not None:
                raise LLMBudgetExceededError(
                    f"budget reached in phase {report.name}: {budget.summary()}",
                    cause=self.fatal,
                )
            raise self.fatal
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
