"""Long histories: compressed committed logs, per-tick summaries and compaction (issue #16)."""

from __future__ import annotations

import gzip
import itertools
import math
import random
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import copy_demo

from sim.analysis.logview import summary
from sim.analysis.usage import group_calls, group_rows
from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.errors import LogError
from sim.llm.budget import Price
from sim.testing.logs import plain_logs
from sim.ticklog.books import tick_books
from sim.ticklog.compression import LogCompression, _pack_line, compress_log
from sim.ticklog.format import (
    DERIVED_DIGEST,
    DERIVED_RAW,
    list_logs,
    log_line,
    log_path,
    pack_state,
    packed_call_line,
    packed_path,
    summary_rel,
    unpack_state,
)
from sim.ticklog.layout import _detail_last
from sim.ticklog.reader import TickLog, read_log, read_log_bytes
from sim.ticklog.records import CallRecord, dump_record
from sim.ticklog.recovery import recover_logs
from sim.ticklog.summary import (
    Listed,
    dump_summary,
    read_summary,
    summarize,
    summary_books,
    summary_numbers,
)

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ticklog"


def unpacked(path: Path) -> bytes:
    """A compressed log's JSONL lines as stored (the layout's order)."""
    return zstd.decompress(path.read_bytes())


def run(world: Path, ticks: int, **overrides: object) -> list:
    config = load_config(world_dir=world, overrides=overrides or None, cwd=world)
    return Runner(world, config).run(ticks)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def invoke_stdout(*args: str) -> tuple[int, str]:
    """Exit code and standard output alone (warnings go to stderr)."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def test_a_compressed_log_reads_back_as_the_bytes_the_tick_wrote(
    tmp_path: Path, captured: dict[int, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: dict[tuple[int, str], str] = {}  # the digest each call was made with
    pack = packed_call_line

    def packed(record: CallRecord, *, own_digest: bool = False) -> bytes:
        made[(len(captured) + 1, record.request_id)] = record.digest
        return pack(record, own_digest=own_digest)

    monkeypatch.setattr("sim.ticklog.writer.packed_call_line", packed)
    world = copy_demo(tmp_path / "w")
    run(world, 3)
    assert sorted(captured) == [1, 2, 3]
    for tick, original in captured.items():
        assert not log_path(world, tick).exists()
        packed = packed_path(log_path(world, tick))
        log = read_log(packed)
        again = b"".join(log_line(r) + b"\n" for r in log.written_records())
        assert again == original
        # what the compressed form leaves out, it can rebuild: raw answers and digests
        lines = [orjson.loads(line) for line in unpacked(packed).splitlines()]
        calls = [r for r in lines if r["type"] == "call"]
        assert calls and all(r["attempts"][-1]["raw"] == DERIVED_RAW for r in calls)
        assert all(r["digest"] == DERIVED_DIGEST for r in calls)
        assert len(packed.read_bytes()) * 3 < len(original)
        # the running tick wrote its call lines packed already: compression took them as
        # they were, and the digests read back are the ones the calls were made with
        written = [orjson.loads(line) for line in original.splitlines()]
        assert [r for r in written if r["type"] == "call"] == calls
        assert {r.request_id: r.digest for r in log.call_records} == {
            rid: d for (t, rid), d in made.items() if t == tick
        }


def test_a_raw_answer_that_is_not_its_result_is_kept(tmp_path: Path) -> None:
    """Only what rebuilds byte for byte is left out: a model's own spacing is kept."""
    path = tmp_path / "tick-000001.jsonl"
    lines = (FIXTURES / "tick-000001.jsonl").read_bytes().splitlines()
    edited = []
    for line in lines:
        record = orjson.loads(line)
        if record["type"] == "call":
            if record.get("result") is not None:
                raw = orjson.dumps(record["result"]).decode() + " "
                record["attempts"][-1]["raw"] = raw
            record["digest"] = "sha256:" + "0" * 32  # not what its fields give
        edited.append(orjson.dumps(record))
    path.write_bytes(b"\n".join(edited) + b"\n")
    before = read_log(path)
    packed = compress_log(path)
    after = read_log(packed)
    assert [dump_record(r) for r in after.written_records()] == [
        dump_record(r) for r in before.written_records()
    ]
    assert b'"derived"' not in unpacked(packed)


