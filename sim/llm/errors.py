"""The one error tree of the LLM layer.

Adapters raise only these; the client returns them in place of failed batch results.

```
LLMError                        message, code, cause, retry_after, model, usage,
                                attempts, served_from
├── LLMConfigurationError       bad or missing key, unknown provider or model   (not retried)
├── LLMAPIError                 HTTP error: status_code, response_body
│   ├── LLMRateLimitError       429                                              (wait, retry)
│   └── LLMChainNotFoundError   previous_response_id unknown to the provider     (resend window)
├── LLMTimeoutError             request timed out                                (retry)
├── LLMRefusalError             the model refused: refusal_message               (not retried)
├── LLMIncompleteError          output truncated: reason                         (not retried)
├── LLMSchemaError              output did not validate against the schema      (retry + feedback)
├── LLMContextLengthError       prompt exceeds the model's context               (not retried)
├── LLMBudgetExceededError      a token or cost cap was reached                  (stops the run)
├── LLMCircuitOpenError         the llm:{provider}:{model} breaker is open       (try a fallback)
├── LLMSubprocessError          a ``cli`` provider's command failed: return_code, stderr
├── LLMFallbackExhausted        every model of a fallback chain failed: exceptions (each one's)
└── ToolNotFoundError           the model called a tool it was not offered: tool  (ignored)
```

Every error carries ``cause`` (the exception it was converted from) and ``context`` (a dict
of what is known about the failure: spec 001), and, when recovery tried more than one model,
``model_errors``: each model's error in order.

The tree unifies spec documents 000 (failure modes), 001 (adapter error hierarchy),
002 (refusal / incomplete) and 004 (``retry_after`` on rate limits, ``ToolNotFoundError``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sim.llm.types import Attempt, ServedFrom, Usage


class LLMError(Exception):
    """Base of every failure of an LLM call.

    Args:
        message: what went wrong, for a person.
        code: a stable machine-readable reason (``"rate_limit"``, ``"schema_error"``...).
        cause: the foreign exception this one was converted from, if any.
        retry_after: seconds the provider asked us to wait, when it said.
        model: the model the failed call asked for, when known.
        usage: the tokens the attempt that raised this was billed for (a provider may
            charge for an answer it then refused, cut short or got wrong).
        attempts: every attempt of the call, this failure's last (set by recovery).
        served_from: ``"live"``, or the tick log's mode when a recording failed again.
        context: what else is known about the failure, as plain data (spec 001).

    Attributes:
        endpoint: the server URL the failed attempt went to, when known (backpressure).
        moved: attempts that failed on other servers of a pool before this one
            (``sim.llm.pool``); recovery puts them in ``attempts``.
        model_errors: each model's error of a fallback chain, in order, this one's last
            (set by recovery when it tried more than one model; else empty).
        notice: what the adapter had to say once (``AdapterResponse.notice``: a form
            switch, say) when the call then failed: the tick summary shows it all the same.
        answered_as: the model the failed attempt is logged and priced as, when not the
            one asked for: the one that answered (an answer its check refused), or the one
            name an endpoint answers under whatever is asked (offline: ``BudgetAdapter``).
    """

    default_code = "llm_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        cause: BaseException | None = None,
        retry_after: float | None = None,
        model: str | None = None,
        usage: Usage | None = None,
        attempts: Iterable[Attempt] = (),
        served_from: ServedFrom = "live",
        context: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self._cause = cause
        self.retry_after = retry_after
        self.model = model
        self.usage: Usage = usage or Usage()
        self.attempts: tuple[Attempt, ...] = tuple(attempts)
        self.served_from: ServedFrom = served_from
        self.endpoint: str | None = None
        self.moved: tuple[Attempt, ...] = ()
        self.context: dict[str, Any] = dict(context or {})
        self.model_errors: tuple[LLMError, ...] = ()
        self.notice: str | None = None
        self.answered_as: str | None = None

    @property
    def cause(self) -> BaseException | None:
        """The exception this one was converted from: the one given, else the one it was
        raised ``from`` (``None``: none, or ``from None``)."""
        return self._cause if self._cause is not None else self.__cause__

    @cause.setter
    def cause(self, value: BaseException | None) -> None:
        self._cause = value

    @property
    def total_usage(self) -> Usage:
        """What every attempt of the failed call used together (each one was paid for)."""
        if not self.attempts:
            return self.usage
        total = Usage()
        for attempt in self.attempts:
            total = total + attempt.usage
        return total

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class LLMConfigurationError(LLMError):
    """A setting the user must fix: missing or rejected key, unknown provider or model."""

    default_code = "configuration_error"


class LLMAPIError(LLMError):
    """The provider answered with an HTTP error."""

    default_code = "api_error"

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        response_body: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.status_code = status_code
        self.response_body = response_body


#: the longest wait honoured from one ``retry_after`` (a server's Retry-After): a larger
#: one is capped, not obeyed, by backpressure's pause and by recovery's wait alike
MAX_RETRY_AFTER_SECONDS = 60.0


class LLMRateLimitError(LLMAPIError):
    """HTTP 429: too many requests or tokens for now."""

    default_code = "rate_limit"


class LLMChainNotFoundError(LLMAPIError):
    """The provider no longer knows the ``previous_response_id`` sent (``server`` chains).

    Not retried as is: the client resets that chain and re-sends the window instead.
    """

    default_code = "previous_response_not_found"


class LLMTimeoutError(LLMError):
    """The request did not complete within the configured timeout."""

    default_code = "timeout"


class LLMRefusalError(LLMError):
    """The model declined to answer (safety refusal)."""

    default_code = "refusal"

    def __init__(self, message: str, *, refusal_message: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.refusal_message = refusal_message


class LLMIncompleteError(LLMError):
    """The response was cut short (for example by ``max_output_tokens``)."""

    default_code = "incomplete"

    def __init__(self, message: str, *, reason: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.reason = reason


class LLMSchemaError(LLMError):
    """The output could not be parsed into the requested schema.

    ``raw`` keeps (the start of) the text that failed, for logs and feedback.
    """

    default_code = "schema_error"

    def __init__(self, message: str, *, raw: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.raw = raw


class LLMContextLengthError(LLMError):
    """The prompt is longer than the model's context window."""

    default_code = "context_length"


