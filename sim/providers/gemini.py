"""The ``gemini`` provider: the Gemini API through Google's own SDK (``google-genai``).

A request becomes one ``generateContent`` call: the instructions as the system
instruction, the chain window (``window`` mode) and the input as alternating user/model
``contents``, and either the schema as ``responseJsonSchema`` (structured output) or the
tools as function declarations with one call forced (mode ``ANY``; ``AUTO`` / ``NONE`` for
``tool_choice`` ``auto`` / ``none``), a conversation's calls and answers as ``functionCall`` /
``functionResponse`` parts (thought signatures sent back). Gemini keeps no
responses, so there are no server chains and nothing to delete.

Embeddings (``[memory] embeddings = "provider"``) are the SDK's ``embed_content``: one
``POST {base_url}/v1beta/models/{model}:batchEmbedContents`` (a ``requests`` entry per text,
at most ``MAX_EMBED_TEXTS``) over the same client, key and HTTP options as the calls.

The answer is checked here, in this order: a blocked prompt (``promptFeedback``) or a
candidate stopped for safety, recitation or a blocklist -> ``LLMRefusalError``; ``MAX_TOKENS``
(Gemini counts thinking tokens against it) or another early stop ->
``LLMIncompleteError``; a malformed function call or text that does not validate against
the schema -> ``LLMSchemaError``. Every failure carries the attempt's usage.

The SDK is an optional extra (``pip install 'sim[gemini]'``); its own retries stay off
(recovery owns retries) and so do its automatic function calling and continuation, so one
``execute`` is one billed request.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import httpx2
import pydantic

from sim.llm.calls import schema_json
from sim.llm.embedding import Embedded
from sim.llm.enums import constrain
from sim.llm.errors import (
    LLMAPIError,
    LLMError,
    LLMIncompleteError,
    LLMSchemaError,
)
from sim.llm.tools import FunctionCall, LLMMessage, ToolCalls, schema_of
from sim.llm.types import AdapterResponse, Exchange, ModelRequest, ToolChoice, Usage
from sim.providers._adapter_common import (
    ErrorReply,
    SDKAdapter,
    connection_failed,
    refused,
    require_module,
    timed_out,
    unexpected,
)
from sim.providers._openai_common import validate_text
from sim.providers._openai_errors import retry_after_seconds
from sim.providers.http.sdk_pool import sdk_http_client
from sim.providers.profiles import GEMINI

try:  # the optional extra; GeminiAdapter() says what to install when it is missing
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types as gt
except ImportError:  # pragma: no cover - the extra is installed wherever tests run
    pass

#: the environment variable read for the key unless ``[llm] api_key_env`` names another
DEFAULT_KEY_ENV = GEMINI.key_env
#: the API version the SDK puts in front of every path (``{base_url}/v1beta/models/...``)
API_VERSION = "v1beta"
INSTALL_HINT = f"pip install 'sim[{GEMINI.sdk_extra}]'"
#: the most texts one ``batchEmbedContents`` request may carry (the API refuses more:
#: "at most 100 requests can be in one batch")
MAX_EMBED_TEXTS = 100

#: finish reasons that mean the model (or Google's filters) declined to answer
_REFUSALS = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "MODEL_ARMOR",
    }
)
#: finish reasons of a complete answer
_DONE = frozenset({"STOP", "FINISH_REASON_UNSPECIFIED", ""})
_CONTEXT = re.compile(
    r"token count.*exceeds|exceeds the maximum number of tokens|context (window|length)",
    re.IGNORECASE | re.DOTALL,
)
_API = "the Gemini API"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)s\s*$")
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def require_sdk() -> None:
    """Raise a clear configuration error when ``google-genai`` is not installed."""
    require_module("google.genai", GEMINI.kind, "Google's SDK (google-genai)", INSTALL_HINT)


_MODES: dict[ToolChoice, str] = {"auto": "AUTO", "required": "ANY", "none": "NONE"}


def _signature(text: str | None) -> bytes | None:
    if not text:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _message_part(message: LLMMessage) -> tuple[str, list[gt.Part]]:
    """One conversation message as (Gemini role, parts)."""
    parts: list[gt.Part] = []
    if message.content:
        parts.append(gt.Part(text=message.content))
    call = message.function_call
    if call is not None:
        parts.append(
            gt.Part(
                function_call=gt.FunctionCall(
                    id=call.call_id or None, name=call.name, args=dict(call.arguments)
                ),
                thought_signature=_signature(call.signature),
            )
        )
    answer = message.function_response
    if answer is not None:
        parts.append(
            gt.Part(
                function_response=gt.FunctionResponse(
                    id=answer.call_id or None, name=answer.name, response=dict(answer.response)
                )
            )
        )
    return ("model" if message.role == "assistant" else "user"), parts


def _contents(
    history: tuple[Exchange, ...], input_data: str, messages: tuple[LLMMessage, ...] = ()
) -> list[gt.Content]:
    """The window's exchanges as user/model turns, the input, then the conversation (the
    model's calls as ``model`` turns, the tools' answers as ``user`` turns; consecutive
    messages of one role merged into one turn, as Gemini expects)."""
    contents: list[gt.Content] = []
    for exchange in history:
        contents.append(gt.Content(role="user", parts=[gt.Part(text=exchange.input)]))
        contents.append(gt.Content(role="model", parts=[gt.Part(text=exchange.output)]))
    contents.append(gt.Content(role="user", parts=[gt.Part(text=input_data)]))
    for message in messages:
        role, parts = _message_part(message)
        last = contents[-1]
        if last.role == role and last.parts is not None:
            last.parts.extend(parts)
        else:
            contents.append(gt.Content(role=role, parts=parts))
    return contents


def _usage(response: gt.GenerateContentResponse) -> Usage:
    """Prompt (plus tool-use prompt) tokens in, candidates plus thinking tokens out: Gemini
    bills thinking as output."""
    meta = response.usage_metadata
    if meta is None:
        return Usage()
    return Usage(
        input_tokens=(meta.prompt_token_count or 0) + (meta.tool_use_prompt_token_count or 0),
        output_tokens=(meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0),
        cached_input_tokens=meta.cached_content_token_count or 0,
    )


def _name(value: Any) -> str:
    """An SDK enum (or the raw string of a value it does not know) as its name."""
    return str(getattr(value, "value", value) or "")


def _candidate(response: gt.GenerateContentResponse, usage: Usage, model: str) -> gt.Candidate:
    """The first candidate; blocked, refused, cut-short and empty answers raise."""
    feedback = response.prompt_feedback
    if feedback is not None and feedback.block_reason is not None:
        reason = _name(feedback.block_reason)
        detail = feedback.block_reason_message or reason
        raise refused(detail, usage, model, reason, what="Gemini blocked the prompt")
    if not response.candidates:
        raise LLMIncompleteError(
            "Gemini returned no candidates", reason="empty", model=model, usage=usage
        )
    candidate = response.candidates[0]
    reason = _name(candidate.finish_reason)
    if reason in _REFUSALS:
        detail = candidate.finish_message or f"finish reason {reason}"
        raise refused(detail, usage, model, reason)
    if reason == "MAX_TOKENS":
        raise LLMIncompleteError(
            "the answer was cut short (max_output_tokens; Gemini counts thinking tokens too)",
            reason="max_output_tokens",
            model=model,
            usage=usage,
        )
    if reason == "MALFORMED_FUNCTION_CALL":
        raise LLMSchemaError(
            f"the model wrote a malformed function call: {candidate.finish_message or ''}",
            model=model,
            usage=usage,
            raw=candidate.finish_message or "",
        )
    if reason not in _DONE:
        raise LLMIncompleteError(
            f"the answer stopped early ({reason})",
            reason=reason.lower(),
            model=model,
            usage=usage,
        )
    return candidate


def _parts(candidate: gt.Candidate) -> list[gt.Part]:
    return list(candidate.content.parts or ()) if candidate.content is not None else []


def _text(parts: list[gt.Part]) -> str:
    """The answer's text: every text part that is not a thought summary."""
    return "".join(part.text for part in parts if part.text and not part.thought)


