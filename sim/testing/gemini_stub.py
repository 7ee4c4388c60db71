"""A loopback stub of the Gemini API's REST surface, answered by the offline model.

The route ``google-genai`` calls: ``POST /v1beta/models/{model}:generateContent`` (contents,
system instruction, ``generationConfig.responseJsonSchema``, function declarations). Answers
come from the same offline engine as the OpenAI stub (``stub_model.answer``), in Gemini's
shape: ``candidates`` with ``finishReason``, ``usageMetadata`` (prompt, candidates and cached
tokens), ``modelVersion``, ``responseId``. Errors are Google's:
``{"error": {"code", "message", "status", "details": [...]}}``.

Point the SDK at it with ``HttpOptions(base_url=server.base_url)`` (``sim tick --provider
gemini --base-url ...``). Faults, latency, stats and ``ServerThread`` work as for
``StubServer``; the faults mean, in Gemini's terms: ``rate_limit`` 429
``RESOURCE_EXHAUSTED`` with a ``RetryInfo`` delay, ``insufficient_quota`` 429 with a daily
``QuotaFailure`` and no delay, ``server_error`` 500 ``INTERNAL``, ``hang``, ``auth`` 400
``API_KEY_INVALID`` (what Gemini answers a bad key with), ``forbidden`` 403
``PERMISSION_DENIED``, ``model_not_found`` 404 ``NOT_FOUND``, ``bad_gateway`` (502 with a
proxy's HTML page), ``stall`` (a hang: no streams here), ``context_length`` 400 "input
token count exceeds", ``malformed`` (half the JSON), ``raw_newline`` (a raw line break in a
JSON string), ``refusal`` (``finishReason: SAFETY``), ``blocked``
(``promptFeedback.blockReason: SAFETY``), ``incomplete`` (``MAX_TOKENS``),
``unknown_tool``. Every fault listed in ``GEMINI_FAULTS`` is performed.

Embeddings: ``POST /v1beta/models/{model}:batchEmbedContents`` (what the SDK's
``embed_content`` sends: ``{"requests": [{"model": "models/...", "content": {"parts":
[{"text"}]}}]}``, at most ``MAX_EMBED_TEXTS``) answers ``{"embeddings": [{"values": [...]}],
"usageMetadata": {"promptTokenCount"}}`` with ``StubServer.embedding`` of each text (the
same deterministic vectors as the OpenAI stub's ``/v1/embeddings``), in request order.
``embedding_faults`` fail the next ones: an HTTP-level fault above in Google's words, or
``malformed`` (half the JSON) or ``empty`` (one embedding short).
"""

from __future__ import annotations

import asyncio
import base64
import re
import uuid
from typing import Any

import orjson

from sim.testing.sdk_stub import SDKStubServer
from sim.testing.stub_model import ANSWER_FAULTS, Ask, Json, Pair, StubAnswer, pair_turns
from sim.testing.stub_server import BAD_GATEWAY_BODY, FAULTS, _HTTPError

GEMINI_FAULTS = (*FAULTS, "blocked")
#: the most texts one ``batchEmbedContents`` request may carry, as Gemini's API
MAX_EMBED_TEXTS = 100
#: the faults ``embedding_faults`` may hold: HTTP-level ones and two of the answer
EMBEDDING_FAULTS = (
    "rate_limit",
    "insufficient_quota",
    "server_error",
    "auth",
    "forbidden",
    "model_not_found",
    "context_length",
    "hang",
    "stall",
    "bad_gateway",
    "malformed",
    "empty",
)
_ROUTE = re.compile(
    r"^/v1beta/models/(?P<model>[^/:]+):(?P<method>generateContent|batchEmbedContents)$"
)
_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
}


def google_error(code: int, message: str, details: list[Json] | None = None) -> Json:
    """An error body in Google's format."""
    error: Json = {"code": code, "message": message, "status": _STATUS.get(code, "UNKNOWN")}
    if details:
        error["details"] = details
    return {"error": error}


