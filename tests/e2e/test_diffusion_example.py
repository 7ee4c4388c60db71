"""examples/diffusion (issue 39): Smallville's information diffusion as a study, run offline
for two ticks; the report's awareness, density and hallucinated share are checked against
the study's own exported tables and a case whose answer is known by construction."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import orjson
import pytest
from click.testing import CliRunner

from sim.analysis.diffusion import diffusion_report
from sim.cli import main
from sim.errors import InputError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "diffusion"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diffusion_report_script", EXAMPLE / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sim(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's study cut to one seed and two ticks, plus a condition in which
    everyone is told of the party in tick 1's inputs."""
    here = tmp_path_factory.mktemp("diffusion")
    study = (EXAMPLE / "study.toml").read_text()
    assert 'world = "world"' in study and "ticks = 8" in study and 'seeds = "1-3"' in study
    study = (
        study.replace('world = "world"', f"world = {str(EXAMPLE / 'world')!r}")
        .replace("ticks = 8", "ticks = 2")
        .replace('seeds = "1-3"', 'seeds = "1"')
        .replace("[0, 1, 2, 3, 4, 5, 6, 7, 8]", "[0, 1, 2]")
        .replace(
            "[conditions.smallville]",
            "[conditions.smallville]\n\n[conditions.told]\ninject = [{ tick = 1, everywhere = "
            "true, text = \"Isabella Rodriguez tells everyone about her Valentine's Day party "
            'at Hobbs Cafe." }]',
        )
    )
    (here / "study.toml").write_text(study)
    code, output = sim("study", "run", str(here / "study.toml"), "--out", str(here / "out"))
    assert code == 0, output
    code, output = sim(
        "export", "--study", str(here / "out"), "--out", str(here / "tables"), "--format", "jsonl"
    )
    assert code == 0, output
    return here


def _rows(here: Path, table: str) -> list[dict[str, object]]:
    return [
        orjson.loads(line)
        for line in (here / "tables" / f"{table}.jsonl").read_bytes().splitlines()
    ]


def test_the_world_is_smallville() -> None:
    characters = sorted((EXAMPLE / "world" / "characters").glob("*.json"))
    assert len(characters) == 25
    knowing = {
        path.stem: [c["text"] for c in orjson.loads(path.read_bytes())["memory"]["cells"]]
        for path in characters
    }
    assert [k for k, cells in knowing.items() if any("Valentine" in c for c in cells)] == [
        "isabella-rodriguez"
    ]
    assert [k for k, cells in knowing.items() if any("mayor" in c for c in cells)] == ["sam-moore"]
    # nobody else's file holds either topic's keyword: no one starts knowing
    for path in characters:
        text = path.read_text().casefold()
        if path.stem not in ("isabella-rodriguez", "sam-moore"):
            assert "valentine" not in text and "mayor" not in text


def test_the_report_is_computed_from_the_study(runs: Path) -> None:
    script = _script()
    report = diffusion_report(runs / "out", script.TOPICS)
    surveys = _rows(runs, "surveys")
    assert report.characters == 25 and report.runs == ["smallville/seed-1", "told/seed-1"]
    for topic in report.topics:
        assert [a.tick for a in topic.ticks] == [0, 1, 2]
        answers = [r for r in surveys if r["question"] == topic.topic.question]
        assert topic.answers == len(answers) == 2 * 3 * 25
        for a in topic.ticks:
            for i, cond in enumerate(("smallville", "told")):
                yes = [
                    r
                    for r in answers
                    if (r["condition"], r["tick"]) == (cond, a.tick) and r["answer"] == "yes"
                ]
                assert a.aware[i] == len(yes) and a.asked[i] == 25
            assert a.share.mean == pytest.approx(sum(a.aware) / 50, abs=1e-6)
    # density: the small-world ties (k = 4) among 25: 100 of 600 directed pairs
    edges = _rows(runs, "edges")
    for d in report.density:
        pairs = {
            (e["condition"], e["from"], e["to"])
            for e in edges
            if e["tick"] == d.tick and e["from"] != e["to"]
        }
        assert d.mean == pytest.approx(len(pairs) / 2 / 600, abs=1e-6)
    assert report.density[0].mean == pytest.approx(100 / 600, abs=1e-6)

    # hallucinated awareness of the party, known by construction in the `told` arm: at tick 0
    # only Isabella's own file holds "Valentine", so every other yes is hallucinated; from
    # tick 1 everyone's inputs hold the announcement, so no yes is
    party = report.topics[0]
    told = [
        r for r in surveys if r["condition"] == "told" and r["question"] == party.topic.question
    ]
    told_tick0 = [
        r
        for r in told
        if r["tick"] == 0 and r["answer"] == "yes" and r["character"] != "isabella-rodriguez"
    ]
    from sim.analysis.diffusion import _first_seen

    people = {p.stem for p in (EXAMPLE / "world" / "characters").glob("*.json")}
    seen = _first_seen(runs / "out" / "smallville" / "seed-1", ["valentine"], people)
    smallville = [
        r
        for r in surveys
        if r["condition"] == "smallville"
        and r["question"] == party.topic.question
        and r["answer"] == "yes"
        and seen.get(str(r["character"]), 99) > int(r["tick"])  # type: ignore[call-overload]
    ]
    assert party.hallucinated == len(told_tick0) + len(smallville)
    assert diffusion_report(runs / "out", script.TOPICS).to_dict() == report.to_dict()
    share = report.hallucinated_share
    assert share is not None and 0 <= share <= 1


def test_the_told_arm_has_no_hallucination_after_the_announcement(runs: Path) -> None:
    from sim.analysis.diffusion import _first_seen

    seen = _first_seen(
        runs / "out" / "told" / "seed-1",
        ["valentine"],
        {p.stem for p in (EXAMPLE / "world" / "characters").glob("*.json")},
    )
    assert seen["isabella-rodriguez"] == 0
    assert len(seen) == 25 and all(t <= 1 for t in seen.values())  # everyone told in tick 1
    control = _first_seen(
        runs / "out" / "smallville" / "seed-1",
        ["valentine"],
        {p.stem for p in (EXAMPLE / "world" / "characters").glob("*.json")},
    )
    assert control["isabella-rodriguez"] == 0


def test_the_script_prints_and_refuses(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script()
    assert script.main([str(runs / "out")]) == 0
    text = capsys.readouterr().out
    assert "party:" in text and "candidacy:" in text and "network density" in text
    assert "hallucinated awareness, all topics" in text
    assert script.main([str(runs / "out"), "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert [t["topic"] for t in data["topics"]] == ["party", "candidacy"]
    assert script.main([str(runs / "nope")]) == 2
    assert "not found" in capsys.readouterr().err
    with pytest.raises(InputError, match="never asked"):
        diffusion_report(
            runs / "out",
            [script.Topic("x", "Did you hear?", ("x",))],
        )
    assert sys.modules.get("diffusion_report_script") is None
