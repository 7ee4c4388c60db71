"""The one place where HTTP failures become ``LLMError``s (both adapters, both paths).

A non-2xx answer is read into a ``StatusAnswer`` (status, the SDK's message and body,
the wait it asks for) the way the OpenAI SDK reads it: from status, headers and body on
an aiohttp route (``read_answer``), from the SDK's exception on the SDK's stack
(``sdk_answer``). ``status_failure`` is then the one table both go through, so the two
paths cannot drift. Timeouts and failed connections likewise, most specific first (a
timeout is a connection failure in both trees). What only a route names: an answer that
is not valid HTTP (``bad_response``, retried), a stream cut short (``stream_cut``,
retried), a certificate that does not verify (a configuration error naming the host).

The SDK is never imported here: an SDK exception can only exist once something else
imported the SDK, so ``map_openai_error`` looks for it among loaded modules.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMChainNotFoundError,
    LLMConfigurationError,
    LLMError,
)
from sim.providers._adapter_common import (
    ErrorReply,
    connection_failed,
    map_sdk_error,
    timed_out,
    unexpected,
)
from sim.providers.http import (
    HttpConnectionError,
    HttpPostError,
    HttpProtocolError,
    HttpStatusError,
    HttpStreamCutError,
    HttpStreamError,
    HttpTimeoutError,
    HttpTLSError,
)

if TYPE_CHECKING:
    import openai

_API = "the provider"
_CONTEXT_CODES = ("context_length_exceeded", "string_above_max_length")


@dataclass(frozen=True, slots=True)
class StatusAnswer:
    """A non-2xx answer as the error table reads it.

    Attributes:
        status: the HTTP status.
        message: ``Error code: N`` and the error's message when the body gives one (the
            text of the SDK's exception).
        body: the JSON body's ``error`` object (or the whole JSON, or the text when it is
            not JSON): the SDK exception's ``body``, kept in ``LLMAPIError.response_body``.
        retry_after: seconds the answer asks to wait (``retry-after-ms``, ``retry-after``).
    """

    status: int
    message: str
    body: object
    retry_after: float | None


def read_answer(status: int, headers: Mapping[str, str], content: bytes) -> StatusAnswer:
    """A non-2xx answer from its parts, read as the OpenAI SDK reads one: the body's text
    parsed as JSON when it is, its ``error`` object kept, and that error's message added
    to ``Error code: N``.

    Args:
        headers: the answer's headers, names lower-cased.
    """
    text = content.decode("utf-8", errors="replace").strip()
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
    return StatusAnswer(status, message, data, retry_after_seconds(headers))


def sdk_answer(exc: openai.APIStatusError) -> StatusAnswer:
    """The answer an SDK status exception holds (the SDK read it as ``read_answer`` does)."""
    return StatusAnswer(
        exc.status_code, exc.message, exc.body, retry_after_seconds(exc.response.headers)
    )


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` (preferred) or ``retry-after``, if present and numeric.

    ``headers``: a mapping with lower-case names, or one that looks names up in any case
    (httpx's)."""
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


def _error_object(body: object) -> dict[str, Any]:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        inner: dict[str, Any] = body["error"]
        return inner
    return body if isinstance(body, dict) else {}


