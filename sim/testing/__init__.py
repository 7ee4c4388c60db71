"""Test doubles for code built on ``sim``: offline adapters with recorded calls."""

from sim.testing.adapters import (
    DefaultFactory,
    ErrorAdapter,
    MockAdapter,
    MockCall,
    MockItem,
    default_instance,
)
from sim.testing.counting import CountingAdapter, call_digest, read_counts

__all__ = [
    "CountingAdapter",
    "DefaultFactory",
    "ErrorAdapter",
    "MockAdapter",
    "MockCall",
    "MockItem",
    "call_digest",
    "default_instance",
    "read_counts",
]
