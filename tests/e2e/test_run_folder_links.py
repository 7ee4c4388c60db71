"""The folders a sweep or a study reads are untrusted input: a link, a FIFO or a device
planted in a run's folder, in a study's shared prefix or as a study's record never makes
`sim` write outside them, read through to another file, or hang. Each is refused by name;
the command exits non-zero.

The commands run as processes with a timeout: a regression that hangs fails here, in
bounded time, instead of stalling the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from sim.runs.process import OUTPUT_FILE, last_line
from sim.storage import dump_json

pytestmark = pytest.mark.skipif(os.name != "posix", reason="links and FIFOs need POSIX")

STUDY = """\
world = "w"
seeds = "1"
ticks = 3
[conditions.control]
[conditions.announce]
inject = [{ tick = 2, at = "square", text = "The lord will pay half the mill." }]
"""


def sim(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr


def refused(result: subprocess.CompletedProcess[str], *named: str) -> None:
    said = result.stdout + result.stderr
    assert result.returncode != 0, said
    assert "Traceback" not in said, said
    for part in named:
        assert part in said, said


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A folder with a world ``w`` (``sim init``: offline) and ``outside.txt``."""
    ok(sim(tmp_path, "init", "w"))
    for i, path in enumerate(sorted((tmp_path / "w" / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["state"]["coins"] = 5 + i
        path.write_bytes(dump_json(data))
    (tmp_path / "outside.txt").write_text("outside\n")
    return tmp_path


def swept(here: Path) -> Path:
    """One run of ``w``, one tick: ``out/seed-1``."""
    ok(sim(here, "sweep", "--world", "w", "--seeds", "1", "--ticks", "1", "--out", "out"))
    return here / "out" / "seed-1"


def replace_with(path: Path, kind: str, target: Path) -> None:
    path.unlink()
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "hard link":
        os.link(target, path)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize(
    ("kind", "said"),
    [("symlink", "is a symlink"), ("hard link", "is a hard link"), ("fifo", "named pipe")],
)
def test_a_run_output_log_that_is_not_its_own_file_is_refused(
    here: Path, kind: str, said: str
) -> None:
    run = swept(here)
    outside = here / "outside.txt"
    replace_with(run / OUTPUT_FILE, kind, outside)
    result = sim(here, "sweep", "--world", "w", "--seeds", "1", "--ticks", "2", "--out", "out")
    refused(result, f"{Path('out/seed-1') / OUTPUT_FILE}", said)
    assert outside.read_text() == "outside\n"  # the child's output went nowhere
    assert orjson.loads((run / "world.json").read_bytes())["tick"] == 1  # nothing ran


@pytest.mark.parametrize("kind", ["a folder", "a file"])
def test_a_link_at_a_runs_temporary_fork_name_is_refused_by_name(here: Path, kind: str) -> None:
    outside = here / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    (here / "out").mkdir()
    target = outside if kind == "a folder" else outside / "keep.txt"
    (here / "out" / ".seed-1.tmp").symlink_to(target)
    result = sim(here, "sweep", "--world", "w", "--seeds", "1", "--ticks", "1", "--out", "out")
    refused(result, ".seed-1.tmp", "is a link or a file")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]  # nothing made there
    assert (outside / "keep.txt").read_text() == "keep\n"
    assert not (here / "out" / "seed-1").exists()


def test_a_run_world_json_linked_to_a_device_is_refused_without_hanging(here: Path) -> None:
    run = swept(here)
    (run / "world.json").unlink()
    (run / "world.json").symlink_to("/dev/zero")
    result = sim(here, "sweep", "--world", "w", "--seeds", "1", "--ticks", "2", "--out", "out")
    refused(result, "world.json", "symlink")


def test_a_failed_runs_last_line_is_read_from_its_own_file_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / OUTPUT_FILE).parent.mkdir(parents=True)
    (run / OUTPUT_FILE).write_bytes(b"x" * 200_000 + b"\nerror: the last word\n\n")
    assert last_line(run) == "error: the last word"  # read from the end
    secret = tmp_path / "secret.txt"
    secret.write_text("a secret line\n")
    for kind in ("symlink", "fifo"):
        replace_with(run / OUTPUT_FILE, kind, secret)
        started = time.monotonic()
        assert last_line(run) == ""
        assert time.monotonic() - started < 5  # a FIFO without a writer is not waited on
    (run / OUTPUT_FILE).unlink()
    assert last_line(run) == ""


def test_a_study_prefix_log_linked_outside_is_not_copied(here: Path) -> None:
    (here / "study.toml").write_text(STUDY)
    ok(sim(here, "study", "run", "study.toml", "--out", "out"))
    shared = next((here / "out" / "_shared").iterdir())
    logs = sorted((shared / ".sim" / "log").glob("tick-000001.jsonl*"))
    assert logs, "the prefix logged its first tick"
    arm = here / "out" / "announce" / shared.name
    assert arm.is_dir()
    subprocess.run(["rm", "-rf", str(arm)], check=True)  # the arm is made again
    replace_with(logs[0], "symlink", here / "outside.txt")
    result = sim(here, "study", "run", "study.toml", "--out", "out")
    refused(result, logs[0].name, "is a symlink")
    assert not arm.exists()


def test_a_study_report_of_a_record_linked_to_a_device_is_refused(here: Path) -> None:
    out = here / "out"
    out.mkdir()
    (out / "study.json").symlink_to("/dev/zero")
    refused(sim(here, "study", "report", "out"), "study.json", "symlink")
    (out / "study.json").unlink()
    os.mkfifo(out / "study.json")
    refused(sim(here, "study", "report", "out"), "study.json", "named pipe")


@pytest.mark.parametrize("target", ["/dev/zero", "outside.json"])
def test_a_world_whose_character_is_a_link_is_not_forked_or_exported(
    here: Path, target: str
) -> None:
    """The fork a sweep makes and `sim export` read the world's state files themselves: a
    character linked to a device does not hang them, nor is an outside file copied in."""
    (here / "outside.json").write_text('{"secret": "outside"}')
    (here / "w" / "characters" / "zz.json").symlink_to(
        target if target.startswith("/") else here / target
    )
    result = sim(here, "sweep", "--world", "w", "--seeds", "1", "--out", "out")
    refused(result, str(Path("w/characters/zz.json")), "is a symlink")
    assert not any((here / "out").rglob("zz.json"))
    result = sim(here, "export", "--world", "w", "--out", "exported")
    refused(result, str(Path("w/characters/zz.json")), "is a symlink")
    exported = here / "exported"
    assert not exported.exists() or "outside" not in "".join(
        p.read_text() for p in exported.rglob("*") if p.is_file()
    )


def _link_away(folder: Path, elsewhere: Path, keep: bool) -> None:
    """Replace ``folder`` with a link to ``elsewhere`` (holding its files, with ``keep``;
    else an empty folder)."""
    if keep:
        folder.rename(elsewhere)
    else:
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        elsewhere.mkdir()
    folder.symlink_to(elsewhere, target_is_directory=True)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("rel", "keep"),
    [("control", False), ("_shared", False), ("control", True), ("announce/seed-1", True)],
)
def test_a_link_in_a_study_folder_is_refused_by_name(here: Path, rel: str, keep: bool) -> None:
    """issue 35 item 2: a linked condition, prefix or run folder in --out would put a whole
    run outside it; refused, naming the link, before anything is written."""
    (here / "study.toml").write_text(STUDY)
    ok(sim(here, "study", "run", "study.toml", "--out", "out"))
    elsewhere = here / "elsewhere"
    _link_away(here / "out" / rel, elsewhere, keep)
    before = _files(elsewhere)
    result = sim(here, "study", "run", "study.toml", "--out", "out")
    refused(result, str(Path("out") / rel), "is a symlink", "nothing was written")
    assert result.returncode == 2
    assert _files(elsewhere) == before  # nothing made or changed there


