"""The stub server's Batch API routes, driven by the real openai SDK over loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator

import orjson
import pytest
from openai import OpenAI

from sim.testing.stub_server import ServerThread, StubOptions, StubServer


@pytest.fixture
def server() -> Iterator[StubServer]:
    thread = ServerThread(StubServer(StubOptions(batch_delay=0.05)))
    yield thread.start()
    thread.stop()


def lines(*ids: str) -> bytes:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "Hello"}]}
    return b"".join(
        orjson.dumps(
            {"custom_id": i, "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
        + b"\n"
        for i in ids
    )


def wait(client: OpenAI, batch_id: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = client.batches.retrieve(batch_id).status
        if status in ("completed", "failed", "expired", "cancelled"):
            return status
        time.sleep(0.02)
    raise AssertionError("the batch never ended")


def test_a_batch_answers_each_line_once_with_faults_in_the_error_file(
    server: StubServer,
) -> None:
    client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    server.enqueue(None, "server_error")
    uploaded = client.files.create(file=("in.jsonl", lines("a", "b", "c")), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.request_counts is not None
    assert wait(client, batch.id) == "completed"
    done = client.batches.retrieve(batch.id)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    assert done.output_file_id and done.error_file_id
    out = [orjson.loads(x) for x in client.files.content(done.output_file_id).content.splitlines()]
    err = [orjson.loads(x) for x in client.files.content(done.error_file_id).content.splitlines()]
    assert [x["custom_id"] for x in out] == ["a", "c"]
    assert out[0]["response"]["status_code"] == 200
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"]
    assert err[0]["custom_id"] == "b" and err[0]["response"]["status_code"] == 500
    assert server.batches.generated == {"a": 1, "b": 1, "c": 1}
    assert server.stats.generations == 2  # the failed line generated nothing


def test_expiry_and_cancel(server: StubServer) -> None:
    client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    uploaded = client.files.create(file=("in.jsonl", lines("a", "b")), purpose="batch")
    server.batches.expire_next(1)
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert wait(client, batch.id) == "expired"
    ended = client.batches.retrieve(batch.id)
    assert ended.error_file_id is not None
    err = orjson.loads(client.files.content(ended.error_file_id).content)
    assert err["custom_id"] == "b" and err["error"]["code"] == "batch_expired"

    server.batches.delay = 5.0
    slow = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert client.batches.cancel(slow.id).status == "cancelling"
    assert wait(client, slow.id) == "cancelled"
    assert server.batches.generated == {"a": 1}  # nothing of the cancelled batch ran


def test_a_batch_of_an_unknown_file_or_endpoint_is_refused(server: StubServer) -> None:
    import openai

    client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    uploaded = client.files.create(file=("in.jsonl", lines("a")), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
        )
