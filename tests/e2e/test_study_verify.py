"""Issue 39: a study's (and a sweep's) inputs fingerprinted, a re-run on other inputs
refused by name, and ``sim study verify`` / ``sim sweep verify`` finding hand edits; the
report and the export refuse an unverified study (and ``sim sweep report`` unverified runs)
unless told ``--unverified``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.storage import dump_json

STUDY = """\
world = "w"
seeds = "1-2"
ticks = 3
[conditions.control]
[conditions.announce]
inject = [{ tick = 2, at = "square", text = "The lord will pay half the mill." }]
[[surveys]]
ticks = [1, 3]
question = "Will you vote to rebuild the mill?"
format = "yesno"
"""


def sim(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    code, output = sim("init", str(tmp_path / "w"))
    assert code == 0, output
    (tmp_path / "study.toml").write_text(STUDY)
    return tmp_path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One study run (shared read-only: ``study`` gives each test its own copy)."""
    base = tmp_path_factory.mktemp("built")
    previous = Path.cwd()
    os.chdir(base)
    try:
        assert sim("init", "w")[0] == 0
        (base / "study.toml").write_text(STUDY)
        code, output = sim("study", "run", "study.toml", "--out", "out")
        assert code == 0, output
    finally:
        os.chdir(previous)
    return base / "out"


@pytest.fixture
def study(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(built, tmp_path / "out", symlinks=True)
    return tmp_path / "out"


def _character(folder: Path) -> Path:
    return sorted((folder / "characters").glob("*.json"))[0]


def test_a_rerun_on_another_world_or_config_is_refused_and_more_seeds_still_run(
    here: Path,
) -> None:
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 0, output
    study = here / "out"
    record = orjson.loads((study / "study.json").read_bytes())
    assert set(record["inputs"]) == {"world", "config", "design", "sim"}
    run = orjson.loads((study / "control" / "seed-1" / "sweep-run.json").read_bytes())
    assert run["inputs"] == record["inputs"]
    # the world edited, and a seed added: refused, naming the world
    path = _character(here / "w")
    original = path.read_bytes()
    data = orjson.loads(original)
    data["identity"]["name"] = "Someone Else"
    path.write_bytes(dump_json(data))
    (here / "study.toml").write_text(STUDY.replace('seeds = "1-2"', 'seeds = "1-3"'))
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 2, output
    assert "study.json" in output and "the world" in output and "config" not in output
    assert not (study / "control" / "seed-3").exists()
    # the user's config changed: refused, naming the config
    path.write_bytes(original)
    (here / "config.toml").write_text("[phase1]\ntemperature = 0.3\n")
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 2 and "the config" in output and "the world" not in output, output
    (here / "config.toml").unlink()
    # the same inputs with one more seed: the new runs are made, the others finished
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 0, output
    assert output.count("finished    ") == 4 and output.count("done ") == 2
    assert sim("study", "verify", "out")[0] == 0


def test_a_sweep_rerun_on_an_edited_world_is_refused(here: Path) -> None:
    assert sim("sweep", "--world", "w", "--out", "runs", "--seeds", "1-2")[0] == 0
    assert sim("sweep", "verify", "runs")[0] == 0
    path = _character(here / "w")
    path.write_bytes(path.read_bytes().replace(b'"name"', b'"name" ', 1))
    code, output = sim("sweep", "--world", "w", "--out", "runs", "--seeds", "1-3")
    assert code == 2 and "sweep-run.json" in output and "the world" in output, output
    assert not (here / "runs" / "seed-3").exists()


def test_the_sweep_report_refuses_a_hand_edited_run_unless_told_unverified(here: Path) -> None:
    assert sim("sweep", "--world", "w", "--out", "runs", "--seeds", "1-2", "--ticks", "2")[0] == 0
    code, output = sim("sweep", "report", "--runs", "runs")
    assert code == 0 and "seed-2" in output and "UNVERIFIED" not in output, output
    document = orjson.loads(sim("sweep", "report", "--runs", "runs", "--json")[1])
    assert document["verified"] is True and document["ok"] is True
    # one run's character edited by hand after it ran, its times kept as `cp -p` would
    path = _character(here / "runs" / "seed-2")
    times = path.stat()
    data = orjson.loads(path.read_bytes())
    data["state"]["mood"] = "furious"
    path.write_bytes(dump_json(data))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    code, output = sim("sweep", "report", "--runs", "runs", "--html", "page.html")
    assert code == 2 and "the runs do not verify" in output, output
    assert "runs/seed-2" in output and f"characters/{path.name}" in output, output
    assert "runs/seed-1" not in output and "`sim sweep verify runs`" in output, output
    assert "--unverified" in output and "tokens" not in output, output  # no table
    assert not Path("page.html").exists()
    code, output = sim("sweep", "report", "--runs", "runs", "--json")
    document = orjson.loads(output.splitlines()[-1])
    assert code == 2 and document["ok"] is False, output
    assert "the runs do not verify" in document["error"]["message"]
    code, output = sim("sweep", "report", "--runs", "runs", "--unverified", "--html", "page.html")
    assert code == 0 and output.startswith("UNVERIFIED sweep (1 problem: sim sweep verify runs)")
    assert "seed-1" in output and "reported as asked (--unverified)" in output, output
    assert "UNVERIFIED" in Path("page.html").read_text()
    code, output = sim("sweep", "report", "--runs", "runs", "--unverified", "--json")
    document = orjson.loads(output.splitlines()[-1])
    assert code == 0 and document["verified"] is False and len(document["runs"]) == 2
    assert document["notes"][0].startswith("UNVERIFIED: the runs do not verify")


def test_a_clean_study_verifies(study: Path) -> None:
    code, output = sim("study", "verify", str(study))
    assert code == 0 and "verified" in output, output
    code, output = sim("study", "verify", str(study), "--json")
    assert code == 0 and orjson.loads(output)["ok"] is True


def test_a_hand_edited_world_file_is_named(study: Path) -> None:
    path = _character(study / "announce" / "seed-2")
    times = path.stat()
    data = orjson.loads(path.read_bytes())
    data["state"]["mood"] = "furious"
    path.write_bytes(dump_json(data))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))  # as `cp -p` would leave it
    code, output = sim("study", "verify", str(study))
    assert code == 1, output
    assert "announce/seed-2" in output and f"characters/{path.name}" in output
    assert "control/seed" not in output