def test_replay_of_compressed_ticks_is_identical(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 3)
    assert [p.name.endswith(".jsonl.zst") for _, p in list_logs(world)] == [True] * 3
    code, out = invoke("replay", "--world", str(world), "--tick", "1", "--to", "3")
    assert code == 0, out
    assert out.strip().endswith("identical")


@pytest.mark.parametrize("priced", [False, True])
def test_the_summary_a_commit_writes_equals_the_one_its_log_gives(
    tmp_path: Path, priced: bool
) -> None:
    """Written call by call by the recorder (which prices each call once, for its record
    and the summary), or computed from the full log: the same."""
    world = copy_demo(tmp_path / "w")
    prices = {"offline": {"input": 1.25, "cached_input": 0.125, "output": 10.0}}
    run(world, 2, phase1={"response_chain_depth": 2}, **({"prices": prices} if priced else {}))
    for tick, path in list_logs(world):
        written = read_summary(world / summary_rel(tick))
        log = read_log(path)
        from_log = summarize(log)
        assert written.head == from_log.head.model_copy(update={"committed": True})
        assert written.groups == from_log.groups
        assert written.places is None  # read only when asked for
        assert read_summary(world / summary_rel(tick), places=True).places == (
            summarize(log, places=True).places
        )
        books = tick_books(log)
        assert written.head.calls == books.calls and written.head.cost == books.cost.value
        assert (written.head.cost or 0) > 0 if priced else written.head.cost == 0
        assert summary_numbers(written.head) == summary(log)


def _random_log(base: TickLog, rng: random.Random) -> TickLog:
    """The fixture log with a random selection of its call records, in a random order, each
    maybe failed or on another model (records of one request id stay in order)."""
    calls = []
    for record in base.call_records:
        if rng.random() < 0.3:
            continue
        update: dict[str, object] = {}
        if rng.random() < 0.3:
            update["error_code"] = rng.choice(["timeout", "refusal", None])
        if rng.random() < 0.3:
            update["batch_ids"] = ["batch_1"]  # charged at the Batch API's rate
        if rng.random() < 0.3:  # a fallback: each attempt on its own model and provider
            update["attempts"] = [
                a.model_copy(
                    update={
                        "model": rng.choice(["gpt-4.1-mini", "mystery", "offline"]),
                        "provider": rng.choice(["", "openai", "local"]),
                        "error_code": rng.choice([None, "timeout"]),
                    }
                )
                for a in record.attempts
            ]
        calls.append(record.model_copy(update=update))
    rng.shuffle(calls)
    log = TickLog(base.path, base.tick, base.header)
    for call in calls:
        log.calls.pop(call.request_id, None)
        log.calls[call.request_id] = call
        log.call_records.append(call)
    return log


