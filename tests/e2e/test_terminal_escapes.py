"""Names, narratives and answers come from worlds and models: untrusted. What sim prints to a
terminal shows their control characters (``\\x1b``), never sends them: a name holding
``\\x1b]0;PWNED\\x07`` retitled the terminal from `sim tick` and `sim log`.

Each command runs as a real process, so the bytes checked are the bytes a terminal gets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import copy_demo

from sim.cli.common import echo_json, printable

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
