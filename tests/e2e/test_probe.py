"""``sim check --provider/--base-url/--model`` probes the endpoint before a tick is paid for
(issue 35): reachable, key accepted, model served, the structured-output form it takes, its
slots; a closed port is named. Against the project's stub server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.testing.stub_server import ServerThread, StubOptions, StubServer


def check(world: Path, *args: str, key: str | None = None) -> tuple[int, str]:
    env = {"OPENAI_API_KEY": key}
    result = CliRunner().invoke(main, ["check", "--world", str(world), *args], env=env)
    return result.exit_code, result.output


def steps(output: str) -> dict[str, str]:
    lines = output.split("\nprobe: ", 1)[1].splitlines()[1:]
    return dict(line.strip().split(": ", 1) for line in lines if line.startswith("  "))


def test_a_local_server_is_probed_as_a_tick_would_find_it(demo_world: Path) -> None:
    server = StubServer(
        StubOptions(reject_json_schema=True, slots=1, capacity_report="llama-cpp-python")
    )
    with ServerThread(server) as running:
        url = running.base_url
        code, out = check(demo_world, "--provider", "chat", "--base-url", url, "--model", "gemma")
    assert code == 0, out
    found = steps(out)
    assert found["reachable"] == "yes"
    assert found["key"].startswith("not needed")
    assert found["model"] == "served (answered as 'gemma')"
    assert found["structured output"].startswith(
        "json_object_schema (rejected json_schema (HTTP 500 naming response_format))"
    )
    assert found["slots"] == "1 (llama-cpp-python serves one request at a time)"
    # one refused form and one answer: two generation requests, nothing more
    assert len(server.log) == 2


def test_a_server_that_takes_json_schema_costs_one_request(
    demo_world: Path, stub_server: StubServer
) -> None:
    url = stub_server.base_url
    code, out = check(demo_world, "--provider", "openai", "--base-url", url, key="any")
    assert code == 0, out
    found = steps(out)
    assert found["key"] == "accepted"
    assert found["structured output"] == "json_schema"
    assert found["slots"].startswith("not reported")
    assert len(stub_server.log) == 1


def test_a_closed_port_is_named(demo_world: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on: bound, then closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    code, out = check(demo_world, "--provider", "chat", "--base-url", url)
    assert code == 2
    found = steps(out)
    assert found["reachable"].startswith("no: ")
    assert f"127.0.0.1:{port}" in found["reachable"]
    assert "key" not in found  # nothing past the first failure is claimed
    assert "the endpoint probe failed" in out


def test_a_refused_key_is_named(demo_world: Path, stub_server: StubServer) -> None:
    stub_server.enqueue("auth")
    url = stub_server.base_url
    code, out = check(demo_world, "--provider", "openai", "--base-url", url, key="sk-wrong")
    assert code == 2
    found = steps(out)
    assert found["reachable"] == "yes"
    assert found["key"].startswith("refused: ") and "OPENAI_API_KEY" in found["key"]
    assert "sk-wrong" not in out  # the key is never printed


def test_a_model_the_server_does_not_serve_is_named(
    demo_world: Path, stub_server: StubServer
) -> None:
    stub_server.model_faults["no-such-model"] = "model_not_found"
    args = ("--provider", "chat", "--base-url", stub_server.base_url, "--model", "no-such-model")
    code, out = check(demo_world, *args)
    assert code == 2
    found = steps(out)
    assert found["key"].startswith("not needed")
    assert found["model"].startswith("not served: ") and "no-such-model" in found["model"]


def test_a_missing_key_is_named_before_anything_is_sent(
    demo_world: Path, stub_server: StubServer
) -> None:
    code, out = check(demo_world, "--provider", "openai", "--base-url", stub_server.base_url)
    assert code == 2
    assert "no API key" in steps(out)["key"]
    assert len(stub_server.log) == 0


def test_the_probe_in_json(demo_world: Path, stub_server: StubServer) -> None:
    url = stub_server.base_url
    code, out = check(demo_world, "--provider", "chat", "--base-url", url, "--json")
    assert code == 0, out
    probe = json.loads(out)["probe"]
    assert probe["ok"] and probe["steps"]["reachable"] == "yes"
    stub_server.enqueue("auth")
    code, out = check(demo_world, "--provider", "chat", "--base-url", url, "--json")
    assert code == 2
    document = json.loads(out)
    assert document["ok"] is False and document["probe"]["ok"] is False


@pytest.mark.parametrize("args", [(), ("--probe",)])
def test_offline_has_nothing_to_probe_and_check_alone_sends_nothing(
    demo_world: Path, args: tuple[str, ...]
) -> None:
    code, out = check(demo_world, *args)
    assert code == 0, out
    assert ("probe:" in out) == bool(args)
    if args:
        assert steps(out) == {"reachable": "offline: no server to probe"}
