"""``sim ask --format`` and ``--schema`` (issue 27): coded answers with a reason beside
them, validated like every structured output (an answer out of range is retried)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import orjson
import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.interview import read_interviews


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def world(tmp_path: Path) -> Path:
    code, output = run("init", str(tmp_path / "w"))
    assert code == 0, output
    return tmp_path / "w"


def answers(output: str) -> list[dict[str, object]]:
    document = orjson.loads(output.splitlines()[-1])
    assert document["ok"], output
    return list(document["answers"])


def test_each_format_codes_the_answer(world: Path, tmp_path: Path) -> None:
    q = "Will you vote to rebuild the mill?"
    cases = {
        "yesno": lambda v: v in ("yes", "no"),
        "likert5": lambda v: isinstance(v, int) and 1 <= v <= 5,
        "number": lambda v: isinstance(v, int | float),
        "choice:mill,bridge,none": lambda v: v in ("mill", "bridge", "none"),
    }
    for form, ok in cases.items():
        code, output = run("ask", "--world", str(world), "--all", q, "--format", form, "--json")
        assert code == 0, output
        for answer in answers(output):
            assert answer["format"] == form and ok(answer["value"]), answer
            assert isinstance(answer["reason"], str) and answer["reason"]
    schema = tmp_path / "coins.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"coins": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["coins"],
                "additionalProperties": False,
            }
        )
    )
    code, output = run("ask", "--world", str(world), "--all", q, "--schema", str(schema), "--json")
    assert code == 0, output
    for answer in answers(output):
        value = answer["value"]
        assert isinstance(value, dict) and 0 <= value["coins"] <= 9
    recorded = read_interviews(world)
    assert len(recorded) == 5 * 3 and all(i.reason for i in recorded)
    assert {i.format for i in recorded} == {*cases, "schema:coins.json"}


def test_bad_formats_are_refused_and_nothing_is_recorded(world: Path, tmp_path: Path) -> None:
    for args in (
        ["--format", "maybe"],
        ["--format", "choice:a"],
        ["--format", "choice:a,a"],
        ["--schema", str(tmp_path / "missing.json")],
    ):
        code, output = run("ask", "--world", str(world), "--all", "Q?", *args)
        assert code == 2 and ("--format" in output or "missing.json" in output), output
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {"x": {"type": "string", "format": "uri"}}}')
    code, output = run("ask", "--world", str(world), "--all", "Q?", "--schema", str(bad))
    assert code == 2 and "bad.json" in output and "format" in output
    assert not (world / ".sim" / "interviews.jsonl").exists()


class _Chat(BaseHTTPRequestHandler):
    """A chat completions server whose first answer to each question is out of range."""

    answers: ClassVar[list[str]] = []
    seen: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        content = type(self).answers.pop(0)
        reply = {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def chat_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_an_answer_out_of_its_format_is_retried(
    world: Path, chat_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real server on loopback answers "maybe" to a yes/no question: refused, asked again."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    _Chat.answers[:] = [
        json.dumps({"answer": "maybe", "reason": "I cannot say."}),
        json.dumps({"answer": "yes", "reason": "The mill feeds us all."}),
    ]
    _Chat.seen.clear()
    code, output = run(
        "ask", "--world", str(world), "ada", "Rebuild the mill?", "--format", "yesno",
        "--provider", "chat", "--base-url", chat_server, "--json",
    )  # fmt: skip
    assert code == 0, output
    [answer] = answers(output)
    assert (answer["value"], answer["reason"]) == ("yes", "The mill feeds us all.")
    assert len(_Chat.seen) == 2 and not _Chat.answers
    schema = orjson.dumps(_Chat.seen[0]["response_format"]).decode()
    assert '"yes"' in schema and '"no"' in schema and "reason" in schema


def _ids(world: Path, kind: str) -> list[str]:
    return sorted(p.stem for p in (world / kind).glob("*.json"))


def test_a_character_answer_names_a_character_of_the_world(world: Path) -> None:
    """``--format character``, offline: every answer is the id of a character that exists
    (the ids go out as the answer's enum, which the offline model picks from)."""
    people = _ids(world, "characters")
    q = "Whom would you trust with the mill's keys?"
    code, output = run("ask", "--world", str(world), "--all", q, "--format", "character", "--json")
    assert code == 0, output
    got = answers(output)
    assert len(got) == len(people)
    assert all(a["format"] == "character" and a["value"] in people and a["reason"] for a in got)


def _reply(answer: object) -> str:
    return json.dumps({"answer": answer, "reason": "Because."})


def _chat_ask(world: Path, url: str, *args: str) -> tuple[int, str]:
    return run(
        "ask", "--world", str(world), "ada", "Whom do you trust?", *args,
        "--provider", "chat", "--base-url", url, "--json",
    )  # fmt: skip


def test_an_answer_naming_no_character_is_asked_again_then_refused(
    world: Path, chat_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real server on loopback names "zed", who does not exist: the problem is fed back
    and the question asked again; an answer still wrong after ``json_max_retries`` is
    recorded as failed and never reaches the export's surveys table."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    people = _ids(world, "characters")
    other = next(p for p in people if p != "ada")
    _Chat.answers[:] = [_reply("zed"), _reply(other)]
    _Chat.seen.clear()
    code, output = _chat_ask(world, chat_server, "--format", "character")
    assert code == 0, output
    [answer] = answers(output)
    assert answer["value"] == other
    assert len(_Chat.seen) == 2 and not _Chat.answers
    sent = orjson.dumps(_Chat.seen[0]["response_format"]).decode()
    assert all(f'"{p}"' in sent for p in people)  # the ids, as the answer's enum
    assert "zed" in orjson.dumps(_Chat.seen[1]["messages"]).decode()  # the problem fed back
    # with constrain_refs = "validate" the ids are not sent, and still checked: "zed" each
    # time (a first answer and json_max_retries = 2 re-asks) is refused
    _Chat.answers[:] = [_reply("zed")] * 3
    _Chat.seen.clear()
    code, output = _chat_ask(
        world, chat_server, "--format", "character", "--set", "llm.constrain_refs=validate"
    )
    assert code != 0, output
    assert len(_Chat.seen) == 3 and not _Chat.answers
    assert '"enum"' not in orjson.dumps(_Chat.seen[0]["response_format"]).decode()
    assert all(f'"{p}"' in _Chat.seen[0]["messages"][0]["content"] for p in people)
    failed = read_interviews(world)[-1]
    assert failed.failed and failed.value is None and "zed" in (failed.error or "")
    from sim.analysis.tables import build_tables

    rows = build_tables(world).surveys.rows
    assert [r["answer"] for r in rows] == [other]  # the refused answer is not a row


def test_a_schema_reference_is_held_to_the_world(
    world: Path, tmp_path: Path, chat_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--schema`` with an ``x-sim-ref`` string: the location ids go out as its enum (the
    keyword itself is not sent), and an answer naming a place that does not exist is asked
    again."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    places = _ids(world, "locations")
    schema = tmp_path / "where.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"place": {"type": "string", "x-sim-ref": "location"}},
                "required": ["place"],
                "additionalProperties": False,
            }
        )
    )
    _Chat.answers[:] = [_reply({"place": "atlantis"}), _reply({"place": places[0]})]
    _Chat.seen.clear()
    code, output = _chat_ask(world, chat_server, "--schema", str(schema))
    assert code == 0, output
    [answer] = answers(output)
    assert answer["value"] == {"place": places[0]}
    assert len(_Chat.seen) == 2
    sent = orjson.dumps(_Chat.seen[0]["response_format"]).decode()
    assert all(f'"{p}"' in sent for p in places) and "x-sim-ref" not in sent
    assert "atlantis" in orjson.dumps(_Chat.seen[1]["messages"]).decode()
