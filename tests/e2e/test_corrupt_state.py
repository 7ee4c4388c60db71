"""Nothing gets stuck: corrupt input and engine state are found by `sim check` before any
call is paid for, repaired where that is safe, refused by name otherwise; OS errors and
signals end a command with one line and a documented exit code, never a traceback."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from conftest import copy_demo, tree

from sim.cli import main
from sim.storage import Storage

ADA = "characters/ada.json"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def clean_exit(result: Result, code: int) -> None:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output


@pytest.fixture
def world(tmp_path: Path) -> Path:
    return copy_demo(tmp_path / "w")


def ticked(world: Path, n: int = 2) -> Path:
    clean_exit(invoke("tick", "--world", str(world), "--ticks", str(n)), 0)
    return world


def edit(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    data = orjson.loads(path.read_bytes())
    change(data)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")


# -- repaired: damaged engine state -----------------------------------------------------------


def _store_files(world: Path) -> list[Path]:
    return sorted((world / ".sim" / "responses").rglob("*.json"))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: raw[: len(raw) // 2], id="truncated"),
        pytest.param(lambda raw: b"[1, 2, 3]\n", id="not-an-object"),
        pytest.param(lambda raw: b'{"resp_1": {"input": 5}}\n', id="bad-entry"),
    ],
)
def test_a_damaged_store_file_is_found_by_check_and_repaired_by_tick(world: Path, damage) -> None:  # type: ignore[no-untyped-def]
    ticked(world)
    store = _store_files(world)[0]
    chain, eid = store.parent.name, store.stem
    store.write_bytes(damage(store.read_bytes()))
    before = tree(world, logs=True)
    result = invoke("check", "--world", str(world))
    clean_exit(result, 0)
    assert f"repair: {store}" in result.output and "restarts that chain empty" in result.output
    assert tree(world, logs=True) == before  # check writes nothing
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 0)
    assert f"repaired: {store}" in result.output
    kind = "characters" if (world / "characters" / f"{eid}.json").exists() else "locations"
    entity = orjson.loads((world / kind / f"{eid}.json").read_bytes())
    chain_now = entity["_openai"][f"{chain}_chain"]
    assert len(chain_now) <= 1  # restarted empty, then this tick's answer
    if store.exists():
        assert isinstance(orjson.loads(store.read_bytes()), dict)
    clean_exit(invoke("check", "--world", str(world)), 0)
    assert "repair" not in invoke("check", "--world", str(world)).output


@pytest.mark.parametrize(
    "garbage",
    [5, "chains", {"resolution_chain": "resp_x"}, {"usage": [1, 2]}],
    ids=["number", "text", "chain-not-list", "usage-not-object"],
)
def test_a_garbage_openai_field_is_found_and_repaired(world: Path, garbage: object) -> None:
    ticked(world, 1)
    edit(world / "locations" / "quay.json", lambda d: d.__setitem__("_openai", garbage))
    result = invoke("check", "--world", str(world))
    clean_exit(result, 0)
    assert "locations/quay.json: field '_openai" in result.output
    result = invoke("tick", "--world", str(world), "--ticks", "2")
    clean_exit(result, 0)
    assert "repaired: " in result.output
    state = orjson.loads((world / "locations" / "quay.json").read_bytes())["_openai"]
    assert isinstance(state, dict)
    assert all(isinstance(v, list) for k, v in state.items() if k.endswith("_chain"))


def test_a_damaged_pending_deletions_list_is_reported(world: Path) -> None:
    (world / ".sim").mkdir()
    (world / ".sim" / "pending_deletions.json").write_text("[1, 2]")
    result = invoke("check", "--world", str(world))
    clean_exit(result, 0)
    assert "pending_deletions.json" in result.output
    clean_exit(invoke("tick", "--world", str(world)), 0)


# -- refused: input a tick could not save or read --------------------------------------------


def _nested(depth: int, leaf: object) -> object:
    value: object = leaf
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.__setitem__("notes", _nested(300, 1)), "nested 301 levels deep"),
        (lambda d: d.__setitem__("notes", _nested(1000, 2**70)), "nested 1001 levels deep"),
    ],
    ids=["unknown-field-300-deep", "1000-deep-big-int"],
)
def test_deep_nesting_is_refused_by_check_before_any_call(
    world: Path, change, expected: str
) -> None:  # type: ignore[no-untyped-def]
    path = world / ADA
    data = orjson.loads(path.read_bytes())
    change(data)
    path.write_bytes(_deep_text(data))
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert f"{path}: {expected}" in result.output
    assert not (world / ".sim" / "log").exists()  # no tick started, nothing paid for


def _deep_text(data: dict[str, object]) -> bytes:
    """orjson refuses to write >254 levels; build the text by hand."""
    notes = data.pop("notes")
    depth = 0
    while isinstance(notes, dict):
        notes = notes["x"]
        depth += 1
    inner = orjson.dumps(data)[:-1]
    return inner + b',"notes":' + b'{"x":' * depth + str(notes).encode() + b"}" * depth + b"}"


def test_duplicate_keys_in_an_entity_file_are_refused(world: Path) -> None:
    path = world / ADA
    text = path.read_text()
    path.write_text(text.replace('"mood":', '"mood": "first",\n    "mood":', 1))
    result = invoke("check", "--world", str(world))
    clean_exit(result, 2)
    assert f"{path}: key 'mood' appears twice in one object" in result.output


def test_a_colon_after_a_quote_in_text_is_not_a_duplicate(world: Path) -> None:
    edit(world / ADA, lambda d: d["state"].__setitem__("mood", 'she said "no": twice'))
    clean_exit(invoke("check", "--world", str(world)), 0)


def test_a_missing_entity_folder_is_an_error(world: Path) -> None:
    for ch in (world / "characters").iterdir():
        ch.unlink()
    (world / "characters").rmdir()
    result = invoke("check", "--world", str(world))
    clean_exit(result, 2)
    assert f"{world / 'characters'}: the characters/ folder is missing" in result.output
    (world / "characters").mkdir()  # an empty cast is an empty folder
    clean_exit(invoke("check", "--world", str(world)), 0)


def test_an_entity_file_over_the_size_limit_is_refused_by_name(world: Path, tmp_path: Path) -> None:
    edit(world / ADA, lambda d: d.__setitem__("notes", "x" * 5000))
    mine = tmp_path / "mine.toml"
    mine.write_text("[limits]\nmax_entity_bytes = 4096\n")
    result = invoke("check", "--world", str(world), "--config", str(mine))
    clean_exit(result, 2)
    assert (
        f"{world / ADA}: file is" in result.output
        and "over the limit of 4096 ([limits] max_entity_bytes in config.toml)" in result.output
    )
    clean_exit(invoke("check", "--world", str(world)), 0)  # the default is 8 MiB


def test_a_non_utf8_prompt_is_found_by_check(world: Path) -> None:
    (world / "prompts").mkdir()
    (world / "prompts" / "memory.md").write_bytes(b"Summarise \xff\xfe the cell.\n")
    for command in ("check", "tick"):
        result = invoke(command, "--world", str(world))
        clean_exit(result, 2)
        assert "prompts/memory.md: not UTF-8 text" in result.output
    assert not (world / ".sim" / "log").exists()


# -- config -----------------------------------------------------------------------------------


def test_config_types_are_strict_and_every_error_is_reported_at_once(
    world: Path, tmp_path: Path
) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('[llm]\nmax_concurrency = "16"\ntimeout_seconds = inf\n')
    (world / "config.toml").write_text("[llm]\ntransient_retries = true\n[phase1]\ntemp = 1\n")
    result = invoke("check", "--world", str(world), "--config", str(mine))
    clean_exit(result, 2)
    assert "4 problems" in result.output
    assert f"{mine}: field 'llm.max_concurrency'" in result.output
    assert f"{mine}: field 'llm.timeout_seconds': expected a finite number" in result.output
    assert f"{world / 'config.toml'}: field 'llm.transient_retries'" in result.output
    assert f"{world / 'config.toml'}: field 'phase1.temp': unknown key" in result.output


def test_server_chains_need_a_provider_that_keeps_them(world: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('[llm]\nprovider = "chat"\nchain_mode = "server"\n')
    result = invoke("check", "--world", str(world), "--config", str(mine))
    clean_exit(result, 2)
    assert "field 'llm.chain_mode': provider 'chat' cannot keep chains on its server" in (
        result.output
    )


# -- running, signals, OS errors --------------------------------------------------------------


def test_check_says_running_while_another_process_holds_the_world(world: Path) -> None:
    ticked(world, 1)
    script = (
        "import sys, time; from pathlib import Path; from sim.storage import Storage\n"
        "with Storage(Path(sys.argv[1])).lock():\n"
        "    print('locked', flush=True); time.sleep(30)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(world)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        result = invoke("check", "--world", str(world))
        clean_exit(result, 0)
        assert "running: another sim process is running this world now" in result.output
        assert "interrupted" not in result.output
    finally:
        holder.kill()
        holder.wait()


def test_sigterm_is_treated_like_ctrl_c(world: Path, stub_server) -> None:  # type: ignore[no-untyped-def]
    stub_server.options.latency = 3.0
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [
            *(sys.executable, "-m", "sim", "tick", "--world", str(world)),
            *("--provider", "chat", "--base-url", stub_server.base_url),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 20
    while stub_server.stats.requests == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stub_server.stats.requests > 0
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=20)
    assert child.returncode == 143, (out, err)
    assert "interrupted: nothing was committed for tick 1" in err
    assert "sim tick --world" in err and "Traceback" not in err
    assert Storage(world).load().tick == 0


@pytest.mark.parametrize("where", ["os.replace", "os.pwrite"])
def test_a_full_disk_is_one_line_nothing_torn_and_the_tick_resumes(
    world: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """ENOSPC injected at the journal's rename (before the commit point) or at the files'
    in-place writes (after it). As root, a read-only folder cannot be simulated with chmod;
    this injects the error at the write points instead."""
    import sim.safefs
    import sim.storage.journal

    _module, name = where.split(".")
    real = getattr(os, name)
    calls = {"n": 0}

    def full(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        raise OSError(errno.ENOSPC, "No space left on device", str(world))

    before = tree(world)
    monkeypatch.setattr(sim.storage.journal.os, name, full) if where == "os.replace" else None
    monkeypatch.setattr(sim.safefs.os, name, full) if where == "os.pwrite" else None
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 1)
    assert calls["n"] >= 1
    lines = [line for line in result.output.splitlines() if line.startswith("failed:")]
    assert len(lines) == 1 and "the disk is full" in lines[0], result.output
    monkeypatch.setattr(sim.storage.journal.os, name, real)
    monkeypatch.setattr(sim.safefs.os, name, real)
    after_fail = Storage(world).load()
    assert after_fail.tick in (0, 1)  # tick 0, or tick 1 read through the committed journal
    if where == "os.replace":
        assert tree(world) == before  # failed before the commit point: nothing written
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 0)
    assert Storage(world).load().tick == after_fail.tick + 1


def test_no_traceback_for_an_unexpected_error(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.engine.runner

    def boom(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyError("surprise")

    monkeypatch.setattr(sim.engine.runner.Runner, "run", boom)
    result = invoke("tick", "--world", str(world))
    clean_exit(result, 1)
    assert "internal error: KeyError" in result.output


@pytest.mark.parametrize(
    "text",
    [
        '"mood" : "a", "mood" : "b"',  # blanks before the colon
        '"mood": "a", "m\\u006fod": "b"',  # the same key spelled with an escape
        '"mood": "a", "mood": "b", "note": "x\\u0022: y"',  # an escaped quote-colon in text
        '"mood":"a",\n"mood"\n:"b"',
    ],
    ids=["blank-colon", "escaped-key", "escaped-quote-colon", "newline-colon"],
)
def test_duplicate_keys_are_found_however_they_are_written(world: Path, text: str) -> None:
    path = world / ADA
    raw = path.read_text()
    path.write_text(raw.replace('"mood": "suspicious and alert"', text, 1))
    result = invoke("check", "--world", str(world))
    clean_exit(result, 2)
    assert "key 'mood' appears twice in one object" in result.output


def test_a_read_only_world_is_one_line_and_the_tick_runs_once_writable(
    tmp_path: Path,
) -> None:
    """A real read-only bind mount (needs root and mount; skipped elsewhere): as root,
    chmod cannot make a folder read-only."""
    src = copy_demo(tmp_path / "src")
    ticked(src, 1)
    view = tmp_path / "ro"
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(src), str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.decode().strip()}")
    try:
        remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True)
        if remount.returncode != 0:
            pytest.skip("cannot remount read-only here")
        before = tree(src, logs=True)
        result = invoke("tick", "--world", str(view))
        clean_exit(result, 1)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert any("the filesystem is read-only" in line for line in lines), result.output
        assert tree(src, logs=True) == before
        clean_exit(invoke("check", "--world", str(view)), 0)  # reading still works
    finally:
        subprocess.run(["umount", str(view)], check=False)
    clean_exit(invoke("tick", "--world", str(src)), 0)
    assert Storage(src).load().tick == 2
