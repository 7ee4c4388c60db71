"""The one place where HTTP failures become ``LLMError``s (both adapters, both paths).

A non-2xx answer is first the SDK's exception for its status (``status_error``: the
SDK's documented status table, used by the direct path; the SDK's own stack makes the
same), then ``map_openai_error`` turns every SDK exception into the sim error tree from
status, headers (``Retry-After``) and body. Most specific first: ``APITimeoutError`` is a
subclass of ``APIConnectionError``, and ``RateLimitError`` of ``APIStatusError``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai

from sim.llm.adapters._adapter_common import (
    ErrorReply,
    map_sdk_error,
)
from sim.llm.errors import (
    LLMBudgetExceededError,
    LLMChainNotFoundError,
    LLMError,
)

_API = "the provider"
_CONTEXT_CODES = ("context_length_exceeded", "string_above_max_length")

#: HTTP status -> the SDK's exception class, as the openai SDK documents it ("Handling
#: errors": 400 BadRequestError ... >=500 InternalServerError, other APIStatusError)
STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def status_error(response: httpx2.Response) -> openai.APIStatusError:
    """The SDK exception for a non-2xx ``response`` (read in full), built as the SDK builds
    it: the JSON body (or its text) kept, its ``error`` object as ``body`` and its message
    in the exception's text."""
    status = response.status_code
    text = response.text.strip()
    body: object = text
    message = f"Error code: {status}"
    try:
        body = json.loads(text)
    except ValueError:
        pass
    else:
        inner = body.get("error", body) if isinstance(body, dict) else None
        detail = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
    data = body.get("error", body) if isinstance(body, dict) else body
    kind = STATUS_ERRORS.get(status) or (
        openai.InternalServerError if status >= 500 else openai.APIStatusError
    )
    return kind(message, response=response, body=data)


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

    def statuses(exc: openai.APIStatusError) -> LLMError:
        status = exc.status_code
        body = _error_body(exc)
        code = str(body.get("code") or exc.code or "")
        message = str(body.get("message") or exc.message)
        reply = ErrorReply(_API, status, message, exc.body, exc, model)
        if status in (401, 403):
            return reply.key_rejected(api_key_env, f"HTTP {status}")
        if status == 429:
            if code == "insufficient_quota":
                return LLMBudgetExceededError(
                    f"the provider account is out of quota: {message}",
                    code="insufficient_quota",
                    cause=exc,
                    model=model,
                )
            return reply.rate_limited(retry_after_seconds(exc.response.headers))
        if code == "previous_response_not_found":
            return LLMChainNotFoundError(
                message,
                status_code=status,
                response_body=exc.body,
                cause=exc,
                model=model,
            )
        if status == 400 and (code in _CONTEXT_CODES or "context length" in message.lower()):
            return reply.too_long()
        if status == 404 and code == "model_not_found":
            return reply.unknown_model("model")
        return reply.failure(f"HTTP {status} from {_API}")

    return map_sdk_error(exc, openai, _API, model, statuses, bad_response="provider error")
