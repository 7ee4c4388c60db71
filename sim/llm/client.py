"""The provider-agnostic LLM client: batches, response chains and usage (spec 002).

Phases speak only to ``LLMClient``. Beyond the spec:

- Requests sharing an ``entity_key`` in one batch run one after another, in order, each
  seeing the previous one's response; a plain ``gather`` would race on the chain. Other
  requests run in parallel under ``max_concurrency``.
- ``depth`` means the model sees exactly the last ``depth`` exchanges of the chain. In
  ``window`` mode (default) the client sends them itself from the ``ResponseStore``; in
  ``server`` mode it sends ``previous_response_id`` as the spec does.
- Evicted responses are not deleted at once: they are collected in ``pending_deletions``
  and deleted by the runner after the tick commits, so saved state never points at a
  deleted response.
- ``asyncio.CancelledError`` always propagates; it is never turned into an ``LLMError``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel

from sim.llm.batching import BatchOptions, BatchTransport
from sim.llm.calls import CallIdentity, CallNamer
from sim.llm.chain import Chain, ResponseChainManager
from sim.llm.enums import SchemaEnums
from sim.llm.errors import (
    LLMChainNotFoundError,
    LLMConfigurationError,
    LLMError,
    LLMRateLimitError,
)
from sim.llm.events import EventKind, EventSink, LLMEvent, null_sink
from sim.llm.store import ResponseStore
from sim.llm.streaming import StreamHub
from sim.llm.tools import LLMMessage, ToolDeclaration
from sim.llm.types import (
    Adapter,
    AdapterResponse,
    AnswerCheck,
    Attempt,
    CallSettings,
    Exchange,
    ModelRequest,
    ToolChoice,
    Usage,
)

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)
ChainMode = Literal["window", "server"]


@dataclass(slots=True)
class LLMRequest:
    """One request of a batch.

    Attributes:
        instructions: the system prompt, re-sent with every call.
        input_data: the user content (the entity's context).
        schema: the pydantic model the answer must validate against.
        entity_key: ``"{chain}:{entity_id}"`` to chain on, ``None`` for an independent call.
        depth_override: this request's chain depth instead of the client's default.
        tools: declare these tools and ask for a call instead of a schema answer; the
            result's ``parsed`` is then a ``ToolCalls`` (``schema`` is ignored).
        messages: with ``tools``, the tool conversation so far (a later step of it).
        tool_choice: with ``tools``, whether a call is required, allowed or not allowed.
        enums: the values some fields of the schema may hold in this request, sent in
            the schema (``sim.llm.enums``); ``None``: the schema as it is.
        check: a check of the parsed answer beyond its schema (a phase's references);
            a problem is a schema error, re-asked with it fed back (``sim.llm.recovery``).
    """

    instructions: str
    input_data: str
    schema: type[BaseModel]
    entity_key: str | None = None
    depth_override: int | None = None
    tools: tuple[ToolDeclaration, ...] | None = None
    messages: tuple[LLMMessage, ...] = ()
    tool_choice: ToolChoice = "required"
    enums: SchemaEnums | None = None
    check: AnswerCheck | None = None


class _AdapterCancelled(Exception):
    """Carries a CancelledError raised inside an adapter out of a TaskGroup."""


def unexpected_error(exc: Exception) -> LLMError:
    """An exception that is not an ``LLMError`` (a bug in an adapter) as one: code
    ``unexpected``, the exception its cause."""
    return LLMError(f"Unexpected error: {exc!r}", code="unexpected", cause=exc)


async def timed_answer(
    adapter: Adapter, request: ModelRequest
) -> tuple[AdapterResponse | LLMError, float]:
    """What ``adapter`` answers ``request``: its response, or the ``LLMError`` it failed with
    (another exception as ``unexpected_error``), and the seconds it took."""
    started = time.perf_counter()
    answer: AdapterResponse | LLMError
    try:
        answer = await adapter.execute(request)
    except LLMError as exc:
        answer = exc
    except Exception as exc:  # a bug in an adapter: an LLMError, as the client has it
        answer = unexpected_error(exc)
    return answer, time.perf_counter() - started


def finished_events(
    phase: str,
    request: Any,
    settings: CallSettings,
    latency: float,
    context: dict[str, Any],
    *,
    response: AdapterResponse | None = None,
    error: LLMError | None = None,
) -> list[LLMEvent]:
    """The events of a call that ended (``response``, or ``error``): one non-final
    ``llm_failed`` per earlier attempt, then the call's final event. ``context``: the chain
    context it was sent with (history, previous response id, depth, call identity).

    The client emits them; so does a sharded tick's coordinator (``sim.engine.shards``),
    which answers its workers' calls and logs each as its answer comes back.
    """
    key = request.entity_key if request is not None else None
    if key is None and context.get("call") is not None:
        key = context["call"].entity_key
    attempts = response.attempts if response is not None else error.attempts if error else ()
    events = [
        LLMEvent(
            "llm_failed",
            phase,
            key,
            earlier.model,
            request,
            attempt=earlier.attempt,
            latency=earlier.latency,
            usage=earlier.usage,
            error_code=earlier.error_code,
            final=False,
            provider=earlier.provider,
            endpoint=earlier.endpoint,
            **context,
        )
        for earlier in attempts[:-1]
    ]
    attempt, provider = (
        (attempts[-1].attempt, attempts[-1].provider) if attempts else (1, settings.provider)
    )
    if response is not None:
        events.append(
            LLMEvent(
                "llm_completed",
                phase,
                key,
                response.model,
                request,
                attempt=attempt,
                latency=latency,
                usage=response.usage,
                response=response,
                provider=provider,
                endpoint=response.endpoint,
                **context,
            )
        )
        return events
    assert error is not None
    events.append(
        LLMEvent(
            "llm_failed",
            phase,
            key,
            error.answered_as or settings.model,  # offline failed as offline, at $0
            request,
            attempt=attempt,
            latency=latency,
            usage=attempts[-1].usage if attempts else error.usage,
            error_code=error.code,
            error=error,
            provider=provider,
            endpoint=error.attempts[-1].endpoint if error.attempts else error.endpoint,
            **context,
        )
    )
    return events


class LLMClient:
    """Facade phases use for every LLM call.

    Args:
        adapter: the provider adapter (possibly wrapped for recovery).
        entities: the characters or locations the chains live in (mutated in place).
        default_depth: chain depth when a request has no ``depth_override`` (0 = independent).
        settings: model and generation settings sent with every call.
        store: exchanges behind chain ids (``window`` mode); in-memory if omitted.
        chain_mode: ``"window"`` (engine sends the window) or ``"server"``
            (``previous_response_id``).
        max_concurrency: how many different entity keys run at once.
        events: sink for ``llm_called`` / ``llm_completed`` / ``llm_failed`` events.
        phase: phase name carried by events.
        batch: send each batch's calls through the OpenAI Batch API (``sim.providers.batch``):
            every entity key runs at once, and the calls that reach the wire together go
            out as one batch.
        namer: names each call as it is made (the tick recorder's ``name_call``); the
            identity travels in the request (``ModelRequest.call``) and in its events.
            ``None``: calls are anonymous (no replay, no idempotency key).
        stream: where streamed answer text goes (the tick's ``StreamHub``): each call
            sends its own text target on it (``ModelRequest.stream_to``).
    """

    def __init__(
        self,
        adapter: Adapter,
        entities: Sequence[dict[str, Any]],
        default_depth: int = 0,
        *,
        settings: CallSettings | None = None,
        store: ResponseStore | None = None,
        chain_mode: ChainMode = "window",
        max_concurrency: int = 16,
        events: EventSink = null_sink,
        phase: str = "",
        batch: BatchOptions | None = None,
        namer: CallNamer | None = None,
        stream: StreamHub | None = None,
    ) -> None:
        if default_depth < 0:
            raise ValueError(f"default_depth must be >= 0, got {default_depth}")
        self.adapter = adapter
        self.default_depth = default_depth
        self.settings = settings or CallSettings()
        self.store = store if store is not None else ResponseStore()
        self.chain_mode: ChainMode = chain_mode
        #: the chains: ids in the entities and, in window mode, exchanges in the store
        self.chain_manager = ResponseChainManager(
            entities, self.store if chain_mode == "window" else None
        )
        self.max_concurrency = max(1, max_concurrency)
        self.events = events
        self.phase = phase
        self.batch = batch
        self.namer = namer
        self.stream = stream
        self.rate_limit_hits = 0
        #: the Batch API session of the last ``create_batch`` (``None`` without ``batch``)
        self.batch_session: BatchTransport | None = None

    @property
    def pending_deletions(self) -> list[tuple[str, str]]:
        """(entity key, response id) pairs evicted so far, to delete after commit."""
        return self.chain_manager.evicted

    async def flush_deletions(self) -> list[tuple[str, str, LLMError]]:
        """Delete evicted responses at the provider; call only after the tick committed.

        Returns:
            The deletions that failed, to retry later; they never raise.
        """
        failed: list[tuple[str, str, LLMError]] = []
        pending = self.chain_manager.evicted
        while pending:  # an id leaves the list only once its deletion was attempted
            entity_key, response_id = pending[0]
            try:
                await self.adapter.delete_response(response_id)
            except LLMError as exc:
                failed.append((entity_key, response_id, exc))
            except Exception as exc:
                error = LLMError(f"deleting {response_id} failed: {exc!r}", cause=exc)
                failed.append((entity_key, response_id, error))
            pending.pop(0)
        return failed

    async def create_response(
        self,
        instructions: str,
        input_data: str,
        schema: type[T],
        entity_key: str | None = None,
        depth_override: int | None = None,
    ) -> T:
        """One call. Returns the parsed answer; raises ``LLMError`` on failure."""
        request = LLMRequest(instructions, input_data, schema, entity_key, depth_override)
        response = await self._execute_one(request)
        return cast(T, response.parsed)

    async def create_batch(self, requests: Sequence[LLMRequest]) -> list[Any]:
        """Run requests in parallel; results in request order, ``LLMError`` for failures."""
        if not requests:
            return []
        results: list[Any] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        queue: list[list[int]] = []
        for index, request in enumerate(requests):
            if request.entity_key is None:
                queue.append([index])
            elif request.entity_key in groups:
                groups[request.entity_key].append(index)
            else:
                group = [index]
                groups[request.entity_key] = group
                queue.append(group)
        queue.reverse()  # pop() from the end keeps request order
        self.rate_limit_hits = 0

        session = None
        if self.batch is not None:
            if self.batch.transport is None:
                raise LLMConfigurationError("batch mode needs a transport (BatchOptions.transport)")
            session = self.batch.transport(self.phase, self.batch)
        self.batch_session = session

        async def settle(index: int) -> Any:
            if session is None:
                return await self._settle(requests[index])
            session.enter()
            try:  # each call carries the session (``ModelRequest.batch``)
                return await self._settle(requests[index], session)
            finally:
                session.leave()

        async def worker() -> None:
            while queue:
                for index in queue.pop():
                    try:
                        results[index] = await settle(index)
                    except asyncio.CancelledError:
                        task = asyncio.current_task()
                        if task is not None and task.cancelling() == 0:
                            # raised by an adapter, not a cancellation of this batch: a
                            # TaskGroup would drop it silently, so carry it out explicitly
                            raise _AdapterCancelled from None
                        raise

        # a Batch API batch holds every call that can be asked now: all keys at once
        workers = len(queue) if session is not None else min(self.max_concurrency, len(queue))
        try:
            if workers == 1:
                await worker()
            else:
                async with asyncio.TaskGroup() as group_:
                    for _ in range(workers):
                        group_.create_task(worker())
        except* _AdapterCancelled:
            raise asyncio.CancelledError from None
        finally:
            if session is not None:
                await session.aclose()
        if self.rate_limit_hits:
            logger.warning("%s: batch had %d rate limit hits", self.phase, self.rate_limit_hits)
        return results

    async def _settle(self, request: LLMRequest, batch: BatchTransport | None = None) -> Any:
        try:
            return (await self._execute_one(request, batch)).parsed
        except LLMError as exc:
            if any(isinstance(e, LLMRateLimitError) for e in (exc, *exc.model_errors)):
                self.rate_limit_hits += 1
            return exc

    def _depth(self, request: LLMRequest) -> int:
        depth = request.depth_override if request.depth_override is not None else self.default_depth
        return max(0, depth)

    def _model_request(
        self,
        request: LLMRequest,
        history: tuple[Exchange, ...],
        previous_id: str | None,
        batch: BatchTransport | None = None,
    ) -> ModelRequest:
        """What the adapter is sent for ``request`` with this chain window (``batch``: in
        this Batch API session)."""
        tools = request.tools
        return ModelRequest(
            instructions=request.instructions,
            input=request.input_data,
            schema=request.schema if tools is None else None,
            tools=tools,
            history=history,
            previous_response_id=previous_id if tools is None else None,
            settings=self.settings,
            messages=request.messages if tools is not None else (),
            tool_choice=request.tool_choice,
            enums=request.enums if tools is None else None,
            check=request.check,
            batch=batch,
        )

    async def _call(
        self, request: LLMRequest, sent: ModelRequest, call: CallIdentity | None
    ) -> AdapterResponse:
        """``sent`` as ``call``, its text streamed to the hub if there is one (one copy of
        the request with both: this runs for every call)."""
        if self.stream is None:
            return await self.adapter.execute(sent if call is None else replace(sent, call=call))
        with self.stream.call(self.phase, request.entity_key) as text:  # where its text goes
            return await self.adapter.execute(replace(sent, call=call, stream_to=text))

    def _emit_attempts(self, request: LLMRequest, attempts: tuple[Attempt, ...]) -> None:
        """Count each earlier attempt's tokens against the entity (its event is one of
        ``finished_events``)."""
        key = request.entity_key
        if key:
            for earlier in attempts[:-1]:
                self._accumulate_usage(key, earlier.usage, requests=0)

    async def _execute_one(
        self, request: LLMRequest, batch: BatchTransport | None = None
    ) -> AdapterResponse:
        key = request.entity_key
        chain: Chain | None = self.chain_manager.chain(key) if key else None
        depth = self._depth(request) if key else 0
        history: tuple[Exchange, ...] = ()
        previous_id: str | None = None
        if chain is not None and depth > 0:
            if self.chain_mode == "server":
                previous_id = chain.previous
            else:
                history = chain.window(depth)
        model = self.settings.model
        sent = self._model_request(request, history, previous_id, batch)
        call: CallIdentity | None = None
        if self.namer is not None:
            call = self.namer(self.phase, key, sent, depth)

        def context() -> dict[str, Any]:
            """The chain context the call is sent with now (it changes if a chain is lost)."""
            return {
                "history": history,
                "previous_response_id": previous_id,
                "depth": depth,
                "call": call,
            }

        def emit(kind: EventKind, event_model: str, **fields: Any) -> None:
            """An event of this call, with the chain context it is sent with now."""
            self.events(
                LLMEvent(
                    kind,
                    self.phase,
                    key,
                    event_model,
                    request,
                    history=history,
                    previous_response_id=previous_id,
                    depth=depth,
                    call=call,
                    **fields,
                )
            )

        def ended(
            attempts: tuple[Attempt, ...],
            *,
            response: AdapterResponse | None = None,
            error: LLMError | None = None,
        ) -> list[LLMEvent]:
            """The events of the call's end (``finished_events``), each earlier attempt's
            tokens counted against the entity."""
            self._emit_attempts(request, attempts)
            latency = time.perf_counter() - started
            return finished_events(
                self.phase,
                request,
                self.settings,
                latency,
                context(),
                response=response,
                error=error,
            )

        emit("llm_called", model)
        started = time.perf_counter()
        try:
            try:
                response = await self._call(request, sent, call)
            except LLMChainNotFoundError as lost:
                if chain is None or previous_id is None:
                    raise
                # the provider lost this chain: start it again from the window we hold
                logger.warning(
                    "%s: chain %s lost at the provider (%s); resending the window",
                    self.phase,
                    key,
                    previous_id,
                )
                emit(
                    "llm_failed",
                    model,
                    latency=time.perf_counter() - started,
                    error_code=lost.code,
                    error=lost,
                    final=False,
                )
                history = chain.exchanges(chain.reset()[-depth:])
                previous_id = None
                sent = self._model_request(request, history, None, batch)
                if call is not None:  # the same call, sent with the window, after its failures
                    call = call.sent(sent).after(a.error_code for a in lost.attempts)
                response = await self._call(request, sent, call)
        except Exception as exc:
            if isinstance(exc, LLMError):
                error = exc
            else:  # a bug in an adapter: report it loudly, but as an LLMError
                logger.error("unexpected error from %s for %s: %r", self.adapter.name, key, exc)
                error = unexpected_error(exc)
            events = ended(error.attempts, error=error)
            if key:
                self._accumulate_usage(key, events[-1].usage, requests=0)
            for event in events:
                self.events(event)
            if error is exc:
                raise
            raise error from exc
        events = ended(response.attempts, response=response)
        for event in events[:-1]:
            self.events(event)
        if chain is not None:
            # ids and exchanges change together, in this tick's atomic commit
            exchange = Exchange(response.response_id, request.input_data, response.raw)
            chain.confirm(response.response_id, exchange, depth)
        if key:
            self._accumulate_usage(key, response.usage)
        self.events(events[-1])
        return response

    def _accumulate_usage(self, entity_key: str, usage: Usage, requests: int = 1) -> None:
        """Add one attempt's tokens to the entity's usage (every attempt is paid for)."""
        if requests == 0 and usage.total_tokens == 0:
            return
        entity_id, _ = self.chain_manager._parse_key(entity_key)
        entity = self.chain_manager.entities.get(entity_id)
        if entity is None:
            return
        stats = entity.setdefault("_openai", {}).setdefault(
            "usage", {"total_input_tokens": 0, "total_output_tokens": 0, "total_requests": 0}
        )
        stats["total_input_tokens"] = stats.get("total_input_tokens", 0) + usage.input_tokens
        stats["total_output_tokens"] = stats.get("total_output_tokens", 0) + usage.output_tokens
        stats["total_requests"] = stats.get("total_requests", 0) + requests
        if usage.cached_input_tokens:
            stats["total_cached_input_tokens"] = (
                stats.get("total_cached_input_tokens", 0) + usage.cached_input_tokens
            )
