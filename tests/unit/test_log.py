"""The tick log format: round trip of every record type (typed records, byte for byte), an
old log, torn tails, bad logs, migrations, markers."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from conftest import copy_demo

from sim.config import load_config
from sim.engine.runner import Runner
from sim.errors import LogError
from sim.testing.logs import plain_log
from sim.ticklog import format as tick_log
from sim.ticklog.books import tick_books
from sim.ticklog.format import (
    FORMAT_VERSION,
    list_logs,
    log_path,
    pack_state,
    read_state,
    state_digest,
    unpack_state,
)
from sim.ticklog.reader import read_log
from sim.ticklog.records import (
    CallRecord,
    HeaderRecord,
    StateRecord,
    dump_record,
    parse_record,
    record_data,
)
from sim.ticklog.recovery import recover_logs
from sim.ticklog.writer import LogWriter

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ticklog"

EVERY_RECORD = [
    {"type": "header", "format": FORMAT_VERSION, "tick": 4, "seed": 7, "config": {"llm": {}}},
    record_data(pack_state({"world.json": b'{"tick": 3}\n', "characters/a.json": "é\n".encode()})),
    {"type": "instructions", "digest": "sha256:ab", "text": "Say what you intend."},
    {
        "type": "call",
        "request_id": "4:intentions:intention:a:0",
        "phase": "intentions",
        "entity_key": "intention:a",
        "n": 0,
        "instructions_digest": "sha256:ab",
        "input": "{}",
        "schema_name": "Intention",
        "schema_digest": "sha256:cd",
        "model": "m",
        "settings": {"temperature": 0.5, "max_output_tokens": 10},
        "depth": 0,
        "history": [],
        "previous_response_id": None,
        "digest": "sha256:ef",
        "latency": 0.25,
        "usage": {"input_tokens": 3, "output_tokens": 4, "cached_input_tokens": 0},
        "source": "live",
        "result": {"action": "wait"},
        "response_id": "r1",
        "response_model": "m",
        "finish_reason": "stop",
        "error_code": None,
        "error": None,
        "attempts": [{"attempt": 1, "raw": '{"action":"wait"}'}],
    },
    {
        "type": "call",
        "request_id": "4:intentions:intention:b:0",
        "phase": "intentions",
        "entity_key": "intention:b",
        "n": 0,
        "result": None,
        "error_code": "timeout",
        "error": "slow",
        "attempts": [{"attempt": 1, "error_code": "timeout", "raw": None}],
    },
    {
        "type": "phase",
        "name": "intentions",
        "report": {"calls": 2, "failures": 1},
        "results": {"a": {"action": "wait"}},
    },
    {"type": "resume", "attempt": 2, "calls_logged": 2, "config": {}},
    {
        "type": "usage",
        "calls": 2,
        "failures": 1,
        "usage": {"input_tokens": 3},
        "elapsed": 1.5,
        "resumed_calls": 1,
    },
    {"type": "commit", "tick": 4, "state_after": "sha256:00", "calls": 2, "committed_at": 1.0},
]


def write(path: Path, records: list[dict]) -> None:
    """Write records given as the JSON objects of their lines, through the typed writer."""
    writer = LogWriter(path)
    for record in records:
        writer.append(parse_record(record))
    writer.close()


def test_every_record_type_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "tick-000004.jsonl"
    write(path, EVERY_RECORD)
    assert path.read_bytes() == b"".join(orjson.dumps(r) + b"\n" for r in EVERY_RECORD)
    log = read_log(path)
    assert [record_data(r) for r in log.records] == EVERY_RECORD
    assert isinstance(log.header, HeaderRecord) and isinstance(log.state_before, StateRecord)
    assert all(isinstance(c, CallRecord) for c in log.calls.values())
    # write -> read -> write gives the same bytes
    again = tmp_path / "again.jsonl"
    writer = LogWriter(again)
    for record in log.records:
        writer.append(record)
    writer.close()
    assert again.read_bytes() == path.read_bytes()
    assert log.tick == 4 and log.committed and log.resumes == 1 and not log.torn
    assert log.instructions == {"sha256:ab": "Say what you intend."}
    assert list(log.calls) == ["4:intentions:intention:a:0", "4:intentions:intention:b:0"]
    assert log.failures() == 1
    assert log.phase_results("intentions") == {"a": {"action": "wait"}}
    assert log.state() == {"world.json": b'{"tick": 3}\n', "characters/a.json": "é\n".encode()}
    assert log.state_before is not None
    assert log.state_before.digest == state_digest(log.state())


def test_a_log_written_before_the_typed_records_reads_and_rewrites_byte_for_byte(
    tmp_path: Path,
) -> None:
    """A real format-1 log from the dict-based writer: a tick against a faulty server,
    aborted five times (one call failed with ``incomplete`` each time) and then resumed."""
    original = (FIXTURES / "tick-000001.jsonl").read_bytes()
    log = read_log(FIXTURES / "tick-000001.jsonl")
    assert log.committed and log.resumes == 5 and len(log.calls) == 22
    assert len(log.call_records) == 27  # the resent call's four earlier records are kept
    assert [c.error_code for c in log.call_records].count("incomplete") == 5
    copy = tmp_path / "tick-000001.jsonl"
    writer = LogWriter(copy)
    for record in log.records:
        writer.append(record)
    writer.close()
    assert copy.read_bytes() == original
    assert [dump_record(r) for r in log.records] == original.splitlines()
    assert tick_books(log).tokens > 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"type": "call", "request_id": "1:x:-:0", "phase": "x", "colour": 1}', "'colour'"),
        (b'{"type": "teleport"}', "unknown record type 'teleport'"),
        (b'{"type": "call", "request_id": "1:x:-:0", "phase": "x", "n": "two"}', "field 'n'"),
        (b'{"type": "commit", "tick": 1}', "field 'state_after'"),
    ],
)
def test_a_record_that_does_not_fit_its_type_is_named(
    tmp_path: Path, line: bytes, reason: str
) -> None:
    path = tmp_path / "tick-000001.jsonl"
    path.write_bytes(b'{"type": "header", "format": 1, "tick": 1}\n' + line + b"\n")
    with pytest.raises(LogError, match=f"line 2: .*{reason}"):
        read_log(path)


def test_state_packing_round_trips() -> None:
    files = {"world.json": b"{}\n", ".sim/responses/x/y.json": b'{"r": 1}\n'}
    assert unpack_state(pack_state(files)) == files


@pytest.mark.parametrize("count", [0, 1, 511, 512, 513, 1300])
def test_the_heads_state_line_made_in_pieces_is_the_records_bytes(
    tmp_path: Path, count: int
) -> None:
    """A tick's head writes the state as it began a few hundred files at a time
    (``state_line``): the line is byte for byte ``pack_state``'s record, text that JSON
    escapes included, and a log written with it reads the same files back."""
    from sim.ticklog.format import STATE_PIECE_FILES, state_line

    assert STATE_PIECE_FILES == 512  # the counts above cross its edges
    files = {
        f"characters/c{i:05d}.json": f'{{"name": "N\\"{i}\\"", "note": "a\\nb é ✓ {i}"}}\n'.encode()
        for i in reversed(range(count))
    }
    digest = state_digest(files)
    pieces = list(state_line(files, digest))
    assert b"".join(pieces) == dump_record(pack_state(files, digest))
    chunks = -(-count // STATE_PIECE_FILES)  # made one at a time, a comma between two
    assert len(pieces) == 3 + max(0, 2 * chunks - 1)
    path = tmp_path / "tick-000001.jsonl"
    LogWriter.create(path, [state_line(files, digest)]).close()
    record = parse_record(orjson.loads(path.read_bytes()))
    assert isinstance(record, StateRecord) and unpack_state(record) == files


def test_a_torn_last_line_is_flagged_and_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "tick-000004.jsonl"
    write(path, EVERY_RECORD[:3])
    with open(path, "ab") as handle:
        handle.write(b'{"type": "call", "request_id": "4:int')
    log = read_log(path)
    assert log.torn and len(log.records) == 3
    write(path, [EVERY_RECORD[5]])  # a resumed tick appends after cutting the torn tail
    log = read_log(path)
    assert not log.torn and [r.type for r in log.records][-1] == "phase"


@pytest.mark.parametrize("torn", [b'{"text": "' + b"x" * 200_000, b"", b"{"])
def test_a_torn_tail_is_cut_back_to_the_last_whole_line(tmp_path: Path, torn: bytes) -> None:
    """The tail is found reading back from the end (a log's first lines can be hundreds of
    megabytes), however long the torn line is; a file that is one torn line empties."""
    path = tmp_path / "tick-000004.jsonl"
    write(path, EVERY_RECORD[:3])
    whole = path.read_bytes()
    path.write_bytes(whole + torn)
    LogWriter(path).close()
    assert path.read_bytes() == whole
    path.write_bytes(torn)
    LogWriter(path).close()
    assert path.read_bytes() == b""


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty log"),
        (b'{"type": "call"}\n', "first record must be a header"),
        (b'{"type": "header", "format": 1}\nnot json\n{"type": "usage"}\n', "line 2"),
        (b'{"type": "header", "format": 99}\n', "newer than this sim"),
        (b"[1, 2]\n", "expected an object"),
    ],
)
def test_an_unreadable_log_is_reported(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "tick-000001.jsonl"
    path.write_bytes(content)
    with pytest.raises(LogError, match=reason):
        read_log(path)


def test_a_migration_upgrades_old_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version-1 record with a field version 2 dropped: refused as unknown until a
    migration upgrades it."""
    path = tmp_path / "tick-000001.jsonl"
    old = {**EVERY_RECORD[2], "legacy": True}
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [EVERY_RECORD[0], old]))
    with pytest.raises(LogError, match="unknown field 'legacy'"):
        read_log(path)
    monkeypatch.setattr("sim.ticklog.reader.FORMAT_VERSION", 2)
    monkeypatch.setattr(
        "sim.ticklog.reader.MIGRATIONS",
        {1: lambda r: {k: v for k, v in r.items() if k != "legacy"}},
    )
    log = read_log(path)
    assert log.instructions == {"sha256:ab": "Say what you intend."}


