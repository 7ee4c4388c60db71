"""The command line, through click's CliRunner."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import tree

from sim.cli import main
from sim.cli.run import moved_lines, print_tick
from sim.engine.runner import TickResult
from sim.phases.base import PhaseReport
from sim.storage import Storage
from sim.ticklog.format import log_path
from sim.ticklog.reader import read_log


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help_lists_commands() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert "tick" in result.output and "check" in result.output


def test_check_ok_writes_nothing(demo_world: Path) -> None:
    before = tree(demo_world)
    result = invoke("check", "--world", str(demo_world))
    assert result.exit_code == 0, result.output
    assert "10 characters, 9 locations" in result.output
    assert tree(demo_world) == before


def test_tick_prints_narratives_and_summary(demo_world: Path) -> None:
    result = invoke("tick", "--world", str(demo_world), "--ticks", "2")
    assert result.exit_code == 0, result.output
    assert "== tick 1 ==" in result.output and "== tick 2 ==" in result.output
    # every location whose narrative the logs hold is printed under its name
    world = Storage(demo_world).load()
    for tick in (1, 2):
        narratives = read_log(log_path(demo_world, tick)).phase_results("narrative")
        assert narratives
        for lid, text in narratives.items():
            assert f"[{world.locations[lid]['identity']['name']}]" in result.output
            assert str(text).split()[0] in result.output
    for phase in ("intentions", "resolution", "narrative", "memory", "total"):
        assert phase in result.output
    assert "wall" in result.output
    assert Storage(demo_world).load().tick == 2


def test_tick_names_who_moved_and_where(demo_world: Path) -> None:
    """The moves of a tick are printed by name (``Ada (Quay → Chapel)``), not by id; the
    --json line keeps the ids in ``moved`` and gives the names beside them."""
    for _ in range(6):  # the demo's first move comes within a few ticks
        before = Storage(demo_world).load()
        result = invoke("tick", "--world", str(demo_world))
        assert result.exit_code == 0, result.output
        after = Storage(demo_world).load()
        moves = [
            (c["identity"]["name"], before.characters[cid]["state"]["location"], where)
            for cid, c in after.characters.items()
            if (where := c["state"]["location"]) != before.characters[cid]["state"]["location"]
        ]
        if moves:
            break
    assert moves, "nobody moved in six ticks"
    names = {lid: loc["identity"]["name"] for lid, loc in after.locations.items()}
    shown = [line for line in result.output.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(shown) if line.startswith("moved: "))
    text = " ".join(line.strip() for line in shown[start:] if not line.startswith("phase"))
    for name, a, b in moves:
        assert f"{name} ({names[a]} → {names[b]})" in text, result.output
        assert f"{a}→{b}" not in result.output
    result = invoke("tick", "--world", str(demo_world), "--ticks", "3", "--json")
    assert result.exit_code == 0, result.output
    documents = [orjson.loads(line) for line in result.output.splitlines() if line[:1] == "{"]
    assert len(documents) == 3 and any(d["moved"] for d in documents), result.output
    world = Storage(demo_world).load()
    places = {lid: loc["identity"]["name"] for lid, loc in world.locations.items()}
    people = {cid: c["identity"]["name"] for cid, c in world.characters.items()}
    for document in documents:
        assert document["moved_names"] == [
            [people[cid], places[a], places[b]] for cid, a, b in document["moved"]
        ]


def test_the_moves_wrap_between_moves_never_inside_one() -> None:
    result = TickResult(
        1,
        {},
        {f"l{i}": f"Place Number {i}" for i in range(9)},
        [],
        0.0,
        moved=[(f"c{i}", f"l{i}", f"l{i + 1}") for i in range(8)],
        character_names={f"c{i}": f"Someone Called {i}" for i in range(8)},
    )
    lines = moved_lines(result)
    assert len(lines) > 2 and all(len(line) <= 88 for line in lines), lines
    assert lines[0].startswith("moved: Someone Called 0 (Place Number 0 → Place Number 1),")
    moves = [m.strip() for line in lines for m in line.removeprefix("moved:").split(",") if m]
    assert moves == [
        f"Someone Called {i} (Place Number {i} → Place Number {i + 1})" for i in range(8)
    ]


def test_tick_with_depth_and_concurrency_flags(demo_world: Path) -> None:
    result = invoke(
        "tick",
        "--world",
        str(demo_world),
        "--depth",
        "intentions=2",
        "--depth",
        "phase2a=1",
        "--concurrency",
        "3",
    )
    assert result.exit_code == 0, result.output
    char = orjson.loads((demo_world / "characters" / "tam.json").read_bytes())
    assert len(char["_openai"]["intention_chain"]) == 1


def test_bad_depth_is_a_usage_error(demo_world: Path) -> None:
    before = tree(demo_world)
    for bad in ("phase3=1", "phase1", "phase1=-2", "phase1=x"):
        result = invoke("tick", "--world", str(demo_world), "--depth", bad)
        assert result.exit_code == 2, (bad, result.output)
        assert "--depth" in result.output
    assert tree(demo_world) == before


def test_bad_world_exits_2_naming_file_and_field(demo_world: Path) -> None:
    path = demo_world / "characters" / "tam.json"
    data = orjson.loads(path.read_bytes())
    data["state"]["location"] = "atlantis"
    path.write_bytes(orjson.dumps(data))
    before = tree(demo_world)
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(demo_world))
        assert result.exit_code == 2
        assert "tam.json" in result.output
        assert "state.location" in result.output
        assert "atlantis" in result.output
    assert tree(demo_world) == before


def test_unknown_provider_exits_2(demo_world: Path) -> None:
    result = invoke("tick", "--world", str(demo_world), "--provider", "nonesuch")
    assert result.exit_code == 2
    assert "unknown provider 'nonesuch'" in result.output


def test_locked_world_gives_a_clear_message(demo_world: Path) -> None:
    with Storage(demo_world).lock():
        result = invoke("tick", "--world", str(demo_world))
    assert result.exit_code == 1
    assert "another sim process is running this world" in result.output
    assert Storage(demo_world).load().tick == 0


def test_missing_world_folder(tmp_path: Path) -> None:
    result = invoke("check", "--world", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert "world folder not found" in result.output


def test_a_fallback_reason_of_several_lines_cannot_pass_for_sims_own_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A failure's reason may quote a server's text: its lines after the first are
    indented, so a server answering "...\\ntick 9 committed: 0 calls" prints no line that
    reads as sim's; control characters are shown, not sent."""
    report = PhaseReport(
        "intentions",
        errors={"intention:ada": "HTTP 500: busy\ntick 9 committed: 0 calls\r\x1b[2Jgone"},
    )
    print_tick(TickResult(1, {}, {}, [report], 0.1))
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("fallback: intentions intention:ada: HTTP 500: busy")
    assert lines[at + 1 : at + 3] == ["    tick 9 committed: 0 calls", "    \\x1b[2Jgone"]
    assert not any(line.startswith("tick 9") for line in lines)
