"""Backpressure: a provider asking the client to slow down is not a failure.

A wrapper (STYLE #6) that every attempt passes through, one shared ``Endpoint`` per
provider URL:

- **An adaptive concurrency limit (AIMD).** At most ``limit`` attempts are in flight. The
  limit is decided once per window (``limit`` completed attempts, at least
  ``MIN_WINDOW``): a window in which more
  than ``CONGESTION_FRACTION`` of the attempts were rate limited or timed out halves it
  (multiplicative decrease), any other window adds one slot (additive increase), between 1
  and ``max_concurrency``. Deciding per window, on a fraction, means a burst of 429s from
  attempts already in flight counts once, and a steady trickle of unrelated 429s or
  timeouts does not shrink the limit to nothing: it is the shared pause that answers
  those.
- **A shared pause.** A 429's ``Retry-After`` (or, without one, a short default) pauses
  *every* attempt to that endpoint, not just the one that was told: the others would be
  told the same thing a moment later.
- **The server's own capacity.** Before an endpoint's first attempt, one call asks the
  server how many requests it serves at once (its kind's profile's probe: llama.cpp's
  ``/props`` or ``/slots``, llama-cpp-python's one-at-a-time) while the others wait; a
  reported capacity caps the limit, so a one-slot server never gets 16 requests and the
  ones past its capacity wait here, where no ``timeout_seconds`` runs (a call's timeout
  starts when its request is sent).
- **Latency as well as 429s.** Where the server reports no capacity (and is not OpenAI's
  API), a window is also congested when its attempts' median latency per unit of work
  (output tokens, plus input tokens at ``INPUT_WEIGHT``) is more than
  ``LATENCY_FACTOR`` times the fastest seen for answers of about the same work (within
  a factor of 2): requests queued at the server. Only like is compared with like: a
  server whose latency is mostly fixed (a hosted gateway, a stub) answers a short memory
  summary in about the time of a long resolution, so per unit of work the short answer
  would look several times slower than the long one, and the limit would halve down to
  one for no queue at all. Nor is the client's own queue taken for the server's: a
  window in which this process was busy for at least ``BUSY_FRACTION`` of the time (CPU
  seconds per wall second) is not judged by latency, since its answers may have waited
  for the event loop, not the server (at 0.1 s latency and 200 in flight, the bench's
  client spent most of each window on its own CPU, and halving the limit on that made
  the tick about 10% slower).
- **Down is not slow.** Connection refused (or reset) means the endpoint is down. After
  ``down_threshold`` of them in a row, attempts
  fail at once for ``down_cooldown`` seconds (one probe then goes through), with a message
  that names the URL: ``cannot connect to http://localhost:11434/v1 (connection
  refused)``. Rate limits, timeouts and 5xx never count toward this (repeated 5xx from a
  model open that model's breaker in the recovery layer, so its fallback models are tried).

The wrapper retries nothing itself: the recovery layer above it retries per spec 000 and
records every attempt. Its statistics (``Endpoint.stats``) say how much the tick slowed
down, for the summary.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from sim.llm.capacity import ServerCapacity
from sim.llm.errors import (
    MAX_RETRY_AFTER_SECONDS,
    LLMAPIError,
    LLMError,
    LLMRateLimitError,
    LLMTimeoutError,
)
from sim.llm.types import Adapter, AdapterResponse, ModelRequest
from sim.llm.wrapper import AdapterWrapper

#: a window with more rate-limited or timed-out attempts than this halves the limit
CONGESTION_FRACTION = 0.5
#: the fewest attempts a window decides on: a handful says little about a fraction
MIN_WINDOW = 10
#: pause after a 429 that carries no Retry-After
DEFAULT_PAUSE_SECONDS = 1.0
#: a window whose median latency per unit of work is this many times the fastest seen is
#: congested (servers that report no capacity)
LATENCY_FACTOR = 3.0
#: what one input token weighs against one output token in a unit of work (a prompt is
#: read far faster than an answer is written)
INPUT_WEIGHT = 1 / 16
#: a window in which the process's CPU time was at least this share of its wall time is
#: not judged by latency: its answers may have waited for the client's own event loop
BUSY_FRACTION = 0.5


@dataclass
class EndpointStats:
    """How an endpoint pushed back during a run."""

    rate_limited: int = 0
    timeouts: int = 0
    decreases: int = 0
    paused_seconds: float = 0.0
    down_failures: int = 0
    lowest_limit: float = 0.0
    #: windows found congested by latency (requests queued at the server)
    slow_windows: int = 0

    def since(self, before: dict[str, Any], limit: float) -> dict[str, Any]:
        """What happened after the snapshot ``before`` (a ``to_dict``), and the limit now."""
        now = self.to_dict()
        out = {
            k: round(now[k] - before[k], 3) if isinstance(now[k], float) else now[k] - before[k]
            for k in ("rate_limited", "timeouts", "decreases", "paused_seconds", "down_failures")
        }
        out["lowest_limit"] = now["lowest_limit"]
        out["limit"] = int(limit)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate_limited": self.rate_limited,
            "timeouts": self.timeouts,
            "decreases": self.decreases,
            "paused_seconds": round(self.paused_seconds, 3),
            "down_failures": self.down_failures,
            "lowest_limit": int(self.lowest_limit),
        }


class EndpointDownError(LLMAPIError):
    """The endpoint refused connections (or failed with 5xx) repeatedly: it is down."""

    default_code = "connection_error"


def _is_down_signal(error: LLMError) -> bool:
    """Connection refused or reset: the endpoint is not answering at all. (A 5xx is one
    model's server failing: the recovery layer's ``provider:model`` breaker handles it, so
    a fallback model on the same endpoint is still tried.)"""
    return error.code == "connection_error" and not isinstance(
        error, (LLMRateLimitError, LLMTimeoutError)
    )


def describe_connection_error(url: str, error: LLMError) -> str:
    """``cannot connect to URL (connection refused)`` from whatever the transport said."""
    parts = [error.message]
    cause: BaseException | None = error.cause
    for _ in range(6):  # the SDK's error wraps the transport's, which wraps the OS's
        if cause is None:
            break
        parts.append(repr(cause))
        cause = cause.__cause__ or cause.__context__
    text = " ".join(parts).lower()
    if "refused" in text:
        why = "connection refused"
    elif "reset" in text:
        why = "connection reset"
    elif "name or service not known" in text or "nodename" in text or "getaddrinfo" in text:
        why = "unknown host"
    else:
        why = "no answer"
    return f"cannot connect to {url} ({why})"


class _Cancelled(LLMError):
    """An attempt cancelled by the caller (Ctrl-C, SIGTERM): says nothing about health."""

    default_code = "cancelled"


_CANCELLED = _Cancelled("cancelled")


class Endpoint:
    """The shared state of one provider URL: concurrency limit, pause, health.

    Args:
        url: the endpoint, as shown in messages.
        max_concurrency: the ceiling of the adaptive limit (``[llm] max_concurrency``).
        down_threshold: consecutive connection errors that mark the endpoint down.
        down_cooldown: seconds before a probe is let through to a down endpoint.
        clock: monotonic seconds.
        cpu_clock: this process's CPU seconds (how busy the client itself was).
    """

    def __init__(
        self,
        url: str,
        max_concurrency: int,
        *,
        down_threshold: int = 5,
        down_cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.url = url
        self.max_limit = float(max(1, max_concurrency))
        self.limit = self.max_limit
        self.in_flight = 0
        self.paused_until = 0.0
        self.window_done = 0
        self.window_congested = 0
        self.down_threshold = max(1, down_threshold)
        self.down_cooldown = down_cooldown
        self.down_streak = 0
        self.down_since: float | None = None
        self.probing = False
        self.last_down_error: LLMError | None = None
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.stats = EndpointStats(lowest_limit=self.limit)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        #: what the server said about its capacity; ``None`` until asked (``fit``)
        self.capacity: ServerCapacity | None = None
        #: adapt the limit to latency too (the server reports no capacity)
        self.adapt_to_latency = False
        #: the fastest seconds per unit of work seen, by size of work (the binary
        #: exponent of its units), and this window's ratios to it
        self.fastest: dict[int, float] = {}
        self.window_ratios: list[float] = []
        #: wall and CPU seconds when this window's first attempt was counted
        self.window_start: tuple[float, float] | None = None
        self._fitting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    # -- capacity ------------------------------------------------------------------------

    async def fit_once(
        self, ask: Callable[[], Awaitable[ServerCapacity | None]] | None
    ) -> str | None:
        """Ask the server its capacity (``ask``) before the first attempt, once: the first
        caller asks while the others wait. Returns the note for the summary (to the caller
        that asked), else ``None``."""
        if self.capacity is not None:
            return None
        loop = asyncio.get_running_loop()
        if self._fitting is None or self._fitting[0] is not loop:
            self._fitting = (loop, asyncio.Lock())
        async with self._fitting[1]:
            if self.capacity is not None:
                return None
            capacity = await ask() if ask is not None else None
            return self.fit(capacity)

    def fit(self, capacity: ServerCapacity | None) -> str | None:
        """Cap the limit at a reported capacity; with none reported, adapt to latency.
        ``None`` (the server was not asked): as before. Returns the note, if any."""
        if capacity is None:
            self.capacity = ServerCapacity(None, "not asked")
            return None
        self.capacity = capacity
        if capacity.slots is None:
            self.adapt_to_latency = True
        else:
            self.max_limit = float(min(self.max_limit, capacity.slots))
            self.limit = min(self.limit, self.max_limit)
            self.stats.lowest_limit = min(self.stats.lowest_limit, self.limit)
        return capacity.note(self.url, int(self.limit))

    # -- gate ----------------------------------------------------------------------------

    def _notify(self) -> None:
        """Wake the waiters the new state lets through, first come first served: as many
        as there are free slots, or all of them when the endpoint is paused or down (each
        then sleeps out the pause or fails). Not the whole queue per freed slot: with a
        phase's calls queued, that woke every one of them for each answer."""
        waiters = self._waiters
        if not waiters:
            return
        if self.down_since is not None or self.paused_until > self.clock():
            wake = len(waiters)
        else:
            wake = max(1, int(self.limit)) - self.in_flight
        while wake > 0 and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                wake -= 1

    async def acquire(self) -> float:
        """Wait for the pause to end and a slot under the limit; returns the send time."""
        while True:
            self._check_down()
            now = self.clock()
            if self.paused_until > now:
                await asyncio.sleep(self.paused_until - now)
                continue
            if self.in_flight < max(1, int(self.limit)):
                self.in_flight += 1
                return now
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._notify()  # woken, then cancelled: the slot goes to the next
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise

    def _check_down(self) -> None:
        if self.down_since is None:
            return
        if self.clock() - self.down_since >= self.down_cooldown and not self.probing:
            self.probing = True  # this attempt is the probe
            return
        cause = self.last_down_error
        message = (
            describe_connection_error(self.url, cause)
            if cause is not None
            else f"cannot connect to {self.url}"
        )
        raise EndpointDownError(
            f"{message}; not retried for {self.down_cooldown:g} s. Is the server running?",
            cause=cause,
        )

    # -- outcomes ------------------------------------------------------------------------

    def release(self, sent_at: float, error: LLMError | None, work: float = 0.0) -> None:
        """Adapt the limit and health to one attempt's outcome (``work``: the answer's
        units of work, for the latency signal)."""
        self.in_flight -= 1
        now = self.clock()
        congested = isinstance(error, (LLMRateLimitError, LLMTimeoutError))
        if error is None:
            self._latency(now - sent_at, work)
            self.down_streak = 0
            self.down_since = None
            self.probing = False
        elif isinstance(error, LLMRateLimitError):
            self.stats.rate_limited += 1
            pause = error.retry_after if error.retry_after is not None else DEFAULT_PAUSE_SECONDS
            until = now + min(pause, MAX_RETRY_AFTER_SECONDS)
            if until > self.paused_until:  # wall-clock time paused, counted once
                self.stats.paused_seconds += until - max(self.paused_until, now)
                self.paused_until = until
            self.probing = False
        elif isinstance(error, LLMTimeoutError):
            self.stats.timeouts += 1
            self.probing = False
        elif _is_down_signal(error):
            self.stats.down_failures += 1
            self.down_streak += 1
            self.last_down_error = error
            if self.probing or self.down_streak >= self.down_threshold:
                self.down_since = now
            self.probing = False
        elif error is not _CANCELLED:  # a content failure: the endpoint answered
            self.down_streak = 0
            self.probing = False
        if error is not _CANCELLED:
            self._count(congested)
        self._notify()

    def _latency(self, seconds: float, work: float) -> None:
        """Record one answered attempt's seconds per unit of work (latency signal only)."""
        if not self.adapt_to_latency or work <= 0 or seconds <= 0:
            return
        rate = seconds / work
        size = math.frexp(work)[1]  # work in [2 ** (size - 1), 2 ** size)
        fastest = self.fastest.get(size)
        if fastest is None or rate < fastest:
            fastest = self.fastest[size] = rate
        self.window_ratios.append(rate / fastest)

    def _slow(self) -> bool:
        """This window's attempts waited in the server's queue: their median latency per
        unit of work is ``LATENCY_FACTOR`` times the fastest of the same size of work (at
        least half the window answered, more than one attempt was allowed in flight, and
        the process itself was not busy for the window: ``_busy``)."""
        ratios = self.window_ratios
        if self.limit <= 1 or len(ratios) * 2 < self.window_done or self._busy():
            return False
        return statistics.median(ratios) > LATENCY_FACTOR

    def _busy(self) -> bool:
        """The process spent at least ``BUSY_FRACTION`` of this window on its own CPU."""
        if self.window_start is None:
            return False
        wall = self.clock() - self.window_start[0]
        return wall > 0 and (self.cpu_clock() - self.window_start[1]) >= BUSY_FRACTION * wall

    def _count(self, congested: bool) -> None:
        """One more attempt in the current window; decide the limit when it is full."""
        if self.window_start is None and self.adapt_to_latency:
            self.window_start = (self.clock(), self.cpu_clock())
        self.window_done += 1
        self.window_congested += congested
        if self.window_done < max(MIN_WINDOW, int(self.limit)):
            return
        slow = self._slow()
        if slow or self.window_congested > CONGESTION_FRACTION * self.window_done:
            self.limit = max(1.0, self.limit / 2.0)
            self.stats.decreases += 1
            self.stats.slow_windows += slow
            self.stats.lowest_limit = min(self.stats.lowest_limit, self.limit)
        else:
            self.limit = min(self.max_limit, self.limit + 1.0)
        self.window_done = self.window_congested = 0
        self.window_ratios = []
        self.window_start = None


