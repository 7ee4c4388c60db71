"""The one place where ``openai`` SDK exceptions become ``LLMError``s (both adapters).

Most specific first: ``APITimeoutError`` is a subclass of ``APIConnectionError``, and
``RateLimitError`` of ``APIStatusError``.
"""

from __future__ import annotations

from typing import Any

import openai

from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMChainNotFoundError,
    LLMConfigurationError,
    LLMContextLengthError,
    LLMError,
    LLMRateLimitError,
    LLMTimeoutError,
)

_CONTEXT_CODES = ("context_length_exceeded", "string_above_max_length")


def _error_body(exc: openai.APIError) -> dict[str, Any]:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        inner: dict[str, Any] = body["error"]
        return inner
    return body if isinstance(body, dict) else {}


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` (preferred) or ``retry-after``, if present and numeric."""
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header) if headers is not None else None
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


def map_openai_error(exc: Exception, *, api_key_env: str, model: str) -> LLMError:
    """Convert an ``openai`` exception (or anything else) into the matching ``LLMError``.

    Args:
        exc: what the SDK raised.
        api_key_env: the environment variable the key came from, named in auth errors.
        model: the model requested, for the error and its message.
    """
    if isinstance(exc, openai.APITimeoutError):
        return LLMTimeoutError(f"request to {model} timed out", cause=exc, model=model)
    if isinstance(exc, openai.APIConnectionError):
        return LLMAPIError(
            f"connection to the provider failed: {exc.message}",
            code="connection_error",
            cause=exc,
            model=model,
        )
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        body = _error_body(exc)
        code = str(body.get("code") or exc.code or "")
        message = str(body.get("message") or exc.message)
        if status in (401, 403):
            return LLMConfigurationError(
                f"the provider rejected the API key from ${api_key_env} (HTTP {status}); "
                f"set a valid key in {api_key_env} or change [llm] api_key_env",
                cause=exc,
                model=model,
            )
        if status == 429:
            if code == "insufficient_quota":
                return LLMBudgetExceededError(
                    f"the provider account is out of quota: {message}",
                    code="insufficient_quota",
                    cause=exc,
                    model=model,
                )
            return LLMRateLimitError(
                f"rate limited by the provider: {message}",
                status_code=status,
                response_body=exc.body,
                cause=exc,
                model=model,
                retry_after=retry_after_seconds(exc.response.headers),
            )
        if code == "previous_response_not_found":
            return LLMChainNotFoundError(
                message,
                status_code=status,
                response_body=exc.body,
                cause=exc,
                model=model,
            )
        if status == 400 and (code in _CONTEXT_CODES or "context length" in message.lower()):
            return LLMContextLengthError(
                f"the prompt is too long for {model}: {message}",
                cause=exc,
                model=model,
            )
        if status == 404 and code == "model_not_found":
            return LLMConfigurationError(
                f"unknown model {model!r}: {message}; check the phase's model in config.toml",
                cause=exc,
                model=model,
            )
        return LLMAPIError(
            f"HTTP {status} from the provider: {message}",
            status_code=status,
            response_body=exc.body,
            cause=exc,
            model=model,
            code="server_error" if status >= 500 else "api_error",
        )
    if isinstance(exc, openai.APIError):  # response validation and other SDK failures
        return LLMAPIError(f"provider error: {exc.message}", cause=exc, model=model)
    if isinstance(exc, LLMError):
        return exc
    return LLMError(f"unexpected error: {exc!r}", code="unexpected", cause=exc, model=model)
