"""The tick log's records as typed models: what ``sim.ticklog.writer`` writes and
``sim.ticklog.reader`` reads (``sim.ticklog.format``: each record's line).

One model per record ``type`` (``header``, ``state_before``, ``intervention``,
``instructions``, ``call``, ``embedding``, ``phase``, ``resume``, ``interrupted``,
``batch``, ``policy``, ``usage``, ``commit``, ``compacted``) and ``LogRecord``, their
union discriminated on ``type``. ``parse_record`` is the only way a line of a log becomes
a record, and ``dump_record`` the only way a record becomes a line.

Round trip: a record keeps which fields its line held (pydantic's "fields set"), and
``dump_record`` writes exactly those, in declaration order, with orjson, so a log written
by this sim reads back and re-serialises to the same bytes, and a field that was absent in
an older log of format 1 stays absent. Fields added to format 1 over time have defaults, so
older logs read, and so do record types added to format 1 (``embedding``): a log without
them is what older sims wrote. A field no model declares is refused (``extra="forbid"``): logs are
written only by sim, so an unknown field means a newer sim or a hand edit, and the reader
names it rather than guess; a change old readers must not miss bumps ``FORMAT_VERSION``
and adds a migration (``sim.ticklog.format.MIGRATIONS``).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from sim.llm.budget import BATCH_PRICE_FACTOR, Price
from sim.llm.types import Usage


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class _Record(_Model):
    """Base of the top-level records: the ``type`` tag is always written."""

    type: str

    def model_post_init(self, context: Any, /) -> None:
        self.__pydantic_fields_set__.add("type")


class TokenCounts(_Model):
    """Tokens as the log writes them (``Usage.to_dict()``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    @classmethod
    def of(cls, usage: Usage) -> TokenCounts:
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
        )

    def to_usage(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=self.cached_input_tokens,
        )


class HeaderRecord(_Record):
    """First record: format version, tick, seed, the config used (no secrets), call scope."""

    type: Literal["header"] = "header"
    format: int
    tick: int = 0
    seed: int = 0
    config: dict[str, Any] = Field(default_factory=dict)
    #: a nonce for this run of the tick: keys its calls' idempotency, kept by a resume;
    #: random, so that a tick run again (a copy, a fork, a rewind) asks afresh
    #: (``sim.ticklog.format.RUN_FIELDS``)
    scope: str = ""
    #: the phases run, in order, and the digests of their templates and answer schemas by
    #: name (absent in logs written before phases were declared by worlds)
    phases: list[str] | None = None
    templates: dict[str, str] | None = None
    schemas: dict[str, str] | None = None

    @property
    def prices(self) -> dict[str, Price]:
        """The ``[prices]`` table in effect when the tick ran (an entry that cannot be read
        leaves its model unpriced: its cost shows as unknown, never as zero)."""
        return price_table(self.config.get("prices"))


