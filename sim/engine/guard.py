"""When a tick must not be committed: configuration errors, budget stops, too many failures."""

from __future__ import annotations

from sim.errors import RunFailed
from sim.llm.budget import Budget
from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError
from sim.llm.events import LLMEvent
from sim.phases.base import PhaseReport


class PhaseGuard:
    """An event sink that remembers stopping errors, and the check run after each phase.

    A configuration error or a budget stop aborts the tick; so does a phase that lost more
    than ``max_failed_fraction`` of its calls after all recovery (rather than saving a world
    made of fallbacks). The runner raises before committing, so nothing is written.
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
        # a phase with several calls per entity fails by entity, not by call
        total, unit = (report.entities, "entities") if report.entities else (report.calls, "calls")
        if total and report.failures / total > self.max_failed_fraction:
            reasons = sorted({reason.split(":", 1)[0] for reason in report.errors.values()})
            raise RunFailed(
                f"phase {report.name}: {report.failures} of {total} {unit} failed "
                f"after recovery ({', '.join(reasons)}), more than max_failed_fraction = "
                f"{self.max_failed_fraction}; the tick was not committed and can be re-run"
            )