@pytest.mark.parametrize("seed", range(25))
def test_summaries_equal_the_books_of_the_full_log(seed: int) -> None:
    """Property: for any set of call records, a summary's totals (and ``summary_books``,
    at any prices) are ``tick_books`` of the log, and ``sim usage``'s rows from summaries
    equal its rows from the call records."""
    rng = random.Random(seed)
    base = read_log(FIXTURES / "tick-000001.jsonl")
    logs = [_random_log(base, rng) for _ in range(rng.randint(1, 4))]
    prices = rng.choice(
        [
            {},
            {"gpt-4.1-mini": Price(0.4, 0.1, 1.6)},
            {"gpt-4.1-mini": Price(0.4, 0.1, 1.6), "offline": Price(1.0, 0.5, 2.0)},
            {"gpt-4.1-mini": Price(0.4, 0.1, 1.6), "local/offline": Price(0.1, 0.0, 0.2)},
        ]
    )
    for log in logs:
        head = summarize(log).head
        books = tick_books(log)
        assert (head.calls, head.failures, head.timed_out) == (
            books.calls,
            books.failures,
            books.timed_out,
        )
        assert head.usage.to_usage() == books.usage
        assert head.cost == books.cost.value and set(head.unpriced) == books.cost.unpriced
        # what a sweep or study counts a folder's spend with (not parsing the log): the
        # same books, at the tick's own prices and at others
        for table, full in ((None, books), (prices, tick_books(log, prices))):
            fast = summary_books(summarize(log), table)
            assert (fast.calls, fast.failures, fast.timed_out) == (
                full.calls,
                full.failures,
                full.timed_out,
            )
            assert fast.usage == full.usage and fast.cost.unpriced == full.cost.unpriced
            assert math.isclose(fast.cost.usd, full.cost.usd, rel_tol=1e-9, abs_tol=1e-12)
    listed = [Listed(i + 1, log.path, summarize(log)) for i, log in enumerate(logs)]
    for i, log in enumerate(logs):
        log.tick = i + 1
    for by in ("entity", "phase", "tick", "model"):
        new = group_rows(listed, by, prices)  # type: ignore[arg-type]
        old = group_calls(logs, by, prices)  # type: ignore[arg-type]
        assert set(new) == set(old)
        for key, row in old.items():
            other = new[key]
            assert (other.calls, other.failures, other.timed_out) == (
                row.calls,
                row.failures,
                row.timed_out,
            )
            assert other.usage == row.usage
            assert other.cost.unpriced == row.cost.unpriced
            assert math.isclose(other.cost.usd, row.cost.usd, rel_tol=1e-9, abs_tol=1e-12)


def test_views_read_summaries_and_check_reads_only_what_it_checks(tmp_path: Path) -> None:
    """A damaged committed log (its summary intact): `sim log --tick all`, `sim usage` and
    `sim check` do not read it; `sim log --tick N` does, and says so."""
    world = copy_demo(tmp_path / "w")
    run(world, 3)
    before = {args: invoke(*args, "--world", str(world)) for args in VIEWS}
    packed_path(log_path(world, 2)).write_bytes(b"\x28\xb5\x2f\xfdnot zstd")
    for args in VIEWS:
        assert invoke(*args, "--world", str(world)) == before[args]
    code, out = invoke("log", "--world", str(world), "--tick", "2")
    assert code == 1 and "damaged compressed tick log" in out


VIEWS = (("log", "--tick", "all"), ("usage", "--by", "entity"), ("usage", "--by", "tick"))


def test_logs_of_an_older_sim_read_and_compact_into_the_same_numbers(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 3)
    expected = {args: invoke(*args, "--world", str(world)) for args in VIEWS}
    plain_logs(world)  # plain JSONL without summaries, as an older sim left them
    assert not list((world / ".sim" / "log").glob("*.zst"))
    for args in VIEWS:
        assert invoke(*args, "--world", str(world)) == expected[args]
    code, out = invoke("log", "--world", str(world), "--compact")
    # (the newest is done by the recovery every command runs first, as after a crash)
    assert code == 0 and "2 logs compressed, 2 summaries written" in out, out
    assert len(list((world / ".sim" / "log").glob("*.summary.jsonl.gz"))) == 3
    assert [p.name.endswith(".zst") for _, p in list_logs(world)] == [True] * 3
    for args in VIEWS:
        assert invoke(*args, "--world", str(world)) == expected[args]


