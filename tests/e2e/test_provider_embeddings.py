"""``[memory] embeddings = "provider"`` on the ``chat``, ``openai`` and ``gemini``
providers: the vectors come from the stub server's ``/v1/embeddings`` over real HTTP (the
adapter's own aiohttp connections), or the Gemini stub's ``batchEmbedContents`` (Google's
SDK), are cached in the world's ``.sim/embeddings`` and decide which cells a character
recalls; a second tick, a replay and a corrupt cache are covered, and a provider without
embeddings is refused by name."""

from __future__ import annotations

import base64
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import WORLDS, tree

from sim.cli import main
from sim.sections import loads as read_sections
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log

MODEL = "text-embedding-3-small"
ZEBRA = "A zebra walked along the causeway at dawn."
GIRAFFE = "Someone painted a giraffe on the chapel door."
#: filler memories; none shares a word with the zebra or the giraffe
FILLER = "Bram wiped cup number {n} behind the counter."
KEY = "sk-embed-test-secret"

CONFIG = f"""
[tick]
phases = ["intentions", "resolution", "narrative", "apply", "memory"]

[memory]
mode = "retrieve"
k = 2
embeddings = "provider"
embedding_model = "{MODEL}"
weights = {{ recency = 0.0, importance = 0.0, relevance = 1.0 }}
"""


def vectors(text: str) -> list[float]:
    """The stub's embeddings in these tests: every situation (it starts with its place's
    id) and the zebra point one way, the giraffe nearly so, everything else elsewhere.
    No word links them: BM25 or the offline embeddings would pick neither (ties go to
    the latest cells)."""
    if "zebra" in text or text.split(" ", 1)[0] in LOCATIONS:
        return [1.0, 0.0, 0.0]
    if "giraffe" in text:
        return [0.9, 0.1, 0.0]
    return [0.0, 0.0, 1.0]


LOCATIONS = {p.stem for p in (WORLDS / "minds" / "locations").glob("*.json")}
CHARACTERS = sorted(p.stem for p in (WORLDS / "minds" / "characters").glob("*.json"))


