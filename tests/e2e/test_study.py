"""``sim study run`` through the CLI (issue 27): a study file, matched arms forked from one
paid-for prefix, scheduled interventions, coded surveys, resume, refusal of another
design's folder, the whole-study budget."""

from __future__ import annotations

import hashlib
import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import tree

from sim.cli import main
from sim.interventions import logged
from sim.interview import read_interviews
from sim.storage import dump_json
from sim.study.run import folder_spend
from sim.testing.stub_server import ServerThread, StubOptions, StubServer
from sim.ticklog.books import tick_books
from sim.ticklog.format import list_logs
from sim.ticklog.reader import read_log

STUDY = """\
world = "w"
seeds = "1-2"
ticks = 4
[conditions.control]
[conditions.announce]
inject = [{ tick = 3, at = "square", text = "The lord will pay half the mill." }]
set = [{ tick = 3, path = "ada.state.coins", value = 99 }]
[[surveys]]
ticks = [2, 4]
question = "Will you vote to rebuild the mill?"
format = "yesno"
"""


def sim(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a world ``w`` (``sim init``, a ``coins`` field) and ``study.toml``."""
    monkeypatch.chdir(tmp_path)
    code, output = sim("init", str(tmp_path / "w"))
    assert code == 0, output
    for i, path in enumerate(sorted((tmp_path / "w" / "characters").glob("*.json"))):
        data = orjson.loads(path.read_bytes())
        data["state"]["coins"] = 5 + i
        path.write_bytes(dump_json(data))
    (tmp_path / "study.toml").write_text(STUDY)
    return tmp_path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def server() -> Iterator[StubServer]:
    thread = ServerThread(StubServer(StubOptions(seed=3)))
    yield thread.start()
    thread.stop()


def test_matched_arms_share_one_paid_prefix(here: Path, server: StubServer) -> None:
    """Every request the server got is one call of a distinct log or answer: the prefix's
    calls once per seed; each arm's logs up to the fork are the prefix's, byte for byte."""
    world_config = here / "w" / "config.toml"
    lines = world_config.read_text().splitlines(True)
    world_config.write_text("".join(ln for ln in lines if not ln.startswith("provider =")))
    user = here / "user.toml"
    user.write_text(f'[llm]\nprovider = "chat"\nbase_url = "{server.base_url}"\n')
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    code, output = sim(
        "study", "run", "study.toml", "--out", "out", "--config", str(user), "--jobs", "2",
        "--json", env=env,
    )  # fmt: skip
    assert code == 0, output
    document = orjson.loads(output.splitlines()[-1])
    assert document["prefix_ticks"] == 2
    assert sorted(r["name"] for r in document["runs"]) == [
        "announce/seed-1", "announce/seed-2", "control/seed-1", "control/seed-2",
    ]  # fmt: skip
    out = here / "out"
    distinct: dict[str, int] = {}
    answers = 0
    for seed in (1, 2):
        prefix = out / "_shared" / f"seed-{seed}"
        shared = dict(list_logs(prefix))
        assert sorted(shared) == [1, 2]
        for folder in (prefix, out / "control" / f"seed-{seed}", out / "announce" / f"seed-{seed}"):
            for tick, path in list_logs(folder):
                if tick <= 2:  # the arms' first ticks are the prefix's, byte for byte
                    assert path.read_bytes() == shared[tick].read_bytes()
                distinct[_digest(path)] = tick_books(read_log(path)).calls
        # the survey at tick 2 was asked once, in the prefix; at tick 4 in each arm
        asked = [i.tick for i in read_interviews(prefix)]
        assert asked == [2, 2, 2]
        for arm in ("control", "announce"):
            interviews = read_interviews(out / arm / f"seed-{seed}")
            assert [i.tick for i in interviews] == [2, 2, 2, 4, 4, 4]
            assert all(i.value in ("yes", "no") and i.reason for i in interviews)
            answers += 3
        answers += 3
    assert server.stats.requests == sum(distinct.values()) + answers
    # each arm's own steps: the announcement and the edit in tick 3 of the treated arm only
    for seed in (1, 2):
        treated = dict(list_logs(out / "announce" / f"seed-{seed}"))
        records = logged(read_log(treated[3]))
        assert [r.kind for r in records] == ["inject", "set"]
        assert records[0].location == "square" and records[1].after == 99
        control = dict(list_logs(out / "control" / f"seed-{seed}"))
        assert not any(logged(read_log(control[t])) for t in control)
    # the study and its design are recorded; the run folders are sweep runs
    record = orjson.loads((out / "study.json").read_bytes())
    assert record["design"]["prefix_ticks"] == 2 and len(record["design"]["runs"]) == 4
    assert (out / "study.toml").read_text() == STUDY
    code, output = sim("sweep", "report", "--runs", str(out / "announce"))
    assert code == 0 and "seed-1" in output


def test_a_study_resumes_and_refuses_another_design(here: Path) -> None:
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 0, output
    before = tree(here / "out", logs=True)
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 0 and output.count("finished    ") == 4, output
    after = tree(here / "out", logs=True)
    assert {k: v for k, v in after.items() if "study." not in k} == {
        k: v for k, v in before.items() if "study." not in k
    }  # finished runs: nothing written
    # another design (a different announcement) into the same folder: refused by name
    (here / "other.toml").write_text(STUDY.replace("half the mill", "nothing"))
    code, output = sim("study", "run", "other.toml", "--out", "out")
    assert code == 2 and "study.json" in output and "conditions" in output, output
    assert tree(here / "out", logs=True) == after
    # a sweep into the study's folder, or a study into a sweep's, is refused too
    code, output = sim("sweep", "--world", "w", "--out", "out")
    assert code == 2 and "holds a study" in output
    assert sim("sweep", "--world", "w", "--out", "runs")[0] == 0
    code, output = sim("study", "run", "study.toml", "--out", "runs")
    assert code == 2 and "something else" in output
    # more seeds: the same design, more runs
    (here / "study.toml").write_text(STUDY.replace('seeds = "1-2"', 'seeds = "1-3"'))
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 0 and output.count("finished    ") == 4 and output.count("done ") == 2


def test_the_budget_caps_the_whole_study(here: Path) -> None:
    code, output = sim("study", "run", "study.toml", "--out", "probe", "--json")
    assert code == 0, output
    whole = orjson.loads(output.splitlines()[-1])["spent_tokens"]
    cap = whole // 3
    code, output = sim(
        "study", "run", "study.toml", "--out", "out", "--budget-tokens", str(cap), "--json"
    )
    document = orjson.loads(output.splitlines()[-1])
    assert code == 1 and not document["ok"]
    assert 0 < document["spent_tokens"] <= cap
    statuses = {r["status"] for r in document["runs"]}
    assert statuses <= {"done", "failed", "not started"} and statuses != {"done"}
    code, output = sim("study", "run", "study.toml", "--out", "out", "--json")
    document = orjson.loads(output.splitlines()[-1])
    assert code == 0 and document["ok"]
    # the prefixes were not paid twice: the study spent what the unbudgeted one did, plus
    # at most what the stopped steps had sent before they stopped
    assert document["spent_tokens"] >= whole


def test_a_bad_study_file_names_its_field(here: Path) -> None:
    cases = {
        'world = "nowhere"': "world",
        "ticks = 0": "ticks",
        "[conditions.Bad]": "conditions.Bad",
        "[conditions.x]\ninject = [{ tick = 1, text = 'no place' }]": "conditions.x.inject.0",
        "[conditions.x]\nset = [{ tick = 1, path = 'nope', value = 1 }]": "conditions.x.set.0",
        "[conditions.x]\ninject = [{ tick = 9, at = 'square', text = 'late' }]": "tick",
        "[[surveys]]\nticks = [2]\nquestion = 'Q?'\nformat = 'maybe'": "surveys.1.format",
        "[[surveys]]\nticks = [7]\nquestion = 'Q?'": "surveys.1.ticks",
        "[factors]\n'phase1.temperature' = [9]": "factors",
        "surprise = 1": "surprise",
    }
    for change, field in cases.items():
        text = STUDY
        key = change.split(" =")[0]
        if key in ("world", "ticks"):
            text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(key + " "))
            text = change + "\n" + text
        elif change.startswith("surprise"):
            text = change + "\n" + text
        else:
            text = text + "\n" + change + "\n"
        (here / "bad.toml").write_text(text)
        code, output = sim("study", "run", "bad.toml", "--out", "bad-out")
        assert code == 2, (change, output)
        assert "bad.toml" in output and field in output, (change, output)
        assert not (here / "bad-out").exists()


def test_the_study_schema_accepts_the_example(here: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import tomllib

    code, output = sim("schema", "--out", "schemas")
    assert code == 0, output
    schema = orjson.loads((here / "schemas" / "study.schema.json").read_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(tomllib.loads(STUDY))
    example = Path(__file__).resolve().parents[2] / "examples" / "harvest-study" / "study.toml"
    validator.validate(tomllib.loads(example.read_text()))
    assert list(validator.iter_errors({"world": "w", "ticks": 1, "conditions": {}, "x": 1}))


def test_folder_spend_counts_answers(here: Path) -> None:
    code, output = sim("study", "run", "study.toml", "--out", "out")
    assert code == 0, output
    arm = here / "out" / "announce" / "seed-1"
    spent = folder_spend(arm, {})
    assert spent.calls == sum(tick_books(read_log(p)).calls for _, p in list_logs(arm)) + 6


RUNS = ("seed-1_phase1.temperature=0.5", "seed-2_phase1.temperature=0.5")


def test_one_table_for_the_whole_study_and_its_report(here: Path, tmp_path: Path) -> None:
    """load_study, sim export --study and sim study report over one study's runs."""
    study = STUDY.replace(
        "[conditions.control]", "[factors]\n'phase1.temperature' = [0.5]\n\n[conditions.control]"
    )
    (here / "study.toml").write_text(study)
    code, output = sim("study", "run", "study.toml", "--out", "out", "--jobs", "2")
    assert code == 0, output
    code, output = sim("export", "--study", "out", "--out", "tables", "--format", "jsonl", "--json")
    assert code == 0, output
    rows = {
        name: [
            orjson.loads(line)
            for line in (here / "tables" / f"{name}.jsonl").read_bytes().splitlines()
        ]
        for name in ("characters", "calls", "surveys")
    }
    assert len(rows["surveys"]) == 2 * 2 * 2 * 3  # conditions x seeds x ticks x characters
    assert list(rows["surveys"][0])[:4] == ["condition", "seed", "run", "phase1.temperature"]
    assert {r["condition"] for r in rows["characters"]} == {"control", "announce"}
    assert all(r["phase1.temperature"] == 0.5 for r in rows["characters"])
    assert all(r["shared"] == (r["tick"] <= 2) for r in rows["calls"] + rows["surveys"])
    assert all(r["answer"] in ("yes", "no") for r in rows["surveys"])

    pandas = pytest.importorskip("pandas")
    from sim.analysis import load_study

    frames = load_study(here / "out")
    assert isinstance(frames.characters, pandas.DataFrame)
    assert frames.factors == ["phase1.temperature"] and len(frames.runs) == 4
    assert len(frames.surveys) == 24 and set(frames.characters["seed"]) == {1, 2}

    # the report: a survey's share of "yes", and the coins the treated arm's edit moved
    code, output = sim("study", "report", "out", "--json", "--html", str(tmp_path / "r.html"))
    assert code == 0, output
    report = orjson.loads(output)
    assert report["reference"] == "control" and set(report["conditions"]) == {"control", "announce"}
    yes = {
        (c, r, t): statistics.fmean(
            1.0 if s["answer"] == "yes" else 0.0
            for s in rows["surveys"]
            if (s["condition"], s["run"], s["tick"]) == (c, r, t)
        )
        for c in ("control", "announce")
        for r in RUNS
        for t in (2, 4)
    }
    for estimate in report["conditions"]["announce"]:
        runs = [yes[("announce", r, estimate["tick"])] for r in RUNS]
        assert estimate["n"] == 2 and estimate["mean"] == pytest.approx(statistics.fmean(runs))
    tick2 = report["differences"]["announce"][0]
    assert tick2["tick"] == 2 and tick2["mean"] == 0 and tick2["low"] == tick2["high"] == 0
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "<script" not in page and "announce" in page

    code, output = sim("study", "report", "out", "--field", "coins", "--json")
    assert code == 0, output
    diffs = {e["tick"]: e for e in orjson.loads(output)["differences"]["announce"]}
    assert diffs[1]["mean"] == 0  # the shared prefix: identical
    # `sim set` for tick 3 edits the files once tick 2 is committed: the state after tick 2
    # (the state tick 3 starts from) holds it
    ada = [
        r
        for r in rows["characters"]
        if r["character"] == "ada" and r["tick"] == 1 and r["condition"] == "control"
    ]
    moved = statistics.fmean(99 - r["state.coins"] for r in ada) / 3
    assert [diffs[t]["mean"] for t in (2, 3, 4)] == pytest.approx([moved] * 3)

    for args, words in (
        (["--field", "nope"], "no state field"),
        (["--field", "mood"], "mood=VALUE"),
        (["--field", "survey:9"], "no survey"),
    ):
        code, output = sim("study", "report", "out", *args)
        assert code == 2 and words in output, output
    code, output = sim("study", "report", str(here / "w"))
    assert code == 2 and "study.json" in output
    code, output = sim("sweep", "report", "--runs", "out")
    assert code == 2 and "announce" in output and "control" in output


def test_one_condition_forks_the_world_and_books_come_from_summaries(here: Path) -> None:
    """A study of one condition has no shared prefix (a second world copy and a copy of
    every log per run, for nothing to share); what a folder spent is read from each
    committed tick's summary, not by parsing its log (which took the study's process about
    a second per tick of 2,200 calls): a log whose bytes are damaged changes nothing."""
    from sim.runs.ledger import spend

    (here / "one.toml").write_text('world = "w"\nseeds = "1-2"\nticks = 2\n[conditions.control]\n')
    code, output = sim("study", "run", "one.toml", "--out", "one", "--jobs", "2", "--json")
    assert code == 0, output
    document = orjson.loads(output.splitlines()[-1])
    assert document["prefix_ticks"] == 0 and not (here / "one" / "_shared").exists()
    run = here / "one" / "control" / "seed-1"
    before, swept = folder_spend(run, {}), spend(run)
    other = folder_spend(here / "one" / "control" / "seed-2", {})
    assert before.calls > 0 and before.tokens == swept.tokens
    assert before.tokens + other.tokens == document["spent_tokens"]
    logs = list_logs(run)
    assert [tick for tick, _ in logs] == [1, 2]
    for _, path in logs:
        path.write_bytes(path.read_bytes()[:64])  # the calls unreadable; the summary kept
    after, swept_after = folder_spend(run, {}), spend(run)
    assert (after.calls, after.tokens) == (before.calls, before.tokens)
    assert (swept_after.calls, swept_after.tokens) == (swept.calls, swept.tokens)


def test_a_survey_of_characters_names_characters_of_the_world(here: Path) -> None:
    """``format = "character"`` in a study's survey: every answer in the export's surveys
    table is the id of a character of the world (``sim ask --format character``)."""
    (here / "who.toml").write_text(
        'world = "w"\nseeds = "1"\nticks = 1\n[conditions.control]\n[[surveys]]\nticks = [1]\n'
        'question = "Whom would you trust with the mill\'s keys?"\nformat = "character"\n'
    )
    code, output = sim("study", "run", "who.toml", "--out", "who")
    assert code == 0, output
    code, output = sim("export", "--study", "who", "--out", "t", "--format", "jsonl", "--json")
    assert code == 0, output
    rows = [orjson.loads(line) for line in (here / "t" / "surveys.jsonl").read_bytes().splitlines()]
    people = {p.stem for p in (here / "w" / "characters").glob("*.json")}
    assert len(rows) == len(people)
    assert all(r["format"] == "character" and r["answer"] in people for r in rows)


TINY = """\
world = "w"
seeds = "1-2"
ticks = 1
[conditions.control]
[[surveys]]
ticks = [1]
question = "Will you vote to rebuild the mill?"
format = "yesno"
"""


def _results(out: Path) -> dict[str, bytes]:
    """A study's folder, byte for byte, less what records times (tick logs, the children's
    output, the answers' latencies) and where the study file was read from."""
    files = {
        rel: data
        for rel, data in tree(out).items()
        if "/.sim/log/" not in rel
        and not rel.endswith(".sim/sweep-output.log")
        and not rel.endswith(".sim/interviews.sha256")  # digests of lines with latencies
        and rel != "study.json"
    }
    for rel, data in files.items():
        if rel.endswith(".sim/interviews.jsonl"):
            lines = [orjson.loads(line) for line in data.splitlines()]
            for line in lines:
                for attempt in line["attempts"]:
                    attempt.pop("latency")
            files[rel] = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    return files


@pytest.mark.slow
def test_a_study_through_ray_equals_the_local_one(here: Path) -> None:
    """``--executor ray`` on a local Ray instance: every step of every run a Ray task; the
    study's folder is byte-identical to the one the local executor makes."""
    ray = pytest.importorskip("ray", reason="Ray cannot be installed here (pip install ray)")
    (here / "tiny.toml").write_text(TINY)
    code, output = sim("study", "run", "tiny.toml", "--out", "local", "--jobs", "2")
    assert code == 0, output
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        code, output = sim(
            "study", "run", "tiny.toml", "--out", "ray", "--jobs", "2", "--executor", "ray",
            "--json",
        )  # fmt: skip
        assert code == 0, output
        document = orjson.loads(output.splitlines()[-1])
        assert [r["status"] for r in document["runs"]] == ["done", "done"]
        # every step (a tick and a survey per run) ran as a Ray task: Ray's own record
        tasks = [e for e in ray.timeline() if str(e.get("name", "")).endswith(".run_one")]
        assert len(tasks) >= 4, [e.get("name") for e in ray.timeline()]
    finally:
        ray.shutdown()
    local, remote = _results(here / "local"), _results(here / "ray")
    assert sorted(local) == sorted(remote)
    assert "control/seed-2/world.json" in local and "control/seed-1/.sim/interviews.jsonl" in local
    for rel, data in local.items():
        assert remote[rel] == data, rel
    for seed in (1, 2):
        world = orjson.loads(
            (here / "ray" / "control" / f"seed-{seed}" / "world.json").read_bytes()
        )
        assert world["tick"] == 1 and world["seed"] == seed
        answers = read_interviews(here / "ray" / "control" / f"seed-{seed}")
        assert len(answers) == 3 and all(a.value in ("yes", "no") for a in answers)
