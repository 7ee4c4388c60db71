"""Test doubles for code built on ``sim``: offline adapters with recorded calls, and
loopback OpenAI-compatible, Gemini API and Anthropic Messages API servers with fault
injection.

Owns: test doubles shipped for users' tests: mock adapters, the stub servers and their
model, fixtures.

May import: ``sim.llm``, ``sim.offline``, ``sim.ticklog``.

Next: a stub server for another wire format builds on ``sdk_stub.SDKStubServer`` (OpenAI's
is ``stub_server``); a fixture goes in ``pytest_plugin``.
"""

from sim.testing.adapters import (
    DefaultFactory,
    ErrorAdapter,
    MockAdapter,
    MockCall,
    MockItem,
    default_instance,
    default_tool_calls,
)
from sim.testing.anthropic_stub import ANTHROPIC_FAULTS, AnthropicStubServer
from sim.testing.counting import CountingAdapter, call_digest, read_counts, read_in_flight
from sim.testing.gemini_stub import GEMINI_FAULTS, GeminiStubServer
from sim.testing.stub_server import FAULTS, ServerThread, StubOptions, StubServer

__all__ = [
    "ANTHROPIC_FAULTS",
    "FAULTS",
    "GEMINI_FAULTS",
    "AnthropicStubServer",
    "CountingAdapter",
    "DefaultFactory",
    "ErrorAdapter",
    "GeminiStubServer",
    "MockAdapter",
    "MockCall",
    "MockItem",
    "ServerThread",
    "StubOptions",
    "StubServer",
    "call_digest",
    "default_instance",
    "default_tool_calls",
    "read_counts",
    "read_in_flight",
]
