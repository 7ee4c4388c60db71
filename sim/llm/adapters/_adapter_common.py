"""What the provider adapters share, so that each says only what differs for its API.

- The errors every adapter maps a failure to, worded once (``timed_out``,
  ``connection_failed``, ``key_rejected``, ``rate_limited``, ``too_long``,
  ``unknown_model``, ``status_failure``, ``unexpected``): the ``openai`` error map and the
  SDK-based ``gemini`` and ``anthropic`` ones name their API and keep their own rules for
  which status or body means what.
- For the adapters on a non-OpenAI SDK (Gemini, Anthropic): importing the optional SDK with
  a clear message, reading the key, the connection-pool limits, the schema cache, and
  ``SDKAdapter``: no server chains, nothing stored to delete, and the answer assembled
  from the parts each API parses its own way.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

import httpx2
from pydantic import BaseModel

from sim.llm.errors import (
    LLMAPIError,
    LLMConfigurationError,
    LLMContextLengthError,
    LLMError,
    LLMRateLimitError,
    LLMTimeoutError,
)
from sim.llm.tools import ToolCalls, schema_of
from sim.llm.types import AdapterResponse, Exchange, ModelRequest, Usage

# -- errors ------------------------------------------------------------------------------------


def timed_out(exc: BaseException, model: str) -> LLMTimeoutError:
    """The request ran out of time on the client."""
    return LLMTimeoutError(f"request to {model} timed out", cause=exc, model=model)


def connection_failed(api: str, detail: object, exc: BaseException, model: str) -> LLMAPIError:
    """No answer came back: the connection to ``api`` failed (retried as transient)."""
    return LLMAPIError(
        f"connection to {api} failed: {detail}", code="connection_error", cause=exc, model=model
    )


def key_rejected(
    api: str, api_key_env: str, status: str, exc: BaseException, model: str
) -> LLMConfigurationError:
    """``api`` refused the key: name the variable it came from, never the key."""
    return LLMConfigurationError(
        f"{api} rejected the API key from ${api_key_env} ({status}); set a valid key in "
        f"{api_key_env} or change [llm] api_key_env",
        cause=exc,
        model=model,
    )


def rate_limited(
    api: str,
    message: str,
    *,
    status: int,
    body: Any,
    exc: BaseException,
    model: str,
    retry_after: float | None,
) -> LLMRateLimitError:
    """HTTP 429 (or the API's word for it), with the wait the server asked for."""
    return LLMRateLimitError(
        f"rate limited by {api}: {message}",
        status_code=status,
        response_body=body,
        cause=exc,
        model=model,
        retry_after=retry_after,
    )


def too_long(message: str, exc: BaseException, model: str) -> LLMContextLengthError:
    """The prompt does not fit the model's context window."""
    return LLMContextLengthError(
        f"the prompt is too long for {model}: {message}", cause=exc, model=model
    )


def unknown_model(
    which: str, message: str, exc: BaseException, model: str, hint: str = ""
) -> LLMConfigurationError:
    """The API does not know the model (``which``: "model", "Gemini model", ...)."""
    return LLMConfigurationError(
        f"unknown {which} {model!r}: {message}; check the phase's model in config.toml{hint}",
        cause=exc,
        model=model,
    )


def status_failure(
    what: str,
    message: str,
    *,
    status: int | None,
    body: Any,
    exc: BaseException,
    model: str,
    code: str | None = None,
) -> LLMAPIError:
    """Any other error status (``what``: "HTTP 500 from the provider" and the like): its
    ``code`` if the API names one, else ``server_error`` for 5xx (which recovery retries),
    else ``api_error``."""
    return LLMAPIError(
        f"{what}: {message}",
        status_code=status,
        response_body=body,
        cause=exc,
        model=model,
        code=code or ("server_error" if (status or 0) >= 500 else "api_error"),
    )


def unexpected(exc: BaseException, model: str) -> LLMError:
    """Something no rule above knows: kept as the cause, never a bare traceback."""
    return LLMError(f"unexpected error: {exc!r}", code="unexpected", cause=exc, model=model)


# -- adapters on a non-OpenAI SDK --------------------------------------------------------------


def window_turns(history: tuple[Exchange, ...], input_data: str) -> list[dict[str, Any]]:
    """The chain window's exchanges as user/assistant turns, then the input as a user turn:
    the message shape the Responses, chat and Messages APIs share."""
    turns: list[dict[str, Any]] = []
    for exchange in history:
        turns.append({"role": "user", "content": exchange.input})
        turns.append({"role": "assistant", "content": exchange.output})
    turns.append({"role": "user", "content": input_data})
    return turns


def require_module(module: str, provider: str, sdk: str, install_hint: str) -> ModuleType:
    """The optional SDK's module; a clear configuration error when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise LLMConfigurationError(f'provider "{provider}" needs {sdk}: {install_hint}') from None


def api_key(api_key_env: str, kind: str) -> str:
    """The key in ``$api_key_env`` (``kind``: "a Gemini API key"); an error when unset."""
    key = os.environ.get(api_key_env, "").strip()
    if not key:
        raise LLMConfigurationError(
            f"no API key: set the environment variable {api_key_env} to {kind} "
            "(or change [llm] api_key_env in config.toml)"
        )
    return key


def pool_limits(max_concurrency: int) -> httpx2.Limits:
    """A connection pool sized for the run's calls in flight."""
    return httpx2.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)


class Responder:
    """What every adapter builds its answer with (one shape for all providers)."""

    name: ClassVar[str]

    def respond(
        self,
        request: ModelRequest,
        usage: Usage,
        calls: Callable[[], ToolCalls],
        structured: Callable[[type[BaseModel]], tuple[BaseModel, str]],
        *,
        response_id: str,
        model: str,
        structured_output: str | None = None,
    ) -> AdapterResponse:
        """The parsed answer: the tool calls with ``request.tools``, else the structured
        answer (``structured(schema)`` gives the model and its raw JSON, in the form
        ``structured_output`` when the adapter chose one)."""
        parsed: BaseModel
        if request.tools is not None:
            parsed = calls()
            raw = parsed.dump()
            finish = "tool_calls" if parsed.calls else "stop"
        else:
            parsed, raw = structured(schema_of(self, request))
            finish = "stop"
        return AdapterResponse(
            parsed=parsed,
            response_id=response_id,
            usage=usage,
            model=model,
            finish_reason=finish,
            raw=raw,
            provider=self.name,
            structured_output=structured_output if request.tools is None else None,
        )


class SDKAdapter(Responder):
    """The frame of an adapter for an API that keeps no responses (no server chains)."""

    def require_window(self, request: ModelRequest) -> None:
        """Refuse a server-chained request: this API stores nothing to chain on."""
        if request.previous_response_id:
            raise LLMConfigurationError(
                f'provider "{self.name}" keeps no responses, so it has no server chains; '
                'set [llm] chain_mode = "window"',
                model=request.settings.model,
            )

    async def delete_response(self, response_id: str) -> None:
        """The API stores nothing for us: nothing to delete."""
        return None
