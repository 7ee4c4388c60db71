"""The gemini adapter's embeddings (``GeminiAdapter.embed``) over real HTTP: Google's SDK
(``embed_content`` -> ``batchEmbedContents``) against the loopback Gemini stub."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from google.genai import types as gt

from sim.llm.embedding import Embedder
from sim.llm.errors import (
    LLMAPIError,
    LLMConfigurationError,
    LLMError,
    LLMRateLimitError,
    LLMTimeoutError,
)
from sim.mind.vectors import VectorCache, fetch
from sim.providers.gemini import MAX_EMBED_TEXTS, GeminiAdapter, _vectors
from sim.testing.gemini_stub import GeminiStubServer
from sim.testing.stub_server import stub_embedding

KEY = "gemini-embed-test-not-a-real-key"
MODEL = "gemini-embedding-001"
ROUTE = f"POST /v1beta/models/{MODEL}:batchEmbedContents"
TEXTS = ["the smuggler hid the key", "under the bell", "a gull cried over the quay"]


@pytest.fixture
def adapter(gemini_stub: GeminiStubServer, monkeypatch: pytest.MonkeyPatch) -> GeminiAdapter:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    return GeminiAdapter(base_url=gemini_stub.base_url, timeout_seconds=5)


async def test_one_vector_per_text_in_order(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    assert isinstance(adapter, Embedder)  # what the stack's builder checks
    answer = await adapter.embed(MODEL, TEXTS, 5)
    assert answer.vectors == tuple(tuple(stub_embedding(t)) for t in TEXTS)
    assert answer.usage.input_tokens == 5 + 3 + 6  # the stub counts words
    assert gemini_stub.stats.by_route == {ROUTE: 1}
    (body,) = gemini_stub.embedding_log
    assert body["requests"] == [
        {"model": f"models/{MODEL}", "content": {"role": "user", "parts": [{"text": t}]}}
        for t in TEXTS
    ]
    await adapter.aclose()


async def test_a_model_the_sdk_takes_for_multimodal_still_embeds_each_text(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    """For a model named like ``gemini-embedding-2`` the SDK joins a list of strings into
    one content: each text is sent as a content of its own, so it gets its own vector."""
    gemini_stub.embedding = lambda text: [float(len(text)), 1.0]
    answer = await adapter.embed("gemini-embedding-2-preview", TEXTS, 5)
    assert answer.vectors == tuple((float(len(t)), 1.0) for t in TEXTS)


async def test_an_answer_without_a_token_count_counts_none(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    embed = gemini_stub._embed

    async def uncounted(model: str, request: Any) -> Any:
        body = await embed(model, request)
        body.pop("usageMetadata")
        return body

    monkeypatch.setattr(gemini_stub, "_embed", uncounted)
    answer = await adapter.embed(MODEL, TEXTS[:1], 5)
    assert answer.usage.input_tokens == 0 and len(answer.vectors) == 1


BAD_VECTORS = [
    pytest.param(lambda text: [], id="empty vector"),
    pytest.param(lambda text: [1.0] * len(text), id="different lengths"),
    pytest.param(lambda text: [float("nan"), 1.0], id="nan (sent as null)"),
]


@pytest.mark.parametrize("vector", BAD_VECTORS)
async def test_a_bad_vector_is_a_bad_response(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer, vector: Any
) -> None:
    gemini_stub.embedding = vector
    with pytest.raises(LLMAPIError) as info:
        await adapter.embed(MODEL, TEXTS, 5)
    assert info.value.code == "bad_response"
    assert "embeddings answer" in str(info.value)


@pytest.mark.parametrize("fault", ["empty", "malformed"])
async def test_a_short_or_broken_answer_is_a_bad_response(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer, fault: str
) -> None:
    gemini_stub.embedding_faults.append(fault)
    with pytest.raises(LLMAPIError) as info:
        await adapter.embed(MODEL, TEXTS, 5)
    assert info.value.code == "bad_response"
    assert gemini_stub.stats.faults[fault] == 1


def test_a_number_that_is_not_finite_is_refused() -> None:
    """JSON as Python reads it may carry NaN and Infinity; the SDK's model keeps them."""
    for bad in (math.nan, math.inf):
        response = gt.EmbedContentResponse(embeddings=[gt.ContentEmbedding(values=[1.0, bad])])
        with pytest.raises(LLMAPIError, match="finite"):
            _vectors(response, 1, MODEL)


FAULTS: list[tuple[str, type[LLMError], str, int | None]] = [
    ("rate_limit", LLMRateLimitError, "rate_limit", 429),
    ("insufficient_quota", LLMRateLimitError, "rate_limit", 429),
    ("server_error", LLMAPIError, "server_error", 500),
    ("bad_gateway", LLMAPIError, "server_error", 502),
    ("auth", LLMConfigurationError, "configuration_error", None),
    ("model_not_found", LLMConfigurationError, "configuration_error", None),
]


@pytest.mark.parametrize(("fault", "error", "code", "status"), FAULTS)
async def test_error_statuses_map_as_a_calls_do(
    adapter: GeminiAdapter,
    gemini_stub: GeminiStubServer,
    fault: str,
    error: type[LLMError],
    code: str,
    status: int | None,
) -> None:
    gemini_stub.embedding_faults.append(fault)
    with pytest.raises(error) as info:
        await adapter.embed(MODEL, TEXTS, 5)
    assert info.value.code == code
    assert KEY not in str(info.value)
    if status is not None:
        assert getattr(info.value, "status_code", None) == status
    if fault == "rate_limit":  # the delay of the error's RetryInfo
        assert info.value.retry_after == pytest.approx(gemini_stub.options.retry_after)
    if fault == "auth":
        assert "GEMINI_API_KEY" in str(info.value)
    assert gemini_stub.stats.by_route == {ROUTE: 1}


async def test_a_hang_past_the_timeout_is_a_timeout(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer
) -> None:
    gemini_stub.embedding_faults.append("hang")
    with pytest.raises(LLMTimeoutError):
        await adapter.embed(MODEL, TEXTS, 0.3)


async def test_a_refused_connection_is_a_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    dead = GeminiAdapter(base_url="http://127.0.0.1:9")
    with pytest.raises(LLMAPIError) as info:
        await dead.embed(MODEL, TEXTS, 5)
    assert info.value.code == "connection_error"


async def test_more_texts_than_a_batch_takes_are_sent_in_several(
    adapter: GeminiAdapter, gemini_stub: GeminiStubServer, tmp_path: Path
) -> None:
    """Gemini refuses a batch of more than 100; the cache's fetch splits by the adapter's
    ``max_texts``."""
    texts = [f"cell number {n}" for n in range(MAX_EMBED_TEXTS * 2 + 50)]
    with pytest.raises(LLMAPIError) as info:  # the stub holds the API's limit
        await adapter.embed(MODEL, texts[: MAX_EMBED_TEXTS + 1], 5)
    assert info.value.status_code == 400  # type: ignore[attr-defined]
    assert "at most 100" in str(info.value)
    cache = VectorCache(tmp_path, MODEL)
    assert await fetch(cache, adapter, texts, 5) == len(texts)
    sizes = [len(body["requests"]) for body in gemini_stub.embedding_log]  # (101: refused)
    assert sizes == [100, 100, 50]
    assert cache.requests == 3 and cache.usage.input_tokens == 3 * len(texts)
    assert (tmp_path / cache.rel).is_file()