def _tool_calls(parts: list[gt.Part]) -> ToolCalls:
    calls = [
        FunctionCall(
            name=part.function_call.name or "",
            arguments=dict(part.function_call.args or {}),
            call_id=part.function_call.id or "",
            signature=(
                base64.b64encode(part.thought_signature).decode()
                if part.thought_signature
                else None
            ),
        )
        for part in parts
        if part.function_call is not None
    ]
    return ToolCalls(calls=calls, content=_text(parts) or None)


def _vectors(
    response: gt.EmbedContentResponse, count: int, model: str
) -> tuple[tuple[float, ...], ...]:
    """The ``count`` vectors of a ``batchEmbedContents`` answer, in the texts' order (Gemini
    answers in request order, without indices).

    Raises:
        LLMAPIError: ``bad_response``, naming what is wrong: not one embedding per text,
            an embedding that is empty or holds a number that is not finite, embeddings
            of different lengths.
    """

    def bad(problem: str) -> LLMAPIError:
        return LLMAPIError(f"the embeddings answer {problem}", code="bad_response", model=model)

    embeddings = response.embeddings or []
    if len(embeddings) != count:
        raise bad(f"holds {len(embeddings)} embedding(s) for {count} text(s)")
    vectors: list[tuple[float, ...]] = []
    for position, embedding in enumerate(embeddings):
        values = embedding.values
        if not values or not all(math.isfinite(v) for v in values):
            raise bad(f"has no list of finite numbers at embeddings[{position}]")
        if vectors and len(values) != len(vectors[0]):
            raise bad("has embeddings of different lengths")
        vectors.append(tuple(float(v) for v in values))
    return tuple(vectors)


