"""Test doubles for code built on ``sim``: offline adapters with recorded calls."""

from sim.testing.adapters import (
    DefaultFactory,
    ErrorAdapter,
    MockAdapter,
    MockCall,
    MockItem,
    default_instance,
)

__all__ = [
    "DefaultFactory",
    "ErrorAdapter",
    "MockAdapter",
    "MockCall",
    "MockItem",
    "default_instance",
]
