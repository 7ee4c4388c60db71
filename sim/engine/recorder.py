"""The tick recorder: writes a tick's log as it runs, and resumes an interrupted tick.

It is three things the runner plugs in: a ``CallNamer`` (``name_call``) the phases' clients
name each call with (``sim.llm.calls``: the identity then travels in the request, with the
exact settings and chain it is sent), an ``LLMEvent`` sink (``on_event``) that appends a
``call`` record as soon as a call completes, and ``wrap`` for the adapter. When a log for
the tick already exists without a ``commit`` record, the tick was interrupted: the recorder
appends a ``resume`` record and ``wrap`` puts a ``ReplayAdapter`` in ``resume`` mode around
the adapter, so calls the log already holds are answered from it and never sent again.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from sim.config import Config, loggable
from sim.errors import LogError
from sim.llm.batching import BATCH_PRICE_FACTOR, BatchLine, SubmittedBatch
from sim.llm.budget import Cost, Price, price_usage
from sim.llm.calls import (
    CallIdentity,
    digest,
    observed_failure,
    request_id,
    schema_digest,
    sent_fields,
)
from sim.llm.embedding import EmbeddingSent
from sim.llm.events import LLMEvent
from sim.llm.redact import redact_text
from sim.llm.streaming import CallText
from sim.llm.types import Adapter, ModelRequest, Usage
from sim.phases.base import TickContext
from sim.providers.replay import ReplayAdapter
from sim.storage import Storage
from sim.ticklog.books import attempts_cost
from sim.ticklog.compression import LogCompression
from sim.ticklog.format import (
    ABANDONED_DIR,
    digests_state,
    header,
    is_state_file,
    log_path,
    marker_rel,
    prune,
    read_store,
    state_digest,
    state_line,
)
from sim.ticklog.reader import TickLog, read_log
from sim.ticklog.records import (
    AttemptRecord,
    BatchLineRecord,
    BatchRecord,
    CallRecord,
    CommitRecord,
    EmbeddingRecord,
    HeaderRecord,
    InstructionsRecord,
    InterruptedRecord,
    InterventionRecord,
    ModelErrorRecord,
    PhaseRecord,
    PhaseReportRecord,
    PolicyRecord,
    ResumeRecord,
    UsageRecord,
    dump_record,
)
from sim.ticklog.summary import (
    Summary,
    SummaryBuilder,
    places_at,
    places_of,
    summary_path,
    write_summary,
)
from sim.ticklog.writer import LogWriter
from sim.world import World


def request_schema(request: ModelRequest) -> tuple[str, str]:
    """The name and digest of what a request asks for: its schema, or its tools."""
    if request.tools is not None:
        declared = [tool.model_dump(mode="json") for tool in request.tools]
        return "ToolCalls", digest(orjson.dumps(declared, option=orjson.OPT_SORT_KEYS))
    assert request.schema is not None  # a ModelRequest has exactly one of the two
    return request.schema.__name__, schema_digest(request.schema)


def attempt_record(
    event: LLMEvent, model: str | None = None, raw: str | None = None, error: str | None = None
) -> AttemptRecord:
    """One attempt of a call, as the log records it (``raw`` only for the final answer,
    ``error`` only for a failed final one). Validated in one pass, its usage included:
    this runs for every call."""
    fields: dict[str, Any] = {
        "attempt": event.attempt,
        "model": event.model if model is None else model,
        "provider": event.provider,
        "usage": event.usage.to_dict(),
        "latency": round(event.latency, 6),
        "error_code": event.error_code,
        "raw": raw,
    }
    if error is not None:
        fields["error"] = error
    endpoint = getattr(event, "endpoint", None)
    if endpoint is not None:  # absent without a network (offline, replay)
        fields["endpoint"] = endpoint
    return AttemptRecord.model_validate(fields)


def call_record(
    ident: CallIdentity,
    event: LLMEvent,
    earlier: list[AttemptRecord],
    config: Config,
    prices: dict[str, Price | None],
    batch_ids: dict[str, list[str]] | None = None,
) -> tuple[CallRecord, Cost] | None:
    """A finished call's record and its cost at ``config``'s prices (``None``: a resumed
    call, already in the log). ``earlier``: its earlier attempts (``attempt_record`` of each
    non-final event); ``prices``: each model's price, looked up once (filled here);
    ``batch_ids``: per request id, the Batch API batches that carried it (its entry is
    taken). The recorder makes each record with it, and so does a sharded tick's worker
    that runs its own calls (``sim.engine.shard_worker``)."""
    sent: dict[str, Any] = {
        "request_id": ident.request_id,
        "phase": ident.phase,
        "entity_key": ident.entity_key,
        "n": ident.n,
        "instructions_digest": ident.instructions_digest,
        "input": ident.input,
        "schema_name": ident.schema_name,
        "schema_digest": ident.schema_digest,
        "model": ident.model,
        "settings": ident.settings,
        "depth": ident.depth,
        "history": ident.history,
        "previous_response_id": ident.previous_response_id,
        "digest": ident.digest,
        "latency": round(event.latency, 6),
    }
    response = event.response
    if event.kind == "llm_completed" and response is not None:
        served = response.served_from
        parsed = response.parsed
        final = attempt_record(event, model=response.model, raw=response.raw)
        came_back: dict[str, Any] = {
            "source": served,
            "result": parsed.model_dump(mode="json"),
            "result_type": f"{type(parsed).__module__}:{type(parsed).__qualname__}",
            "response_id": response.response_id,
            "response_model": response.model,
            "finish_reason": response.finish_reason,
            "error_code": None,
            "error": None,
        }
    else:
        error = event.error
        served = error.served_from if error is not None else "live"
        # stored: any URL the error quotes without its credentials
        message = redact_text(str(error)) if error is not None else ""
        final = attempt_record(event, error=message)
        came_back = {
            "source": served,
            "result": None,
            "response_id": None,
            "response_model": None,
            "finish_reason": None,
            "error_code": event.error_code,
            "error": message,
        }
        if error is not None and error.model_errors:  # each model of a fallback chain
            came_back["model_errors"] = [
                ModelErrorRecord(
                    target=str(e.context.get("target") or e.model or ""),
                    error_code=e.code,
                    error=str(e),
                )
                for e in error.model_errors
            ]
    attempts = [*earlier, final]
    carried = batch_ids.pop(ident.request_id, None) if batch_ids is not None else None
    batched = {"batch_ids": carried} if carried else {}
    if served == "resume":
        return None  # already in this log, its cost counted
    cost = attempts_cost(attempts, config.prices, prices, BATCH_PRICE_FACTOR if batched else 1.0)
    endpoint = getattr(event, "endpoint", None)
    if endpoint is not None:
        came_back["endpoint"] = endpoint
    # the final attempt's tokens are the call's: one frozen TokenCounts for both
    record = CallRecord(
        **sent,
        usage=final.usage,
        **came_back,
        attempts=attempts,
        cost_usd=cost.value,
        **batched,
    )
    return record, cost


#: the built-in phases whose results a ``TickContext`` holds apart from its ``results``:
#: typed (``intentions``, ``resolutions``) or as ``narratives`` (``phase_results`` reads
#: them there)
HELD_APART = frozenset({"intentions", "resolution", "narrative"})


def phase_results(name: str, ctx: TickContext) -> dict[str, Any]:
    """A phase's results as the tick log holds them."""
    return _results(name, ctx)