def test_an_edited_or_missing_answer_is_named(study: Path) -> None:
    answers = study / "control" / "seed-1" / ".sim" / "interviews.jsonl"
    lines = answers.read_bytes().splitlines(True)
    edited = lines[-1].replace(b'"value":"yes"', b'"value":"no"')
    if edited == lines[-1]:
        edited = lines[-1].replace(b'"value":"no"', b'"value":"yes"')
    assert edited != lines[-1]
    answers.write_bytes(b"".join([*lines[:-1], edited]))
    code, output = sim("study", "verify", str(study))
    assert code == 1 and f"line {len(lines)} differs" in output, output
    # a line deleted, from the answers and from their digests too: the survey names who
    other = study / "announce" / "seed-1" / ".sim"
    kept = (other / "interviews.jsonl").read_bytes().splitlines(True)
    (other / "interviews.jsonl").write_bytes(b"".join(kept[:-1]))
    code, output = sim("study", "verify", str(study))
    assert code == 1 and "announce" in output and "are missing" in output, output
    sums = (other / "interviews.sha256").read_bytes().splitlines(True)
    (other / "interviews.sha256").write_bytes(b"".join(sums[:-1]))
    code, output = sim("study", "verify", str(study))
    assert code == 1 and "announce/seed-1: survey 1 at tick 3: no answer from" in output, output


