"""With the offline provider, the same world, config and seed give the same tick logs and
summaries whatever the processes' str hash seed (``PYTHONHASHSEED``): byte for byte but
for the fields documented to differ between two runs of one tick (``RUN_FIELDS``: the
clock's readings and the run's idempotency nonce); and so the same ``sim log``,
``sim usage`` and ``sim replay``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import WORLDS

from sim.testing.logs import comparable
from sim.ticklog.format import LOG_DIR
from sim.ticklog.reader import read_log_bytes

#: what a user reads of a world's logs (``sim log --tick all``'s wall time left out)
VIEWS = (
    ("log",),
    ("log", "--calls"),
    ("log", "--tick", "all"),
    ("usage",),
    ("usage", "--by", "model"),
    ("replay", "--tick", "1", "--to", "2"),
)
_WALL = re.compile(r" +[0-9.]+s$", re.MULTILINE)


def _sim(*args: str, hash_seed: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "sim", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


@pytest.mark.parametrize("name", ["demo", "harvest-vote", "minds"])
def test_two_ticks_under_other_hash_seeds_write_the_same_logs(tmp_path: Path, name: str) -> None:
    files: dict[str, dict[str, bytes]] = {}
    views: dict[str, list[str]] = {}
    scopes: dict[str, str] = {}
    for hash_seed in ("1", "2"):
        # the same path for both runs: only the hash seed differs
        world = tmp_path / "w"
        shutil.rmtree(world, ignore_errors=True)
        shutil.copytree(WORLDS / name, world)
        _sim("tick", "--world", str(world), "--ticks", "2", hash_seed=hash_seed)
        files[hash_seed] = {
            path.relative_to(world).as_posix(): (
                comparable(path) if LOG_DIR in path.as_posix() else path.read_bytes()
            )
            for path in sorted(world.rglob("*"))
            if path.is_file()
        }
        views[hash_seed] = [
            _WALL.sub("", _sim(*view, "--world", str(world), hash_seed=hash_seed).stdout)
            for view in VIEWS
        ]
        head = orjson.loads(read_log_bytes(world / LOG_DIR / "tick-000001.jsonl").split(b"\n")[0])
        scopes[hash_seed] = head["scope"]
    assert sorted(files["1"]) == sorted(files["2"])
    assert any(LOG_DIR in rel for rel in files["1"])  # the logs and summaries were compared
    for rel, data in files["1"].items():
        assert data == files["2"][rel], rel
    for view, one, two in zip(VIEWS, views["1"], views["2"], strict=True):
        assert one == two, view
    assert "tick 2: identical" in views["1"][-1]
    # the scope is the run's own (a tick run again asks a provider's cache afresh)
    assert scopes["1"] != scopes["2"]
