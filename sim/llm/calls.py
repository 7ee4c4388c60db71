"""The identity of one LLM call: who asked (request id) and exactly what was asked (digest).

A call is named ``{tick}:{phase}:{entity_key}:{n}`` (``n`` counts that entity key's calls
within the phase, from 0) and fingerprinted by a digest over everything that decides its
answer: instructions, input, schema, model and settings, and the chain sent (window
history or ``previous_response_id``). The tick recorder (``sim.engine.recorder``) sets the current
call in a context variable just before the client hands the request to the adapter, so
adapter wrappers that serve recorded answers (``replay``, resume) know which call they are
answering without the client having to pass it along.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
from contextvars import ContextVar
from dataclasses import dataclass, field
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


@dataclass(slots=True)
class CallIdentity:
    """What one call asked, in the form the tick log records and replay compares.

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
    #: failed attempts of this call whose outcome was seen, in this run and in the runs a
    #: resume continues (the recorder seeds it from the log, ``note_failure`` counts on)
    failures_seen: int = 0
    #: the Batch API batches that carried this call's attempts (``sim.providers.batch``)
    batch_ids: list[str] = field(default_factory=list)

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

    def set_sent(self, request: ModelRequest) -> None:
        """Fill in what the adapter is actually sent."""
        self.model = request.settings.model
        self.settings = settings_dict(request.settings)
        if request.messages or request.tool_choice != "required":
            # a step of a tool conversation: what was said so far decides its answer too
            # (absent for single-turn calls, so their records and digests are unchanged)
            steps = [m.model_dump(mode="json", exclude_none=True) for m in request.messages]
            self.settings["tool_choice"] = request.tool_choice
            self.settings["conversation"] = digest(orjson.dumps(steps))
        self.history = [e.response_id for e in request.history]
        self.previous_response_id = request.previous_response_id


#: the call the current task is making (set by the recorder on ``llm_called``)
current_call: ContextVar[CallIdentity | None] = ContextVar("sim_current_call", default=None)

#: error codes of attempts whose outcome the client never saw: the request may have been
#: answered (and billed) by the server, so sending it again must reuse its key (a stream
#: cut short: the provider may have finished the answer the client did not receive)
UNOBSERVED = frozenset({"timeout", "connection_error", "stream_cut"})
#: error codes of attempts that were never sent
UNSENT = frozenset({"circuit_open", "budget_exceeded"})


def observed_failure(code: str | None) -> bool:
    """Whether an attempt that ended with ``code`` failed with an outcome the client saw."""
    return code is not None and code not in UNOBSERVED and code not in UNSENT


def note_failure(code: str | None) -> None:
    """Count a failed attempt of the current call, if its outcome was seen: the next
    attempt then asks with a fresh idempotency key (the recovery layer calls this)."""
    ident = current_call.get()
    if ident is not None and observed_failure(code):
        ident.failures_seen += 1


def idempotency_key(body: bytes) -> str | None:
    """The ``Idempotency-Key`` for sending ``body`` as the current call, if one is set.

    Same tick scope, request id, exact body and number of failures seen give the same
    key, so the same attempt re-sent after a crash, Ctrl-C or a client-side timeout (its
    outcome never seen) can be answered from a provider's cache rather than paid for
    twice. A retry after a failure the client saw (an error status, an ``incomplete`` or
    malformed answer) gets a fresh key, in the same run or after a resume: a provider that
    honours keys would otherwise answer the cached failure forever. A retry with schema
    feedback changes the body and so the key. The scope changes when a tick is run anew
    (after a rewind), so a re-run asks afresh.
    """
    ident = current_call.get()
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