def price_table(table: Any) -> dict[str, Price]:
    """A logged ``[prices]`` table (a header's, a summary's) as prices: an entry that cannot
    be read leaves its model unpriced (its cost shows as unknown, never as zero)."""
    out: dict[str, Price] = {}
    for model, entry in (table if isinstance(table, dict) else {}).items():
        try:
            out[str(model)] = Price(
                float(entry["input"]), float(entry["cached_input"]), float(entry["output"])
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


class StateRecord(_Record):
    """The state at the start of the tick: its files' text by path as a JSON object
    (``encoding: "object"``), zlib-compressed and base64-encoded in the running logs of
    earlier sims (``"zlib+base64"``), or that object's JSON text in logs they compressed
    (``"json"``); ``sim.ticklog.format.unpack_state`` reads each."""

    type: Literal["state_before"] = "state_before"
    encoding: str
    digest: str
    files: int = 0
    data: str | dict[str, str]


class InterventionRecord(_Record):
    """An intervention made between ticks, which this tick applied: ``sim inject`` (an
    event the tick's inputs show at ``location``, or everywhere when it is ``None``) or
    ``sim set`` (``target``'s field ``path`` changed from ``before`` to ``after``; the
    change was already in the world files when the tick started).

    The same records wait in ``.sim/interventions.json`` until a tick commits them
    (``sim.interventions``); the log has them right after ``state_before``.
    """

    type: Literal["intervention"] = "intervention"
    kind: Literal["inject", "set"]
    #: its place among the interventions made since the last tick (1, 2, ...)
    n: int = 0
    #: inject: the event's text and where it happens (``None``: everywhere)
    text: str | None = None
    location: str | None = None
    #: set: the entity file (``characters/ada``), the dotted field path, the values
    target: str | None = None
    path: str | None = None
    before: Any = None
    after: Any = None


class InstructionsRecord(_Record):
    type: Literal["instructions"] = "instructions"
    digest: str
    text: str


class AttemptRecord(_Model):
    """One attempt of a call; ``raw`` only on the final one, ``error`` on a failed final."""

    attempt: int = 1
    model: str = ""
    #: the endpoint it went to (``[llm]``'s kind or a ``[providers.NAME]``); "" in older logs
    provider: str = ""
    usage: TokenCounts = Field(default_factory=TokenCounts)
    latency: float = 0.0
    error_code: str | None = None
    raw: str | None = None
    error: str | None = None
    #: the server URL the attempt went to (absent: no network, or a log from before)
    endpoint: str | None = None

    @property
    def target(self) -> str:
        """Where it ran, as ``sim usage --by model`` and ``calls.csv`` name it:
        ``provider/model`` (a log older than the provider field: the model alone)."""
        return f"{self.provider}/{self.model}" if self.provider else self.model


class ModelErrorRecord(_Model):
    """One model's error in a failed fallback chain (``LLMError.model_errors``)."""

    #: ``provider/model`` as recovery tried it
    target: str
    error_code: str
    error: str


class CallRecord(_Record):
    """One completed LLM call: what was sent, what came back, every attempt."""

    type: Literal["call"] = "call"
    request_id: str
    phase: str
    entity_key: str | None = None
    n: int = 0
    instructions_digest: str = ""
    input: str = ""
    schema_name: str = ""
    schema_digest: str = ""
    model: str = ""
    settings: dict[str, Any] = Field(default_factory=dict)
    depth: int = 0
    history: list[str] = Field(default_factory=list)
    previous_response_id: str | None = None
    digest: str = ""
    latency: float = 0.0
    #: the final attempt's tokens (``attempts`` has every attempt's)
    usage: TokenCounts = Field(default_factory=TokenCounts)
    source: str = "live"
    result: dict[str, Any] | None = None
    result_type: str | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reason: str | None = None
    error_code: str | None = None
    error: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    #: the attempts' cost at the prices in effect (``None``: a model had no price); a log
    #: is untrusted, so a negative or non-finite cost is refused, not summed into the books
    cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    #: the OpenAI Batch API batches that carried its attempts (absent: sent live); such a
    #: call is priced at the batch rate (``sim.llm.budget.BATCH_PRICE_FACTOR``)
    batch_ids: list[str] | None = None
    #: the server URL whose answer (or failure) ended the call (absent: no network)
    endpoint: str | None = None
    #: a failed call that tried several models: each model's error, in order (absent: one
    #: model was tried, or a log from before)
    model_errors: list[ModelErrorRecord] | None = None

    @property
    def price_factor(self) -> float:
        """What fraction of list prices this call is charged at."""
        return BATCH_PRICE_FACTOR if self.batch_ids else 1.0

    @property
    def failed(self) -> bool:
        return self.error_code is not None

    def every_attempt(self) -> list[AttemptRecord]:
        """The attempts, or for a record without them the call as one attempt."""
        if self.attempts:
            return self.attempts
        return [
            AttemptRecord(
                model=self.model,
                usage=self.usage,
                error_code=self.error_code,
                endpoint=self.endpoint,
            )
        ]


class EmbeddingRecord(_Record):
    """One embeddings request (``[memory] embeddings = "provider"``, ``sim.mind.vectors``),
    sent before phase ``phase`` built its inputs: the model, how many texts it carried,
    the tokens the server counted and their cost at the prices in effect (``None``: the
    model had no price). Appended as soon as the answer arrives, before its vectors are
    cached: a resumed or replayed tick finds them cached and sends nothing again.

    A request is not a model call: the books count it in ``embedding_requests``, its
    tokens and cost in the totals (``sim.ticklog.books``).
    """

    type: Literal["embedding"] = "embedding"
    phase: str
    model: str
    #: the endpoint it went to (``[llm]``'s kind or a ``[providers.NAME]``)
    provider: str = ""
    texts: int = Field(default=0, ge=0)
    #: the tokens the server counted (an embeddings request has input tokens only)
    input_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    def to_usage(self) -> Usage:
        return Usage(input_tokens=self.input_tokens)


class PhaseReportRecord(_Model):
    """A phase's report (``PhaseReport.to_dict()``)."""

    name: str = ""
    calls: int = 0
    failures: int = 0
    usage: TokenCounts = Field(default_factory=TokenCounts)
    fallbacks: list[str] = Field(default_factory=list)
    errors: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    retries: int = 0
    model_fallbacks: dict[str, str] = Field(default_factory=dict)
    #: attempts that timed out on the client (the server may have billed them)
    timed_out: int = 0
    #: what the phase left undone (``PhaseReport.gaps``); absent when nothing was
    gaps: list[str] = Field(default_factory=list)


class PhaseRecord(_Record):
    type: Literal["phase"] = "phase"
    name: str
    report: PhaseReportRecord = Field(default_factory=PhaseReportRecord)
    #: intentions, resolutions or narratives by id, as JSON
    results: dict[str, Any] = Field(default_factory=dict)


class ResumeRecord(_Record):
    type: Literal["resume"] = "resume"
    attempt: int
    calls_logged: int = 0
    config: dict[str, Any] = Field(default_factory=dict)


class InterruptedRecord(_Record):
    """A call still in flight when the tick was interrupted (Ctrl-C), with the text it had
    streamed by then; resume sends it again."""

    type: Literal["interrupted"] = "interrupted"
    request_id: str
    phase: str
    entity_key: str | None = None
    partial: str = ""


class PolicyRecord(_Record):
    """A policy decision that was not "allow" (``sim.policy``), before the call it decided.

    ``deny``: the call was not sent (its entity fell back, or with ``llm_failure_policy =
    "fail"`` the tick stopped); ``defer``: the tick stopped, resumable after ``until``;
    ``ask``: a person was asked (``answer``, and ``by`` whom or what: ``terminal``,
    ``--yes``, ``no terminal``). ``sim replay`` reproduces these instead of deciding again.
    """

    type: Literal["policy"] = "policy"
    request_id: str
    phase: str
    entity_key: str | None = None
    #: the policy that decided (``allowed_models``, a ``sim.policies`` entry point's name)
    policy: str
    decision: Literal["deny", "defer", "ask"]
    reason: str = ""
    #: ``defer``: when the tick may run again (ISO 8601, UTC), if the policy said
    until: str | None = None
    #: ``ask``: what the answer is remembered by within the tick (asked once per key)
    key: str | None = None
    answer: Literal["approved", "refused"] | None = None
    by: str | None = None


class BatchLineRecord(_Model):
    """One line of a Batch API batch: its custom id and the digest of its body."""

    custom_id: str
    digest: str


class BatchRecord(_Record):
    """A Batch API batch, written as soon as the provider accepted it: a resumed tick
    polls it again instead of submitting its calls a second time (``sim.providers.batch``)."""

    type: Literal["batch"] = "batch"
    batch_id: str
    phase: str
    endpoint: str = ""
    input_file_id: str = ""
    lines: list[BatchLineRecord] = Field(default_factory=list)


class UsageRecord(_Record):
    """The tick's totals, written just before the commit."""

    type: Literal["usage"] = "usage"
    calls: int = 0
    failures: int = 0
    usage: TokenCounts = Field(default_factory=TokenCounts)
    elapsed: float | None = None
    cost: float | None = None
    resumed_calls: int = 0


class CommitRecord(_Record):
    type: Literal["commit"] = "commit"
    tick: int
    state_after: str
    calls: int = 0
    committed_at: float = 0.0


class CompactedRecord(_Record):
    """``sim log --compact`` dropped this committed tick's call detail (its ``call`` and
    ``instructions`` records); its summary keeps the numbers. Such a tick cannot be replayed."""

    type: Literal["compacted"] = "compacted"
    #: call records dropped
    calls: int = 0
    #: the ``--before`` tick the compaction was asked for
    before: int = 0


LogRecord = Annotated[
    HeaderRecord
    | StateRecord
    | InterventionRecord
    | InstructionsRecord
    | CallRecord
    | EmbeddingRecord
    | PhaseRecord
    | ResumeRecord
    | InterruptedRecord
    | PolicyRecord
    | BatchRecord
    | UsageRecord
    | CommitRecord
    | CompactedRecord,
    Field(discriminator="type"),
]


@functools.cache
def _record_adapter() -> TypeAdapter[LogRecord]:
    return TypeAdapter(LogRecord)


def parse_record(data: Any) -> LogRecord:
    """A record from its parsed JSON object.

    Raises:
        pydantic.ValidationError: not a record of a known type, or a field is wrong.
    """
    return _record_adapter().validate_python(data)


def record_data(record: BaseModel) -> dict[str, Any]:
    """A record as the JSON object its line holds (the fields it was given, in order)."""
    return record.model_dump(mode="json", exclude_unset=True)


def dump_record(record: BaseModel) -> bytes:
    """A record as one log line's bytes, without the newline."""
    return orjson.dumps(record_data(record))


__all__ = [
    "AttemptRecord",
    "BatchLineRecord",
    "BatchRecord",
    "CallRecord",
    "CommitRecord",
    "CompactedRecord",
    "EmbeddingRecord",
    "HeaderRecord",
    "InstructionsRecord",
    "InterruptedRecord",
    "InterventionRecord",
    "LogRecord",
    "ModelErrorRecord",
    "PhaseRecord",
    "PhaseReportRecord",
    "PolicyRecord",
    "ResumeRecord",
    "StateRecord",
    "TokenCounts",
    "UsageRecord",
    "dump_record",
    "parse_record",
    "price_table",
    "record_data",
]