def _results(name: str, ctx: TickContext) -> dict[str, Any]:
    if name == "intentions":
        return {k: v.model_dump(mode="json") for k, v in ctx.intentions.items()}
    if name == "resolution":
        return {k: v.model_dump(mode="json") for k, v in ctx.resolutions.items()}
    if name == "narrative":
        return dict(ctx.narratives)
    return dict(ctx.results.get(name, {}))  # a declared or entry-point phase


def _set_aside(path: Path) -> Path:
    """Move a log the tick cannot continue into ``.sim/log/abandoned/``, never deleting it."""
    folder = path.parent / ABANDONED_DIR
    folder.mkdir(parents=True, exist_ok=True)
    n = 1
    while (target := folder / f"{path.stem}.{n}.jsonl").exists():
        n += 1
    path.rename(target)
    return target


class CallNames:
    """Names the calls of one tick (a ``sim.llm.calls.CallNamer``): ``{tick}:{phase}:
    {entity_key}:{n}``, keyed for idempotency by the tick's ``scope``. The recorder holds
    one; a shard's worker (``sim tick --workers``) gets a copy, and names its part's calls
    as the recorder would (its entity keys are its own: the counters never overlap).

    Args:
        failures_seen: per request id, the failed attempts an earlier run of the tick saw.
    """

    def __init__(self, tick: int, scope: str, failures_seen: Mapping[str, int]) -> None:
        self.tick = tick
        self.scope = scope
        self.failures_seen = dict(failures_seen)
        self._counters: dict[tuple[str, str | None], int] = {}

    def __call__(
        self, phase: str, entity_key: str | None, request: ModelRequest, depth: int
    ) -> CallIdentity:
        counter = (phase, entity_key)
        n = self._counters.get(counter, 0)
        self._counters[counter] = n + 1
        schema_name, schema_hash = request_schema(request)
        rid = request_id(self.tick, phase, entity_key, n)
        return CallIdentity(
            rid,
            phase,
            entity_key,
            n,
            request.instructions,
            request.input,
            schema_name,
            schema_hash,
            depth=depth,
            scope=self.scope,
            failures_seen=self.failures_seen.get(rid, 0),
            **sent_fields(request),  # made as sent: one object per call, not a copy
        )

    def copy(self) -> CallNames:
        """A fresh namer of the same tick (no call counted yet)."""
        return CallNames(self.tick, self.scope, self.failures_seen)