def test_compact_before_drops_call_detail_and_keeps_the_numbers(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 4)
    expected = {args: invoke(*args, "--world", str(world)) for args in VIEWS}
    sizes = {t: p.stat().st_size for t, p in list_logs(world)}
    code, out = invoke("log", "--world", str(world), "--compact", "--before", "3")
    assert code == 0, out
    assert "call detail of 2 ticks dropped" in out
    for tick, path in list_logs(world):
        log = read_log(path)
        if tick < 3:
            assert log.compacted is not None and log.compacted.before == 3
            assert not log.call_records and log.compacted.calls > 0
            assert log.state_before is not None and log.phases and log.committed
            assert path.stat().st_size < sizes[tick]
        else:
            assert log.compacted is None and log.call_records
    for args in VIEWS:
        assert invoke(*args, "--world", str(world)) == expected[args]
    code, out = invoke("log", "--world", str(world), "--tick", "1", "--calls")
    assert code == 0 and "call detail dropped" in out
    code, out = invoke("log", "--world", str(world), "--tick", "2")
    assert code == 0 and "== tick 2 ==" in out
    code, out = invoke("replay", "--world", str(world), "--tick", "2")
    assert code != 0 and "cannot be replayed" in out and "--compact --before 3" in out
    code, out = invoke("replay", "--world", str(world), "--tick", "3", "--to", "4")
    assert code == 0 and out.strip().endswith("identical"), out
    # compacting again changes nothing; rewinding to a compacted tick still works
    code, out = invoke("log", "--world", str(world), "--compact", "--before", "3")
    assert code == 0 and "call detail of 0 ticks dropped" in out
    code, out = invoke("rewind", "--world", str(world), "--tick", "2")
    assert code == 0, out
    assert orjson.loads((world / "world.json").read_bytes())["tick"] == 1


def test_compact_refuses_other_options(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 1)
    code, out = invoke("log", "--world", str(world), "--compact", "--tick", "1")
    assert code == 2 and "--compact" in out
    code, out = invoke("log", "--world", str(world), "--before", "1")
    assert code == 2 and "--before" in out


def test_a_crash_between_compressing_and_removing_the_plain_log(tmp_path: Path) -> None:
    """Both forms on disk: listed once (the complete .gz), and the plain one is removed."""
    world = copy_demo(tmp_path / "w")
    run(world, 2)
    packed = packed_path(log_path(world, 2))
    plain = log_path(world, 2)
    plain.write_bytes(read_log_bytes(packed))
    assert [p for t, p in list_logs(world) if t == 2] == [packed]
    recover_logs(world)
    assert not plain.exists() and packed.is_file()
    [result] = run(world, 1)
    assert result.tick == 3


def test_a_rewind_moves_compressed_logs_aside_as_plain_logs(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 3)
    code, out = invoke("rewind", "--world", str(world), "--tick", "2")
    assert code == 0, out
    aside = world / ".sim" / "log" / "rewound-1"
    assert sorted(p.name for p in aside.iterdir()) == ["tick-000002.jsonl", "tick-000003.jsonl"]
    assert read_log(aside / "tick-000003.jsonl").committed
    assert not (world / summary_rel(2)).exists() and not (world / summary_rel(3)).exists()
    assert [t for t, _ in list_logs(world)] == [1]
    run(world, 2)
    code, out = invoke("log", "--world", str(world), "--tick", "all")
    assert code == 0 and len(out.strip().splitlines()) == 4


def test_compress_level_zero_keeps_logs_plain(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 2, history={"compress_level": 0})
    assert [p.name for _, p in list_logs(world)] == ["tick-000001.jsonl", "tick-000002.jsonl"]
    assert (world / summary_rel(2)).is_file()