def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def world_with_cells(tmp_path: Path, cells: int, who: Sequence[str] = ("bram",)) -> Path:
    """worlds/minds with the config above and, in Bram's long-term store (or those of
    ``who``), the zebra (the oldest), the giraffe and ``cells`` fillers."""
    world = tmp_path / "minds"
    shutil.copytree(WORLDS / "minds", world, ignore=shutil.ignore_patterns(".sim"))
    (world / "config.toml").write_text(CONFIG)
    texts = [ZEBRA, *(FILLER.format(n=n) for n in range(cells // 2)), GIRAFFE]
    texts += [FILLER.format(n=n) for n in range(cells // 2, cells)]
    for cid in who:
        path = world / "characters" / f"{cid}.json"
        char = orjson.loads(path.read_bytes())
        char["memory"]["archive"] = [
            {"tick": 0, "text": t, "importance": 3, "mentions": []} for t in texts
        ]
        path.write_bytes(orjson.dumps(char, option=orjson.OPT_INDENT_2))
    return world


def tick(world: Path, provider: str, base_url: str, *more: str) -> Result:
    return run(
        "tick",
        "--world",
        str(world),
        "--provider",
        provider,
        "--base-url",
        base_url,
        *more,
        env={"OPENAI_API_KEY": KEY},
    )


def recalled(world: Path, number: int, cid: str = "bram") -> list[str]:
    calls = read_log(log_path(world, number)).calls.values()
    call = next(c for c in calls if c.phase == "intentions" and c.entity_key == f"intention:{cid}")
    doc = read_sections(call.input)
    assert doc is not None
    lines: list[str] = doc["memory"]["recall"]
    return lines


def sent_texts(stub: Any) -> list[str]:
    return [t for body in stub.embedding_log for t in body["input"]]


@pytest.mark.parametrize(("provider", "cells"), [("chat", 60), ("openai", 10)])
def test_retrieval_follows_the_providers_vectors(
    tmp_path: Path, stub_server: Any, provider: str, cells: int
) -> None:
    """60 cells: the numpy scoring; 10: the loop. Either way the two cells the vectors
    point to are recalled, though they are the oldest and share no word with anything."""
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, cells)
    result = tick(world, provider, stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert recalled(world, 1) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]
    # one batched request, to the configured model, on the configured server
    assert stub_server.stats.by_route["POST /v1/embeddings"] == 1
    (body,) = stub_server.embedding_log
    assert body["model"] == MODEL
    assert ZEBRA in body["input"] and GIRAFFE in body["input"]
    assert len(body["input"]) == len(set(body["input"]))  # each text once
    assert "embeddings: 1 request(s)" in result.output
    assert KEY not in result.output
    cache = list((world / ".sim" / "embeddings").glob("*.jsonl"))
    assert len(cache) == 1 and KEY.encode() not in cache[0].read_bytes()
    assert orjson.loads(cache[0].read_bytes().split(b"\n")[0]) == {
        "model": MODEL,
        "dimensions": 3,
    }


def test_a_second_tick_and_a_replay_send_no_cached_text_again(
    tmp_path: Path, stub_server: Any
) -> None:
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, 60)
    assert tick(world, "chat", stub_server.base_url).exit_code == 0
    first = sent_texts(stub_server)
    second = tick(world, "chat", stub_server.base_url)
    assert second.exit_code == 0, second.output
    again = sent_texts(stub_server)[len(first) :]
    assert again, "tick 2's new cells and situations are fetched"
    assert not set(again) & set(first), "a cached text was sent again"
    assert ZEBRA not in again
    assert recalled(world, 2) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]
    # replayed from the log and the cache: byte for byte, no request at all
    requests = stub_server.stats.by_route["POST /v1/embeddings"]
    generations = stub_server.stats.generations
    replay = run("replay", "--world", str(world), "--tick", "1")
    assert replay.exit_code == 0, replay.output
    assert stub_server.stats.by_route["POST /v1/embeddings"] == requests
    assert stub_server.stats.generations == generations


def test_a_corrupt_cache_is_ignored_and_refetched(tmp_path: Path, stub_server: Any) -> None:
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, 10)
    assert tick(world, "chat", stub_server.base_url).exit_code == 0
    (cache,) = (world / ".sim" / "embeddings").glob("*.jsonl")
    lines = cache.read_bytes().split(b"\n")
    # a line of garbage, a vector of the wrong length, a number that is not one
    lines[1] = b"{not json"
    lines[2] = orjson.dumps({"text": "0" * 64, "vector": "AAAA"})
    lines[3] = b'{"text": 5, "vector": []}'
    cache.write_bytes(b"\n".join(lines))
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "3 bad line(s) ignored" in result.output
    # and a file that is not a cache at all: ignored whole, every text fetched again
    cache.write_bytes(b"\x00\xff garbage")
    before = len(sent_texts(stub_server))
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert "ignored" in result.output
    assert ZEBRA in sent_texts(stub_server)[before:]
    assert recalled(world, 3) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]


def test_a_tampered_dimensions_is_named_and_the_cache_rebuilt_once(
    tmp_path: Path, stub_server: Any
) -> None:
    """The right model, a wrong ``dimensions`` in the header: every entry is then of
    another length. It used to fail every tick, paying the embeddings request again each
    time, with an error naming no file: the file is named with the field and what the
    model sends, its vectors are dropped, and the cache is rebuilt once."""
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, 10)
    assert tick(world, "chat", stub_server.base_url).exit_code == 0
    (cache,) = (world / ".sim" / "embeddings").glob("*.jsonl")
    head, _, rest = cache.read_bytes().partition(b"\n")
    assert orjson.loads(head) == {"model": MODEL, "dimensions": 3}
    cache.write_bytes(orjson.dumps({"model": MODEL, "dimensions": 7}) + b"\n" + rest)
    check = run("check", "--world", str(world))  # it says so before any tick
    assert check.exit_code == 0, check.output
    assert f"warning: {cache}: " in check.output and "'dimensions' 7" in check.output
    before = len(sent_texts(stub_server))
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert f"{cache}: field 'dimensions' is 7, but model {MODEL!r} sends vectors of 3" in (
        result.output
    )
    assert ZEBRA in sent_texts(stub_server)[before:]  # fetched again, this once
    assert orjson.loads(cache.read_bytes().partition(b"\n")[0])["dimensions"] == 3
    assert recalled(world, 2) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]
    # rebuilt: the next tick sends only its new texts
    before = len(sent_texts(stub_server))
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert "dimensions" not in result.output
    assert ZEBRA not in sent_texts(stub_server)[before:]