class LLMBudgetExceededError(LLMError):
    """A per-run token or cost cap was reached; no further calls are made."""

    default_code = "budget_exceeded"


class LLMCircuitOpenError(LLMError):
    """A circuit breaker is open for this provider and model: the call was not sent."""

    default_code = "circuit_open"


class LLMSubprocessError(LLMError):
    """A ``cli`` provider's command failed: it exited non-zero, or could not be started.

    Args:
        return_code: its exit status (negative: killed by that signal; ``None``: it never
            ran).
        stderr: the end of what it wrote on its standard error.
    """

    default_code = "subprocess_error"

    def __init__(
        self, message: str, *, return_code: int | None = None, stderr: str = "", **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.return_code = return_code
        self.stderr = stderr


class LLMFallbackExhausted(LLMError):
    """Every model of a fallback chain failed with an error worth trying the next model
    for: each one's error, in order, like an ``ExceptionGroup`` holds them (``exceptions``).

    Its ``code``, ``model``, ``usage``, ``retry_after`` and ``served_from`` are those of
    ``main`` (default: the last error; recovery passes the most telling one, not an open
    breaker's); ``attempts`` has every model's attempts. Each error is named by its
    ``context["target"]`` (``provider/model``, set by recovery), else its model.
    """

    default_code = "fallback_exhausted"

    def __init__(self, errors: Sequence[LLMError], main: LLMError | None = None) -> None:
        if not errors:
            raise ValueError("LLMFallbackExhausted needs at least one error")
        last = main or errors[-1]
        each = "; ".join(f"{e.context.get('target') or e.model or '?'}: {e}" for e in errors)
        super().__init__(
            f"all {len(errors)} models failed: {each}",
            code=last.code,
            cause=last,
            retry_after=last.retry_after,
            model=last.model,
            usage=last.usage,
            served_from=last.served_from,
            context={"targets": [e.context.get("target") or e.model for e in errors]},
        )
        self.exceptions: tuple[LLMError, ...] = tuple(errors)
        self.model_errors = self.exceptions


class ToolNotFoundError(LLMError):
    """The model called a tool it was not offered (spec 004). Not raised by a call: the
    unknown call is ignored and the conversation goes on; ``sim.llm.tools.generate`` lists
    these in ``GenerateResponse.ignored``."""

    default_code = "tool_not_found"

    def __init__(self, message: str, *, tool: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.tool = tool


__all__ = [
    "MAX_RETRY_AFTER_SECONDS",
    "LLMAPIError",
    "LLMBudgetExceededError",
    "LLMChainNotFoundError",
    "LLMCircuitOpenError",
    "LLMConfigurationError",
    "LLMContextLengthError",
    "LLMError",
    "LLMFallbackExhausted",
    "LLMIncompleteError",
    "LLMRateLimitError",
    "LLMRefusalError",
    "LLMSchemaError",
    "LLMSubprocessError",
    "LLMTimeoutError",
    "ToolNotFoundError",
]
