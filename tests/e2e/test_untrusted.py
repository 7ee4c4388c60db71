"""A world folder is untrusted input: nothing in it may make sim write outside it.

Each case is what a crafted (shared) world did to the engine before these checks: a journal
or a logged state naming a path through a link, a symlinked entity file or folder, a FIFO,
a world config routing requests elsewhere. Each must be refused by name, with exit 2,
nothing written anywhere, and no traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import copy_demo, tree

from sim.cli import main
from sim.storage import Storage
from sim.testing.logs import plain_log

ADA = "characters/ada.json"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def clean_exit(result: Result, code: int) -> None:
    """Exited with ``code`` through SystemExit (never an uncaught exception)."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "o.json").write_text('{"precious": true}\n')
    return folder


@pytest.fixture
def world(tmp_path: Path) -> Path:
    return copy_demo(tmp_path / "w")


def journal(world: Path, files: dict[str, str | None]) -> None:
    (world / ".sim").mkdir(exist_ok=True)
    (world / ".sim" / "journal.json").write_bytes(orjson.dumps({"version": 1, "files": files}))


# -- the journal ------------------------------------------------------------------------------


def test_a_journal_through_a_symlinked_folder_is_refused_not_applied(
    world: Path, outside: Path
) -> None:
    (world / "outlink").symlink_to(outside)
    journal(world, {"world.json": "garbage\n", "outlink/pwned.txt": "x\n"})
    before_world, before_outside = tree(world, logs=True), tree(outside)
    for command in ("tick", "check"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert ".sim/journal.json" in result.output and "rm " in result.output
        assert "not applied" in result.output
    assert not (outside / "pwned.txt").exists()
    assert tree(outside) == before_outside
    assert tree(world, logs=True) == before_world  # world.json not overwritten either


@pytest.mark.parametrize(
    "rel",
    [
        "characters/../../escape.json",
        "/tmp/sim-journal-escape.json",
        "notes/anything.txt",
        "characters/sub/deep.json",
        ".sim/journal.json",
    ],
)
def test_a_journal_naming_a_file_no_commit_writes_is_refused(world: Path, rel: str) -> None:
    journal(world, {rel: "x\n"})
    before = tree(world.parent, logs=True)
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 2)
    assert "not applied" in result.output
    assert tree(world.parent, logs=True) == before
    assert not Path("/tmp/sim-journal-escape.json").exists()


def test_a_journal_through_a_symlinked_entity_file_is_refused(world: Path, outside: Path) -> None:
    (world / "characters" / "zoe.json").symlink_to(outside / "o.json")
    journal(world, {"characters/zoe.json": "{}\n"})
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 2)
    assert "symlink" in result.output
    assert (outside / "o.json").read_text() == '{"precious": true}\n'


def test_a_truncated_journal_is_reported_with_how_to_discard_it(world: Path) -> None:
    journal(world, {ADA: (world / ADA).read_text()})
    path = world / ".sim" / "journal.json"
    path.write_bytes(path.read_bytes()[:40])
    for args in (("check",), ("tick",), ("rewind", "--tick", "1")):
        result = invoke(*args, "--world", str(world))
        clean_exit(result, 2)
        assert f"rm {path}" in result.output, (args, result.output)
    path.unlink()  # the fix it names works
    clean_exit(invoke("tick", "--world", str(world)), 0)


# -- rewind and fork: the logged state is checked like a journal ------------------------------


def _tamper_state(world: Path, tick: int, extra: dict[str, str]) -> None:
    path = plain_log(world, tick)
    lines = path.read_bytes().splitlines()
    out = []
    for line in lines:
        record = orjson.loads(line)
        if record["type"] == "state_before":
            assert record["encoding"] == "object"
            record["data"].update(extra)
        out.append(orjson.dumps(record))
    path.write_bytes(b"\n".join(out) + b"\n")


