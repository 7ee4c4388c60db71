"""Credentials written into a ``base_url`` (``http://user:pw@host``, ``?api-key=...``) are
never printed or stored (issue 24, item 8): ``sim check``, the tick's output and its log,
``sim usage --by endpoint`` and error messages show them as ``***``. Real ``sim``
processes against the stub server on loopback; every file the run leaves is searched."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_demo

from sim.llm.redact import redact_text, redact_url
from sim.testing.stub_server import StubServer
from sim.ticklog.reader import read_log_bytes

SECRETS = ("PWSECRET", "QSECRET", "TSECRET", "KSECRET")


def with_credentials(base_url: str) -> str:
    """The stub's URL with a user, a password and three credential query parameters."""
    scheme, _, rest = base_url.partition("://")
    return f"{scheme}://alice:PWSECRET@{rest}?api-key=QSECRET&token=TSECRET&key=KSECRET"


def sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "OPENAI_API_KEY": "sk-test"},
        timeout=120,
    )


def stored_text(world: Path) -> str:
    """Every file under the world's ``.sim``, decompressed where it is a compressed log."""
    texts = []
    for path in sorted((world / ".sim").rglob("*")):
        if not path.is_file():
            continue
        if path.name.endswith((".jsonl", ".jsonl.zst")):
            data = read_log_bytes(path)
        elif path.name.endswith(".gz"):
            data = gzip.decompress(path.read_bytes())
        else:
            data = path.read_bytes()
        texts.append(data.decode("utf-8", "replace"))
    return "\n".join(texts)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, text


def config(tmp_path: Path, base_url: str | list[str], extra: str = "") -> Path:
    value = f'"{base_url}"' if isinstance(base_url, str) else repr(base_url).replace("'", '"')
    path = tmp_path / "user.toml"
    path.write_text(f'[llm]\nprovider = "chat"\nbase_url = {value}\n{extra}')
    return path


def test_check_tick_log_and_usage_never_show_url_credentials(
    tmp_path: Path, stub_server: StubServer
) -> None:
    world = copy_demo(tmp_path / "w")
    url = with_credentials(stub_server.base_url)
    user = config(tmp_path, url)
    checked = sim("check", "--world", str(world), "--config", str(user), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "endpoint: http://***@127.0.0.1:" in checked.stdout
    assert "api-key=***&token=***&key=***" in checked.stdout
    as_json = sim("check", "--world", str(world), "--config", str(user), "--json", cwd=tmp_path)
    ticked = sim("tick", "--world", str(world), "--config", str(user), "--json", cwd=tmp_path)
    assert ticked.returncode == 0, ticked.stderr
    assert stub_server.stats.generations == 22  # the calls went to the server
    usage = sim("usage", "--world", str(world), "--by", "endpoint", cwd=tmp_path)
    assert usage.returncode == 0, usage.stderr
    assert "http://***@127.0.0.1:" in usage.stdout and " 22 " in usage.stdout
    logged = stored_text(world)
    assert "127.0.0.1" in logged  # the server is recorded, its credentials are not
    assert_no_secret(
        checked.stdout,
        checked.stderr,
        as_json.stdout,
        ticked.stdout,
        ticked.stderr,
        usage.stdout,
        logged,
    )


def test_a_pool_given_on_the_command_line_is_redacted_too(
    tmp_path: Path, stub_server: StubServer
) -> None:
    world = copy_demo(tmp_path / "w")
    url = with_credentials(stub_server.base_url)
    other = url.replace("127.0.0.1", "localhost")
    flags = ("--provider", "chat", "--base-url", f"{url},{other}")
    ticked = sim("tick", "--world", str(world), *flags, cwd=tmp_path)
    assert ticked.returncode == 0, ticked.stderr
    usage = sim("usage", "--world", str(world), "--by", "endpoint", cwd=tmp_path)
    logs = sim("log", "--world", str(world), "--tick", "1", "--calls", cwd=tmp_path)
    assert "***@" in usage.stdout
    assert_no_secret(ticked.stdout, ticked.stderr, usage.stdout, logs.stdout, stored_text(world))


def test_an_error_naming_the_server_hides_its_credentials(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    world = copy_demo(tmp_path / "w")
    user = config(
        tmp_path,
        with_credentials(f"http://127.0.0.1:{port}/v1"),
        'transient_retries = 0\nconnect_timeout_seconds = 2\nllm_failure_policy = "fail"\n',
    )
    ticked = sim("tick", "--world", str(world), "--config", str(user), cwd=tmp_path)
    assert ticked.returncode == 1, ticked.stdout + ticked.stderr
    assert f"127.0.0.1:{port}" in ticked.stdout + ticked.stderr  # the server is named
    assert_no_secret(ticked.stdout, ticked.stderr, stored_text(world))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@h:8000/v1", "http://***@h:8000/v1"),
        ("http://TOKEN@h/v1", "http://***@h/v1"),
        ("https://h/v1?api-key=s&x=1", "https://h/v1?api-key=***&x=1"),
        (
            "https://h/v1?apiKey=s&access_token=t&sig=u",
            "https://h/v1?apiKey=***&access_token=***&sig=***",
        ),
        ("https://h/v1?key=s", "https://h/v1?key=***"),
        ("https://api.openai.com/v1", "https://api.openai.com/v1"),
        ("http://localhost:11434/v1?model=x", "http://localhost:11434/v1?model=x"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_finds_every_url_in_a_message() -> None:
    text = "cannot connect to http://a:SECRET@h:1/v1 or https://g/v1?token=SECRET (refused)"
    assert redact_text(text) == (
        "cannot connect to http://***@h:1/v1 or https://g/v1?token=*** (refused)"
    )


def test_the_logged_config_masks_credentials_the_plain_one_reads_back() -> None:
    from sim.config import Config, loggable, redacted

    url = "http://alice:PWSECRET@gpu1:8000/v1?api-key=QSECRET"
    config = Config.model_validate(
        {"llm": {"provider": "chat", "base_url": [url, "http://gpu2:8000/v1"]}}
    )
    # a config written out to be read back (a sweep run's) keeps the URL it must reach
    assert Config.model_validate(redacted(config)) == config
    logged = loggable(config)
    assert logged["llm"]["base_url"] == [
        "http://***@gpu1:8000/v1?api-key=***",
        "http://gpu2:8000/v1",
    ]
    assert_no_secret(str(logged))
