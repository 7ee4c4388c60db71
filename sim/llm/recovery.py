"""Recovery: retries, backoff, schema feedback, fallback models, circuit breakers.

A wrapper around any adapter (STYLE #6), implementing spec 000's table exactly:

| error                                   | what happens                                    |
| --------------------------------------- | ----------------------------------------------- |
| schema error (or the request's answer   | retry with the validation error fed back,       |
| check failed: a wrong id)               | ``json_max_retries`` times (spec 000: 2)        |
| rate limit (429)                        | wait Retry-After (else backoff), retry, x2      |
| timeout, 5xx, connection error          | backoff, retry (``transient_retries`` times)    |
| auth, bad request, context length,      | fail at once                                    |
| refusal, incomplete, budget, lost chain |                                                 |

Backoff is exponential with full jitter, capped. When a model still fails with a retryable
error after its retries, or its circuit breaker is open, the phase's ``fallback_models``
are tried in order (spec 003), each on its own endpoint (``ModelTarget``: a fallback may
run on another provider), the candidates deduplicated by (provider, model) with the model's
case and surrounding whitespace ignored. A breaker per ``llm:{provider}:{model}`` (spec
003's key) opens after K consecutive 5xx answers, fails fast while open and lets one probe
through after a cool-down. Rate
limits and timeouts never count toward it: they are the provider asking the client to slow
down, which ``sim.llm.backpressure`` does (an adaptive concurrency limit and a shared pause
per endpoint); an endpoint that refuses connections is detected there too, by its URL.
A timeout is also a failure of that call, not of the endpoint: calls queued behind a busy
local server time out while it is healthy, so timeouts are retried but leave the breaker
as it is. Schema errors and refusals say nothing about the provider's health either.

Every attempt is recorded (model, attempt number, usage, latency, error code, server) in
``response.attempts`` or ``error.attempts``, so the client can emit one event per attempt
and every attempt's usage is counted; attempts a pool of servers moved elsewhere
(``sim.llm.pool``) are recorded among them but are not retries here. Each retry or
fallback is the caller's ``ModelRequest`` changed with ``dataclasses.replace``: the schema
feedback appended to its instructions, the fallback model in its settings.

When more than one model was tried, every model's error is kept (``LLMError.model_errors``):
a chain that ran out of models raises ``LLMFallbackExhausted``, which holds them all like an
``ExceptionGroup`` (pydantic-ai's ``FallbackExceptionGroup``); a chain ended by a fatal
error (budget, key, a lost server chain) raises that error, whose type decides what the
caller does, with the earlier models' errors in its ``model_errors``. The tick log keeps
them (``CallRecord.model_errors``) and ``sim log --calls`` shows them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal

from sim.llm.backpressure import EndpointDownError
from sim.llm.calls import with_attempts
from sim.llm.errors import (
    MAX_RETRY_AFTER_SECONDS,
    LLMAPIError,
    LLMChainNotFoundError,
    LLMCircuitOpenError,
    LLMError,
    LLMFallbackExhausted,
    LLMRateLimitError,
    LLMSchemaError,
    LLMTimeoutError,
)
from sim.llm.types import (
    Adapter,
    AdapterResponse,
    Attempt,
    CallSettings,
    ModelRequest,
    ModelTarget,
    Usage,
)
from sim.llm.wrapper import AdapterWrapper

Kind = Literal["schema", "rate_limit", "transient", "fatal"]
Sleep = Callable[[float], Awaitable[None]]

FEEDBACK = (
    "\n\nYour previous answer was rejected: {error}\n"
    "Answer again with JSON that matches the required schema exactly."
)


def breaker_key(adapter: str, model: str) -> str:
    """The name of a model's breaker, spec 003's ``llm:{adapter}:{normalized_model}``: the
    endpoint (``adapter``) and the model with its case and surrounding whitespace ignored."""
    return f"llm:{adapter}:{model.strip().casefold()}"


def classify(error: LLMError) -> Kind:
    """Which row of the recovery table an error belongs to."""
    if isinstance(error, LLMSchemaError):
        return "schema"
    if isinstance(error, LLMRateLimitError):
        return "rate_limit"
    if isinstance(error, LLMTimeoutError):
        return "transient"
    if (
        isinstance(error, LLMAPIError)
        and not isinstance(error, LLMChainNotFoundError)
        and (error.status_code is None or error.status_code >= 500)
    ):
        return "transient"
    return "fatal"


def is_server_failure(error: LLMError) -> bool:
    """An HTTP 5xx: the model's server failed (what opens an ``llm:{provider}:{model}`` breaker).

    Not a 429 or a timeout (backpressure), not a connection error (the endpoint, not the
    model: ``sim.llm.backpressure`` tracks it by URL), not a content failure.
    """
    return (
        isinstance(error, LLMAPIError)
        and not isinstance(error, LLMRateLimitError)
        and (error.status_code or 0) >= 500
    )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many retries and how long to wait. The defaults are spec 000's; the schema count
    is ``[llm] json_max_retries`` (0: an answer that does not fit fails at once)."""

    schema_retries: int = 2
    rate_limit_retries: int = 2
    transient_retries: int = 2
    backoff_base_seconds: float = 0.5
    backoff_cap_seconds: float = 20.0
    max_retry_after_seconds: float = MAX_RETRY_AFTER_SECONDS

    def retries(self, kind: Kind) -> int:
        return {
            "schema": self.schema_retries,
            "rate_limit": self.rate_limit_retries,
            "transient": self.transient_retries,
        }.get(kind, 0)

    def delay(self, retry: int, error: LLMError, rng: Callable[[], float]) -> float:
        """Seconds before retry number ``retry`` (1-based)."""
        if isinstance(error, LLMRateLimitError) and error.retry_after is not None:
            return min(error.retry_after, self.max_retry_after_seconds)
        ceiling = min(self.backoff_cap_seconds, self.backoff_base_seconds * 2.0 ** (retry - 1))
        return rng() * ceiling


