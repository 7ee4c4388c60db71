"""The stub server's OpenAI Batch API: files and batches, answered by its stub model.

Routes (under ``/v1``): ``POST /files`` (multipart upload, ``purpose=batch``),
``GET /files/{id}`` and ``GET /files/{id}/content``, ``POST /batches``,
``GET /batches/{id}``, ``POST /batches/{id}/cancel``. A batch is ``in_progress`` for
``delay`` seconds after it is created, then each line is generated exactly as the same
request sent live would be (``StubServer.generate``: the same faults, model and counters),
and the batch is ``completed`` with an output file (answers with status 200) and an error
file (other statuses). ``expire_next(n)`` makes the next batch run only its first ``n``
lines and end ``expired``, the rest in its error file as ``batch_expired``, as OpenAI
reports a batch its completion window ran out on.

``generated`` counts how often each ``custom_id`` was generated, and ``lines`` every line
received: a test asserts that no call was paid for twice.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson

from sim.testing.stub_model import Json, error_body

if TYPE_CHECKING:
    from sim.testing.stub_server import StubServer

#: the routes this module answers (path prefixes)
PREFIXES = ("/v1/files", "/v1/batches")
_ENDPOINTS = ("/v1/responses", "/v1/chat/completions")


def _not_found(what: str) -> tuple[int, Json]:
    return 404, error_body(f"No such {what}", "invalid_request_error", None)


def _bad(message: str) -> tuple[int, Json]:
    return 400, error_body(message, "invalid_request_error", None)


def parse_multipart(body: bytes, content_type: str) -> dict[str, bytes]:
    """The fields of a ``multipart/form-data`` body, by name."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, bytes] = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = payload
    return fields


