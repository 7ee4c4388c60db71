"""Test doubles for code built on ``sim``: offline adapters with recorded calls, and a
loopback OpenAI-compatible server with fault injection."""

from sim.testing.adapters import (
    DefaultFactory,
    ErrorAdapter,
    MockAdapter,
    MockCall,
    MockItem,
    default_instance,
    default_tool_calls,
)
from sim.testing.counting import CountingAdapter, call_digest, read_counts, read_in_flight
from sim.testing.stub_server import FAULTS, ServerThread, StubOptions, StubServer

__all__ = [
    "FAULTS",
    "CountingAdapter",
    "DefaultFactory",
    "ErrorAdapter",
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