def test_a_study_export_does_not_read_through_a_linked_condition(here: Path) -> None:
    (here / "study.toml").write_text(STUDY)
    ok(sim(here, "study", "run", "study.toml", "--out", "out"))
    _link_away(here / "out" / "control", here / "elsewhere", keep=True)
    result = sim(here, "export", "--study", "out", "--out", "tables")
    refused(result, str(Path("out") / "control"), "is a symlink")
    assert result.returncode == 2 and not (here / "tables").exists()
    refused(sim(here, "study", "report", "out"), str(Path("out") / "control"), "is a symlink")


@pytest.mark.parametrize("keep", [False, True])
def test_a_linked_run_folder_of_a_sweep_is_refused_by_name(here: Path, keep: bool) -> None:
    """Refused before as "not a sweep run" (or, holding a run, continued in place): now
    refused naming the link, the run left as it was."""
    run = swept(here)
    elsewhere = here / "elsewhere"
    _link_away(run, elsewhere, keep)
    before = _files(elsewhere)
    result = sim(here, "sweep", "--world", "w", "--seeds", "1", "--ticks", "2", "--out", "out")
    refused(result, str(Path("out") / "seed-1"), "is a symlink", "nothing was written")
    assert result.returncode == 2 and _files(elsewhere) == before


def test_a_link_at_a_study_records_scratch_name_is_not_written_through(here: Path) -> None:
    (here / "study.toml").write_text(STUDY)
    ok(sim(here, "study", "run", "study.toml", "--out", "out"))
    outside = here / "outside.txt"
    for name in (".study.json.tmp", ".study.toml.tmp"):
        (here / "out" / name).symlink_to(outside)
    ok(sim(here, "study", "run", "study.toml", "--out", "out"))
    assert outside.read_text() == "outside\n"
    assert (here / "out" / "study.toml").read_text() == STUDY
    assert not (here / "out" / ".study.json.tmp").exists()
