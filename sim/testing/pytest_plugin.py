"""pytest fixtures for code built on ``sim``: a loopback OpenAI-compatible server.

Enable with ``pytest_plugins = ["sim.testing.pytest_plugin"]`` in a ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
