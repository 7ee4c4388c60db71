"""The compressed tick log's layout and codec: the state snapshot after the phase records,
Zstandard, and logs an earlier sim wrote (gzip, snapshot first) still read (issue #16)."""

from __future__ import annotations

import base64
import gzip
import os
import shutil
import sys
import zlib
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import copy_demo

from sim.analysis.report.data import collect
from sim.cli import main
from sim.config import load_config
from sim.engine.runner import Runner
from sim.ticklog.compression import compress_log
from sim.ticklog.format import gz_path, list_logs, log_line, log_path, pack_state, packed_path
from sim.ticklog.reader import read_log, read_log_bytes
from sim.ticklog.records import dump_record

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

#: demo world after two ticks run by the sim before this change: its logs are gzip, with
#: the state snapshot second (no ``state`` in the layout line)
OLD_LAYOUT = Path(__file__).parent.parent / "fixtures" / "ticklog" / "old-layout" / "world"


def run(world: Path, ticks: int, **overrides: object) -> None:
    config = load_config(world_dir=world, overrides=overrides or None, cwd=world)
    Runner(world, config).run(ticks)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def kinds(data: bytes) -> list[str]:
    return [orjson.loads(line)["type"] for line in data.splitlines()]


@pytest.fixture
def old_world(tmp_path: Path) -> Path:
    """A scratch copy of the old-layout world (the fixture is never touched)."""
    return Path(shutil.copytree(OLD_LAYOUT, tmp_path / "old"))


def test_the_state_snapshot_is_stored_after_the_phase_records(tmp_path: Path) -> None:
    """Stored order: header, layout, the tick's other records (phases, usage, commit), its
    state snapshot, then its call detail; read back, the order the tick wrote."""
    world = copy_demo(tmp_path / "w")
    run(world, 2, history={"compress_level": 0})
    plain = log_path(world, 2)
    written = plain.read_bytes()
    packed = compress_log(plain)
    assert packed.name == "tick-000002.jsonl.zst" and not plain.exists()
    stored = kinds(zstd.decompress(packed.read_bytes()))
    assert stored[:2] == ["header", "layout"]
    at = stored.index("state_before")
    assert {"phase", "usage", "commit"} <= set(stored[2:at])
    assert set(stored[at + 1 :]) == {"call", "instructions"}
    stored_lines = zstd.decompress(packed.read_bytes()).splitlines()
    layout = orjson.loads(stored_lines[1])
    assert layout["state"] == [kinds(written)[1:].index("state_before")] == [0]
    # the files as a JSON object, parsed with the line (not JSON text inside a string)
    snapshot = orjson.loads(stored_lines[at])
    assert snapshot["encoding"] == "object" and isinstance(snapshot["data"], dict)
    log = read_log(packed)
    again = b"".join(log_line(r) + b"\n" for r in log.written_records())
    assert again == written
    light = read_log(packed, calls=False)
    assert light.records == [r for r in log.records if r.type not in ("call", "instructions")]
    assert light.state_before == log.state_before
    bare = read_log(packed, calls=False, state=False)
    assert bare.state_before is None
    assert bare.records == [r for r in light.records if r.type != "state_before"]


def test_reading_a_tick_without_its_state_stops_before_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report reads most ticks without calls or state: only the lines before the
    snapshot are decompressed (it was 277 MB of the 304 MB inflated for a 500 x 100
    history), and the snapshot's line too when the state is wanted."""
    world = copy_demo(tmp_path / "w")
    run(world, 2, history={"compress_level": 0})
    plain = log_path(world, 2)
    lines = plain.read_bytes().splitlines(keepends=True)
    files = read_log(plain).state()
    files["characters/zz-filler.json"] = orjson.dumps({"text": os.urandom(3_000_000).hex()})
    lines[1] = dump_record(pack_state(files)) + b"\n"
    plain.write_bytes(b"".join(lines))
    packed = compress_log(plain)
    inflated: list[int] = []
    real = zstd.ZstdDecompressor

    class Counting:
        def __init__(self) -> None:
            self.inner = real()

        def decompress(self, data: bytes) -> bytes:
            out = self.inner.decompress(data)
            inflated.append(len(out))
            return out

    monkeypatch.setattr(zstd, "ZstdDecompressor", Counting)
    bare = read_log(packed, calls=False, state=False)
    assert bare.phases and bare.committed and bare.state_before is None
    assert 0 < sum(inflated) < 1_000_000  # the snapshot is 6 MB of text
    inflated.clear()
    assert read_log(packed, calls=False).state() == files
    assert sum(inflated) > 6_000_000


def test_an_old_layout_log_reads_as_it_did(old_world: Path) -> None:
    """gzip, snapshot second, no ``state`` in its layout: every way of reading it gives
    the records the tick wrote, in that order."""
    for tick, path in list_logs(old_world):
        assert path.name == f"tick-{tick:06d}.jsonl.gz"
        stored = kinds(gzip.decompress(path.read_bytes()))
        assert stored[:3] == ["header", "layout", "state_before"]
        assert "state" not in orjson.loads(gzip.decompress(path.read_bytes()).splitlines()[1])
        log = read_log(path)
        order = [r.type for r in log.records]
        assert order[:2] == ["header", "state_before"] and order[-1] == "commit"
        assert log.committed and log.call_records and len(log.state()) > 10
        light = read_log(path, calls=False)
        assert light.records == [r for r in log.records if r.type not in ("call", "instructions")]
        bare = read_log(path, calls=False, state=False)
        assert bare.records == [r for r in light.records if r.type != "state_before"]
        assert read_log_bytes(log_path(old_world, tick)) == read_log_bytes(path)