class TickRecorder:
    """Records one tick into ``.sim/log/tick-NNNNNN.jsonl``.

    Build it with ``TickRecorder.begin``; then ``wrap`` the adapter, give ``name_call`` and
    ``on_event`` to the phases' clients, call ``phase_end`` after each phase and
    ``calls_done`` after the last, put ``commit_files`` into the tick's commit and call
    ``committed`` after it, then ``compress`` (or ``close`` when the tick fails).
    """

    def __init__(
        self,
        root: Path,
        tick: int,
        config: Config,
        seed: int,
        before: dict[str, bytes],
        partial: TickLog | None,
        phases: Mapping[str, Any] | None = None,
        interventions: Sequence[InterventionRecord] = (),
        where: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.tick = tick
        self.config = config
        #: the state files as the tick began, until ``open`` logs them (their bytes are the
        #: world's, freed as the commit replaces them)
        self._before: dict[str, bytes] | None = before
        #: the digest of each of them (``open``): all the commit needs of them
        self._digests: dict[str, str] = {}
        self._interventions = list(interventions)
        #: each character's location as the tick began (``where``: from the loaded world;
        #: parsing every character file again at the commit cost seconds for a big world)
        self._where = dict(where) if where is not None else places_of(before).where()
        self.partial = partial
        self.notes: list[str] = []
        self.resumed_calls = 0
        self._names: CallNames | None = None
        self._inflight: dict[int, CallIdentity] = {}
        self._attempts: dict[int, list[AttemptRecord]] = {}
        self._instructions: set[str] = set(partial.instructions) if partial else set()
        self._calls: set[str] = set(partial.calls) if partial else set()
        self._commit: CommitRecord | None = None
        self._committed = False
        #: the log compressed while the commit runs (``calls_done`` starts it)
        self._compression: LogCompression | None = None
        #: the tick's usage record (``calls_done``)
        self._usage: UsageRecord | None = None
        self._summary: Summary | None = None
        #: what the tick's logged calls cost at the configured prices
        self._cost_usd = 0.0
        self._prices: dict[str, Price | None] = {}
        #: a logged call used a model without a price: the tick's cost is unknown
        self._cost_unknown = False
        #: per request id, the failed attempts whose outcome a run saw (``sim.llm.calls``:
        #: a call sent again after them asks with a fresh idempotency key)
        self._failures_seen: dict[str, int] = {}
        #: per request id, the Batch API batches that carried its attempts (``carried``)
        self._batch_ids: dict[str, list[str]] = {}
        # every call record, superseded ones included: a resumed call's earlier attempts
        # were billed too
        for earlier in partial.embeddings if partial else ():  # sent, and billed
            self._add_cost(earlier.cost_usd)
        for call in partial.call_records if partial else ():
            self._add_cost(call.cost_usd)
            self._failures_seen[call.request_id] = self._failures_seen.get(
                call.request_id, 0
            ) + sum(1 for a in call.every_attempt() if observed_failure(a.error_code))
        #: keys the idempotency of this tick's calls; a resume keeps it (sim.llm.calls)
        self.scope = (
            (partial.header.scope or str(partial.path)) if partial else secrets.token_hex(8)
        )
        head: HeaderRecord = (
            partial.header
            if partial is not None
            else header(tick, loggable(config), seed, self.scope, phases)
        )
        #: the tick's summary, fed every call record and embeddings request the log holds
        #: (sim.ticklog.summary), in its order
        self._head = head
        self.summary = SummaryBuilder(head)
        for record in partial.billed() if partial else ():
            self.summary.add(record)
        # a tick not yet committed has no summary: one left by an earlier run of this tick
        # number (a crash during `sim rewind`) must not describe it
        with contextlib.suppress(FileNotFoundError):
            summary_path(root, tick).unlink()
        #: a new log's folders that did not exist before it (``discard_unused`` removes them)
        self._made_dirs: list[Path] = []
        #: a call, a policy decision or a batch went into the log (it may have cost money)
        self._spent = False
        self._writer: LogWriter | None = None

    @property
    def writer(self) -> LogWriter:
        """The log's writer, once ``open`` has written its head."""
        if self._writer is None:
            raise RuntimeError(f"the log of tick {self.tick} is not open yet")
        return self._writer

    def open(self) -> LogWriter:
        """Write the log's head, durably, before anything else goes in: a new log is
        created with its header, the state as the tick began and the interventions it
        applies in it; a resumed one gets a record of this run. Nothing is logged before
        (``begin(open_now=False)``: a sharded tick's workers get their plans first, and run
        their free local model's calls while this is written; the coordinator logs them
        once it starts their phase, ``Shards.starting``). Once only: later, the writer."""
        if self._writer is not None:
            return self._writer
        before, self._before = self._before, None
        assert before is not None
        self._digests = {rel: digest(data) for rel, data in before.items()}
        self._state_before = digests_state(self._digests)
        path = log_path(self.root, self.tick)
        if self.partial is None:
            log_dir = path.parent
            self._made_dirs = [d for d in (log_dir, log_dir.parent) if not d.exists()]
            # created with its header in it: a kill at any instant never leaves an empty log
            self._writer = LogWriter.create(
                path, [self._head, state_line(before, self._state_before), *self._interventions]
            )
        else:
            self._writer = LogWriter(path)
            self._writer.append(
                ResumeRecord(
                    attempt=self.partial.resumes + 2,
                    calls_logged=len(self.partial.calls),
                    config=loggable(self.config),
                )
            )
            self._writer.sync()
        return self._writer

    @classmethod
    def begin(
        cls,
        storage: Storage,
        world: World,
        config: Config,
        phases: Mapping[str, Any] | None = None,
        *,
        interventions: Sequence[InterventionRecord] = (),
        open_now: bool = True,
    ) -> TickRecorder:
        """Start the log of the tick after ``world.tick``, resuming an interrupted one.

        Args:
            phases: the phase list and template and schema digests, for the header.
            interventions: ``sim inject`` / ``sim set`` records this tick applies, logged
                after the state (a resumed log has them already).
            open_now: write the log's head now (``open``); ``False``: the caller does,
                before the tick's first record.
        """
        root = storage.root
        tick = world.tick + 1
        before = {rel: data for rel, data in world.originals.items() if is_state_file(rel)}
        before.update(read_store(root))
        path = log_path(root, tick)
        partial: TickLog | None = None
        notes: list[str] = []
        if path.exists():
            try:
                log = read_log(path)
            except LogError as exc:
                notes.append(f"unreadable log set aside ({exc}): {_set_aside(path)}")
            else:
                if (
                    log.committed
                    or log.state_before is None
                    or log.state_before.digest != state_digest(before)
                ):
                    target = _set_aside(path)
                    notes.append(f"a log of tick {tick} for another state was set aside: {target}")
                else:
                    partial = log
        where = {cid: c["state"]["location"] for cid, c in world.characters.items()}
        recorder = cls(
            root, tick, config, world.seed, before, partial, phases, interventions, where
        )
        recorder.notes.extend(notes)
        if open_now:
            recorder.open()
        return recorder

    def wrap(self, adapter: Adapter) -> Adapter:
        """The adapter the tick should use: resuming if the log has calls."""
        if self.partial is not None and self.partial.calls:
            return ReplayAdapter(
                self.partial.replay_calls(),
                instructions=self.partial.instructions,
                live=adapter,
                mode="resume",
            )
        return adapter

    # -- calls and events -----------------------------------------------------------------

    def name_call(
        self, phase: str, entity_key: str | None, request: ModelRequest, depth: int
    ) -> CallIdentity:
        """The identity of a call the client is making now (``sim.llm.calls.CallNamer``):
        named ``{tick}:{phase}:{entity_key}:{n}``, with what ``request`` sends."""
        return self.names(phase, entity_key, request, depth)

    @property
    def names(self) -> CallNames:
        """The tick's ``CallNamer`` (the one ``name_call`` uses)."""
        if self._names is None:
            self._names = CallNames(self.tick, self.scope, self._failures_seen)
        return self._names

    def on_event(self, event: LLMEvent) -> None:
        key = id(event.request)
        if event.kind == "llm_called":
            self._spent = True
            if event.call is not None:  # a call the recorder named
                self._inflight[key] = event.call
                self._attempts[key] = []
            return
        if not getattr(event, "final", True):  # an earlier attempt of a call with retries
            if key in self._attempts:
                self._attempts[key].append(attempt_record(event))
            return
        done = self._inflight.pop(key, None)
        if done is None:
            return
        # as it was last sent (a call whose provider lost its chain was sent again)
        self._record(event.call or done, event, self._attempts.pop(key, []))

    def embedded(self, sent: EmbeddingSent) -> None:
        """Log an embeddings request the server answered (``sim.mind.vectors.fetch``, before
        it caches the vectors), priced at the configured prices: the books count its tokens
        and cost (``sim.ticklog.books``). A resumed or replayed tick finds its texts cached
        and sends (and logs) nothing again."""
        self._spent = True
        tokens = max(0, sent.usage.input_tokens)  # all an embeddings request is billed for
        usage = Usage(input_tokens=tokens)
        cost = price_usage(usage, sent.model, self.config.prices, self._prices, sent.provider)
        self._add_cost(cost.value)
        record = EmbeddingRecord(
            phase=sent.phase,
            model=sent.model,
            provider=sent.provider,
            texts=sent.texts,
            input_tokens=tokens,
            cost_usd=cost.value,
        )
        self.writer.append(record)
        # a fresh tick's header holds this config's prices, as for a call (``_record``)
        self.summary.add_embedding(record)

    def replayed(self, record: EmbeddingRecord) -> None:
        """Write a logged embeddings request into a replayed tick's log as it was logged
        (``sim replay``: the cache holds its texts, nothing is sent), so the replay's
        books are the logged tick's."""
        self._add_cost(record.cost_usd)
        self.writer.append(record)
        self.summary.add_embedding(record)

    def decision(self, record: PolicyRecord) -> None:
        """Log a policy decision that was not "allow", before the call it decided; one
        that stops the tick (defer, ask) is made durable at once."""
        self._spent = True
        self.writer.append(record)
        if record.decision != "deny":
            self.writer.sync()

    def interrupted(self, streamed: list[CallText]) -> None:
        """Log each call still in flight when the tick was interrupted, with the text it
        had streamed so far. Resume ignores these records: the calls are sent again.
        (Before ``open`` no call of this process was made: nothing to log.)"""
        if self._writer is None:
            return
        partial = {(c.phase, c.entity_key): c.text for c in streamed}
        for ident in self._inflight.values():
            self.writer.append(
                InterruptedRecord(
                    request_id=ident.request_id,
                    phase=ident.phase,
                    entity_key=ident.entity_key,
                    partial=partial.get((ident.phase, ident.entity_key), ""),
                )
            )
        self._inflight.clear()
        self.writer.sync()

    def _record(self, ident: CallIdentity, event: LLMEvent, earlier: list[AttemptRecord]) -> None:
        made = self._call_record(ident, event, earlier)
        if made is None:
            self.resumed_calls += 1
            return
        record, cost = made
        if ident.instructions_digest not in self._instructions:
            self._instructions.add(ident.instructions_digest)
            self.writer.append(
                InstructionsRecord(digest=ident.instructions_digest, text=ident.instructions)
            )
        self._calls.add(ident.request_id)
        self.writer.append_call(record)
        # a fresh tick's header holds this config's prices: the summary takes the cost as
        # priced here (a resumed one prices at its header's, which the config may not hold)
        self.summary.add_call(record, cost if self.partial is None else None)

    def _call_record(
        self, ident: CallIdentity, event: LLMEvent, earlier: list[AttemptRecord]
    ) -> tuple[CallRecord, Cost] | None:
        """The call's record and its cost at the configured prices (``None``: a resumed
        call, already in this log)."""
        made = call_record(ident, event, earlier, self.config, self._prices, self._batch_ids)
        if made is not None:
            self._add_cost(made[1].value)
        return made

    def logged(self, calls: Sequence[tuple[CallRecord, bytes, Cost, str | None]]) -> None:
        """Log calls a sharded tick's workers made and recorded themselves (``call_record``
        and ``packed_call_line``, in ``sim.engine.shard_worker``): each call's record, its
        packed line, its cost and its instructions' text when the worker had not sent them
        before. Flushed, as ``on_event`` does, before the workers are told and use the
        answers."""
        self._spent = True
        lines: list[bytes] = []
        for record, line, cost, instructions in calls:
            self._add_cost(cost.value)
            digest_ = record.instructions_digest
            if digest_ not in self._instructions and instructions is not None:
                self._instructions.add(digest_)
                lines.append(dump_record(InstructionsRecord(digest=digest_, text=instructions)))
            self._calls.add(record.request_id)
            lines.append(line)
            self.summary.add_call(record, cost if self.partial is None else None)
        self.writer.append_lines(lines)

    def _add_cost(self, cost: float | None) -> None:
        if cost is None:
            self._cost_unknown = True
        else:
            self._cost_usd += float(cost)

    # -- Batch API batches (``sim.llm.batching.BatchJournal``) --------------------------------

    def resumable(self) -> dict[BatchLine, str]:
        """The lines of the batches earlier runs of this tick created, with their batch ids."""
        found: dict[BatchLine, str] = {}
        for batch in self.partial.batches if self.partial is not None else ():
            for line in batch.lines:
                found[BatchLine(line.custom_id, line.digest)] = batch.batch_id
        return found

    def carried(self, request_id: str, batch_id: str) -> None:
        """Note that a batch carried an attempt of the call ``request_id`` (its record
        then names the batches, and is priced at the Batch API's rate)."""
        self._batch_ids.setdefault(request_id, []).append(batch_id)

    def submitted(self, batch: SubmittedBatch) -> None:
        """Log a batch the provider accepted, durably, before waiting for it: if the process
        stops now, the next run finds it here and polls it rather than paying again."""
        self._spent = True
        self.writer.append(
            BatchRecord(
                batch_id=batch.batch_id,
                phase=batch.phase,
                endpoint=batch.endpoint,
                input_file_id=batch.input_file_id,
                lines=[
                    BatchLineRecord(custom_id=x.custom_id, digest=x.digest) for x in batch.lines
                ],
            )
        )
        self.writer.sync()

    # -- phases and commit ----------------------------------------------------------------

    def phase_end(self, name: str, ctx: TickContext, results: dict[str, Any] | None = None) -> None:
        """Record a phase's results (``results``: as logged, gathered from the shards of
        a sharded tick; else the context's) and make the log durable before the next
        phase."""
        report = ctx.reports[-1]
        self.writer.append(
            PhaseRecord(
                name=name,
                report=PhaseReportRecord.model_validate(report.to_dict()),
                results=_results(name, ctx) if results is None else results,
            )
        )
        self.writer.sync()

    def calls_done(self, totals: Mapping[str, Any]) -> None:
        """The tick's calls are over: its usage record goes in, and the log's compression
        starts (``LogCompression``), reading the log while the tick's files are made and
        digested; ``commit_files`` gives it the one line still to come."""
        cost = None if self._cost_unknown else round(self._cost_usd, 8)
        usage = UsageRecord.model_validate(
            {**totals, "cost": cost, "resumed_calls": self.resumed_calls}
        )
        self._usage = usage
        self.writer.append(usage)
        self.writer.sync()
        level = self.config.history.compress_level
        if level > 0:  # compressed while the commit writes the world
            self._compression = LogCompression(self.writer.path, level)

    def commit_files(
        self,
        storage: Storage,
        world: World,
        store_changes: Mapping[str, bytes | None],
        changed: Mapping[str, bytes] | None = None,
    ) -> dict[str, bytes | None]:
        """The marker file that completes the log, to put into the tick's atomic commit
        (after ``calls_done``).

        ``changed``: ``storage.changed_files(world)`` if the caller already has it.
        """
        assert self._usage is not None, "commit_files comes after calls_done"
        after = dict(self._digests)
        for rel, new in (storage.changed_files(world) if changed is None else changed).items():
            after[rel] = digest(new)
        for rel, data in store_changes.items():
            if not is_state_file(rel):
                continue
            if data is None:
                after.pop(rel, None)
            else:
                after[rel] = digest(data)
        self._commit = CommitRecord(
            tick=self.tick,
            state_after=digests_state(after),
            calls=len(self._calls),
            committed_at=time.time(),
        )
        self._summary = self.summary.finish(
            committed=True,
            wall=self._usage.elapsed,
            resumes=self.partial.resumes + 1 if self.partial is not None else 0,
            state_before=self._state_before,
            commit=self._commit,
            places=places_at(self._where),  # what `sim report` places characters by
        )
        marker = dump_record(self._commit)
        if self._compression is not None:
            self._compression.end_with([marker])
        return {marker_rel(self.tick): marker}

    def committed(self) -> None:
        """After the commit: the log gets its final record and its summary, the marker
        goes. ``compress`` does the rest."""
        assert self._commit is not None
        self.writer.append(self._commit)
        self.writer.close()
        self._committed = True
        with contextlib.suppress(FileNotFoundError):
            (self.root / marker_rel(self.tick)).unlink()
        # derived from the log: a crash before these is made good by `recover_logs`
        assert self._summary is not None
        write_summary(self.root, self._summary)

    def compress(self) -> None:
        """After ``committed``: the compressed log takes the plain one's place and old
        logs go (derived from the log: a crash before this is made good by
        ``recover_logs``)."""
        assert self._committed
        if self._compression is not None:
            self._compression.finish()
            self._compression = None
        prune(self.root, self.tick, self.config.history.keep_ticks)

    def close(self, failed: bool = False) -> None:
        """Called however the tick ended; one that stopped without committing keeps what
        was logged, durably, and plain. ``failed``: the tick raised, perhaps after its
        commit (a response's deletion, say): the compression stops too (a child process
        ended and waited for, not left running), and the next run compresses the plain
        log (``recover_logs``), as after a crash at that point."""
        if self._writer is not None:  # else it was never written
            self._writer.close()
        if self._compression is not None and (failed or not self._committed):
            self._compression.cancel()
            self._compression = None

    def discard_unused(self) -> bool:
        """Remove a log this run created for a tick that stopped on bad input (a template
        that fails to render, say) before any call, decision or batch was logged: it holds
        only what the world's files already say, and bad input writes nothing. The folders
        its creation made go too. Returns whether it was removed (a resumed log, or one
        holding anything paid for, is kept)."""
        if self.partial is not None or self._spent or self._committed:
            return False
        self.close()
        if self._writer is None:  # never written
            return True
        with contextlib.suppress(FileNotFoundError):
            self._writer.path.unlink()
        for folder in self._made_dirs:  # deepest first; one holding anything else stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        return True


__all__ = ["CallNames", "TickRecorder", "phase_results"]
