"""The OpenAI Batch API as a transport: a phase's calls sent as one batch, half the price.

With ``[llm] batch = true`` the stack's builder chooses this transport
(``sim.engine.stack.batch_transport``), an ``LLMClient`` opens a ``BatchSession`` for each
batch of requests, and each request of the batch carries it (``ModelRequest.batch``).
Everything above the wire stays as it is: each call still goes through recovery, budget
and the recorder, and the ``openai`` / ``chat`` adapter still builds its body and reads its
answer; only the POST changes. Instead of sending its body, the adapter hands it to the session
(``BatchSession.post``) and waits. When every call of the batch in progress is waiting
(nothing else can still join), the session uploads them as one JSONL file (``POST
/files``), creates the batch (``POST /batches``), polls it (``GET /batches/{id}``) and
answers each waiting call from the output or error file (``GET /files/{id}/content``),
on the adapter's own connections (``_openai_common.ServerAPI``: aiohttp, or the SDK
client a user handed in). A line that failed comes back to its adapter as the error its
status maps to, so recovery treats it as it would a live failure: a schema error is retried
with feedback, a fallback model is tried; those retries join the next batch (a retry batch
of the failed ones). A line the batch did not run before it expired comes back as a
transient ``batch_expired`` error and is retried likewise.

Resume: the session tells its ``BatchJournal`` (the tick recorder) about each batch as soon
as it is created: its id and, per line, the ``custom_id`` and body digest. A later run of
the same tick passes those lines back; a call whose line (same custom id, same body) is in
a batch already created waits for that batch instead of being submitted again, so no call
is paid for twice.

Why a transport and not a separate code path: the answer of a batched call must be
exactly what the same call would have given live, recorded the same way (``sim log``,
``sim usage``, replay), and failures must take the same recovery. Only the POST differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import orjson

from sim.llm.batching import BatchLine, BatchOptions, BatchProgress, SubmittedBatch
from sim.llm.calls import CallIdentity, digest
from sim.llm.errors import LLMAPIError, LLMError, LLMTimeoutError

if TYPE_CHECKING:
    from sim.providers._openai_common import ServerAPI

# The error mapping is imported where a batch uses it: the stack's builder names this
# transport for every ``[llm] batch`` run, and an offline tick (or any tick without a
# batch) must not pay for its imports at start-up.

logger = logging.getLogger(__name__)

Json = dict[str, Any]
Sleep = Callable[[float], Awaitable[None]]
BatchEndpoint = Literal["/v1/responses", "/v1/chat/completions"]

#: batch statuses after which nothing more changes
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
#: how long OpenAI has to complete a batch (the only window it offers)
COMPLETION_WINDOW: Literal["24h"] = "24h"
#: consecutive failed polls of one batch before its calls fail
MAX_POLL_FAILURES = 10


@dataclass(slots=True)
class _Item:
    """One call waiting for its line of a batch."""

    client: ServerAPI
    endpoint: BatchEndpoint
    custom_id: str
    body: bytes
    line: BatchLine
    model: str
    api_key_env: str
    future: asyncio.Future[Json]
    batch_id: str = ""


class BatchSession:
    """Collects the calls of one ``create_batch`` into Batch API batches.

    The client counts its calls in (``enter``) and out (``leave``); a call that reaches
    the wire waits in ``post``. Once every call in progress is waiting, the waiting ones
    go out as one batch per endpoint (or, when an earlier run created a batch holding
    them, wait for that one).

    Args:
        phase: the phase, for the journal and progress.
        options: journal, poll interval, progress sink.
        sleep: how polling waits (tests may pass a faster one).
    """

    def __init__(self, phase: str, options: BatchOptions, sleep: Sleep = asyncio.sleep) -> None:
        self.phase = phase
        self.options = options
        self.sleep = sleep
        self._resumable: Mapping[BatchLine, str] = (
            options.journal.resumable() if options.journal is not None else {}
        )
        self._active = 0
        self._waiting = 0
        self._pending: list[_Item] = []
        self._changed = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._runs: set[asyncio.Task[None]] = set()
        self._sent: Counter[str] = Counter()
        self._anonymous = 0
        #: batches this session created and batches of an earlier run it waited for
        self.created: list[str] = []
        self.resumed: list[str] = []

    # -- the client's side ----------------------------------------------------------------

    def enter(self) -> None:
        """A call of the batch started."""
        self._active += 1

    def leave(self) -> None:
        """A call of the batch finished (answered or failed)."""
        self._active -= 1
        self._changed.set()

    async def aclose(self) -> None:
        """Stop collecting; batches still polled are abandoned (their calls were
        cancelled), to be resumed by the next run from the journal."""
        tasks = [t for t in (self._flusher, *self._runs) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._flusher = None
        self._runs.clear()

    # -- the adapter's side ---------------------------------------------------------------

    async def post(
        self,
        client: ServerAPI,
        path: str,
        payload: Json,
        *,
        model: str,
        api_key_env: str,
        call: CallIdentity | None = None,
    ) -> Json:
        """Send ``payload`` (a body for ``path``) as a line of the next batch; its answer.

        ``call`` names the line (``{request id}#{attempt}``) and is told to the journal
        when a batch carried it (``None``: an anonymous call, ``call-N``).

        Raises:
            LLMError: the line failed (mapped from its status as a live answer would
                be), expired, or the batch could not be submitted or read.
        """
        body = orjson.dumps(payload)
        if call is not None:
            name = call.request_id
        else:
            self._anonymous += 1
            name = f"call-{self._anonymous}"
        # one custom id per attempt: a retry of a failed line is a new line
        attempt = self._sent[name]
        self._sent[name] += 1
        custom_id = f"{name}#{attempt}"
        endpoint = cast(BatchEndpoint, "/v1" + path)
        item = _Item(
            client,
            endpoint,
            custom_id,
            body,
            BatchLine(custom_id, digest(endpoint.encode() + b"\0" + body)),
            model,
            api_key_env,
            asyncio.get_running_loop().create_future(),
        )
        self._pending.append(item)
        self._waiting += 1
        self._changed.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_when_quiet())
        try:
            return await item.future
        finally:
            self._waiting -= 1
            journal = self.options.journal
            if call is not None and item.batch_id and journal is not None:
                journal.carried(call.request_id, item.batch_id)  # answered or failed in it

    # -- batching -------------------------------------------------------------------------

    async def _flush_when_quiet(self) -> None:
        """Send the waiting calls once every call in progress waits (none can join)."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            # let calls that were just answered run on to their next attempt or finish
            for _ in range(5):
                await asyncio.sleep(0)
            if self._pending and self._waiting >= self._active:
                items, self._pending = self._pending, []
                task = asyncio.create_task(self._run(items))
                self._runs.add(task)
                task.add_done_callback(self._runs.discard)

    async def _run(self, items: list[_Item]) -> None:
        """Answer ``items``: resumed ones from their earlier batch, the rest from new ones."""
        groups: dict[tuple[int, str], list[_Item]] = {}
        resumed: dict[str, list[_Item]] = {}
        for item in items:
            old = self._resumable.get(item.line)
            if old is not None:
                resumed.setdefault(old, []).append(item)
            else:
                groups.setdefault((id(item.client), item.endpoint), []).append(item)
        jobs = [self._wait(batch_id, group, resumed=True) for batch_id, group in resumed.items()]
        jobs += [self._submit_and_wait(group) for group in groups.values()]
        try:
            await asyncio.gather(*jobs)
        except Exception as exc:  # a bug here must not leave calls waiting forever
            logger.error("%s: handling a batch failed: %r", self.phase, exc)
            self._fail(items, LLMError(f"handling the batch failed: {exc!r}", cause=exc))
        finally:
            # whatever happened, no call is left waiting
            self._fail(items, LLMError("the batch ended without an answer for this call"))

    @staticmethod
    def _settle(item: _Item, answer: Json | LLMError) -> None:
        """Answer or fail one waiting call (unless it stopped waiting: cancelled)."""
        if item.future.done():
            return
        if isinstance(answer, LLMError):
            item.future.set_exception(answer)
        else:
            item.future.set_result(answer)

    def _fail(self, items: list[_Item], error: LLMError) -> None:
        for item in items:
            self._settle(item, error)

    def _mapped(self, exc: Exception, items: list[_Item]) -> LLMError:
        from sim.providers._openai_errors import map_openai_error

        first = items[0]
        if isinstance(exc, ValueError):  # an answer not shaped as the Batch API's
            return LLMAPIError(
                f"the Batch API at {first.client.base_url} answered something else: {exc}",
                code="bad_response",
                cause=exc,
                model=first.model,
            )
        return map_openai_error(exc, api_key_env=first.api_key_env, model=first.model)

    async def _submit_and_wait(self, items: list[_Item]) -> None:
        from sim.providers._openai_errors import failures_or_odd

        first = items[0]
        client = first.client
        lines = b"".join(
            b'{"custom_id":'
            + orjson.dumps(item.custom_id)
            + b',"method":"POST","url":'
            + orjson.dumps(item.endpoint)
            + b',"body":'
            + item.body
            + b"}\n"
            for item in items
        )
        try:
            uploaded = _id_of(
                await client.upload("batch", f"sim-{self.phase}.jsonl", lines, "application/jsonl")
            )
            batch = _id_of(
                await client.json(
                    "POST",
                    "/batches",
                    {
                        "input_file_id": uploaded,
                        "endpoint": first.endpoint,
                        "completion_window": COMPLETION_WINDOW,
                        "metadata": {"sim_phase": self.phase[:512]},
                    },
                )
            )
        except failures_or_odd() as exc:
            self._fail(items, self._mapped(exc, items))
            return
        self.created.append(batch)
        if self.options.journal is not None:
            self.options.journal.submitted(
                SubmittedBatch(
                    batch,
                    self.phase,
                    first.endpoint,
                    uploaded,
                    tuple(item.line for item in items),
                )
            )
        await self._wait(batch, items, resumed=False)

    async def _wait(self, batch_id: str, items: list[_Item], *, resumed: bool) -> None:
        """Poll ``batch_id`` until it ends, then answer ``items`` from its files."""
        from sim.providers._openai_errors import failures_or_odd, post_failures

        for item in items:
            item.batch_id = batch_id
        if resumed:
            self.resumed.append(batch_id)
        client = items[0].client
        started = time.monotonic()
        failures = 0
        while True:
            try:
                batch = BatchState.read(await client.json("GET", f"/batches/{batch_id}"))
            except failures_or_odd() as exc:
                error = self._mapped(exc, items)
                failures += 1
                if failures >= MAX_POLL_FAILURES or (
                    isinstance(error, LLMAPIError) and error.status_code in (401, 403, 404)
                ):
                    self._fail(items, error)
                    return
                logger.warning("%s: polling batch %s failed: %s", self.phase, batch_id, error)
                await self.sleep(self.options.poll_seconds)
                continue
            failures = 0
            counts = batch.counts
            if self.options.on_progress is not None:
                self.options.on_progress(
                    BatchProgress(
                        self.phase,
                        batch_id,
                        batch.status,
                        counts[0] if counts else len(items),
                        counts[1] if counts else 0,
                        counts[2] if counts else 0,
                        resumed,
                        time.monotonic() - started,
                    )
                )
            if batch.status in TERMINAL:
                break
            await self.sleep(self.options.poll_seconds)
        if batch.status == "failed":
            reasons = "; ".join(batch.errors)
            self._fail(
                items,
                LLMAPIError(
                    f"the provider refused batch {batch_id}: {reasons or 'no reason given'}",
                    code="batch_failed",
                    status_code=400,
                    model=items[0].model,
                ),
            )
            return
        try:
            answers = await self._read(client, batch.output_file_id)
            answers.update(await self._read(client, batch.error_file_id))
        except post_failures() as exc:
            self._fail(items, self._mapped(exc, items))
            return
        for item in items:
            line = answers.get(item.custom_id)
            if line is None:
                self._unanswered(item, batch_id, batch.status)
            else:
                self._answer(item, line)

    async def _read(self, client: ServerAPI, file_id: str | None) -> dict[str, Json]:
        """The lines of a batch's output or error file, by custom id."""
        if not file_id:
            return {}
        content = await client.content(f"/files/{file_id}/content")
        found: dict[str, Json] = {}
        for raw in content.splitlines():
            if not raw.strip():
                continue
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                logger.warning("%s: a line of batch file %s is not JSON", self.phase, file_id)
                continue
            if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
                found[line["custom_id"]] = line
        return found

    def _unanswered(self, item: _Item, batch_id: str, status: str) -> None:
        """A line with no answer: not run before the batch expired or was cancelled."""
        if status == "cancelled":
            error: LLMError = LLMError(
                f"batch {batch_id} was cancelled before this call ran",
                code="batch_cancelled",
                model=item.model,
            )
        else:
            error = LLMTimeoutError(
                f"batch {batch_id} {status} before this call ran",
                code="batch_expired",
                model=item.model,
            )
        self._settle(item, error)

    def _answer(self, item: _Item, line: Json) -> None:
        """Answer one call from its line, or fail it as its status says."""
        from sim.providers._openai_errors import map_openai_error
        from sim.providers.http import HttpStatusError

        response = line.get("response")
        if isinstance(response, dict):
            status = int(response.get("status_code") or 0)
            body = response.get("body")
            if status == 200 and isinstance(body, dict):
                self._settle(item, body)
                return
            if status:
                url = item.client.base_url.rstrip("/") + item.endpoint.removeprefix("/v1")
                # the line's answer, read and mapped as a live answer's would be
                exc = HttpStatusError(url, status, {}, orjson.dumps(body))
                self._settle(
                    item, map_openai_error(exc, api_key_env=item.api_key_env, model=item.model)
                )
                return
        problem = line.get("error")
        code = str(problem.get("code") or "") if isinstance(problem, dict) else ""
        message = str(problem.get("message") or "") if isinstance(problem, dict) else ""
        if code == "batch_expired":
            self._settle(
                item,
                LLMTimeoutError(
                    f"batch {item.batch_id} expired before this call ran",
                    code="batch_expired",
                    model=item.model,
                ),
            )
            return
        self._settle(
            item,
            LLMError(
                f"batch {item.batch_id}: {code or 'error'}: {message or 'no answer'}",
                code=code or "batch_error",
                model=item.model,
            ),
        )


def _id_of(answer: Any) -> str:
    """The ``id`` of an object the API made (a file, a batch).

    Raises:
        ValueError: the answer holds none (what a server answers is untrusted).
    """
    made = answer.get("id") if isinstance(answer, dict) else None
    if not isinstance(made, str) or not made:
        raise ValueError(f"the answer names no id: {str(answer)[:200]}")
    return made


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class BatchState:
    """What a poll of a batch says: its status, request counts (total, completed,
    failed; ``None``: not given), files, and why it failed (one line per error)."""

    status: str
    counts: tuple[int, int, int] | None
    output_file_id: str | None
    error_file_id: str | None
    errors: tuple[str, ...]

    @classmethod
    def read(cls, data: Any) -> BatchState:
        """A batch object as the API answers it (untrusted: odd fields read as absent).

        Raises:
            ValueError: not an object with a status.
        """
        status = data.get("status") if isinstance(data, dict) else None
        if not isinstance(status, str):
            raise ValueError(f"a batch without a status: {str(data)[:200]}")
        counted = data.get("request_counts")
        counts = (
            (
                _count(counted.get("total")),
                _count(counted.get("completed")),
                _count(counted.get("failed")),
            )
            if isinstance(counted, dict)
            else None
        )
        listed = data.get("errors")
        found = listed.get("data") if isinstance(listed, dict) else None
        errors = tuple(
            f"{_text(e.get('code')) or 'error'}: {_text(e.get('message')) or ''}"
            + (f" (line {e['line']})" if isinstance(e.get("line"), int) else "")
            for e in (found if isinstance(found, list) else [])
            if isinstance(e, dict)
        )
        return cls(
            status,
            counts,
            _text(data.get("output_file_id")),
            _text(data.get("error_file_id")),
            errors,
        )


__all__ = ["BatchSession", "BatchState"]
