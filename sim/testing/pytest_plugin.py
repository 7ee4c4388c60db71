"""pytest fixtures for code built on ``sim``: loopback OpenAI-compatible, Gemini and
Anthropic servers.

Enable with ``pytest_plugins = ["sim.testing.pytest_plugin"]`` in a ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sim.testing.anthropic_stub import AnthropicStubServer
from sim.testing.gemini_stub import GeminiStubServer
from sim.testing.stub_server import ServerThread, StubOptions, StubServer


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """A fresh stub server on a free loopback port, in its own thread; ``.base_url`` to use."""
    thread = ServerThread(StubServer(StubOptions(hang_seconds=600.0)))
    server = thread.start()
    try:
        yield server
    finally:
        thread.stop()


@pytest.fixture
def gemini_stub() -> Iterator[GeminiStubServer]:
    """A fresh Gemini API stub on a free loopback port; ``.base_url`` is the SDK's base URL."""
    server = GeminiStubServer(StubOptions(hang_seconds=600.0))
    thread = ServerThread(server)
    thread.start()
    try:
        yield server
    finally:
        thread.stop()


@pytest.fixture
def anthropic_stub() -> Iterator[AnthropicStubServer]:
    """A fresh Messages API stub on a free loopback port; ``.base_url`` is the SDK's base URL."""
    server = AnthropicStubServer(StubOptions(hang_seconds=600.0))
    thread = ServerThread(server)
    thread.start()
    try:
        yield server
    finally:
        thread.stop()