def _parts(content: Any) -> list[Json]:
    parts = field(content, "parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _text(content: Any) -> str:
    """The text of a ``Content``: its text parts, and its function calls and function
    responses as JSON."""
    out = []
    for part in _parts(content):
        if isinstance(part.get("text"), str):
            out.append(part["text"])
        for name in ("functionCall", "functionResponse"):
            value = field(part, name)
            if isinstance(value, dict):
                out.append(orjson.dumps(value).decode())
    return "".join(out)


def split_contents(contents: list[Any]) -> tuple[list[Pair], str]:
    """(earlier turns as (user, model) pairs, the last user text) of a ``contents`` list.

    The input is the last ``user`` turn with text; a tool conversation after it (function
    calls and responses) is added to the pairs, so each step of it gets its own answer.
    """
    turns = [
        (
            field(c, "role") or "user",
            _text(c),
            any(isinstance(p.get("text"), str) for p in _parts(c)),
        )
        for c in contents
        if isinstance(c, dict)
    ]
    asked = [i for i, (role, _, has_text) in enumerate(turns) if role == "user" and has_text]
    last = asked[-1] if asked else len(turns)
    pairs, pending = pair_turns(((role, text) for role, text, _ in turns[:last]), "model")
    if pending is not None:
        pairs.append((pending, ""))
    pairs.extend((text, "") for _, text, _ in turns[last + 1 :])
    return pairs, turns[last][1] if asked else ""


def field(data: Any, name: str) -> Any:
    """A field by its JSON name (``parametersJsonSchema``) or its proto name
    (``parameters_json_schema``): Google's servers accept both, and the SDK sends nested
    fields in the second form."""
    if not isinstance(data, dict):
        return None
    if name in data:
        return data[name]
    return data.get(re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name))


def gemini_tools(tools: Any) -> list[Json] | None:
    """Function declarations as the offline tool chooser reads them (name, parameters)."""
    out: list[Json] = []
    for tool in tools if isinstance(tools, list) else ():
        for decl in field(tool, "functionDeclarations") or ():
            params = field(decl, "parametersJsonSchema") or field(decl, "parameters") or {}
            out.append({"name": field(decl, "name"), "parameters": params})
    return out or None


def content_body(rid: str, model: str, ans: StubAnswer) -> Json:
    """A ``GenerateContentResponse`` for one answer (with its answer-level fault)."""
    usage: Json = {
        "promptTokenCount": ans.input_tokens,
        "candidatesTokenCount": ans.output_tokens,
        "totalTokenCount": ans.input_tokens + ans.output_tokens,
    }
    if ans.cached_tokens:
        usage["cachedContentTokenCount"] = ans.cached_tokens
    body: Json = {"usageMetadata": usage, "modelVersion": model, "responseId": rid}
    if ans.fault == "blocked":
        usage["candidatesTokenCount"] = 0
        usage["totalTokenCount"] = ans.input_tokens
        body["promptFeedback"] = {"blockReason": "SAFETY"}
        return body
    if ans.fault == "refusal":
        body["candidates"] = [
            {
                "finishReason": "SAFETY",
                "index": 0,
                "safetyRatings": [
                    {
                        "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                        "probability": "HIGH",
                        "blocked": True,
                    }
                ],
            }
        ]
        return body
    if ans.call is not None:
        name, args = ans.call
        # thinking models sign their calls: the signature must come back with the call
        signature = base64.b64encode(f"signed:{rid}".encode()).decode()
        parts: list[Json] = [
            {"functionCall": {"name": name, "args": args}, "thoughtSignature": signature}
        ]
    else:
        parts = [{"text": ans.text}]
    body["candidates"] = [
        {
            "content": {"role": "model", "parts": parts},
            "finishReason": "MAX_TOKENS" if ans.fault == "incomplete" else "STOP",
            "index": 0,
        }
    ]
    return body