def replayed(out: str) -> None:
    """Both old ticks were read and re-run. Their prompts are an earlier sim's, so they
    may drift from today's inputs; replay says so per tick rather than failing to read."""
    lines = out.strip().splitlines()
    for tick in (1, 2):
        line = next((x for x in lines if x.startswith(f"tick {tick}: ")), "")
        assert line.endswith(("identical", "drifted", "differs from the log")), out


def test_old_layout_logs_replay_rewind_and_check(old_world: Path) -> None:
    code, out = invoke("replay", "--world", str(old_world), "--tick", "1", "--to", "2")
    assert code in (0, 1), out
    replayed(out)
    code, out = invoke("check", "--world", str(old_world))
    assert code == 0, out
    code, out = invoke("rewind", "--world", str(old_world), "--tick", "2")
    assert code == 0, out
    assert orjson.loads((old_world / "world.json").read_bytes())["tick"] == 1
    assert [p.name for _, p in list_logs(old_world)] == ["tick-000001.jsonl.gz"]
    run(old_world, 1)  # the next tick is written in the current form beside the old one
    assert [p.name for _, p in list_logs(old_world)] == [
        "tick-000001.jsonl.gz",
        "tick-000002.jsonl.zst",
    ]
    code, out = invoke("replay", "--world", str(old_world), "--tick", "2")
    assert code == 0 and out.strip().endswith("identical"), out  # today's tick: exact


VIEWS = (
    ("log", "--tick", "all"),
    ("log", "--tick", "2"),
    ("log", "--tick", "1", "--calls"),
    ("usage", "--by", "entity"),
    ("usage", "--by", "tick"),
)


def test_compact_rewrites_old_layout_logs_and_nothing_shown_changes(old_world: Path) -> None:
    """`sim log --compact` rewrites an earlier sim's gzip logs in the current form; the
    views, the report's data and replay are the same before and after."""
    before = {args: invoke(*args, "--world", str(old_world)) for args in VIEWS}
    replay_before = invoke("replay", "--world", str(old_world), "--tick", "1", "--to", "2")
    replayed(replay_before[1])
    report = collect(old_world)
    records = {t: read_log(p).records for t, p in list_logs(old_world)}
    code, out = invoke("log", "--world", str(old_world), "--compact")
    assert code == 0 and "2 logs compressed" in out, out
    assert [p.name for _, p in list_logs(old_world)] == [
        "tick-000001.jsonl.zst",
        "tick-000002.jsonl.zst",
    ]
    assert not list((old_world / ".sim" / "log").glob("tick-??????.jsonl.gz"))
    for tick, path in list_logs(old_world):
        assert read_log(path).records == records[tick]
        stored = kinds(zstd.decompress(path.read_bytes()))
        assert stored.index("state_before") > stored.index("commit")
    for args in VIEWS:
        assert invoke(*args, "--world", str(old_world)) == before[args]
    assert collect(old_world) == report
    # replay reads the rewritten logs as it read the old ones
    assert invoke("replay", "--world", str(old_world), "--tick", "1", "--to", "2") == replay_before


def test_a_log_in_both_codecs_is_listed_once_as_the_newer(old_world: Path) -> None:
    """A crash while compact rewrote a gzip log leaves both: the complete ``.zst`` (it is
    renamed into place whole) is the one read; the recovery leaves the ``.gz`` alone."""
    old = gz_path(log_path(old_world, 2))
    new = packed_path(log_path(old_world, 2))
    new.write_bytes(zstd.compress(read_log_bytes(old)))
    assert [p for t, p in list_logs(old_world) if t == 2] == [new]
    assert read_log(log_path(old_world, 2)).path == new


def test_the_compression_level_is_checked(tmp_path: Path) -> None:
    world = copy_demo(tmp_path / "w")
    for level in (3, 19):
        assert load_config(overrides={"history": {"compress_level": level}}, cwd=tmp_path)
    with pytest.raises(Exception, match="compress_level"):
        load_config(overrides={"history": {"compress_level": 20}}, cwd=tmp_path)
    run(world, 1, history={"compress_level": 19})
    assert read_log(packed_path(log_path(world, 1))).committed


@pytest.mark.parametrize(
    "payload",
    [b'{"characters/a.json":"{}"}\n{"type":"call"}', b'["not", "an object"]', b'{"a":"\xff"}'],
)
def test_a_snapshot_that_is_not_one_compact_object_is_not_packed(
    tmp_path: Path, payload: bytes
) -> None:
    """A plain log of an earlier sim holds its snapshot zlib-compressed: its JSON goes into
    the compressed line as it is inflated, and a payload that would not keep that line
    one JSON object (a newline, not an object, not UTF-8) stops the compression; the
    plain log stays, with nothing beside it."""
    world = copy_demo(tmp_path / "w")
    run(world, 1, history={"compress_level": 0})
    plain = log_path(world, 1)
    lines = plain.read_bytes().splitlines(keepends=True)
    record = orjson.loads(lines[1])
    assert record["type"] == "state_before" and record["encoding"] == "object"
    record["encoding"] = "zlib+base64"
    record["data"] = base64.b64encode(zlib.compress(payload)).decode()
    lines[1] = orjson.dumps(record) + b"\n"
    plain.write_bytes(b"".join(lines))
    with pytest.raises((zlib.error, UnicodeDecodeError)):
        compress_log(plain)
    assert plain.read_bytes() == b"".join(lines)
    assert sorted(p.name for p in plain.parent.iterdir() if p.name.startswith(plain.name)) == [
        plain.name
    ]