class BatchRoutes:
    """The files and batches of one stub server.

    Args:
        server: the stub whose model, faults and counters answer the lines.
        delay: seconds a batch stays ``in_progress`` before its lines are generated.
    """

    def __init__(self, server: StubServer, delay: float = 0.0) -> None:
        self.server = server
        self.delay = delay
        self.files: dict[str, tuple[Json, bytes]] = {}
        self.batches: dict[str, Json] = {}
        #: how many times each custom id was generated (paid for)
        self.generated: Counter[str] = Counter()
        #: lines received in batches, in order
        self.lines: list[str] = []
        self._expire: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def expire_next(self, completed: int) -> None:
        """The next batch runs only its first ``completed`` lines, then expires."""
        self._expire = completed

    def reset(self) -> None:
        self.generated.clear()
        self.lines.clear()
        self._expire = None

    async def handle(
        self, method: str, path: str, body: bytes, content_type: str
    ) -> tuple[int, Json | bytes]:
        parts = path.removeprefix("/v1/").split("/")
        if parts[0] == "files":
            if method == "POST" and len(parts) == 1:
                return self._upload(body, content_type)
            if method == "GET" and len(parts) == 2:
                found = self.files.get(parts[1])
                return (200, found[0]) if found else _not_found("file")
            if method == "GET" and len(parts) == 3 and parts[2] == "content":
                found = self.files.get(parts[1])
                return (200, found[1]) if found else _not_found("file")
        if parts[0] == "batches":
            if method == "POST" and len(parts) == 1:
                return self._create(body)
            batch = self.batches.get(parts[1]) if len(parts) > 1 else None
            if batch is None:
                return _not_found("batch")
            if method == "GET" and len(parts) == 2:
                return 200, batch
            if method == "POST" and len(parts) == 3 and parts[2] == "cancel":
                if batch["status"] in ("validating", "in_progress"):
                    batch["status"] = "cancelling"
                return 200, batch
        return 404, error_body(f"no route {method} {path}", "invalid_request_error", "not_found")

    def _store(self, data: bytes, purpose: str, filename: str) -> Json:
        file_id = f"file-{uuid.uuid4().hex}"
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        self.files[file_id] = (meta, data)
        return meta

    def _upload(self, body: bytes, content_type: str) -> tuple[int, Json]:
        if not content_type.startswith("multipart/form-data"):
            return _bad("expected a multipart/form-data upload")
        fields = parse_multipart(body, content_type)
        if "file" not in fields:
            return _bad("missing the 'file' field")
        purpose = fields.get("purpose", b"").decode()
        return 200, self._store(fields["file"], purpose, "upload.jsonl")

    def _create(self, body: bytes) -> tuple[int, Json]:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _bad("body is not JSON")
        endpoint = request.get("endpoint")
        if endpoint not in _ENDPOINTS:
            return _bad(f"unsupported endpoint {endpoint!r}")
        found = self.files.get(str(request.get("input_file_id")))
        if found is None:
            return _not_found("file")
        lines: list[Json] = []
        for raw in found[1].splitlines():
            if raw.strip():
                line = orjson.loads(raw)
                if line.get("url") != endpoint:
                    return _bad(f"line {line.get('custom_id')!r} is not for {endpoint}")
                lines.append(line)
        ids = [str(line.get("custom_id")) for line in lines]
        if len(set(ids)) != len(ids):
            return _bad("custom_id values must be unique within a batch")
        self.lines.extend(ids)
        batch_id = f"batch_{uuid.uuid4().hex}"
        now = int(time.time())
        batch: Json = {
            "id": batch_id,
            "object": "batch",
            "endpoint": endpoint,
            "input_file_id": found[0]["id"],
            "completion_window": request.get("completion_window", "24h"),
            "status": "in_progress",
            "created_at": now,
            "in_progress_at": now,
            "expires_at": now + 86400,
            "output_file_id": None,
            "error_file_id": None,
            "errors": None,
            "metadata": request.get("metadata"),
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
        }
        self.batches[batch_id] = batch
        expire, self._expire = self._expire, None
        task = asyncio.create_task(self._complete(batch, lines, expire))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return 200, batch

    async def _complete(self, batch: Json, lines: list[Json], expire: int | None) -> None:
        """After the delay, generate the lines (as live requests would be) and finish."""
        waited = 0.0
        while waited < self.delay and batch["status"] == "in_progress":
            await asyncio.sleep(min(0.05, self.delay))
            waited += 0.05
        outputs: list[bytes] = []
        errors: list[bytes] = []
        counts = batch["request_counts"]
        for index, line in enumerate(lines):
            custom_id = str(line.get("custom_id"))
            if batch["status"] == "cancelling" or (expire is not None and index >= expire):
                code = "batch_cancelled" if batch["status"] == "cancelling" else "batch_expired"
                problem = {"code": code, "message": "This request was not executed."}
                errors.append(self._line(custom_id, None, problem))
                continue
            self.generated[custom_id] += 1
            status, answer = await self.server.generate(str(line["url"]), line.get("body") or {})
            response = {"status_code": status, "request_id": uuid.uuid4().hex, "body": answer}
            if status == 200:
                outputs.append(self._line(custom_id, response, None))
                counts["completed"] += 1
            else:
                errors.append(self._line(custom_id, response, None))
                counts["failed"] += 1
        if outputs:
            batch["output_file_id"] = self._store(b"".join(outputs), "batch_output", "out")["id"]
        if errors:
            batch["error_file_id"] = self._store(b"".join(errors), "batch_output", "err")["id"]
        now = int(time.time())
        if batch["status"] == "cancelling":
            batch["status"], batch["cancelled_at"] = "cancelled", now
        elif expire is not None and expire < len(lines):
            batch["status"], batch["expired_at"] = "expired", now
        else:
            batch["status"], batch["completed_at"] = "completed", now

    @staticmethod
    def _line(custom_id: str, response: Json | None, error: Json | None) -> bytes:
        data: dict[str, Any] = {
            "id": f"batch_req_{uuid.uuid4().hex}",
            "custom_id": custom_id,
            "response": response,
            "error": error,
        }
        return orjson.dumps(data) + b"\n"