def test_a_folder_in_the_caches_place_is_named_before_anything_is_paid(
    tmp_path: Path, stub_server: Any
) -> None:
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, 10)
    assert tick(world, "chat", stub_server.base_url).exit_code == 0
    (cache,) = (world / ".sim" / "embeddings").glob("*.jsonl")
    cache.unlink()
    cache.mkdir()
    requests = stub_server.stats.by_route["POST /v1/embeddings"]
    check = run("check", "--world", str(world))
    assert check.exit_code == 2 and f"{cache}: is a folder" in check.output
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 2, result.output
    assert f"{cache}: is a folder; expected the {MODEL!r} embeddings cache file" in (result.output)
    assert ".tmp" not in result.output and "Traceback" not in result.output
    assert stub_server.stats.by_route["POST /v1/embeddings"] == requests  # nothing paid


def test_a_bad_embeddings_answer_stops_the_tick_with_nothing_written(
    tmp_path: Path, stub_server: Any
) -> None:
    stub_server.embedding = lambda text: [float("nan")] if "zebra" in text else [1.0]
    world = world_with_cells(tmp_path, 10)
    before = tree(world)
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert "embeddings" in result.output
    assert tree(world) == before


GEMINI_MODEL = "gemini-embedding-001"
GEMINI_ROUTE = f"POST /v1beta/models/{GEMINI_MODEL}:batchEmbedContents"


def gemini_tick(world: Path, stub: Any) -> Result:
    env = {"GEMINI_API_KEY": KEY, "GEMINI_MODEL": None, "OPENAI_API_KEY": None}
    args = ["--provider", "gemini", "--base-url", stub.base_url]
    return run("tick", "--world", str(world), *args, env=env)


def gemini_texts(stub: Any) -> list[str]:
    return [
        r["content"]["parts"][0]["text"] for body in stub.embedding_log for r in body["requests"]
    ]


def test_gemini_embeds_through_its_sdk_and_caches(tmp_path: Path, gemini_stub: Any) -> None:
    """The gemini provider: ``batchEmbedContents`` on the configured server, with the
    configured model; the vectors decide the recall, are cached, and neither a second tick
    nor a replay sends a cached text again."""
    gemini_stub.embedding = vectors
    world = world_with_cells(tmp_path, 60)
    (world / "config.toml").write_text(CONFIG.replace(MODEL, GEMINI_MODEL))
    result = gemini_tick(world, gemini_stub)
    assert result.exit_code == 0, result.output
    assert recalled(world, 1) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]
    assert gemini_stub.stats.by_route[GEMINI_ROUTE] == 1
    (body,) = gemini_stub.embedding_log
    assert {r["model"] for r in body["requests"]} == {f"models/{GEMINI_MODEL}"}
    first = gemini_texts(gemini_stub)
    assert ZEBRA in first and GIRAFFE in first and len(first) == len(set(first))
    assert "embeddings: 1 request(s)" in result.output
    assert KEY not in result.output
    (cache,) = (world / ".sim" / "embeddings").glob("*.jsonl")
    assert KEY.encode() not in cache.read_bytes()
    assert orjson.loads(cache.read_bytes().split(b"\n")[0]) == {
        "model": GEMINI_MODEL,
        "dimensions": 3,
    }
    second = gemini_tick(world, gemini_stub)
    assert second.exit_code == 0, second.output
    again = gemini_texts(gemini_stub)[len(first) :]
    assert again and not set(again) & set(first), "a cached text was sent again"
    assert recalled(world, 2) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]
    requests = gemini_stub.stats.by_route[GEMINI_ROUTE]
    generations = gemini_stub.stats.generations
    replay = run("replay", "--world", str(world), "--tick", "1")
    assert replay.exit_code == 0, replay.output
    assert gemini_stub.stats.by_route[GEMINI_ROUTE] == requests
    assert gemini_stub.stats.generations == generations


