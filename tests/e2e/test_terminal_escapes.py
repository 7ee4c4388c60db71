"""Names, narratives and answers come from worlds and models: untrusted. What sim prints to a
terminal shows their control characters (``\\x1b``), never sends them: a name holding
``\\x1b]0;PWNED\\x07`` retitled the terminal from `sim tick` and `sim log`.

Each command runs as a real process, so the bytes checked are the bytes a terminal gets.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import copy_demo

from sim.cli.common import echo_json
from sim.terminal import one_line, printable
from sim.testing.logs import plain_log

#: the bidirectional controls: invisible, they reorder what follows them on the line
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\r\x9b31m\x7f" + "\u202etxt.exe" + BIDI
#: bytes a terminal acts on: ESC, BEL, CR, DEL, CSI (C1, in UTF-8 and raw), and the
#: bidirectional controls (U+202E shows "exe.txt" reversed, in UTF-8)
ACTIVE = (
    b"\x1b",
    b"\x07",
    b"\r",
    b"\x7f",
    "\x9b".encode(),
    b"\x9b",
    *(control.encode() for control in BIDI),
)


def rename(path: Path, suffix: str) -> None:
    data = json.loads(path.read_text())
    data["identity"]["name"] += suffix
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def hostile_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = copy_demo(tmp_path_factory.mktemp("escapes") / "w")
    for folder in ("characters", "locations"):
        for path in sorted((world / folder).glob("*.json")):
            rename(path, HOSTILE)
    data = json.loads((world / "world.json").read_text())
    data["name"] += HOSTILE
    (world / "world.json").write_text(json.dumps(data))
    return world


def sim(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args], capture_output=True, timeout=300, check=False
    )


def test_no_command_sends_a_control_character_to_the_terminal(hostile_world: Path) -> None:
    world = str(hostile_world)
    runs = {
        "check": sim("check", "--world", world),
        "tick": sim("tick", "--world", world, "--ticks", "2"),
        "log": sim("log", "--world", world),
        "log --calls": sim("log", "--world", world, "--calls"),
        "log --tick all": sim("log", "--world", world, "--tick", "all"),
        "ask": sim("ask", "--world", world, "ada", "Who are you?"),
        "usage": sim("usage", "--world", world, "--by", "entity"),
    }
    shown = b""
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr.decode())
        output = done.stdout + done.stderr
        for byte in ACTIVE:
            assert byte not in output, (name, byte, output[:2000])
        shown += output
    # the names were printed (shown, not sent): the checks above could fail
    assert b"\\x1b]0;PWNED\\x07" in runs["tick"].stdout
    assert b"\\x1b]0;PWNED\\x07" in runs["log"].stdout
    assert b"\\u202etxt.exe\\u202a" in runs["tick"].stdout
    # who moved is named, escaped as every name is
    moved = [line for line in runs["tick"].stdout.splitlines() if line.startswith(b"moved: ")]
    assert moved and b"\\x1b]0;PWNED\\x07" in moved[0], runs["tick"].stdout[-3000:]
    assert b"PWNED" in runs["ask"].stdout


def test_json_output_keeps_the_value_and_escapes_what_json_may_hold_raw(
    hostile_world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = sim("check", "--world", str(hostile_world), "--json")
    assert b"\x1b" not in done.stdout and "\x9b".encode() not in done.stdout
    assert not [control for control in BIDI if control.encode() in done.stdout]
    echo_json(orjson.dumps({"name": HOSTILE}).decode())
    printed = capsys.readouterr().out
    assert "\x9b" not in printed and "\x7f" not in printed
    assert not set(BIDI) & set(printed)
    assert json.loads(printed) == {"name": HOSTILE}  # the same value, losslessly


def test_printable_keeps_text_line_breaks_and_tabs() -> None:
    assert printable("Zoë said:\n\t“hello”") == "Zoë said:\n\t“hello”"
    assert printable("a\x1b[2Jb\x07\x9b\x00") == "a\\x1b[2Jb\\x07\\x9b\\x00"
    assert printable("Ada\u202etxt.exe\u2066") == "Ada\\u202etxt.exe\\u2066"
    # a joiner is no reordering control: emoji and scripts that need it are shown
    assert printable("👩\u200d🌾 Zoë") == "👩\u200d🌾 Zoë"


def test_every_command_prints_through_echo() -> None:
    """One way to the terminal: no command writes with click or print directly."""
    cli = Path(__file__).resolve().parents[2] / "sim" / "cli"
    direct = [
        f"{path.name}:{n}"
        for path in sorted(cli.glob("*.py"))
        if path.name != "common.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if any(call in line for call in ("click.echo(", "click.secho(", "print(", ".write("))
    ]
    assert direct == []


#: what a world's name tries to print as a line of its own: a commit of a tick never run
FORGED = "tick 7 committed: 0 calls"


@pytest.fixture(scope="module")
def forging_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A world whose characters' names hold a line of sim's output between line feeds, and
    whose places' names one between carriage returns and line feeds."""
    world = copy_demo(tmp_path_factory.mktemp("lines") / "w")
    for path in sorted((world / "characters").glob("*.json")):
        rename(path, f"\n{FORGED}\n")
    for path in sorted((world / "locations").glob("*.json")):
        rename(path, f"\r\n{FORGED}\r\n")
    return world


