"""The identity of one LLM call: who asked (request id) and exactly what was asked (digest).

A call is named ``{tick}:{phase}:{entity_key}:{n}`` (``n`` counts that entity key's calls
within the phase, from 0) and fingerprinted by a digest over everything that decides its
answer: instructions, input, schema, model and settings, and the chain sent (window
history or ``previous_response_id``). The tick recorder (``sim.engine.recorder``) names each
call when the client makes it (a ``CallNamer``), and the identity travels in the request
(``ModelRequest.call``): every layer that needs to know which call it serves (the policy
gate, ``replay`` and resume, the Batch API session, the idempotency key) reads it there.
Recovery re-asking after a failure it saw sends a new request whose identity counts that
failure (``CallIdentity.after``), so the next attempt asks with a fresh idempotency key.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from pydantic import BaseModel

from sim.llm.types import CallSettings, ModelRequest

_SCHEMAS: dict[type[BaseModel], dict[str, Any]] = {}
_SCHEMA_DIGESTS: dict[type[BaseModel], str] = {}


def digest(text: str | bytes) -> str:
    """A short, stable content digest (``sha256:`` + 32 hex digits)."""
    data = text.encode() if isinstance(text, str) else text
    return "sha256:" + hashlib.sha256(data).hexdigest()[:32]


@functools.lru_cache(maxsize=256)
def text_digest(text: str) -> str:
    """``digest`` for texts sent over and over (a phase's instructions): computed once."""
    return digest(text)


def schema_json(schema: type[BaseModel]) -> dict[str, Any]:
    """The schema's JSON Schema, computed once per class."""
    cached = _SCHEMAS.get(schema)
    if cached is None:
        cached = _SCHEMAS[schema] = schema.model_json_schema()
    return cached


def schema_digest(schema: type[BaseModel]) -> str:
    """The digest of the schema's JSON Schema, computed once per class."""
    cached = _SCHEMA_DIGESTS.get(schema)
    if cached is None:
        data = orjson.dumps(schema_json(schema), option=orjson.OPT_SORT_KEYS)
        cached = _SCHEMA_DIGESTS[schema] = digest(data)
    return cached


def settings_dict(settings: CallSettings | None) -> dict[str, Any]:
    """The settings that decide an answer (the timeout does not)."""
    s = settings or CallSettings()
    return {"temperature": s.temperature, "max_output_tokens": s.max_output_tokens}


def sent_fields(request: ModelRequest) -> dict[str, Any]:
    """What ``request`` actually sends, as ``CallIdentity`` fields: its model, settings and
    chain (``CallIdentity.sent``; a new identity takes them as it is made)."""
    settings = settings_dict(request.settings)
    if request.messages or request.tool_choice != "required":
        # a step of a tool conversation: what was said so far decides its answer too
        # (absent for single-turn calls, so their records and digests are unchanged)
        steps = [m.model_dump(mode="json", exclude_none=True) for m in request.messages]
        settings["tool_choice"] = request.tool_choice
        settings["conversation"] = digest(orjson.dumps(steps))
    return {
        "model": request.settings.model,
        "settings": settings,
        "history": [e.response_id for e in request.history],
        "previous_response_id": request.previous_response_id,
    }


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Which call a request is, and what it asked, in the form the tick log records and
    replay compares. It travels in the request (``ModelRequest.call``).

    ``history`` holds the response ids of the window sent (the exchanges themselves are in
    the response store, whose state the log snapshots).
    """

    request_id: str
    phase: str
    entity_key: str | None
    n: int
    instructions: str
    input: str
    schema_name: str
    schema_digest: str
    model: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)
    previous_response_id: str | None = None
    depth: int = 0
    #: the tick's call scope (a nonce in its log header, kept across resumes)
    scope: str = ""
    #: failed attempts of this call whose outcome was seen before this attempt, in this run
    #: and in the runs a resume continues (the recorder seeds it from the log; recovery and
    #: the pool count on with ``after``)
    failures_seen: int = 0

    @property
    def instructions_digest(self) -> str:
        return text_digest(self.instructions)

    def fields(self) -> dict[str, Any]:
        """The compared parts, by the name drift reports use."""
        return {
            "instructions": self.instructions_digest,
            "input": self.input,
            "schema": self.schema_digest,
            "model": self.model,
            "settings": self.settings,
            "history": [*self.history, self.previous_response_id],
        }

    @property
    def digest(self) -> str:
        return digest(orjson.dumps(self.fields(), option=orjson.OPT_SORT_KEYS))

    def sent(self, request: ModelRequest) -> CallIdentity:
        """This identity with what the adapter is actually sent by ``request``: its model,
        settings and chain."""
        return replace(self, **sent_fields(request))

    def after(self, codes: Iterable[str | None]) -> CallIdentity:
        """The identity of the attempt after failed ones ending with ``codes``: each
        failure whose outcome was seen is counted, so that attempt asks with a fresh
        idempotency key (``self`` when none was seen)."""
        seen = sum(1 for code in codes if observed_failure(code))
        return replace(self, failures_seen=self.failures_seen + seen) if seen else self


#: names a call as the client makes it: (phase, entity key, the request as it will be
#: sent, chain depth) -> its identity (the tick recorder's ``name_call``)
CallNamer = Callable[[str, "str | None", ModelRequest, int], CallIdentity]

#: error codes of attempts whose outcome the client never saw: the request may have been
#: answered (and billed) by the server, so sending it again must reuse its key (a stream
#: cut short: the provider may have finished the answer the client did not receive)
UNOBSERVED = frozenset({"timeout", "connection_error", "stream_cut"})
#: error codes of attempts that were never sent
UNSENT = frozenset({"circuit_open", "budget_exceeded"})


def observed_failure(code: str | None) -> bool:
    """Whether an attempt that ended with ``code`` failed with an outcome the client saw."""
    return code is not None and code not in UNOBSERVED and code not in UNSENT


def with_attempts(request: ModelRequest, attempts: Iterable[Any]) -> ModelRequest:
    """``request`` as the next attempt after ``attempts`` (``Attempt``s, each with an
    ``error_code``) asks: its identity counts the failures among them whose outcome was
    seen (recovery; a request without an identity is returned as it is)."""
    call = request.call
    if call is None:
        return request
    after = call.after(a.error_code for a in attempts)
    return request if after is call else replace(request, call=after)


def idempotency_key(call: CallIdentity | None, body: bytes) -> str | None:
    """The ``Idempotency-Key`` for sending ``body`` as ``call`` (``None``: an anonymous
    call, sent without a key).

    Same tick scope, request id, exact body and number of failures seen give the same
    key, so the same attempt re-sent after a crash, Ctrl-C or a client-side timeout (its
    outcome never seen) can be answered from a provider's cache rather than paid for
    twice. A retry after a failure the client saw (an error status, an ``incomplete`` or
    malformed answer) gets a fresh key, in the same run or after a resume: a provider that
    honours keys would otherwise answer the cached failure forever. A retry with schema
    feedback changes the body and so the key. The scope changes when a tick is run anew
    (after a rewind), so a re-run asks afresh.
    """
    ident = call
    if ident is None:
        return None
    h = hashlib.blake2b(digest_size=16)
    h.update(ident.scope.encode())
    h.update(b"\0")
    h.update(ident.request_id.encode())
    h.update(b"\0")
    h.update(body)
    if ident.failures_seen:
        h.update(b"\0failures=%d" % ident.failures_seen)
    return "sim-" + h.hexdigest()


def request_id(tick: int, phase: str, entity_key: str | None, n: int) -> str:
    return f"{tick}:{phase}:{entity_key or '-'}:{n}"


def _diff(old: str, new: str, name: str, limit: int = 12) -> str:
    lines = list(
        difflib.unified_diff(
            old.splitlines(),
            new.splitlines(),
            f"recorded/{name}",
            f"now/{name}",
            lineterm="",
            n=1,
        )
    )
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more lines)"]
    return "\n".join(lines)


def _pretty_input(text: str) -> str:
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return text


def describe_drift(
    recorded: dict[str, Any], now: CallIdentity, recorded_instructions: str | None
) -> tuple[list[str], str]:
    """Which fields of a request differ from its recording, and a short unified diff.

    Args:
        recorded: the call record from the tick log.
        now: the request as it is made now.
        recorded_instructions: the recorded instructions text, if the log holds it.

    Returns:
        (names of the differing fields, a diff of the first textual difference).
    """
    fields: list[str] = []
    diffs: list[str] = []
    if recorded.get("instructions_digest") != now.instructions_digest:
        fields.append("instructions")
        if recorded_instructions is not None:
            diffs.append(_diff(recorded_instructions, now.instructions, "instructions"))
    if recorded.get("input") != now.input:
        fields.append("input")
        diffs.append(
            _diff(_pretty_input(str(recorded.get("input", ""))), _pretty_input(now.input), "input")
        )
    if recorded.get("schema_digest") != now.schema_digest:
        fields.append("schema")
        diffs.append(
            f"schema {recorded.get('schema_name')} -> {now.schema_name}: JSON schema changed"
        )
    if recorded.get("model") != now.model:
        fields.append("model")
        diffs.append(f"model {recorded.get('model')!r} -> {now.model!r}")
    if recorded.get("settings") != now.settings:
        fields.append("settings")
        diffs.append(f"settings {recorded.get('settings')} -> {now.settings}")
    if (
        recorded.get("history") != now.history
        or recorded.get("previous_response_id") != now.previous_response_id
    ):
        fields.append("history")
        diffs.append(f"chain sent {recorded.get('history')} -> {now.history}")
    return fields, "\n".join(d for d in diffs if d)