class BackpressureAdapter(AdapterWrapper):
    """Gates every attempt through its endpoint's limit and pause (see the module doc).

    Args:
        inner: the adapter below (budget, rate limiter, provider).
        endpoint: the shared state of the provider URL this adapter sends to.
    """

    def __init__(self, inner: Adapter, endpoint: Endpoint) -> None:
        super().__init__(inner)
        self.endpoint = endpoint

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        endpoint = self.endpoint
        note = None
        if endpoint.capacity is None:  # the first attempts: one asks, the others wait
            note = await endpoint.fit_once(getattr(self.inner, "server_capacity", None))
        sent_at = await endpoint.acquire()
        try:
            response = await self.inner.execute(request)
        except LLMError as exc:
            endpoint.release(sent_at, exc)
            exc.endpoint = endpoint.url
            if note is not None:  # told with the attempt's outcome, whatever it is
                exc.notice = f"{exc.notice}\n{note}" if exc.notice else note
            if exc.code == "connection_error" and not isinstance(exc, EndpointDownError):
                exc.message = f"{describe_connection_error(endpoint.url, exc)}: {exc.message}"
                exc.args = (exc.message,)
            raise
        except BaseException:
            endpoint.release(sent_at, _CANCELLED)
            raise
        usage = response.usage
        endpoint.release(
            sent_at, None, (usage.output_tokens or 0) + (usage.input_tokens or 0) * INPUT_WEIGHT
        )
        if note is not None:  # one note a line (the runner shows each once)
            notice = f"{response.notice}\n{note}" if response.notice else note
            return replace(response, endpoint=endpoint.url, notice=notice)
        return replace(response, endpoint=endpoint.url)