def _embed_usage(response: gt.EmbedContentResponse) -> Usage:
    """The tokens the answer counted (``usageMetadata.promptTokenCount``); none counted
    when it carries no count."""
    meta = response.usage_metadata
    tokens = meta.prompt_token_count if meta is not None else None
    return Usage(input_tokens=max(0, tokens or 0))


def _error_details(exc: genai_errors.APIError) -> list[dict[str, Any]]:
    """The ``details`` list of a Google error body (``{"error": {..., "details": [...]}}``)."""
    body = exc.details
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    details = body.get("details") if isinstance(body, dict) else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def retry_delay_seconds(exc: genai_errors.APIError) -> float | None:
    """Seconds from the error's ``RetryInfo`` (``"retryDelay": "12.5s"``), else from a
    ``retry-after`` header, else ``None``."""
    for detail in _error_details(exc):
        if detail.get("@type") == _RETRY_INFO:
            match = _DURATION.match(str(detail.get("retryDelay") or ""))
            if match:
                return float(match.group(1))
    headers = getattr(exc.response, "headers", None)
    return retry_after_seconds(headers)


def map_gemini_error(exc: Exception, *, api_key_env: str, model: str) -> LLMError:
    """Convert what the SDK (or its HTTP client) raised into the matching ``LLMError``.

    Most specific first: timeouts before other transport errors; auth (Gemini answers a
    bad key with 400 ``API_KEY_INVALID``) before other 4xx.
    """
    if isinstance(exc, LLMError):
        return exc
    if isinstance(exc, httpx2.TimeoutException | TimeoutError):
        return timed_out(exc, model)
    if isinstance(exc, httpx2.TransportError):
        return connection_failed(_API, exc, exc, model)
    if isinstance(exc, genai_errors.APIError):
        status = int(exc.code or 0)
        message = str(exc.message or exc)
        reasons = {
            str(d.get("reason") or "") for d in _error_details(exc) if d.get("@type") == _ERROR_INFO
        }
        reply = ErrorReply(_API, status or None, message, exc.details, exc, model)
        if status in (401, 403) or "API_KEY_INVALID" in reasons:
            return reply.key_rejected(api_key_env, f"HTTP {status}: {exc.status or ''}")
        if status == 429:
            return reply.rate_limited(retry_delay_seconds(exc))
        if status == 400 and _CONTEXT.search(message):
            return reply.too_long()
        if status == 404:
            return reply.unknown_model("Gemini model", " (or GEMINI_MODEL)")
        return reply.failure(f"HTTP {status} {exc.status or ''} from {_API}")
    if isinstance(exc, json.JSONDecodeError):
        return LLMAPIError(
            f"the Gemini API sent a body that is not JSON: {exc}",
            code="bad_response",
            cause=exc,
            model=model,
        )
    return unexpected(exc, model)