def run(world: Path, ticks: int, **overrides: object) -> list:
    config = load_config(world_dir=world, overrides=overrides or None, cwd=world)
    return Runner(world, config).run(ticks)


def test_a_tick_writes_a_complete_log(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    results = run(world, 2)
    assert [t for t, _ in list_logs(world)] == [1, 2]
    first, second = read_log(log_path(world, 1)), read_log(log_path(world, 2))
    assert first.committed and second.committed
    assert first.commit is not None and second.commit is not None
    assert second.state_before is not None
    assert len(first.calls) == results[0].calls == first.commit.calls
    # the state after tick 1 is exactly the state before tick 2, and what is on disk now
    assert first.commit.state_after == second.state_before.digest
    assert second.commit.state_after == state_digest(read_state(world))
    assert set(first.phases) == {"intentions", "resolution", "narrative", "apply", "memory"}
    assert first.phase_results("narrative") == results[0].narratives
    call = next(iter(first.calls.values()))
    assert call.instructions_digest in first.instructions
    assert call.attempts[0].raw and call.response_id and call.usage.input_tokens
    assert first.header.config["phase1"]["temperature"] == 0.8
    assert not list((world / ".sim" / "log").glob("*.commit.json"))


def test_a_commit_marker_completes_its_log(tmp_path: Path) -> None:
    """A crash after the commit, before the log's last line: the marker finishes it."""
    world = copy_demo(tmp_path / "w")
    run(world, 1)
    path = plain_log(world, 1)  # as it was before `committed()`: plain, no summary
    lines = path.read_bytes().splitlines(keepends=True)
    commit = orjson.loads(lines[-1])
    path.write_bytes(b"".join(lines[:-1]))
    (world / tick_log.marker_rel(1)).write_bytes(orjson.dumps(commit))
    assert recover_logs(world) == [1]
    done = read_log(path).commit
    assert done is not None and record_data(done) == commit
    assert not (world / tick_log.marker_rel(1)).exists()
    # and what `committed()` does after the commit record is made good too
    assert not path.exists() and tick_log.packed_path(path).is_file()
    assert (world / tick_log.summary_rel(1)).is_file()


def test_keep_ticks_prunes_old_logs(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    run(world, 4, history={"keep_ticks": 2})
    assert [t for t, _ in list_logs(world)] == [3, 4]


def test_a_header_with_the_phase_manifest_round_trips(tmp_path: Path) -> None:
    """Logs of worlds that declare phases carry the phase list and template and schema
    digests in the header; they read and rewrite byte for byte like any other."""
    head = {
        **EVERY_RECORD[0],
        "scope": "s",
        "phases": ["intentions", "vote"],
        "templates": {"intentions.md": "sha256:aa"},
        "schemas": {"vote": "sha256:bb"},
    }
    path = tmp_path / "tick-000004.jsonl"
    write(path, [head, *EVERY_RECORD[1:3]])
    log = read_log(path)
    assert log.header.phases == ["intentions", "vote"] and log.header.schemas == {
        "vote": "sha256:bb"
    }
    assert [record_data(r) for r in log.records] == [head, *EVERY_RECORD[1:3]]


class Crash(BaseException):
    """The process dying: nothing catches it as an error."""


def test_a_new_log_appears_with_its_header_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while the log is being created: no empty, header-less log is left behind
    (it is written aside and renamed into place), and the next run starts the tick afresh."""
    world = copy_demo(tmp_path / "w")
    real = tick_log.dump_record

    def dies_on_the_header(record: object) -> bytes:
        if isinstance(record, HeaderRecord):
            raise Crash
        return real(record)  # type: ignore[arg-type]

    monkeypatch.setattr(tick_log, "dump_record", dies_on_the_header)
    with pytest.raises(Crash):
        run(world, 1)
    assert not log_path(world, 1).exists()
    monkeypatch.undo()
    [result] = run(world, 1)
    log = read_log(log_path(world, 1))
    assert log.committed and log.resumes == 0 and len(log.calls) == result.calls
    assert result.notes == []  # nothing was set aside
    assert not (world / ".sim" / "log" / "abandoned").exists()
    assert sorted(p.name for p in (world / ".sim" / "log").iterdir()) == [
        "tick-000001.jsonl.zst",
        "tick-000001.summary.jsonl.gz",
    ]


def test_an_empty_log_left_by_an_older_sim_is_set_aside(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    log_path(world, 1).parent.mkdir(parents=True)
    log_path(world, 1).write_bytes(b"")
    [result] = run(world, 1)
    assert read_log(log_path(world, 1)).committed
    assert any("empty log (no header)" in note for note in result.notes)
    aside = world / ".sim" / "log" / "abandoned" / "tick-000001.1.jsonl"
    assert aside.read_bytes() == b""