def test_a_missing_or_extra_arm_is_named(study: Path) -> None:
    shutil.rmtree(study / "announce" / "seed-2")
    code, output = sim("study", "verify", str(study))
    assert code == 1 and "announce/seed-2: missing" in output, output
    shutil.copytree(study / "control" / "seed-2", study / "control" / "seed-9")
    code, output = sim("study", "verify", str(study))
    assert code == 1 and "control/seed-9: an arm the study's record does not name" in output


def test_the_report_and_the_export_refuse_an_unverified_study(study: Path) -> None:
    assert sim("study", "report", str(study))[0] == 0
    shutil.rmtree(study / "announce" / "seed-2")
    code, output = sim("study", "report", str(study))
    assert code == 2 and "does not verify" in output and "--unverified" in output, output
    code, output = sim("study", "report", str(study), "--unverified", "--html", "page.html")
    assert code == 0 and "UNVERIFIED" in output, output
    assert "UNVERIFIED" in Path("page.html").read_text()
    code, output = sim("study", "report", str(study), "--unverified", "--json")
    document = orjson.loads(output.splitlines()[-1])
    assert code == 0 and document["verified"] is False
    assert any("UNVERIFIED" in note for note in document["notes"])
    code, output = sim("export", "--study", str(study), "--out", "tables")
    assert code == 2 and "does not verify" in output, output
    assert not Path("tables").exists()
    code, output = sim("export", "--study", str(study), "--out", "tables", "--unverified")
    assert code == 0 and "UNVERIFIED" in output, output


def test_compare_refuses_a_hand_edited_study_unless_told_unverified(study: Path) -> None:
    pytest.importorskip("scipy")
    code, output = sim("study", "compare", str(study))
    assert code == 0 and "UNVERIFIED" not in output, output
    assert orjson.loads(sim("study", "compare", str(study), "--json")[1])["verified"] is True
    path = _character(study / "announce" / "seed-2")
    data = orjson.loads(path.read_bytes())
    data["state"]["mood"] = "furious"
    path.write_bytes(dump_json(data))
    code, output = sim("study", "compare", str(study))
    assert code == 2 and "does not verify" in output and "--unverified" in output, output
    assert "announce/seed-2" in output and f"characters/{path.name}" in output, output
    assert "p_adj" not in output
    code, output = sim("study", "compare", str(study), "--json")
    document = orjson.loads(output.splitlines()[-1])
    assert code == 2 and document["ok"] is False and "does not verify" in output, output
    code, output = sim("study", "compare", str(study), "--unverified")
    assert code == 0 and "UNVERIFIED study (1 problem" in output and "p_adj" in output, output
    assert "compared as asked (--unverified)" in output
    code, output = sim("study", "compare", str(study), "--unverified", "--json")
    document = orjson.loads(output.splitlines()[-1])
    assert code == 0 and document["verified"] is False and document["comparisons"], output
    assert document["notes"][0].startswith("UNVERIFIED: the study does not verify")


def test_load_study_refuses_an_unverified_study_unless_told(study: Path) -> None:
    """``sim.analysis.load_study``, a notebook's way in, holds the export's rule: a study
    that does not verify is refused by name, and loaded with ``unverified=True`` under a
    warning naming its problems."""
    pytest.importorskip("pandas")
    from sim.analysis import UnverifiedStudyWarning, load_study
    from sim.errors import InputError

    clean = load_study(study)
    path = _character(study / "announce" / "seed-2")
    data = orjson.loads(path.read_bytes())
    data["state"]["mood"] = "furious"
    path.write_bytes(dump_json(data))
    with pytest.raises(InputError, match=r"does not verify.*unverified=True") as refused:
        load_study(study)
    assert "seed-2" in str(refused.value)
    with pytest.warns(UnverifiedStudyWarning, match="seed-2"):
        frames = load_study(study, unverified=True)
    assert len(frames.characters) == len(clean.characters)