class GeminiAdapter(SDKAdapter["genai.Client"]):
    """Gemini API adapter on ``google-genai``; takes the options of every SDK adapter
    (``SDKAdapter``). ``client`` is a ``google.genai.Client``; ``base_url`` ``None`` is
    Google's, under which the SDK posts to ``/v1beta/models/...``.
    """

    name = "gemini"
    profile = GEMINI
    default_key_env = DEFAULT_KEY_ENV
    key_name = "a Gemini API key"
    require_sdk = staticmethod(require_sdk)
    #: the HTTP client this adapter built (none for a client handed in)
    _http: httpx2.AsyncClient | None = None
    #: the most texts one ``embed`` sends (``sim.mind.vectors.fetch`` batches by it)
    max_texts: int = MAX_EMBED_TEXTS

    def connect(
        self, key: str, base_url: str | None, timeout_seconds: float, max_concurrency: int
    ) -> genai.Client:
        # our own pool: sized for the run, and the SDK's aiohttp path is never taken
        self._http = sdk_http_client(
            max_concurrency,
            httpx2.AsyncClient,
            timeout=httpx2.Timeout(timeout_seconds, connect=self.connect_timeout_seconds),
        )
        return genai.Client(
            vertexai=False,  # not GOOGLE_GENAI_USE_VERTEXAI from the environment
            api_key=key,
            http_options=gt.HttpOptions(
                base_url=base_url or None,
                api_version=API_VERSION,
                timeout=int(timeout_seconds * 1000),
                httpx_async_client=self._http,
            ),
        )

    def config(self, request: ModelRequest) -> gt.GenerateContentConfig:
        """The generation config: settings, system instruction, and the schema or tools."""
        settings = request.settings
        config = gt.GenerateContentConfig(
            system_instruction=request.instructions or None,
            temperature=settings.temperature,
            max_output_tokens=settings.max_output_tokens,
            http_options=gt.HttpOptions(timeout=max(1, int(settings.timeout_seconds * 1000))),
            automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True),
            automatic_continuation=False,
        )
        if request.tools is not None:
            config.tools = [
                gt.Tool(
                    function_declarations=[
                        gt.FunctionDeclaration(
                            name=tool.name,
                            description=tool.description,
                            parameters_json_schema=tool.parameters,
                        )
                        for tool in request.tools
                    ]
                )
            ]
            config.tool_config = gt.ToolConfig(
                function_calling_config=gt.FunctionCallingConfig(
                    mode=gt.FunctionCallingConfigMode(_MODES[request.tool_choice])
                )
            )
        else:
            config.response_mime_type = "application/json"
            config.response_json_schema = constrain(
                schema_json(schema_of(self, request)), request.enums
            )
        return config

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        settings = request.settings
        self.require_window(request)
        try:
            response = await self.client.aio.models.generate_content(
                model=settings.model,
                contents=_contents(request.history, request.input, request.messages),
                config=self.config(request),
            )
        except Exception as exc:
            raise map_gemini_error(exc, api_key_env=self.api_key_env, model=settings.model) from exc
        return self.answer(request, response)

    async def embed(self, model: str, texts: Sequence[str], timeout_seconds: float) -> Embedded:
        """The embeddings of ``texts`` (at most ``max_texts``) by ``model``: the SDK's
        ``embed_content``, one ``batchEmbedContents`` request, on this adapter's client
        (base URL, key, HTTP options). Each text is a ``Content`` of its own, so a model
        the SDK takes for multimodal does not merge them into one. The answer is untrusted
        (``_vectors``).

        Raises:
            LLMError: as a call's failures are mapped (``map_gemini_error``), or
                ``bad_response`` for an answer that is not one vector per text.
        """
        contents = [gt.Content(role="user", parts=[gt.Part(text=text)]) for text in texts]
        config = gt.EmbedContentConfig(
            http_options=gt.HttpOptions(timeout=max(1, int(timeout_seconds * 1000)))
        )
        try:
            response = await self.client.aio.models.embed_content(
                model=model, contents=contents, config=config
            )
        except pydantic.ValidationError as exc:  # the SDK read an answer of another shape
            raise LLMAPIError(
                f"the embeddings answer is not in Gemini's shape ({exc.error_count()} problem(s))",
                code="bad_response",
                cause=exc,
                model=model,
            ) from exc
        except Exception as exc:
            raise map_gemini_error(exc, api_key_env=self.api_key_env, model=model) from exc
        return Embedded(_vectors(response, len(texts), model), _embed_usage(response))

    def answer(
        self, request: ModelRequest, response: gt.GenerateContentResponse
    ) -> AdapterResponse:
        """The checked, parsed answer of one ``generateContent`` response."""
        model = request.settings.model
        usage = _usage(response)
        parts = _parts(_candidate(response, usage, model))
        return self.respond(
            request,
            usage,
            lambda: _tool_calls(parts),
            lambda schema: validate_text(schema, _text(parts), usage, model),
            response_id=response.response_id or "",
            model=response.model_version or model,
        )

    async def aclose(self) -> None:
        """Close the HTTP client this adapter built (call on the loop that used it)."""
        if self._http is not None:
            await self._http.aclose()