def status_failure(
    answer: StatusAnswer, *, cause: BaseException, api_key_env: str, model: str
) -> LLMError:
    """The sim error for a non-2xx answer: the one table of the OpenAI wire family.

    401/403 the key was rejected (naming its variable, never the key); 429 rate limited
    with the wait asked for, or out of quota (a budget stop); ``previous_response_not_found``
    a chain error; a too-long prompt; an unknown model; anything else a failure
    (``server_error`` for 5xx, which recovery retries).

    Args:
        cause: the exception the answer came with (the SDK's, or ``HttpStatusError``).
        api_key_env: the environment variable the key came from, named in auth errors.
        model: the model requested, for the error and its message.
    """
    status = answer.status
    inner = _error_object(answer.body)
    outer = answer.body if isinstance(answer.body, dict) else {}
    code = str(inner.get("code") or outer.get("code") or "")
    message = str(inner.get("message") or answer.message)
    reply = ErrorReply(_API, status, message, answer.body, cause, model)
    if status in (401, 403):
        return reply.key_rejected(api_key_env, f"HTTP {status}")
    if status == 429:
        if code == "insufficient_quota":
            return LLMBudgetExceededError(
                f"the provider account is out of quota: {message}",
                code="insufficient_quota",
                cause=cause,
                model=model,
            )
        return reply.rate_limited(answer.retry_after)
    if code == "previous_response_not_found":
        return LLMChainNotFoundError(
            message,
            status_code=status,
            response_body=answer.body,
            cause=cause,
            model=model,
        )
    if status == 400 and (code in _CONTEXT_CODES or "context length" in message.lower()):
        return reply.too_long()
    if status == 404 and code == "model_not_found":
        return reply.unknown_model("model")
    return reply.failure(f"HTTP {status} from {_API}")


def post_failures() -> tuple[type[Exception], ...]:
    """What a POST of either path raises on failure, for an ``except`` clause: a route's
    ``HttpPostError``, ``TimeoutError`` (the deadline around the SDK's stack), and the
    SDK's base exception if the SDK is loaded (nothing can raise it before, and looking
    must not import it)."""
    sdk = sys.modules.get("openai")
    own: tuple[type[Exception], ...] = (HttpPostError, TimeoutError)
    return (*own, sdk.OpenAIError) if sdk is not None else own


def failures_or_odd() -> tuple[type[Exception], ...]:
    """``post_failures``, and ``ValueError``: an answer that is not what the API answers
    (not JSON, no id, no status)."""
    return (*post_failures(), ValueError)


def map_openai_error(exc: BaseException, *, api_key_env: str, model: str) -> LLMError:
    """Convert a failure of either path into the matching ``LLMError``.

    Args:
        exc: what a route (``HttpPostError``) or the SDK raised, or anything else (an
            ``LLMError`` as it is, any other an ``unexpected`` error).
        api_key_env: the environment variable the key came from, named in auth errors.
        model: the model requested, for the error and its message.
    """
    if isinstance(exc, HttpStatusError):
        answer = read_answer(exc.status, exc.headers, exc.content)
        return status_failure(answer, cause=exc, api_key_env=api_key_env, model=model)
    if isinstance(exc, HttpTimeoutError | TimeoutError):
        return timed_out(exc, model)
    if isinstance(exc, HttpStreamCutError):
        return stream_cut(exc.message, exc, model)
    if isinstance(exc, HttpConnectionError):
        return connection_failed(_API, exc.message, exc, model)
    if isinstance(exc, HttpTLSError):
        return LLMConfigurationError(
            f"cannot reach {exc.url}: {exc.message}", code="tls_error", cause=exc, model=model
        )
    if isinstance(exc, HttpProtocolError):
        return LLMAPIError(
            f"{_API} sent an answer that is not valid HTTP ({exc.url}): "
            f"{exc.message.partition(': ')[2] or exc.message}",
            code="bad_response",
            cause=exc,
            model=model,
        )
    if isinstance(exc, HttpStreamError):
        return LLMAPIError(f"provider error: {exc.message}", cause=exc, model=model)
    sdk = sys.modules.get("openai")
    if sdk is None:  # nothing imported the SDK, so it raised nothing
        return exc if isinstance(exc, LLMError) else unexpected(exc, model)

    def statuses(error: openai.APIStatusError) -> LLMError:
        return status_failure(sdk_answer(error), cause=error, api_key_env=api_key_env, model=model)

    return map_sdk_error(exc, sdk, _API, model, statuses, bad_response="provider error")


def stream_cut(detail: str, exc: BaseException | None, model: str) -> LLMAPIError:
    """A streamed answer that broke off before its last event: no answer was seen, so it
    is retried (transient) with the same idempotency key, which lets a provider that
    finished it answer from its cache."""
    return LLMAPIError(
        f"the streamed answer from {_API} was cut short: {detail}",
        code="stream_cut",
        cause=exc,
        model=model,
    )
