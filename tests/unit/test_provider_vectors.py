"""The provider embeddings' cache (``sim.mind.vectors``) and the checks on an embeddings
answer (``sim.providers._openai_family``): untrusted files and answers, never a
traceback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from sim.llm.errors import LLMAPIError
from sim.mind.vectors import MAX_DIMENSIONS, VectorCache, text_digest
from sim.providers._openai_family import _embeddings


def saved(root: Path, model: str = "m") -> VectorCache:
    cache = VectorCache(root, model)
    cache.add(["a bell", "a key"], [[1.0, 0.0], [0.6, 0.8]])
    cache.save()
    return cache


def test_a_cache_round_trips_to_the_same_float32_vectors(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path, "m")
    cache.add(["a bell", "a key"], [[0.1, 0.7], [0.3, 0.3]])
    before = cache.similarities(["a bell", "a key", "nothing"], "a key")
    cache.save()
    again = VectorCache(tmp_path, "m")
    assert again.missing(["a bell", "a key", "nothing"]) == ["nothing"]
    assert again.similarities(["a bell", "a key", "nothing"], "a key") == before
    assert before[1] == pytest.approx(1.0) and before[2] == 0.0
    assert not again.notes
    # the same vectors, the same bytes
    first = cache.root.joinpath(cache.rel).read_bytes()
    again.add(["a bell"], [[0.1, 0.7]])
    again.save()
    assert cache.root.joinpath(cache.rel).read_bytes() == first


def test_another_model_has_another_file(tmp_path: Path) -> None:
    saved(tmp_path, "one")
    assert VectorCache(tmp_path, "two").missing(["a bell"]) == ["a bell"]
    assert VectorCache(tmp_path, "one").missing(["a bell"]) == []


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"\x00\xff",
        b"[1, 2]",
        b'{"model": "other", "dimensions": 2}',
        b'{"model": "m", "dimensions": 0}',
        b'{"model": "m", "dimensions": true}',
        orjson.dumps({"model": "m", "dimensions": MAX_DIMENSIONS + 1}),
    ],
)
def test_a_bad_head_ignores_the_file(tmp_path: Path, damage: bytes) -> None:
    cache = saved(tmp_path)
    path = tmp_path / cache.rel
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([damage, *lines[1:]]))
    again = VectorCache(tmp_path, "m")
    assert again.missing(["a bell", "a key"]) == ["a bell", "a key"]
    if damage:
        assert "ignored" in again.notes[0]


@pytest.mark.parametrize(
    "line",
    [
        b"{",
        b"5",
        orjson.dumps({"text": text_digest("a key"), "vector": "not base64!"}),
        orjson.dumps({"text": text_digest("a key"), "vector": "AAAA"}),  # 3 bytes
        orjson.dumps({"text": "short", "vector": "AAAAAAAAAAA="}),
        # two float32 NaNs
        orjson.dumps({"text": text_digest("a key"), "vector": "AADAfwAAwH8="}),
    ],
)
def test_a_bad_line_is_skipped_and_fetched_again(tmp_path: Path, line: bytes) -> None:
    cache = saved(tmp_path)
    path = tmp_path / cache.rel
    head, *entries = path.read_bytes().split(b"\n")
    kept = [e for e in entries if e and text_digest("a key").encode() not in e]
    path.write_bytes(b"\n".join([head, *kept, line]))
    again = VectorCache(tmp_path, "m")
    assert again.missing(["a bell", "a key"]) == ["a key"]
    assert "1 bad line(s) ignored" in again.notes[0]


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    cache = saved(tmp_path)
    path = tmp_path / cache.rel
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    os.symlink(outside, path)
    again = VectorCache(tmp_path, "m")
    assert again.missing(["a bell"]) == ["a bell"] and "ignored" in again.notes[0]
    again.add(["a bell"], [[1.0, 0.0]])
    again.save()  # replaces the link with a file; the file outside is untouched
    assert not path.is_symlink()
    assert outside.read_bytes().count(b"\n") == 3


def test_vectors_of_another_length_are_refused(tmp_path: Path) -> None:
    cache = saved(tmp_path)
    with pytest.raises(ValueError, match="expected 2"):
        cache.add(["a rope"], [[1.0, 0.0, 0.0]])


def answer(*vectors: Any, **item: Any) -> dict[str, Any]:
    return {"data": [{"index": i, "embedding": v, **item} for i, v in enumerate(vectors)]}


def test_an_answer_comes_back_in_input_order() -> None:
    data = {"data": [{"index": 1, "embedding": [0, 1]}, {"index": 0, "embedding": [1, 0]}]}
    assert _embeddings(data, 2) == ((1.0, 0.0), (0.0, 1.0))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([], "under 'data'"),
        ({"data": "x"}, "under 'data'"),
        (answer([1.0]), "under 'data'"),  # one of two
        (answer([1.0], [1.0, 2.0]), "different lengths"),
        (answer([1.0], ["x"]), "not a list of numbers"),
        (answer([1.0], []), "not a list of numbers"),
        (answer([1.0], [True]), "not a list of numbers"),
        (answer([1.0], [float("inf")]), "not a list of numbers"),
        ({"data": [{"index": 0, "embedding": [1]}, {"index": 0, "embedding": [1]}]}, "twice"),
        ({"data": [{"index": 5, "embedding": [1]}, {"index": 0, "embedding": [1]}]}, "index"),
        ({"data": [1, 2]}, "not an object"),
    ],
)
def test_a_bad_answer_is_a_bad_response(data: Any, problem: str) -> None:
    with pytest.raises(LLMAPIError, match=problem) as caught:
        _embeddings(data, 2)
    assert caught.value.code == "bad_response"


def test_a_blank_text_is_never_asked_for(tmp_path: Path) -> None:
    cache = saved(tmp_path)
    assert cache.missing(["", "  ", "a rope"]) == ["a rope"]
    assert cache.similarities(["", "a bell"], "a bell")[0] == 0.0


def test_a_file_over_the_limit_is_ignored_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sim.mind.vectors as vectors

    cache = saved(tmp_path)
    monkeypatch.setattr(vectors, "MAX_BYTES", 10)
    again = VectorCache(tmp_path, "m")
    assert again.missing(["a bell"]) == ["a bell"]
    assert "over the cache's limit of 10" in again.notes[0]
    assert cache.rel in again.notes[0]


def test_the_file_is_json_lines_as_orjson_writes_them(tmp_path: Path) -> None:
    """``save`` formats its lines itself (orjson's buffer for one is many times its size):
    the bytes are orjson's compact form, one JSON object a line."""
    cache = saved(tmp_path)
    head, *lines, end = cache.path.read_bytes().split(b"\n")
    assert end == b"" and head == orjson.dumps({"model": "m", "dimensions": 2})
    for line in lines:
        item = orjson.loads(line)
        assert line == orjson.dumps({"text": item["text"], "vector": item["vector"]})
    assert [orjson.loads(line)["text"] for line in lines] == sorted(
        text_digest(t) for t in ("a bell", "a key")
    )


def test_a_header_of_another_length_than_the_model_sends_is_dropped_once(
    tmp_path: Path,
) -> None:
    cache = saved(tmp_path)
    rest = cache.path.read_bytes().partition(b"\n")[2]
    cache.path.write_bytes(orjson.dumps({"model": "m", "dimensions": 3}) + b"\n" + rest)
    again = VectorCache(tmp_path, "m")
    assert again.missing(["a bell", "a key"]) == ["a bell", "a key"]  # 2 bad lines
    assert "'dimensions' 3" in again.notes[0]
    assert again.add(["a bell"], [[1.0, 0.0]]) is True  # the file's length was wrong
    assert (
        f"{again.path}: field 'dimensions' is 3, but model 'm' sends vectors of 2"
        in (again.notes[-1])
    )
    assert again.add(["a key"], [[0.6, 0.8]]) is False
    again.save()
    assert VectorCache(tmp_path, "m").missing(["a bell", "a key"]) == []