def test_reading_a_tick_without_its_calls_stops_before_them(tmp_path: Path) -> None:
    """A compressed log keeps its call detail last (a layout line says where it was): the
    records read without calls are the full log's other records, and the full log reads
    back in the order the tick wrote it."""
    world = copy_demo(tmp_path / "w")
    run(world, 2)
    packed = packed_path(log_path(world, 2))
    lines = unpacked(packed).splitlines()
    kinds = [orjson.loads(line)["type"] for line in lines]
    assert kinds[:2] == ["header", "layout"] and kinds[-1] == "call"
    first_call = kinds.index("call")
    assert set(kinds[first_call:]) <= {"call", "instructions"}
    full = read_log(packed)
    light = read_log(packed, calls=False)
    assert not light.calls_read and not light.call_records and not light.instructions
    others = [r for r in full.records if r.type not in ("call", "instructions")]
    assert light.records == others
    order = [r.type for r in full.records]
    assert order.index("phase") < len(order) - 1 and "call" in order[order.index("phase") :]


def test_a_damaged_layout_is_reported_not_trusted(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 1)
    packed = packed_path(log_path(world, 1))
    lines = unpacked(packed).splitlines(keepends=True)
    lines[1] = b'{"type":"layout","lines":3,"detail":[7,2]}\n'
    packed.write_bytes(zstd.compress(b"".join(lines)))
    for calls in (True, False):
        with pytest.raises(LogError, match="layout"):
            read_log(packed, calls=calls)


def test_a_damaged_summary_is_rebuilt_from_its_log(tmp_path: Path) -> None:
    """A summary is derived data: when it cannot be read, the views read the log instead
    (same numbers), and the next recovery is not needed for that."""
    world = copy_demo(tmp_path / "w")
    run(world, 2)
    expected = {args: invoke_stdout(*args, "--world", str(world)) for args in VIEWS}
    (world / summary_rel(1)).write_bytes(b"not a summary")
    (world / summary_rel(2)).write_bytes(gzip.compress(b'{"type":"summary","tick":"x"}\n'))
    for args in VIEWS:  # the same numbers (a warning on stderr names the damaged summary)
        assert invoke_stdout(*args, "--world", str(world)) == expected[args]
    code, out = invoke("check", "--world", str(world))
    assert code == 0 and "unreadable" not in out


