"""The message channel (issue 39): with ``[messages] enabled = true`` a character reaches
anyone it has a tie with, wherever they are. The message is in the recipient's next
tick's input and its memory, in ``sim log``, replayed identically, and in the
``messages`` table; a message to someone without a tie is re-asked, then refused; a world
without ``[messages]`` keeps its schemas, inputs and logged config."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import tree
from pydantic import BaseModel

from sim import sections
from sim.cli import main
from sim.config import load_config, loggable
from sim.engine.runner import Runner
from sim.engine.split import LOCAL_FIRST_SHARE, partition
from sim.errors import UserError
from sim.messages import actions
from sim.phases.intentions import Intention, intention_schema
from sim.testing import MockAdapter, default_instance
from sim.testing.stub_server import StubServer
from sim.ticklog.format import log_path
from sim.ticklog.reader import TickLog, read_log

CHANNEL = "\n[messages]\nenabled = true\n"


def sim(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def make_world(root: Path, extra: str = CHANNEL, network: str = "ring") -> Path:
    world = root / "w"
    code, out = sim(
        "init", str(world), "--characters", "6", "--locations", "4", "--network", network
    )
    assert code == 0, out
    with (world / "config.toml").open("a") as handle:
        handle.write(extra)
    return world


def where(log: TickLog) -> dict[str, str]:
    """Character id -> its location when the tick began."""
    out = {}
    for rel, data in log.state().items():
        if rel.startswith("characters/"):
            char = orjson.loads(data)
            out[char["identity"]["id"]] = char["state"]["location"]
    return out


def intention_input(log: TickLog, cid: str) -> dict[str, Any]:
    call = next(c for c in log.calls.values() if c.entity_key == f"intention:{cid}")
    data = sections.loads(call.input)
    assert isinstance(data, dict)
    return data


def test_a_message_reaches_a_tie_in_another_place(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    code, out = sim("tick", "--world", str(world), "--ticks", "5")
    assert code == 0, out
    found = None
    for tick in range(1, 5):
        log = read_log(log_path(world, tick))
        at = where(log)
        for item in log.phase_results("apply").get("messages", []):
            if at[item["from"]] != at[item["to"]]:
                found = (tick, item)
                break
        if found:
            break
    assert found is not None, "the offline model sent no message across places"
    tick, item = found
    sender, recipient, text = item["from"], item["to"], item["text"]
    sent_log = read_log(log_path(world, tick))
    assert intention_input(sent_log, sender)["contacts"]  # whom it may reach was shown
    assert sent_log.phase_results("intentions")[sender]["target"] == recipient

    # the next tick's input of the recipient shows it, and its memory holds it
    after = read_log(log_path(world, tick + 1))
    shown = intention_input(after, recipient)
    assert {"tick": tick, "from": sender, "text": text}.items() <= shown["messages"][0].items()
    char = orjson.loads(after.state()[f"characters/{recipient}.json"])
    assert char["inbox"] == [{"tick": tick, "from": sender, "text": text}]
    cells = [c for c in char["memory"]["cells"] if c["tick"] == tick]
    assert any(text in c["text"] and c["text"].startswith("A message from ") for c in cells)
    # read: the inbox is emptied by the tick that showed it (unless new ones came)
    later = orjson.loads(
        read_log(log_path(world, tick + 2)).state()[f"characters/{recipient}.json"]
    )
    assert all(m["tick"] == tick + 1 for m in later.get("inbox", []))

    code, out = sim("log", "--world", str(world), "--tick", str(tick))
    assert code == 0 and "[messages]" in out, out
    assert text[:40] in out

    code, out = sim("replay", "--world", str(world), "--tick", str(tick), "--to", str(tick + 1))
    assert code == 0, out
    assert f"tick {tick}: identical" in out and f"tick {tick + 1}: identical" in out

    code, out = sim("export", "--world", str(world), "--out", str(tmp_path / "t"))
    assert code == 0, out
    with (tmp_path / "t" / "messages.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {"tick": str(tick), "from": sender, "to": recipient, "text": text} in rows
    assert list(rows[0]) == ["tick", "from", "to", "text"]


def test_the_tie_rule_decides_who_may_message(tmp_path: Path) -> None:
    """``kinds`` the world counts as ties: the init network's "acquaintance" does not
    count, so no one has a contact and no message is sent."""
    world = make_world(tmp_path, CHANNEL + 'kinds = ["family"]\n')
    code, out = sim("tick", "--world", str(world), "--ticks", "3")
    assert code == 0, out
    for tick in (1, 2, 3):
        log = read_log(log_path(world, tick))
        assert "messages" not in log.phase_results("apply")
        assert "contacts" not in intention_input(log, "ada")
        assert all(i["action"] != "message" for i in log.phase_results("intentions").values())


def _ada_messages_dov(schema: type[BaseModel], text: str) -> Any:
    """Ada always messages Dov (no tie: a ring of ada, bram, cora, dov, esme, finn gives
    her bram and finn); the others wait; any other schema its default."""
    if issubclass(schema, Intention):
        data = sections.loads(text)
        if isinstance(data, dict) and data["character"]["id"] == "ada":
            return {"action": "message", "target": "dov", "content": "psst", "reasoning": "x"}
        return {"action": "wait", "target": None, "content": "", "reasoning": "mock"}
    return default_instance(schema)


def test_a_message_to_someone_without_a_tie_is_refused(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    adapter = MockAdapter(default=_ada_messages_dov)
    config = load_config(world_dir=world, cwd=world)
    Runner(world, config, adapter=adapter).run(1)
    log = read_log(log_path(world, 1))
    call = next(c for c in log.calls.values() if c.entity_key == "intention:ada")
    assert [a.error_code for a in call.attempts] == ["schema_error"] * 3
    problem = call.error or ""
    assert "is not someone you have a tie with" in problem, problem
    assert '"bram", "finn"' in problem  # the valid ids, fed back
    assert log.phase_results("intentions")["ada"]["action"] == "wait"  # the fallback
    assert "messages" not in log.phase_results("apply")
    dov = orjson.loads((world / "characters" / "dov.json").read_bytes())
    assert "inbox" not in dov


def test_a_world_without_the_channel_is_unchanged(tmp_path: Path) -> None:
    world = make_world(tmp_path, "")
    config = load_config(world_dir=world, cwd=world)
    assert config.messages is None
    assert "messages" not in loggable(config)  # the logged config, as before
    assert intention_schema(actions(config)) is Intention
    off = make_world(tmp_path / "off", "\n[messages]\nenabled = false\n")
    assert intention_schema(actions(load_config(world_dir=off, cwd=off))) is Intention
    code, out = sim("tick", "--world", str(world), "--ticks", "2")
    assert code == 0, out
    log = read_log(log_path(world, 2))
    data = intention_input(log, "ada")
    assert "contacts" not in data and "messages" not in data
    assert all(i["action"] != "message" for i in log.phase_results("intentions").values())


def test_a_verb_named_message_clashes_with_the_channel(tmp_path: Path) -> None:
    world = make_world(tmp_path, CHANNEL + '\n[actions]\nmessage = "send a note"\n')
    with pytest.raises(UserError) as err:
        load_config(world_dir=world, cwd=world)
    assert "actions.message" in str(err.value)


def test_a_grammar_server_gets_the_contacts_as_the_message_enum(
    tmp_path: Path, stub_server: StubServer
) -> None:
    """``constrain_refs = "schema"`` (a chat server): the ``message`` branch of the
    intention schema allows only the character's contacts; the tick runs on it."""
    world = make_world(tmp_path)
    result = CliRunner().invoke(
        main,
        ["tick", "--world", str(world), "--provider", "chat", "--base-url", stub_server.base_url],
        env={"OPENAI_API_KEY": "sk-test"},
    )
    assert result.exit_code == 0, result.output
    for body in stub_server.log:
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema", {})
        if schema.get("title") != "Intention" and "Intention" not in str(schema.get("anyOf")):
            continue
        data = sections.loads(body["messages"][-1]["content"])
        assert isinstance(data, dict)
        targets = {
            b["properties"]["action"]["enum"][0]: b["properties"]["target"].get("enum")
            for b in schema["anyOf"]
        }
        assert targets["message"] == [c["id"] for c in data["contacts"]]
        assert data["character"]["id"] not in targets["message"]
        break
    else:
        raise AssertionError("no intention request was sent")