def test_gemini_failures_are_retried_and_a_bad_answer_stops_the_tick(
    tmp_path: Path, gemini_stub: Any
) -> None:
    """A rate limit and a short answer are retried as a call's failures are; an answer
    that stays bad stops the tick with nothing written."""
    gemini_stub.embedding = vectors
    gemini_stub.embedding_faults.extend(["rate_limit", "empty"])
    world = world_with_cells(tmp_path, 10)
    config = CONFIG.replace(MODEL, GEMINI_MODEL) + "\n[llm]\nbackoff_base_seconds = 0.01\n"
    (world / "config.toml").write_text(config)
    result = gemini_tick(world, gemini_stub)
    assert result.exit_code == 0, result.output
    assert gemini_stub.stats.by_route[GEMINI_ROUTE] == 3
    assert recalled(world, 1) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]
    fresh = world_with_cells(tmp_path / "fresh", 10)
    (fresh / "config.toml").write_text(config)
    gemini_stub.embedding = lambda text: [1.0] * len(text)  # lengths differ: every time
    before = tree(fresh)
    stopped = gemini_tick(fresh, gemini_stub)
    assert stopped.exit_code != 0
    assert "Traceback" not in stopped.output
    assert "embeddings answer has embeddings of different lengths" in stopped.output
    assert tree(fresh) == before


def test_a_gemini_endpoint_is_asked_for_a_gemini_embedding_model(tmp_path: Path) -> None:
    world = world_with_cells(tmp_path, 10)
    (world / "config.toml").unlink()
    mine = tmp_path / "mine.toml"
    mine.write_text(
        '[llm]\nprovider = "gemini"\n' + CONFIG.replace(f'embedding_model = "{MODEL}"', "")
    )
    result = run("check", "--world", str(world), "--config", str(mine))
    assert result.exit_code == 2, result.output
    assert "memory.embedding_model" in result.output
    assert 'embedding_model = "gemini-embedding-001"' in result.output


@pytest.mark.parametrize("command", ["tick", "check"])
@pytest.mark.parametrize("provider", ["anthropic"])
def test_a_provider_without_embeddings_is_refused(
    tmp_path: Path, provider: str, command: str
) -> None:
    world = world_with_cells(tmp_path, 10)
    (world / "config.toml").unlink()
    mine = tmp_path / "mine.toml"
    mine.write_text(f'[llm]\nprovider = "{provider}"\n' + CONFIG)
    before = tree(world)
    result = run(command, "--world", str(world), "--config", str(mine))
    assert result.exit_code == 2, result.output
    assert "memory.embeddings" in result.output and f"'{provider}'" in result.output
    assert tree(world) == before


@pytest.mark.parametrize(
    ("setting", "field"),
    [("", "memory.embedding_model"), ('embedding_model = "  "', "memory.embedding_model")],
)
def test_the_embedding_model_is_required_and_checked(
    tmp_path: Path, stub_server: Any, setting: str, field: str
) -> None:
    world = world_with_cells(tmp_path, 10)
    config = CONFIG.replace(f'embedding_model = "{MODEL}"', setting)
    (world / "config.toml").write_text(config)
    before = tree(world)
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert tree(world) == before
    assert stub_server.stats.requests == 0


def test_a_resumed_tick_sends_no_embeddings_request_again(tmp_path: Path, stub_server: Any) -> None:
    """A tick stopped after its intentions (the server refuses the key from then on) is
    resumed: the answered calls come from its log, the vectors from the cache."""
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, 10)
    chars = len(list((world / "characters").glob("*.json")))
    stub_server.enqueue(*([None] * chars), *(["auth"] * 200))
    stopped = tick(world, "chat", stub_server.base_url)
    assert stopped.exit_code != 0, stopped.output
    assert "Traceback" not in stopped.output
    assert stub_server.stats.by_route["POST /v1/embeddings"] == 1
    stub_server.script.clear()
    resumed = tick(world, "chat", stub_server.base_url)
    assert resumed.exit_code == 0, resumed.output
    assert f"resumed: {chars} calls taken from the interrupted tick's log" in resumed.output
    assert stub_server.stats.by_route["POST /v1/embeddings"] == 1  # nothing fetched again
    assert recalled(world, 1) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]


