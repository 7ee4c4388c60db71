"""pytest fixtures for code built on ``sim``: loopback OpenAI-compatible, Gemini and
Anthropic servers.

Enable with ``pytest_plugins = ["sim.testing.pytest_plugin"]`` in a ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import pytest

from sim.testing.anthropic_stub import AnthropicStubServer
from sim.testing.gemini_stub import GeminiStubServer
from sim.testing.stub_server import ServerThread, StubOptions, StubServer

_Stub = TypeVar("_Stub", bound=StubServer)


def _serve(server: _Stub) -> Iterator[_Stub]:
    """Run ``server`` on a free loopback port in its own thread for one test, then stop it."""
    thread = ServerThread(server)
    thread.start()
    try:
        yield server
    finally:
        thread.stop()


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """A fresh stub server on a free loopback port, in its own thread; ``.base_url`` to use."""
    yield from _serve(StubServer(StubOptions(hang_seconds=600.0)))


@pytest.fixture
def gemini_stub() -> Iterator[GeminiStubServer]:
    """A fresh Gemini API stub on a free loopback port; ``.base_url`` is the SDK's base URL."""
    yield from _serve(GeminiStubServer(StubOptions(hang_seconds=600.0)))


@pytest.fixture
def anthropic_stub() -> Iterator[AnthropicStubServer]:
    """A fresh Messages API stub on a free loopback port; ``.base_url`` is the SDK's base URL."""
    yield from _serve(AnthropicStubServer(StubOptions(hang_seconds=600.0)))
