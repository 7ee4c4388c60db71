"""Client-side pacing: requests and tokens per minute, as async token buckets.

A big batch paces itself instead of provoking a storm of 429s. Waiters queue in order on a
lock and each sleeps exactly as long as its deficit needs (no polling); the bucket starts
full, as a provider's per-minute limits do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from sim.llm.budget import estimate_usage
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.llm.wrapper import AdapterWrapper

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


class TokenBucket:
    """``per_minute`` units per minute, refilled continuously, holding at most ``burst``.

    Args:
        per_minute: the sustained rate.
        burst: the most that can be taken at once after a pause (default: a minute's worth).
        clock: monotonic seconds (injectable for tests).
        sleep: how to wait (injectable for tests).
    """

    def __init__(
        self,
        per_minute: float,
        burst: float | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if per_minute <= 0:
            raise ValueError("per_minute must be > 0")
        self.rate = per_minute / 60.0
        self.capacity = float(burst if burst is not None else per_minute)
        self.level = self.capacity
        self.clock = clock
        self.sleep = sleep
        self.updated = clock()
        self.waited = 0.0
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    async def take(self, amount: float = 1.0) -> None:
        """Take ``amount`` units, waiting (in arrival order) until they are there."""
        amount = min(float(amount), self.capacity)
        async with self._lock:
            self._refill()
            if self.level < amount:
                wait = (amount - self.level) / self.rate
                self.waited += wait
                await self.sleep(wait)
                self._refill()
            self.level -= amount

    def give_back(self, amount: float) -> None:
        """Return units taken for an estimate that turned out too high (or take more)."""
        self.level = min(self.capacity, self.level + amount)


class RateLimitedAdapter(AdapterWrapper):
    """Wraps an adapter: each attempt takes one request and its estimated tokens first."""

    def __init__(
        self,
        inner: Adapter,
        requests: TokenBucket | None = None,
        tokens: TokenBucket | None = None,
    ) -> None:
        super().__init__(inner)
        self.requests = requests
        self.tokens = tokens

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        estimate = estimate_usage(request).total_tokens
        if self.requests is not None:
            await self.requests.take(1)
        if self.tokens is not None:
            await self.tokens.take(estimate)
        response = await self.inner.execute(request)
        if self.tokens is not None:
            self.tokens.give_back(estimate - response.usage.total_tokens)
        return response