class CircuitBreaker:
    """Closed -> open after ``threshold`` consecutive failures -> half-open after ``cooldown``.

    In half-open one probe goes through; its success closes the breaker, its failure
    re-opens it.
    """

    def __init__(
        self,
        threshold: int = 5,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = max(1, threshold)
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    @property
    def state(self) -> Literal["closed", "open", "half_open"]:
        if self.opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self.opened_at >= self.cooldown else "open"

    def allow(self) -> bool:
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self.probing:
            self.probing = True
            return True
        return False

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def failure(self) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = self.clock()
            self.probing = False

    def neutral(self) -> None:
        """An answer that says nothing about the provider's health (schema error, refusal)."""
        self.probing = False


def _add_moved(attempts: list[Attempt], moved: tuple[Attempt, ...], provider: str) -> None:
    """Attempts a pool moved to another server (``sim.llm.pool``), numbered in order and
    named by the endpoint (``provider``) the pool serves: they were sent (and may have
    been billed), but are not retries of this layer."""
    for attempt in moved:
        attempts.append(replace(attempt, attempt=len(attempts) + 1, provider=provider))


def checked(request: ModelRequest, response: AdapterResponse) -> AdapterResponse:
    """``response`` if it passes the request's answer check (``ModelRequest.check``).

    Raises:
        LLMSchemaError: the check found a problem (worded for the model); it carries the
            attempt's usage and answer, like any schema error.
    """
    if request.check is None or request.tools is not None:
        return response
    problem = request.check(response.parsed)
    if problem is None:
        return response
    error = LLMSchemaError(
        problem, model=response.model, usage=response.usage, raw=response.raw[:2000]
    )
    error.endpoint, error.moved = response.endpoint, response.moved
    error.answered_as = response.model  # priced as an accepted answer is
    error.notice = response.notice
    raise error


def with_feedback(request: ModelRequest, error: LLMSchemaError) -> ModelRequest:
    """The request to retry after a schema error: the same, with the error fed back."""
    return replace(
        request, instructions=request.instructions + FEEDBACK.format(error=error.message)
    )


class RecoveryAdapter(AdapterWrapper):
    """Wraps an adapter with the recovery table, fallback models and breakers.

    Args:
        inner: the adapter to call (usually rate-limited and budgeted).
        policy: retry counts and backoff.
        breaker_threshold: consecutive 5xx answers that open a breaker.
        breaker_cooldown: seconds before an open breaker lets a probe through.
        sleep: how to wait between attempts (tests pass a fast fake).
        rng: jitter source in [0, 1).
        clock: monotonic seconds, for breakers.
    """

    def __init__(
        self,
        inner: Adapter,
        policy: RetryPolicy | None = None,
        *,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        sleep: Sleep = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(inner)
        self.policy = policy or RetryPolicy()
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown = breaker_cooldown
        self.sleep = sleep
        self.rng = rng
        self.clock = clock
        self.breakers: dict[str, CircuitBreaker] = {}
        #: each (model, provider) as spelled in a request -> its breaker (one per call)
        self._breaker_of: dict[tuple[str, str], CircuitBreaker] = {}
        #: the candidates of the settings last seen (a phase sends one settings object
        #: with every call): those settings and their targets
        self._candidates: tuple[CallSettings, tuple[ModelTarget, ...]] | None = None

    def breaker(self, model: str, provider: str = "") -> CircuitBreaker:
        """The breaker of one model on one endpoint (``provider``; "": this stack's)."""
        found = self._breaker_of.get((model, provider))
        if found is not None:
            return found
        key = breaker_key(provider or self.name, model)
        breaker = self.breakers.get(key)
        if breaker is None:
            breaker = self.breakers[key] = CircuitBreaker(
                self.breaker_threshold, self.breaker_cooldown, self.clock
            )
        self._breaker_of[(model, provider)] = breaker
        return breaker

    def targets(self, settings: CallSettings) -> tuple[ModelTarget, ...]:
        """``candidates(settings)``, worked out once per settings object."""
        last = self._candidates
        if last is not None and last[0] is settings:
            return last[1]
        targets = tuple(candidates(settings))
        self._candidates = (settings, targets)
        return targets

    async def _model(self, request: ModelRequest, attempts: list[Attempt]) -> AdapterResponse:
        """One model (``request.settings.model``), retried per the table. Raises the last
        error."""
        model = request.settings.model
        provider = request.settings.provider
        breaker = self.breaker(model, provider)
        retried = {"schema": 0, "rate_limit": 0, "transient": 0}
        asked = request  # the request of the next attempt, before its identity is counted
        notices: list[str] = []
        while True:
            # the next attempt's identity counts the failures seen so far (earlier models'
            # too): a retry after a seen failure asks with a fresh idempotency key
            sent = with_attempts(asked, attempts)
            if not breaker.allow():
                attempts.append(
                    Attempt(
                        model,
                        len(attempts) + 1,
                        Usage(),
                        0.0,
                        LLMCircuitOpenError.default_code,
                        provider,
                    )
                )
                raise LLMCircuitOpenError(
                    f"circuit open for {breaker_key(provider or self.name, model)}: it answered "
                    f"{self.breaker_threshold} server errors (HTTP 5xx) in a row; "
                    f"tried again after {self.breaker_cooldown:g} s",
                    model=model,
                )
            started = time.perf_counter()
            try:
                response = checked(sent, await self.inner.execute(sent))
            except LLMError as exc:
                # a failed attempt's notice goes with the call's outcome, whatever it is
                notices += [exc.notice] if exc.notice else []
                exc.notice = "\n".join(notices) or None
                _add_moved(attempts, exc.moved, provider)
                attempts.append(
                    Attempt(
                        exc.answered_as or model,  # offline failed as offline, at $0
                        len(attempts) + 1,
                        exc.usage,
                        time.perf_counter() - started,
                        exc.code,
                        provider,
                        exc.endpoint,
                    )
                )
                kind = classify(exc)
                if is_server_failure(exc):
                    breaker.failure()
                else:
                    breaker.neutral()
                if kind == "fatal" or retried[kind] >= self.policy.retries(kind):
                    raise
                if isinstance(exc, EndpointDownError):
                    raise  # failed unsent, and will until its cool-down: the next candidate
                retried[kind] += 1
                if isinstance(exc, LLMSchemaError):
                    asked = with_feedback(request, exc)
                else:
                    await self.sleep(self.policy.delay(retried[kind], exc, self.rng))
                continue
            breaker.success()
            _add_moved(attempts, response.moved, provider)
            attempts.append(
                Attempt(
                    model,
                    len(attempts) + 1,
                    response.usage,
                    time.perf_counter() - started,
                    provider=provider,
                    endpoint=response.endpoint,
                )
            )
            if notices:  # what failed attempts had to say, before this answer's own
                said = "\n".join([*notices, *([response.notice] if response.notice else [])])
                return replace(response, notice=said)
            return response

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """The request on its model, then on each fallback model, per the table."""
        settings = request.settings
        targets = self.targets(settings)
        attempts: list[Attempt] = []
        errors: list[LLMError] = []  # each model's, in order
        last: LLMError | None = None
        exhausted = True  # every model failed with an error worth trying the next one for
        for index, target in enumerate(targets):
            if target.provider == settings.provider and target.model == settings.model:
                sent = request  # the first target as asked: no copy of the request
            else:
                sent = replace(
                    request,
                    settings=replace(settings, provider=target.provider, model=target.model),
                )
            if target.provider != settings.provider and request.previous_response_id:
                # a server-side chain lives at the provider that made it, not at this one
                sent = replace(sent, previous_response_id=None)
            try:
                response = await self._model(sent, attempts)
            except LLMError as exc:
                exc.context.setdefault("target", str(target))
                errors.append(exc)
                if isinstance(exc, LLMCircuitOpenError) and last is not None:
                    pass  # keep the more telling error of an earlier model
                else:
                    last = exc
                if classify(exc) == "fatal" and not isinstance(exc, LLMCircuitOpenError):
                    exhausted = False
                    last = exc  # it decides what happens next (stop the run, resend a chain)
                    break
                continue
            fell_back = index > 0  # the candidates are distinct by key()
            return replace(
                response,
                attempts=tuple(attempts),
                fallback_from=str(ModelTarget(settings.provider, settings.model))
                if fell_back
                else None,
                fallback_to=str(target) if fell_back else None,
            )
        assert last is not None
        if len(errors) > 1:
            # every model's error is kept: a group when all were worth a fallback, else the
            # fatal one that ended the chain (its type decides what the caller does)
            failure = LLMFallbackExhausted(errors, last) if exhausted else last
            failure.model_errors = tuple(errors)
            last = failure
        last.attempts = tuple(attempts)
        raise last


def candidates(settings: CallSettings) -> list[ModelTarget]:
    """The model, then each fallback model, on their endpoints: each (provider, model) once,
    the model's case and surrounding whitespace ignored (the first spelling is sent)."""
    seen: dict[tuple[str, str], ModelTarget] = {}
    first = ModelTarget(settings.provider, settings.model.strip())
    for item in (first, *settings.fallback_models):
        target = (
            item if isinstance(item, ModelTarget) else ModelTarget(settings.provider, item.strip())
        )
        seen.setdefault(target.key(), target)
    return list(seen.values())
