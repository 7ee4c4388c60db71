"""The ``openai`` provider against a real Responses API server: llama-stack 0.7.3 (from
the package index, ``make stack-env``) over llama-cpp-python's server running Gemma 3 270M.

Run by ``make test-model`` (CI runs it). Each test drives the real CLI for two ticks of a
two-character scratch copy of the demo world, chaining the narrative at depth 1, in one
``chain_mode``. What the stack keeps is read back from it: the responses it stores
(``GET /responses/{id}``, ``/input_items``) and the chat completions it sent the model
(``GET /chat/completions``: llama-stack stores each one with the messages it sent).

The server's quirks, and what the engine does with them: ``json_schema`` is refused
(llama-cpp-python's HTTP 500, passed on) and a ``json_object``'s schema is dropped, so
``auto`` settles on the forced function call; ``usage`` is null, so server chains cannot
be checked and the summary says so; ``max_output_tokens`` reaches llama-cpp-python as
``max_completion_tokens``, which it ignores, so the stack caps every answer itself
(``LlamaStack``'s ``max_tokens``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from test_real_model import calls, scratch, sim

from sim.storage import Storage
from sim.testing.llama_server import LlamaServer, ModelUnavailable, model_python
from sim.testing.llama_stack import LlamaStack, stack_python, tiktoken_dir

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
PHASES = ("phase1", "phase2a", "phase2b", "phase4")


@pytest.fixture(scope="module")
def stack() -> Iterator[LlamaStack]:
    """llama-stack over llama-cpp-python's server, both on free loopback ports.

    Unavailable (no ``.venv-model`` or ``.venv-stack``, no tiktoken file, a server not
    starting): skipped with the reason, but failed in CI (``CI=true``).
    """
    try:
        with LlamaServer(model_python(REPO)) as chat_url:
            server = LlamaStack(stack_python(REPO), chat_url, tiktoken_dir(REPO), max_tokens=300)
            with server:
                yield server
    except ModelUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the llama-stack tests cannot run in CI: {exc}", pytrace=False)
        pytest.skip(str(exc))


def configure(world: Path, stack: LlamaStack, chain_mode: str) -> Path:
    """Defaults except: the ``openai`` provider at the stack, ``auto``, the chain mode, the
    stack's model name, a narrative chained at depth 1 (and no other chain), one re-ask,
    and no abort for this small model's failures (what is under test is the server's
    part). No ``max_output_tokens``: it would not reach the model (the stack caps)."""
    lines = [
        "[llm]",
        'provider = "openai"',
        f'base_url = "{stack.base_url}"',
        'structured_output = "auto"',
        f'chain_mode = "{chain_mode}"',
        "max_failed_fraction = 1.0",
        "max_content_failed_fraction = 1.0",
        "json_max_retries = 1",  # fewer re-asks: each answer takes 10-60 s here
    ]
    for phase in PHASES:
        lines += [f"[{phase}]", f'model = "{stack.model}"']
        lines += ["response_chain_depth = 1"] if phase == "phase2b" else []
        lines += ["response_chain_depth = 0"] if phase == "phase2a" else []
    (world / "config.toml").write_text("\n".join(lines) + "\n")
    return world


def stored(stack: LlamaStack, path: str) -> httpx2.Response:
    return httpx2.get(f"{stack.base_url}{path}", timeout=30)


def texts(messages: list[dict[str, Any]]) -> str:
    """The text of messages (or Responses input items), one per line."""
    lines = []
    for message in messages:
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"text": content}]
        lines += [str(part.get("text") or "") for part in parts if isinstance(part, dict)]
    return "\n".join(lines)


def sent_to_model(stack: LlamaStack) -> list[str]:
    """The text of each chat completion the stack sent the model."""
    listed = stored(stack, "/chat/completions?limit=1000")
    assert listed.status_code == 200, listed.text
    return [texts(c.get("input_messages") or []) for c in listed.json()["data"]]


def two_ticks(tmp_path: Path, stack: LlamaStack, chain_mode: str) -> tuple[Path, list[str]]:
    world = configure(scratch(tmp_path, keep=("bram", "corin")), stack, chain_mode)
    outputs = []
    for _ in range(2):
        result = sim("tick", "--world", str(world), "--trust-world-config")
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    assert Storage(world).load().tick == 2  # both committed
    for output in outputs:
        for bad in ("circuit_open", "server_error", "timeout", "api_error", "deletions:"):
            assert bad not in output, output
    # auto found the form the stack honours: json_schema refused, json_object's schema
    # dropped, the forced function call taken (said by each run: each `sim tick` probes)
    assert "rejected json_schema (HTTP 500 naming format)" in outputs[0]
    assert "rejected json_object_schema (answered outside the schema" in outputs[0]
    assert "using tool for the rest of the run" in outputs[0]
    return world, outputs


def narratives(world: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tick 1's and tick 2's narrative call (one place: one each), both answered."""
    first, second = ([c for c in calls(world, t) if c["phase"] == "narrative"] for t in (1, 2))
    assert len(first) == len(second) == 1
    assert first[0]["error_code"] is None, first[0]
    assert second[0]["error_code"] is None, second[0]
    return first[0], second[0]


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "local")  # the stack asks for none


def test_window_chains_reach_the_model_and_nothing_is_stored(
    stack: LlamaStack, tmp_path: Path
) -> None:
    world, _ = two_ticks(tmp_path, stack, "window")
    first, second = narratives(world)
    # the engine sent tick 1's exchange itself, and chained nothing at the server
    assert second["depth"] == 1 and second["history"] == [first["response_id"]]
    assert second["previous_response_id"] is None
    # store: false: the stack kept neither answer
    for call in (first, second):
        assert stored(stack, f"/responses/{call['response_id']}").status_code == 404
    # the model was sent tick 1's narrative input along with tick 2's
    assert any(first["input"] in m and second["input"] in m for m in sent_to_model(stack))


def test_server_chains_reach_the_model_and_evicted_responses_are_deleted(
    stack: LlamaStack, tmp_path: Path
) -> None:
    world, outputs = two_ticks(tmp_path, stack, "server")
    first, second = narratives(world)
    assert second["previous_response_id"] == first["response_id"]
    # usage is null: whether the stack keeps chains cannot be told from it, and is said
    assert "reports no token usage, so whether it keeps chains" in outputs[1]
    # ... but it does: the chained response's stored input holds tick 1's exchange
    items = stored(stack, f"/responses/{second['response_id']}/input_items")
    assert items.status_code == 200, items.text
    held = texts(items.json()["data"])
    assert first["input"] in held and second["input"] in held
    assert any(first["input"] in m and second["input"] in m for m in sent_to_model(stack))
    # tick 1's response left the depth-1 window at tick 2's commit: deleted, and gone;
    # tick 2's is still in the window: kept
    assert stored(stack, f"/responses/{first['response_id']}").status_code == 404
    assert stored(stack, f"/responses/{second['response_id']}").status_code == 200