def test_compressing_a_big_log_streams_it_into_the_same_bytes(tmp_path: Path) -> None:
    """A 100,000-character tick's log is gigabytes: it is compressed as it is read, never
    held whole (the one-shot compressor held it four times over), into the same bytes."""
    import tracemalloc

    lines = (FIXTURES / "tick-000001.jsonl").read_bytes().splitlines()
    head, calls = lines[:3], [line for line in lines if line.startswith(b'{"type":"call"')]
    rest = [line for line in lines[3:] if not line.startswith(b'{"type":"call"')]
    big = [*head, *(calls * (20_000 // len(calls) + 1)), *rest]
    path = tmp_path / "tick-000001.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in big) + b'{"type":"torn')
    size = path.stat().st_size
    assert size > 20_000_000
    packed = [_pack_line(line) for line in big]
    expected = b"".join(line + b"\n" for line in _detail_last(packed))
    del packed
    source = path.read_bytes()
    tracemalloc.start()
    try:
        target = compress_log(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert unpacked(target) == expected
    assert peak < size / 5
    # the same log always compresses to the same bytes
    first = target.read_bytes()
    path.write_bytes(source)
    assert compress_log(path).read_bytes() == first


@pytest.mark.parametrize("encoding", ["object", "zlib+base64"])
def test_a_big_state_snapshot_is_packed_in_pieces_into_the_same_bytes(
    tmp_path: Path, encoding: str
) -> None:
    """The snapshot of a big world is hundreds of megabytes of JSON: a running tick's
    (``object``) is copied into the compressed log a chunk at a time, and an earlier
    sim's (``zlib+base64``) is inflated and checked a piece at a time (with quotes,
    newlines and non-ASCII text cut across pieces), never whole, into the object
    ``_pack_line`` gives."""
    import tracemalloc

    rng = random.Random(3)
    words = ["é", '"q"', "\\", "\n", "ü\u2028", "plain", "\t", "日本"]
    files = {
        f"characters/c{i:05d}.json": orjson.dumps(
            {"id": i, "text": " ".join(rng.choice(words) for _ in range(400))}
        )
        for i in range(8_000)
    }
    state = pack_state(files, encoding=encoding)
    lines = (FIXTURES / "tick-000001.jsonl").read_bytes().splitlines()
    big = [lines[0], dump_record(state), *lines[2:]]
    assert big[1].startswith(b'{"type":"state_before","encoding":"%s"' % encoding.encode())
    path = tmp_path / "tick-000001.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in big))
    packed = [_pack_line(line) for line in big]
    text_size = len(packed[1])
    assert text_size > 15_000_000
    expected = b"".join(line + b"\n" for line in _detail_last(packed))
    del packed
    tracemalloc.start()
    try:
        target = compress_log(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert unpacked(target) == expected
    assert peak < text_size  # packing it whole held it four times over
    assert unpack_state(read_log(target).state_before) == files


def test_the_log_compressed_beside_the_commit_is_the_committed_log_compressed(
    tmp_path: Path, captured: dict[int, bytes]
) -> None:
    """The log is compressed while the commit writes the world, from the log as it stood
    then and the commit record to come: the result is the committed log compressed."""
    world = copy_demo(tmp_path / "w")
    run(world, 2)
    for tick, plain in captured.items():
        again = tmp_path / f"again-{tick}" / log_path(world, tick).name
        again.parent.mkdir()
        again.write_bytes(plain)
        assert plain.splitlines()[-1].startswith(b'{"type":"commit"')
        expected = compress_log(again).read_bytes()
        assert packed_path(log_path(world, tick)).read_bytes() == expected
    assert sorted(p.name for p in (world / ".sim" / "log").iterdir() if ".tmp" in p.name) == []


def test_a_compression_thread_that_starts_late_still_takes_the_commit_record_once(
    tmp_path: Path, captured: dict[int, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compression thread may first run only after the tick has appended its commit
    record to the plain log (a busy machine: about one tick in ten of a study on two
    shared cores). The log's length is taken when the compression is started, so the
    record comes once, from the ``tail``, and the result is still the committed log
    compressed (it once held the commit record twice)."""
    from sim.engine.recorder import TickRecorder

    appended = threading.Event()
    real_committed, real_run = TickRecorder.committed, LogCompression._run

    def committed(self: TickRecorder) -> None:
        real_committed(self)
        appended.set()  # the plain log ends with its commit record now

    def late(self: LogCompression, *args: object) -> None:
        appended.wait(timeout=60)
        appended.clear()
        real_run(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(TickRecorder, "committed", committed)
    monkeypatch.setattr(LogCompression, "_run", late)
    world = copy_demo(tmp_path / "w")
    run(world, 2)
    assert sorted(captured) == [1, 2]
    for tick, plain in captured.items():
        again = tmp_path / f"again-{tick}" / log_path(world, tick).name
        again.parent.mkdir()
        again.write_bytes(plain)
        packed = packed_path(log_path(world, tick))
        assert packed.read_bytes() == compress_log(again).read_bytes()
        types = [orjson.loads(line)["type"] for line in unpacked(packed).splitlines()]
        assert types.count("commit") == 1


@pytest.mark.parametrize("by", ["thread", "child"])
def test_a_compression_started_before_its_tail_is_known_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    """The compression starts when the tick's calls are over, before the commit record
    (its files' digests) exists: it reads the log, waits for the record (``end_with``),
    and gives the committed log compressed; cancelled while it waits, it ends and leaves
    nothing beside the plain log."""
    from sim.ticklog import compression

    monkeypatch.setattr(compression, "CHILD_FROM_BYTES", 0 if by == "child" else 1 << 62)
    world = copy_demo(tmp_path / "w")
    run(world, 1, history={"compress_level": 0})
    body = log_path(world, 1).read_bytes().splitlines(keepends=True)[:-1]  # no commit
    record = b'{"type":"commit","tick":1,"state_after":"sha256:0","calls":0,"committed_at":0}'
    for name, ends in (("waits", True), ("cancelled", False)):
        log = tmp_path / name / log_path(world, 1).name
        log.parent.mkdir()
        log.write_bytes(b"".join(body))
        job = LogCompression(log, 3)
        assert (job._child is not None) == (by == "child")
        time.sleep(0.3)  # the log read through: the compression waits for its tail
        if not ends:
            job.cancel()
            assert job._thread is None or not job._thread.is_alive()
            assert sorted(p.name for p in log.parent.iterdir()) == [log.name]
            continue
        job.end_with([record])
        with log.open("ab") as out:
            out.write(record + b"\n")
        packed = job.finish()
        again = tmp_path / "again" / log.name
        again.parent.mkdir()
        again.write_bytes(b"".join(body) + record + b"\n")
        assert packed.read_bytes() == compress_log(again).read_bytes()
        assert sorted(p.name for p in log.parent.iterdir()) == [packed.name]


@pytest.mark.parametrize("by", ["thread", "child"])
def test_a_tick_that_does_not_commit_keeps_its_log_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    """The compression started for the commit is dropped when the commit fails: the log
    stays plain with nothing beside it (a child compressing it has ended), and the next run
    resumes and compresses it."""
    from sim.storage import Storage
    from sim.ticklog import compression

    monkeypatch.setattr(compression, "CHILD_FROM_BYTES", 0 if by == "child" else 1 << 62)
    started: list[compression._ChildCompression | None] = []
    real_start = compression._ChildCompression.start

    def start(*args: object) -> compression._ChildCompression | None:
        started.append(real_start(*args))  # type: ignore[arg-type]
        return started[-1]

    monkeypatch.setattr(compression._ChildCompression, "start", start)
    world = copy_demo(tmp_path / "w")
    real = Storage.commit

    def refuse(self: Storage, *args: object, **kwargs: object) -> list[str]:
        if args and (self.root / ".sim" / "log").is_dir():
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Storage, "commit", refuse)
    with pytest.raises(OSError, match="No space"):
        run(world, 1)
    ended = [child is not None and child.process.returncode is not None for child in started]
    assert ended == ([True] if by == "child" else [])
    names = sorted(p.name for p in (world / ".sim" / "log").iterdir())
    assert names == [log_path(world, 1).name]
    monkeypatch.setattr(Storage, "commit", real)
    run(world, 1)
    assert packed_path(log_path(world, 1)).exists() and not log_path(world, 1).exists()
    assert read_log(packed_path(log_path(world, 1))).resumes == 1


def test_summary_places_equal_the_logs_state_snapshots(tmp_path: Path) -> None:
    """Where each character was at each tick's start, as the commit wrote it in the
    summary: the same as the log's state snapshot says (the report relies on it)."""
    world = copy_demo(tmp_path / "w")
    run(world, 4)
    seen: list[dict[str, str]] = []
    for tick, path in list_logs(world):
        places = read_summary(world / summary_rel(tick), places=True).places
        assert places is not None
        state = read_log(path).state()
        expected = {}
        for rel, raw in state.items():
            if rel.startswith("characters/"):
                data = orjson.loads(raw)
                expected[data["identity"]["id"]] = data["state"]["location"]
        assert places.where() == expected and len(expected) == 10
        seen.append(places.where())
    assert any(a != b for a, b in itertools.pairwise(seen))  # characters moved


def test_a_summary_without_places_reads_as_before(tmp_path: Path) -> None:
    """A summary written before places were (two lines) still reads; places is None."""
    world = copy_demo(tmp_path / "w")
    run(world, 1)
    file = world / summary_rel(1)
    full = read_summary(file, places=True)
    assert full.places is not None
    file.write_bytes(dump_summary(type(full)(full.head, full.groups)))
    old = read_summary(file, places=True)
    assert old.places is None and old.head == full.head and old.groups == full.groups
