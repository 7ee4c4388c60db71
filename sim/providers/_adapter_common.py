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
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from sim.llm.errors import (
    LLMAPIError,
    LLMConfigurationError,
    LLMContextLengthError,
    LLMError,
    LLMRateLimitError,
    LLMRefusalError,
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


StatusErrorT = TypeVar("StatusErrorT", bound=LLMAPIError)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error status from ``api`` as an error map reads it, once per failure: the
    status, its message and body, what the SDK raised, and the model asked for. Its
    methods are the sim errors such a reply can be."""

    api: str
    status: int | None
    message: str
    body: Any
    exc: BaseException
    model: str

    def key_rejected(self, api_key_env: str, detail: str) -> LLMConfigurationError:
        """The API refused the key: name the variable it came from, never the key."""
        return LLMConfigurationError(
            f"{self.api} rejected the API key from ${api_key_env} ({detail}); set a valid key "
            f"in {api_key_env} or change [llm] api_key_env",
            cause=self.exc,
            model=self.model,
        )

    def rate_limited(self, retry_after: float | None) -> LLMRateLimitError:
        """HTTP 429 (or the API's word for it), with the wait the server asked for."""
        return self._status_error(
            LLMRateLimitError, f"rate limited by {self.api}", retry_after=retry_after
        )

    def too_long(self) -> LLMContextLengthError:
        """The prompt does not fit the model's context window."""
        return LLMContextLengthError(
            f"the prompt is too long for {self.model}: {self.message}",
            cause=self.exc,
            model=self.model,
        )

    def unknown_model(self, which: str, hint: str = "") -> LLMConfigurationError:
        """The API does not know the model (``which``: "model", "Gemini model", ...)."""
        return LLMConfigurationError(
            f"unknown {which} {self.model!r}: {self.message}; check the phase's model in "
            f"config.toml{hint}",
            cause=self.exc,
            model=self.model,
        )

    def failure(self, what: str, code: str | None = None) -> LLMAPIError:
        """Any other error status (``what``: "HTTP 500 from the provider" and the like):
        its ``code`` if the API names one, else ``server_error`` for 5xx (which recovery
        retries), else ``api_error``."""
        return self._status_error(
            LLMAPIError,
            what,
            code=code or ("server_error" if (self.status or 0) >= 500 else "api_error"),
        )

    def _status_error(self, kind: type[StatusErrorT], what: str, **extra: Any) -> StatusErrorT:
        """``kind`` worded "``what``: the API's message", with the reply's status and body."""
        return kind(
            f"{what}: {self.message}",
            status_code=self.status,
            response_body=self.body,
            cause=self.exc,
            model=self.model,
            **extra,
        )


def map_sdk_error(
    exc: BaseException,
    sdk: ModuleType,
    api: str,
    model: str,
    statuses: Callable[[Any], LLMError],
    *,
    bad_response: str,
    code: str | None = None,
) -> LLMError:
    """The error map of an SDK generated the way ``openai``'s and ``anthropic``'s are (the
    same exception classes): an ``LLMError`` as it is; a timeout, a failed connection; an
    error status as ``statuses`` reads it; any other SDK failure (response validation) an
    ``LLMAPIError`` worded ``bad_response`` with ``code``; anything else unexpected. Most
    specific first: ``APITimeoutError`` is an ``APIConnectionError``, and
    ``APIStatusError`` an ``APIError``."""
    if isinstance(exc, LLMError):
        return exc
    if isinstance(exc, sdk.APITimeoutError):
        return timed_out(exc, model)
    if isinstance(exc, sdk.APIConnectionError):
        return connection_failed(api, exc.message, exc, model)
    if isinstance(exc, sdk.APIStatusError):
        return statuses(exc)
    if isinstance(exc, sdk.APIError):
        return LLMAPIError(f"{bad_response}: {exc.message}", code=code, cause=exc, model=model)
    return unexpected(exc, model)


def refused(
    detail: str,
    usage: Usage,
    model: str,
    why: str | None = None,
    *,
    what: str = "the model refused",
) -> LLMRefusalError:
    """A refusal, with the attempt's usage (it is paid for); ``why``: the API's reason or
    category, when it gives one."""
    return LLMRefusalError(
        f"{what} ({why}): {detail}" if why else f"{what}: {detail}",
        refusal_message=detail,
        model=model,
        usage=usage,
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


ClientT = TypeVar("ClientT")


class SDKAdapter(Responder, Generic[ClientT]):
    """The frame of an adapter on a provider's own SDK, for an API that keeps no responses
    (no server chains).

    Args:
        client: the SDK's client to use (tests may hand one in); built by ``connect`` from
            the other arguments when omitted.
        base_url: API root (``None``: the SDK's default); the SDK adds the endpoint's path,
            so a loopback stub is ``http://127.0.0.1:PORT``.
        api_key_env: the environment variable holding the key (never printed);
            ``default_key_env`` when omitted.
        timeout_seconds: default total timeout; each call uses its settings' timeout.
        connect_timeout_seconds: connect timeout.
        max_concurrency: calls in flight to size the HTTP connection pool for.

    Raises:
        LLMConfigurationError: the SDK is not installed, or the key variable is unset.
    """

    #: the environment variable read for the key unless ``[llm] api_key_env`` names another
    default_key_env: ClassVar[str]
    #: the key as the error for an unset variable names it ("an Anthropic API key")
    key_name: ClassVar[str]
    #: checks that the SDK (an optional extra) is installed; says what to install if not
    require_sdk: Callable[[], object]

    def __init__(
        self,
        client: ClientT | None = None,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        timeout_seconds: float = 60.0,
        connect_timeout_seconds: float = 10.0,
        max_concurrency: int = 64,
    ) -> None:
        self.require_sdk()
        self.api_key_env = api_key_env or self.default_key_env
        self.connect_timeout_seconds = connect_timeout_seconds
        if client is None:
            key = api_key(self.api_key_env, self.key_name)
            client = self.connect(key, base_url, timeout_seconds, max_concurrency)
        self.client: ClientT = client

    def connect(
        self, key: str, base_url: str | None, timeout_seconds: float, max_concurrency: int
    ) -> ClientT:
        """A new SDK client with its retries off (recovery owns retries), on an httpx
        client whose pool ``http.sdk_pool`` sizes for ``max_concurrency``."""
        raise NotImplementedError

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