def test_embeddings_are_held_against_the_budget(tmp_path: Path, stub_server: Any) -> None:
    """A token cap the texts could cross: the request is not sent, the tick stops."""
    world = world_with_cells(tmp_path, 10)
    (world / "config.toml").write_text(CONFIG + "\n[budget]\nmax_total_tokens = 50\n")
    before = tree(world)
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code != 0
    assert "token budget reached" in result.output
    assert stub_server.stats.requests == 0
    assert tree(world) == before


def test_one_phase_may_use_its_own_embedding_model(tmp_path: Path, stub_server: Any) -> None:
    """``[memory.phases.intentions]`` sets the model for that phase alone; the top level
    needs none when no other phase uses provider embeddings."""
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, 10)
    config = CONFIG.replace('embeddings = "provider"\n', "").replace(
        f'embedding_model = "{MODEL}"\n', ""
    )
    config += '\n[memory.phases.intentions]\nembeddings = "provider"\n'
    (world / "config.toml").write_text(config)
    refused = tick(world, "chat", stub_server.base_url)
    assert refused.exit_code == 2 and "memory.phases.intentions.embedding_model" in refused.output
    (world / "config.toml").write_text(config + 'embedding_model = "mini-embed"\n')
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert {b["model"] for b in stub_server.embedding_log} == {"mini-embed"}
    assert recalled(world, 1) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]


def test_embeddings_go_to_the_endpoint_the_phase_runs_on(tmp_path: Path) -> None:
    """``[llm]`` is one server, the intentions run on ``[providers.near]``, another: the
    embeddings go to the intentions' server, with its key, and nowhere else."""
    from sim.testing.stub_server import ServerThread, StubServer

    with ServerThread(StubServer()) as default, ServerThread(StubServer()) as near:
        near.embedding = vectors
        world = world_with_cells(tmp_path, 10)
        config = CONFIG + (
            f'\n[llm]\nprovider = "chat"\nbase_url = "{default.base_url}"\n'
            f'\n[providers.near]\nkind = "chat"\nbase_url = "{near.base_url}"\n'
            'api_key_env = "NEAR_KEY"\n'
            '\n[phase1]\nmodel = "near/small"\n'
        )
        (world / "config.toml").unlink()  # a world's config may not say where requests go
        mine = tmp_path / "mine.toml"
        mine.write_text(config)
        env = {"OPENAI_API_KEY": KEY, "NEAR_KEY": "sk-near"}
        result = run("tick", "--world", str(world), "--config", str(mine), env=env)
        assert result.exit_code == 0, result.output
        assert near.stats.by_route["POST /v1/embeddings"] == 1
        assert default.stats.by_route["POST /v1/embeddings"] == 0
        assert default.stats.generations > 0  # the other phases ran there
        assert recalled(world, 1) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]


def test_a_rate_limit_or_a_server_error_is_retried(tmp_path: Path, stub_server: Any) -> None:
    stub_server.embedding = vectors
    stub_server.embedding_faults.extend(["rate_limit", "server_error"])
    world = world_with_cells(tmp_path, 10)
    config = CONFIG + "\n[llm]\nbackoff_base_seconds = 0.01\n"
    (world / "config.toml").write_text(config)
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code == 0, result.output
    assert stub_server.stats.by_route["POST /v1/embeddings"] == 3
    assert recalled(world, 1) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]


def test_a_refused_key_is_not_retried_and_never_printed(tmp_path: Path, stub_server: Any) -> None:
    stub_server.embedding_faults.append("auth")
    world = world_with_cells(tmp_path, 10)
    before = tree(world)
    result = tick(world, "chat", stub_server.base_url)
    assert result.exit_code != 0
    assert "OPENAI_API_KEY" in result.output and KEY not in result.output
    assert "Traceback" not in result.output
    assert stub_server.stats.by_route["POST /v1/embeddings"] == 1
    assert stub_server.stats.generations == 0
    assert tree(world) == before


