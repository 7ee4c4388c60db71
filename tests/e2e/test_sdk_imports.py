"""A tick imports only what it uses: an offline tick, and an openai or chat tick, streamed
or not, with the Batch API or not, never load the OpenAI SDK (~0.4 s of CPU at start-up):
the SDK is only for a client a user hands in. Each tick runs in a fresh Python against
the stub server on 127.0.0.1, and reports what it loaded (``sys.modules``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.testing.stub_server import StubServer

ROOT = Path(__file__).resolve().parents[2]

#: runs ``sim tick`` with the arguments in argv, then prints its result and the modules
#: of interest that were loaded
SCRIPT = """
import json, os, sys
if os.environ.get("SIM_TEST_PRELOAD"):
    __import__(os.environ["SIM_TEST_PRELOAD"])
from sim.cli import main
try:
    main(['tick', *sys.argv[1:]])
except SystemExit as stop:
    code = stop.code
else:
    code = 0
loaded = [m for m in ('openai', 'anthropic', 'google.genai') if m in sys.modules]
print(json.dumps({'exit': code, 'loaded': loaded}))
"""


def tick_in_a_fresh_python(world: Path, *args: str, preload: str = "") -> dict[str, object]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env.update(OPENAI_API_KEY="sk-test", PYTHONPATH=str(ROOT), SIM_TEST_PRELOAD=preload)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "--world", str(world), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=world.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit"] == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return result


def test_an_offline_tick_imports_no_sdk(demo_world: Path) -> None:
    assert tick_in_a_fresh_python(demo_world, "--provider", "offline")["loaded"] == []


@pytest.mark.parametrize("provider", ["openai", "chat"])
def test_a_tick_on_a_direct_url_imports_no_sdk(
    demo_world: Path, stub_server: StubServer, provider: str
) -> None:
    result = tick_in_a_fresh_python(
        demo_world, "--provider", provider, "--base-url", stub_server.base_url
    )
    assert result["loaded"] == []
    assert stub_server.stats.generations > 0  # the tick did go over HTTP


def test_a_streamed_tick_imports_no_sdk(demo_world: Path, stub_server: StubServer) -> None:
    """Streams are read by the HTTP routes too (``http.Route.stream``)."""
    result = tick_in_a_fresh_python(
        demo_world, "--provider", "openai", "--base-url", stub_server.base_url, "--stream"
    )
    assert result["loaded"] == []
    assert stub_server.log and all(body.get("stream") is True for body in stub_server.log)


@pytest.mark.parametrize("provider", ["openai", "chat"])
def test_a_batch_tick_imports_no_sdk(
    demo_world: Path, stub_server: StubServer, provider: str
) -> None:
    """The Batch API's files, batches and polls go on the adapter's own routes."""
    (demo_world / "config.toml").write_text("[llm]\nbatch_poll_seconds = 0.05\n")
    result = tick_in_a_fresh_python(
        demo_world, "--provider", provider, "--base-url", stub_server.base_url, "--batch"
    )
    assert result["loaded"] == []
    assert stub_server.batches.generated  # the tick's calls did go through a batch


def test_the_check_sees_a_loaded_sdk(demo_world: Path, stub_server: StubServer) -> None:
    """The control: the same tick with the SDK imported first reports it."""
    result = tick_in_a_fresh_python(
        demo_world, "--provider", "openai", "--base-url", stub_server.base_url, preload="openai"
    )
    assert result["loaded"] == ["openai"]