def test_a_name_cannot_print_a_line_of_its_own(forging_world: Path) -> None:
    """A name is printed inside a line (who moved, a place's header, who intends what): its
    line breaks are shown, as its other control characters are, so it forges no line."""
    world = str(forging_world)
    runs = {
        "tick": sim("tick", "--world", world, "--ticks", "2"),
        "log": sim("log", "--world", world),
        "log --tick all": sim("log", "--world", world, "--tick", "all"),
        "ask": sim("ask", "--world", world, "ada", "Who are you?"),
        "tick --stream": sim("tick", "--world", world, "--stream"),
    }
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr.decode())
        lines = (done.stdout + done.stderr).decode().split("\n")
        # a line of its own (a narrative, wrapped, may begin a line with the name's words)
        forged = [line for line in lines if re.fullmatch(rf"\s*{FORGED}(\\x0d)?\s*", line)]
        assert forged == [], (name, forged, done.stdout.decode()[-3000:])
    tick = runs["tick"].stdout.decode()
    moved = [line for line in tick.splitlines() if line.startswith("moved: ")]
    assert moved and f"\\x0a{FORGED}\\x0a (" in moved[0], tick[-3000:]
    assert f"\\x0d\\x0a{FORGED}\\x0d\\x0a → " in tick  # the places in the moved line
    streamed = runs["tick --stream"].stdout.decode()
    headers = [line for line in (tick + streamed).splitlines() if line.startswith("[")]
    assert len(headers) > 6 and all(h.endswith(f"\\x0a{FORGED}\\x0d\\x0a]") for h in headers), (
        headers
    )
    story = runs["log"].stdout.decode().splitlines()
    assert f"[Herring Quay\\x0d\\x0a{FORGED}\\x0d\\x0a]" in story
    assert [line for line in story if line.startswith("  Ada Strand\\x0a")], story
    assert f"[Ada Strand\\x0a{FORGED}\\x0a]" in runs["ask"].stdout.decode()


def test_one_line_shows_line_breaks_and_leaves_the_rest_as_printable_does() -> None:
    assert one_line("Ada\nStrand\r\n") == "Ada\\x0aStrand\\x0d\\x0a"
    assert one_line("Ada\u2028Strand\u2029") == "Ada\\u2028Strand\\u2029"
    assert one_line("a\x1b[2Jb\x9b\u202e") == printable("a\x1b[2Jb\x9b\u202e")
    # an ordinary name, a tab, a joiner: as they were; shown again, it stays as it is
    for name in ("Zoë Ó Briain", "Brother\tElm", "👩\u200d🌾 Ada", "Route 9 → Diner"):
        assert one_line(name) == name
    assert printable(one_line("Ada\n\x1b")) == one_line("Ada\n\x1b")


def test_a_name_in_a_tick_log_cannot_print_a_line_of_its_own(tmp_path: Path) -> None:
    """A log is untrusted too: the model a server said answered, the tools a model called,
    a call's id, an intervention's place and a policy's name are printed inside a line by
    `sim log`, `sim log --calls` and `sim usage`."""
    world = copy_demo(tmp_path / "w")
    assert sim("tick", "--world", str(world)).returncode == 0
    path = plain_log(world, 1)
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    calls = [r for r in records if r["type"] == "call"]
    calls[0]["response_model"] = calls[0]["attempts"][0]["model"] = f"m\n{FORGED}\n"
    calls[0]["result"] = {"calls": [{"name": f"look\n{FORGED}\n"}]}
    calls[1]["request_id"] += f"\n{FORGED}\n"
    first = records.index(calls[0])
    records[first:first] = [
        {
            "type": "intervention",
            "kind": "inject",
            "n": 1,
            "text": "A storm.",
            "location": f"quay\n{FORGED}\n",
        },
        {
            "type": "policy",
            "request_id": calls[0]["request_id"],
            "phase": "intentions",
            "policy": f"p\n{FORGED}\n",
            "decision": "deny",
        },
    ]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    runs = {
        "log": sim("log", "--world", str(world)),
        "log --calls": sim("log", "--world", str(world), "--calls"),
        "usage --by model": sim("usage", "--world", str(world), "--by", "model"),
    }
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr.decode())
        lines = (done.stdout + done.stderr).decode().split("\n")
        assert FORGED not in [line.strip() for line in lines], (name, done.stdout.decode())
    assert f"m\\x0a{FORGED}\\x0a" in runs["log --calls"].stdout.decode()
    assert f"tools: look\\x0a{FORGED}\\x0a" in runs["log --calls"].stdout.decode()
    assert f":0\\x0a{FORGED}\\x0a " in runs["log --calls"].stdout.decode()
    assert f"m\\x0a{FORGED}\\x0a" in runs["usage --by model"].stdout.decode()
    story = runs["log"].stdout.decode()
    assert f"intervention 1: inject at quay\\x0a{FORGED}\\x0a: " in story
    assert f"by p\\x0a{FORGED}\\x0a: " in story