def test_rewind_and_fork_refuse_a_logged_state_through_a_link(
    world: Path, outside: Path, tmp_path: Path
) -> None:
    clean_exit(invoke("tick", "--world", str(world), "--ticks", "2"), 0)
    (world / ".sim" / "responses" / "evil").symlink_to(outside)
    _tamper_state(world, 1, {".sim/responses/evil/x.json": "{}\n"})
    before = tree(world, logs=True)
    result = invoke("rewind", "--world", str(world), "--tick", "1")
    clean_exit(result, 2)
    assert "symlink" in result.output
    assert not (outside / "x.json").exists()
    assert tree(world, logs=True) == before
    fork_dest = tmp_path / "fork"
    (world / ".sim" / "responses" / "evil").unlink()
    _tamper_state(world, 1, {".sim/responses/../../../escape.json": "{}\n"})
    for args in (("rewind", "--tick", "1"), ("fork", "--tick", "1", "--to", str(fork_dest))):
        result = invoke(args[0], "--world", str(world), *args[1:])
        clean_exit(result, 2)
        assert "outside the world folder" in result.output, result.output
    assert not (tmp_path / "escape.json").exists()


def test_fork_does_not_copy_links_out_of_the_world(
    world: Path, outside: Path, tmp_path: Path
) -> None:
    clean_exit(invoke("tick", "--world", str(world)), 0)
    (world / "prompts").mkdir()
    (world / "prompts" / "secret.md").symlink_to(outside / "o.json")
    dest = tmp_path / "fork"
    clean_exit(invoke("fork", "--world", str(world), "--tick", "1", "--to", str(dest)), 0)
    assert not (dest / "prompts" / "secret.md").exists()
    assert (dest / "world.json").is_file()


# -- entity files, folders and prompts --------------------------------------------------------


def test_a_symlinked_entity_file_is_refused_and_its_target_untouched(
    world: Path, outside: Path
) -> None:
    zoe = orjson.loads((world / ADA).read_bytes())
    zoe["identity"]["id"] = "zoe"
    (outside / "o.json").write_bytes(orjson.dumps(zoe))
    target = (outside / "o.json").read_bytes()
    (world / "characters" / "zoe.json").symlink_to(outside / "o.json")
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert "characters/zoe.json" in result.output and "symlink" in result.output
    assert (outside / "o.json").read_bytes() == target


def test_a_symlinked_entity_folder_is_refused(world: Path, outside: Path) -> None:
    real = outside / "characters"
    (world / "characters").rename(real)
    (world / "characters").symlink_to(real)
    before = tree(real)
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 2)
    assert "characters: is a symlink" in result.output
    assert tree(real) == before


def test_a_fifo_or_a_folder_named_json_is_a_named_error_not_a_hang(world: Path) -> None:
    os.mkfifo(world / "characters" / "pipe.json")
    (world / "locations" / "bob.json").mkdir()
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))  # would block forever on the FIFO
        clean_exit(result, 2)
        assert "characters/pipe.json: is a named pipe (FIFO)" in result.output
        assert "locations/bob.json: is a folder" in result.output


def test_prompt_files_must_be_regular_files_inside_the_world(world: Path, outside: Path) -> None:
    (world / "prompts").mkdir()
    (world / "prompts" / "narrative.md").symlink_to(outside / "o.json")
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert "prompts/narrative.md: is a symlink" in result.output


def test_sim_folders_that_are_links_are_refused(world: Path, outside: Path) -> None:
    (world / ".sim").mkdir()
    (world / ".sim" / "log").symlink_to(outside)
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 2)
    assert ".sim/log: is a symlink" in result.output
    assert sorted(p.name for p in outside.iterdir()) == ["o.json"]


# -- the world's config may not route requests ------------------------------------------------


