"""A provider-independent token estimate, for reservations before a call is sent."""

from __future__ import annotations


def estimate_tokens(text: str) -> int:
    """About four characters per token; at least one for any non-empty text."""
    return (len(text) + 3) // 4 if text else 0
