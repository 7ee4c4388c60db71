"""`sim ask`: in-character answers that change nothing in the world, recorded and counted."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import tree

from sim.cli import main
from sim.interview import INTERVIEW_DIGESTS, INTERVIEWS, read_interviews
from sim.testing.stub_server import StubServer

QUESTION = "How will you vote on the new harbour master?"


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def world_files(world: Path) -> dict[str, bytes]:
    """Every file of the world, logs included, but the interview record (and its digests)."""
    files = tree(world, logs=True)
    files.pop(INTERVIEWS, None)
    files.pop(INTERVIEW_DIGESTS, None)
    return files


@pytest.fixture
def ticked(demo_world: Path) -> Path:
    assert run("tick", "--world", str(demo_world), "--ticks", "2").exit_code == 0
    return demo_world


def test_ask_answers_in_character_and_changes_nothing(ticked: Path) -> None:
    before = world_files(ticked)
    result = run("ask", "--world", str(ticked), "ada", QUESTION)
    assert result.exit_code == 0, result.output
    assert "[Ada Strand]" in result.stdout
    assert world_files(ticked) == before  # byte-identical, logs and response store included
    [interview] = read_interviews(ticked)
    assert (interview.tick, interview.character, interview.question) == (2, "ada", QUESTION)
    assert interview.answer is not None
    # in character: built from her own goals, not another's
    ada = orjson.loads((ticked / "characters" / "ada.json").read_bytes())
    assert any(goal.rstrip(".")[1:] in interview.answer for goal in ada["identity"]["goals"])
    assert interview.model == "gpt-4.1-mini" and interview.answered_by == "offline"
    assert interview.usage.input_tokens > 0 and len(interview.attempts) == 1
    # the same question at the same tick gets the same answer (offline is deterministic)
    again = run("ask", "--world", str(ticked), "ada", QUESTION)
    assert again.stdout == result.stdout
    assert len(read_interviews(ticked)) == 2


def test_a_survey_asks_everyone_and_sim_usage_counts_it(ticked: Path) -> None:
    before = world_files(ticked)
    result = run("ask", "--world", str(ticked), "--all", "What do you fear most?", "--json")
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    chars = sorted(p.stem for p in (ticked / "characters").glob("*.json"))
    assert doc["command"] == "ask" and doc["ok"] is True and doc["tick"] == 2
    assert [a["character"] for a in doc["answers"]] == chars
    assert all(a["answer"] and a["cost_usd"] == 0.0 for a in doc["answers"])
    assert len({a["answer"] for a in doc["answers"]}) == len(chars)  # each their own
    assert world_files(ticked) == before
    interviews = read_interviews(ticked)
    assert len(interviews) == len(chars)

    usage = orjson.loads(run("usage", "--world", str(ticked), "--by", "phase", "--json").stdout)
    [row] = [r for r in usage["rows"] if r["key"] == "ask"]
    assert row["requests"] == len(chars)
    assert row["input_tokens"] == sum(i.usage.input_tokens for i in interviews)
    phases = sum(r["total_tokens"] for r in usage["rows"] if r["key"] != "ask")
    assert usage["total"]["total_tokens"] == phases + row["total_tokens"]


def test_bad_questions_are_refused_and_nothing_is_recorded(ticked: Path) -> None:
    result = run("ask", "--world", str(ticked), "nobody", QUESTION)
    assert result.exit_code == 2 and "no character 'nobody'" in result.output
    assert run("ask", "--world", str(ticked), "ada", "  ").exit_code == 2
    assert run("ask", "--world", str(ticked), "--all").exit_code == 2
    assert run("ask", "--world", str(ticked), "ada").exit_code == 2
    assert not (ticked / INTERVIEWS).exists()


def test_a_link_out_of_the_world_is_not_followed(ticked: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"")
    (ticked / INTERVIEWS).symlink_to(outside)
    result = run("ask", "--world", str(ticked), "ada", QUESTION)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "not a link" in result.output
    assert outside.read_bytes() == b""


def test_ask_through_a_real_server_and_a_failure_is_recorded(
    ticked: Path, stub_server: StubServer
) -> None:
    """The openai SDK against the stub server on loopback: an answer, then a refusal."""
    args = ("--provider", "chat", "--base-url", stub_server.base_url)
    result = run("ask", "--world", str(ticked), "bram", QUESTION, *args, "--json")
    assert result.exit_code == 0, result.output
    [answer] = orjson.loads(result.stdout)["answers"]
    assert answer["answer"] and answer["usage"]["input_tokens"] > 0

    stub_server.model_faults["gpt-4.1-mini"] = "refusal"
    before = world_files(ticked)
    result = run("ask", "--world", str(ticked), "bram", QUESTION, *args, "--json")
    assert result.exit_code == 1
    doc = orjson.loads(result.stdout)
    assert doc["ok"] is False and doc["answers"][0]["answer"] is None
    assert doc["answers"][0]["error_code"]
    assert world_files(ticked) == before
    recorded = read_interviews(ticked)
    assert [i.failed for i in recorded] == [False, True]
    assert recorded[-1].attempts  # the refused attempts are kept: they may be billed


def test_a_failed_offline_answer_is_logged_and_priced_as_offline(tmp_path: Path) -> None:
    """Issue 39: a failed offline attempt was recorded under the configured model
    (gpt-4.1-mini) and priced at its price, so a free study reported a cost."""
    world = tmp_path / "w"
    assert run("init", str(world)).exit_code == 0
    config = world / "config.toml"
    # ids not sent as enums ("validate"): the offline model's answers name no character
    text = config.read_text().replace("[llm]\n", '[llm]\nconstrain_refs = "validate"\n', 1)
    config.write_text(text + '\n[phase1]\nmodel = "gpt-4.1-mini"\n')
    result = run("ask", "--world", str(world), "--all", "--format", "character", QUESTION)
    assert "failed" in result.output, result.output
    failed = [a for i in read_interviews(world) for a in i.attempts if a.error_code]
    assert failed and {a.model for a in failed} == {"offline"}
    usage = orjson.loads(run("usage", "--world", str(world), "--json").stdout)
    assert usage["total"]["cost_usd"] == 0 and usage["total"]["total_tokens"] > 0