def without_the_stubs_ids(files: dict[str, bytes]) -> dict[str, Any]:
    """A world's files without what the stub makes differently in each run of the same
    world: its answers' ids (the chains, ``_openai``) and the prompt-cache tokens it
    counts, which depend on which of two like requests came first."""
    out: dict[str, Any] = {}
    for rel, data in files.items():
        if rel.startswith(".sim/responses"):
            continue
        if rel.startswith(("characters/", "locations/")):
            entity = orjson.loads(data)
            entity.pop("_openai", None)
            out[rel] = entity
        else:
            out[rel] = data
    return out


def test_sharded_ticks_fetch_what_one_process_fetches_and_recall_the_same(
    tmp_path: Path,
) -> None:
    """``--workers 2`` and ``3``: ``sim tick`` fetches every shard's texts, in the
    requests one process sends, and each shard recalls with the vectors it asked for;
    the world files, the cache and the recall are one process's, over two ticks (each
    run against a fresh stub: its prompt cache would remember the last)."""
    from sim.testing.stub_server import ServerThread, StubOptions, StubServer

    source = world_with_cells(tmp_path / "source", 60, CHARACTERS)
    sent, trees, recalls = [], [], []
    for workers in (1, 2, 3):
        world = tmp_path / f"w{workers}"
        shutil.copytree(source, world)
        stub = StubServer(StubOptions())
        stub.embedding = vectors
        with ServerThread(stub) as server:
            args = ("--ticks", "2", "--workers", str(workers))
            result = tick(world, "chat", server.base_url, *args)
        assert result.exit_code == 0, result.output
        assert "one process" not in result.output
        sent.append([body["input"] for body in stub.embedding_log])
        trees.append(without_the_stubs_ids(tree(world)))
        recalls.append([recalled(world, n, cid) for n in (1, 2) for cid in CHARACTERS])
    # everyone's oldest two, which only the vectors point to: every shard had them
    assert recalls[0] == [[f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"]] * len(recalls[0])
    assert len(sent[0]) == 2  # a request each tick
    assert sent[1] == sent[0] and sent[2] == sent[0]
    assert recalls[1] == recalls[0] and recalls[2] == recalls[0]
    assert trees[1] == trees[0] and trees[2] == trees[0]


def test_a_sharded_tick_rebuilds_a_cache_of_another_length_once(
    tmp_path: Path, stub_server: Any
) -> None:
    """The cache holds vectors of 7 numbers, the model sends 3: ``sim tick`` drops the
    file's vectors and fetches again, and each shard, which had them from the file and
    asked only for what it lacked, asks again for the rest: the recall is the model's
    vectors' in every shard, and the next tick fetches nothing old."""
    stub_server.embedding = vectors
    world = world_with_cells(tmp_path, 10, CHARACTERS)
    assert tick(world, "chat", stub_server.base_url).exit_code == 0
    (cache,) = (world / ".sim" / "embeddings").glob("*.jsonl")
    lines = [orjson.dumps({"model": MODEL, "dimensions": 7})]
    seven = base64.b64encode(struct.pack("<7f", 1, 0, 0, 0, 0, 0, 0)).decode()
    for line in cache.read_bytes().splitlines()[1:]:  # each a vector of 7: a whole file
        lines.append(orjson.dumps({"text": orjson.loads(line)["text"], "vector": seven}))
    cache.write_bytes(b"\n".join(lines) + b"\n")
    result = tick(world, "chat", stub_server.base_url, "--workers", "3")
    assert result.exit_code == 0, result.output
    assert "one process" not in result.output
    assert "field 'dimensions' is 7" in result.output
    for cid in CHARACTERS:  # each shard's too
        assert recalled(world, 2, cid) == [f"tick 0: {ZEBRA}", f"tick 0: {GIRAFFE}"], cid
    assert orjson.loads(cache.read_bytes().partition(b"\n")[0])["dimensions"] == 3
    before = len(sent_texts(stub_server))
    result = tick(world, "chat", stub_server.base_url, "--workers", "3")
    assert result.exit_code == 0, result.output
    assert ZEBRA not in sent_texts(stub_server)[before:]