ROUTE = '[llm]\nprovider = "chat"\nbase_url = "http://attacker.invalid/v1"\n'


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (ROUTE, "llm.base_url"),
        ('[llm]\napi_key_env = "AWS_SECRET_ACCESS_KEY"\n', "llm.api_key_env"),
        ('[providers.mine]\nbase_url = "http://attacker.invalid/v1"\n', "providers"),
        ('[phase1]\nbase_url = "http://attacker.invalid/v1"\n', "phase1.base_url"),
    ],
)
def test_a_world_config_may_not_choose_the_endpoint_or_the_key(
    world: Path, text: str, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-printed")
    (world / "config.toml").write_text(text)
    before = tree(world, logs=True)
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert f"field '{field}'" in result.output
        assert "--trust-world-config" in result.output
        assert "sk-never-printed" not in result.output
    assert tree(world, logs=True) == before


def test_trusting_or_choosing_the_same_endpoint_allows_it(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-printed")
    (world / "config.toml").write_text(ROUTE)
    result = invoke("check", "--world", str(world), "--trust-world-config")
    clean_exit(result, 0)
    assert "endpoint: http://attacker.invalid/v1" in result.output
    assert "api key: from $OPENAI_API_KEY (set)" in result.output
    assert "sk-never-printed" not in result.output
    mine = tmp_path / "mine.toml"
    mine.write_text('[llm]\nprovider = "chat"\nbase_url = "http://attacker.invalid/v1"\n')
    clean_exit(invoke("check", "--world", str(world), "--config", str(mine)), 0)


def test_check_prints_the_effective_endpoint_and_key_variable(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("MY_KEY", raising=False)
    result = invoke("check", "--world", str(world))
    clean_exit(result, 0)
    assert "endpoint: none (offline provider" in result.output
    mine = tmp_path / "mine.toml"
    mine.write_text('[llm]\nprovider = "openai"\napi_key_env = "MY_KEY"\n')
    result = invoke("check", "--world", str(world), "--config", str(mine))
    clean_exit(result, 0)
    assert "endpoint: https://api.openai.com/v1" in result.output
    assert "api key: from $MY_KEY (not set)" in result.output


def test_storage_never_follows_a_link_swapped_in_after_load(world: Path, outside: Path) -> None:
    """No check-then-open: a file replaced by a link between load and commit is refused."""
    storage = Storage(world)
    loaded = storage.load()
    loaded.characters["ada"]["state"]["mood"] = "swapped"
    (world / ADA).unlink()
    (world / ADA).symlink_to(outside / "o.json")
    with pytest.raises(Exception, match="symlink"):
        storage.commit(loaded)
    assert (outside / "o.json").read_text() == '{"precious": true}\n'


def test_a_fifo_or_link_posing_as_a_tick_log_never_hangs_or_writes_out(
    world: Path, outside: Path
) -> None:
    (world / ".sim" / "log").mkdir(parents=True)
    os.mkfifo(world / ".sim" / "log" / "tick-000001.jsonl")
    result = invoke("tick", "--world", str(world))  # would block forever reading the FIFO
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1, 2), result.output
    for left in (world / ".sim" / "log").glob("tick-000001.*"):
        left.unlink()  # the FIFO, or the log (and summary) of the tick it let run
    target = outside / "o.json"
    before = target.read_bytes()
    tick = orjson.loads((world / "world.json").read_bytes())["tick"] + 1
    (world / ".sim" / "log" / f"tick-{tick:06d}.jsonl").symlink_to(target)
    result = invoke("tick", "--world", str(world))
    assert "Traceback" not in result.output
    assert target.read_bytes() == before


def test_commands_that_send_nothing_read_a_routing_world_config(world: Path) -> None:
    """`sim usage` and an offline `sim replay` send no request, so no key can be misrouted."""
    clean_exit(invoke("tick", "--world", str(world)), 0)
    (world / "config.toml").write_text(ROUTE)
    clean_exit(invoke("usage", "--world", str(world)), 0)
    clean_exit(invoke("replay", "--world", str(world), "--tick", "1"), 0)
    clean_exit(invoke("replay", "--world", str(world), "--tick", "1", "--live"), 2)


def test_check_prints_each_phase_endpoint_that_differs(world: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        '[phase2b]\nprovider = "chat"\nbase_url = "http://127.0.0.1:8000/v1"\n'
        'api_key_env = "LOCAL_KEY"\n'
    )
    result = invoke("check", "--world", str(world), "--config", str(mine))
    clean_exit(result, 0)
    assert "endpoint: none (offline provider" in result.output
    assert (
        "endpoint of phase narrative: http://127.0.0.1:8000/v1, api key from $LOCAL_KEY"
        in result.output
    )


def test_a_world_may_always_choose_the_offline_provider(world: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('[llm]\nprovider = "chat"\nbase_url = "http://127.0.0.1:9/v1"\n')
    (world / "config.toml").write_text('[llm]\nprovider = "offline"\n')
    result = invoke("check", "--world", str(world), "--config", str(mine))
    clean_exit(result, 0)
    assert "endpoint: none (offline provider" in result.output


def test_a_link_planted_as_the_new_log_temp_file_is_not_written_through(
    world: Path, outside: Path
) -> None:
    (world / ".sim" / "log").mkdir(parents=True)
    target = outside / "o.json"
    before = target.read_bytes()
    (world / ".sim" / "log" / "tick-000001.jsonl.tmp").symlink_to(target)
    clean_exit(invoke("tick", "--world", str(world)), 0)
    assert target.read_bytes() == before