def test_the_offline_model_messages_through_tools_too(tmp_path: Path) -> None:
    """``[phase1] mode = "tools"``: ``message`` is a tool; the offline model aims it at a
    contact, so no answer is refused."""
    world = make_world(tmp_path)
    code, out = sim("tick", "--world", str(world), "--ticks", "4", "--set", "phase1.mode=tools")
    assert code == 0, out
    assert "fallback" not in out, out
    sent = [
        item
        for tick in range(1, 5)
        for item in read_log(log_path(world, tick)).phase_results("apply").get("messages", [])
    ]
    assert sent


def test_messages_cross_shards_as_they_cross_places_in_one_process(tmp_path: Path) -> None:
    """With ``--workers``, each shard checks its own senders' messages and every shard
    delivers all of them to its own characters: a message to a character of another
    shard is in its inbox and memory, as in one process, and the files are the same."""
    source = make_world(tmp_path / "source", network="small-world")
    trees, outputs = [], []
    for workers in (1, 2, 3):
        world = tmp_path / f"w{workers}"
        shutil.copytree(source, world)
        code, out = sim("tick", "--world", str(world), "--ticks", "5", "--workers", str(workers))
        assert code == 0, out
        assert "one process" not in out
        trees.append(tree(world))
        outputs.append(re.sub(r"\d+(?:\.\d+)?s\b", "", out.replace(str(world), "W")))
    assert trees[1] == trees[0] and trees[2] == trees[0]
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]
    crossed = []  # (tick, message) sent to another of the 3 workers' shards
    for tick in range(1, 6):
        log = read_log(log_path(tmp_path / "w3", tick))
        at = where(log)
        occupied: dict[str, list[str]] = {}
        for cid in sorted(at):
            occupied.setdefault(at[cid], []).append(cid)
        parts = partition(dict(sorted(occupied.items())), 3, LOCAL_FIRST_SHARE)
        shard = {lid: i for i, part in enumerate(parts) for lid in part}
        for item in log.phase_results("apply").get("messages", []):
            if shard[at[item["from"]]] != shard[at[item["to"]]]:
                crossed.append((tick, item))
    assert crossed, "no message went to another shard"
    tick, item = crossed[0]
    after = orjson.loads(
        read_log(log_path(tmp_path / "w3", tick + 1)).state()[f"characters/{item['to']}.json"]
    )
    assert {"tick": tick, "from": item["from"], "text": item["text"]} in after["inbox"]
    assert any(item["text"] in cell["text"] for cell in after["memory"]["cells"])
