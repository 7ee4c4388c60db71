"""Build the adapter stack from config, and decide when a tick must not be committed.

The stack, innermost first: the provider's adapter -> budget (each attempt reserves its
worst case, priced for the model actually used) -> rate limiter (requests and tokens per
minute) -> recovery (retries, fallback models, breakers). Phases see only the outermost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sim.errors import RunFailed
from sim.llm.adapters import create_adapter
from sim.llm.budget import Budget, BudgetAdapter, Price
from sim.llm.errors import LLMBudgetExceededError, LLMConfigurationError, LLMError
from sim.llm.events import LLMEvent
from sim.llm.ratelimit import RateLimitedAdapter, TokenBucket
from sim.llm.recovery import RecoveryAdapter, RetryPolicy
from sim.llm.types import Adapter

if TYPE_CHECKING:
    from sim.config import Config
    from sim.phases.base import PhaseReport


def provider_options(config: Config, seed: int) -> dict[str, Any]:
    """Constructor options for the configured provider's adapter."""
    llm = config.llm
    if llm.provider == "offline":
        return {"seed": seed}
    return {
        "base_url": llm.base_url or None,
        "api_key_env": llm.api_key_env,
        "timeout_seconds": llm.timeout_seconds,
        "connect_timeout_seconds": llm.connect_timeout_seconds,
        "max_concurrency": llm.max_concurrency,
        "store": llm.chain_mode == "server",
    }


def make_budget(config: Config) -> Budget:
    return Budget(
        max_total_tokens=config.budget.max_total_tokens or None,
        max_cost_usd=config.budget.max_cost_usd or None,
        prices={
            model: Price(p.input, p.cached_input, p.output) for model, p in config.prices.items()
        },
    )


def build_stack(
    config: Config,
    seed: int = 0,
    *,
    provider: Adapter | None = None,
    budget: Budget | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RecoveryAdapter:
    """The full adapter stack for a run.

    Args:
        config: the effective configuration.
        seed: the world seed (offline provider).
        provider: use this provider adapter instead of building one (tests inject one
            around their own ``AsyncOpenAI`` client).
        budget: share this budget (default: a new one from ``[budget]`` and ``[prices]``).
        sleep: how recovery waits between attempts.

    Raises:
        LLMConfigurationError: unknown provider, missing API key.
    """
    llm = config.llm
    inner: Any = provider or create_adapter(llm.provider, **provider_options(config, seed))
    inner = BudgetAdapter(inner, budget or make_budget(config))
    if llm.requests_per_minute or llm.tokens_per_minute:
        inner = RateLimitedAdapter(
            inner,
            TokenBucket(llm.requests_per_minute) if llm.requests_per_minute else None,
            TokenBucket(llm.tokens_per_minute) if llm.tokens_per_minute else None,
        )
    policy = RetryPolicy(
        transient_retries=llm.transient_retries,
        backoff_base_seconds=llm.backoff_base_seconds,
        backoff_cap_seconds=llm.backoff_cap_seconds,
    )
    return RecoveryAdapter(
        inner,
        policy,
        breaker_threshold=llm.breaker_threshold,
        breaker_cooldown=llm.breaker_cooldown_seconds,
        sleep=sleep,
    )


async def close_stack(adapter: object) -> None:
    """Close the HTTP client at the bottom of a stack, on the loop that used it."""
    while adapter is not None:
        close = getattr(adapter, "aclose", None)
        if close is not None:
            await close()
            return
        adapter = getattr(adapter, "inner", None)


def find_budget(adapter: object) -> Budget | None:
    """The budget inside a stack, if any (for reports)."""
    while adapter is not None:
        if isinstance(adapter, BudgetAdapter):
            return adapter.budget
        adapter = getattr(adapter, "inner", None)
    return None


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
        if report.calls and report.failures / report.calls > self.max_failed_fraction:
            reasons = sorted({reason.split(":", 1)[0] for reason in report.errors.values()})
            raise RunFailed(
                f"phase {report.name}: {report.failures} of {report.calls} calls failed "
                f"after recovery ({', '.join(reasons)}), more than max_failed_fraction = "
                f"{self.max_failed_fraction}; the tick was not committed and can be re-run"
            )