class GeminiStubServer(SDKStubServer):
    """``StubServer`` speaking the Gemini API instead of OpenAI's (same faults and stats)."""

    FAULTS = GEMINI_FAULTS
    NOT_JSON = "Invalid JSON payload received."

    def _error(self, status: int, type_: str, message: str) -> Json:
        return google_error(status, message)

    async def _route(self, method: str, path: str, request: Any) -> Json | bytes | None:
        match = _ROUTE.match(path)
        if method != "POST" or not match:
            return None
        if match["method"] == "batchEmbedContents":
            return await self._embed(match["model"], request)
        self.log.append(request)
        return await self._generate(match["model"], request)

    async def _embed(self, model: str, request: Any) -> Json | bytes:
        """``batchEmbedContents``: a vector per request entry, in order; the request is
        checked as Google checks it (each entry names this model and holds text)."""
        entries = field(request, "requests")
        if not isinstance(entries, list) or not entries:
            raise _HTTPError(400, google_error(400, "requests must be a non-empty list"))
        if len(entries) > MAX_EMBED_TEXTS:
            raise _HTTPError(
                400,
                google_error(
                    400,
                    "* BatchEmbedContentsRequest.requests: at most 100 requests can be in "
                    "one batch",
                ),
            )
        texts: list[str] = []
        for n, entry in enumerate(entries):
            if field(entry, "model") != f"models/{model}":
                raise _HTTPError(
                    400, google_error(400, f"requests[{n}].model must be models/{model}")
                )
            text = _text(field(entry, "content"))
            if not text:
                raise _HTTPError(400, google_error(400, f"requests[{n}].content has no text"))
            texts.append(text)
        self.embedding_log.append(request)
        fault = self.embedding_faults.popleft() if self.embedding_faults else None
        if fault is not None:
            if fault not in EMBEDDING_FAULTS:  # a test's mistake: said, not answered
                raise _HTTPError(400, google_error(400, f"stub: no embeddings fault {fault!r}"))
            self.stats.faults[fault] += 1
            if fault in ("hang", "stall"):
                await asyncio.sleep(self.options.hang_seconds)
                raise _HTTPError(500, google_error(500, "hung"))
            if fault == "bad_gateway":
                raise _HTTPError(502, BAD_GATEWAY_BODY)
            self._http_fault(fault, model)  # raises for an HTTP-level fault
        tokens = sum(max(1, len(t.split())) for t in texts)
        self.stats.input_tokens += tokens
        vectors = [{"values": self.embedding(t)} for t in texts]
        if fault == "empty":
            vectors.pop()
        body: Json = {
            "embeddings": vectors,
            "usageMetadata": {"promptTokenCount": tokens, "totalTokenCount": tokens},
        }
        if fault == "malformed":
            raw = orjson.dumps(body)
            return raw[: len(raw) // 2]
        return body

    def _http_fault(self, fault: str, model: str) -> str | None:
        """Google's status and error details for each HTTP-level fault."""
        opts = self.options
        if fault == "rate_limit":
            details: list[Json] = [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_free_tier_requests",
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                        }
                    ],
                }
            ]
            if opts.retry_after is not None:
                details.append(
                    {
                        "@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": f"{opts.retry_after:g}s",
                    }
                )
            raise _HTTPError(
                429,
                google_error(429, "You exceeded your current quota, please retry.", details),
            )
        if fault == "insufficient_quota":
            raise _HTTPError(
                429,
                google_error(
                    429,
                    "You exceeded your current quota, please check your plan and billing.",
                    [
                        {
                            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                            "violations": [
                                {"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}
                            ],
                        }
                    ],
                ),
            )
        if fault == "server_error":
            raise _HTTPError(500, google_error(500, "An internal error has occurred."))
        if fault == "auth":
            raise _HTTPError(
                400,
                google_error(
                    400,
                    "API key not valid. Please pass a valid API key.",
                    [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                            "domain": "googleapis.com",
                        }
                    ],
                ),
            )
        if fault == "forbidden":
            raise _HTTPError(
                403,
                google_error(
                    403, "Permission denied: Consumer does not have access to this model."
                ),
            )
        if fault == "model_not_found":
            raise _HTTPError(
                404,
                google_error(
                    404,
                    f"models/{model} is not found for API version v1beta, or is not "
                    "supported for generateContent.",
                ),
            )
        if fault == "context_length":
            raise _HTTPError(
                400,
                google_error(
                    400,
                    "The input token count (1048577) exceeds the maximum number of tokens "
                    "allowed (1048576).",
                ),
            )
        return fault if fault in ANSWER_FAULTS or fault == "blocked" else None

    async def _generate(self, model: str, request: Json) -> Json:
        fault = await self._sdk_prelude(model)
        pairs, input_text = split_contents(field(request, "contents") or [])
        instructions = _text(field(request, "systemInstruction") or {})
        config = field(request, "generationConfig") or {}
        schema = field(config, "responseJsonSchema") or field(config, "responseSchema")
        tools = gemini_tools(field(request, "tools"))
        calling = field(field(request, "toolConfig"), "functionCallingConfig")
        if field(calling, "mode") == "NONE":  # tools declared but not to be called: text
            tools = None
        ans = self._answer(Ask(model, instructions, pairs, input_text, schema, tools, fault))
        return content_body(uuid.uuid4().hex[:22], model, ans)
