"""A pool of model servers: one provider, a list of ``base_url``, calls spread over them.

Users who outgrow one GPU run several vLLM or SGLang servers behind the same model name.
``base_url = ["http://gpu1:8000/v1", "http://gpu2:8000/v1", ...]`` builds one adapter
stack per server (its own SDK client, its own ``sim.llm.backpressure`` endpoint with an
adaptive concurrency limit, its own budget gate on the run's shared ``Budget``), and this
wrapper above them (STYLE #6) decides where each attempt goes:

- **Least loaded first.** An attempt goes to the server with the fewest attempts in
  flight relative to its current concurrency limit (with equal limits: the fewest in
  flight), earlier servers winning ties.
- **A breaker per server.** Connection errors (refused, reset, a server that went away
  mid-answer), timeouts and HTTP 5xx are the server failing; ``breaker_threshold`` of them
  in a row open that server's breaker and it gets nothing for ``breaker_cooldown`` seconds.
  Then one attempt is let through as a probe: an answer closes the breaker (the server is
  back in the pool), a failure opens it again. Any answer from the server, a refusal or a
  schema error included, shows it is alive; rate limits say nothing either way.
- **Failed attempts move.** An attempt that failed on one server for one of those reasons
  (or a 429) is sent at once to another server it has not tried, without backoff and
  without counting as one of the recovery layer's retries, so a server dying in the middle
  of a phase costs its calls a resend each, not a failure. Only when every server was
  tried (or every breaker is open) does the error go up to recovery, which backs off and
  retries per spec 000 as with one server.
- **Nothing is paid twice on purpose.** A moved attempt keeps its idempotency key when its
  outcome was never seen (a connection lost mid-answer, a timeout): a server or gateway
  that honours keys answers it from its cache. After a failure the client did see (a 5xx)
  the key changes, as for any retry (``sim.llm.calls``).

Each moved attempt is recorded with its server (``AdapterResponse.moved`` /
``LLMError.moved``; recovery lists them among the call's attempts), so ``sim log --calls``
and ``sim usage --by endpoint`` show where every call went and what it cost there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sim.llm.backpressure import Endpoint, EndpointDownError
from sim.llm.calls import with_attempts
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMConfigurationError,
    LLMError,
    LLMRateLimitError,
    LLMTimeoutError,
)
from sim.llm.recovery import CircuitBreaker
from sim.llm.types import Adapter, AdapterResponse, Attempt, Closeable, ModelRequest
from sim.llm.wrapper import AdapterWrapper


@dataclass
class ServerStats:
    """What one server of a pool did during a run."""

    #: attempts it answered
    answered: int = 0
    #: attempts that failed there and were moved to another server
    moved_away: int = 0
    #: times its breaker opened
    opened: int = 0


@dataclass(frozen=True)
class ServerReport:
    """One server's share of a stretch of a run (a tick), for the summary."""

    url: str
    answered: int
    moved_away: int
    #: its breaker took it out of the pool during the stretch
    opened: int
    #: ``closed`` (in the pool), ``open`` (out) or ``half_open`` (due a probe)
    state: str


@dataclass(eq=False)
class Server:
    """One server of a pool.

    Args:
        url: its base URL, as recorded in the tick log.
        adapter: its adapter stack (provider -> backpressure -> budget).
        endpoint: its backpressure state (the adaptive limit), if any.
        breaker: its health.
        provider: the provider adapter at the bottom of ``adapter`` (what the builder
            made it from; ``None``: not said), for what goes around the stack
            (embeddings: ``sim.llm.embedding``).
    """

    url: str
    adapter: Adapter
    endpoint: Endpoint | None = None
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    in_flight: int = 0
    stats: ServerStats = field(default_factory=ServerStats)
    provider: Adapter | None = None

    @property
    def load(self) -> float:
        """Attempts in flight per slot of its current concurrency limit."""
        limit = self.endpoint.limit if self.endpoint is not None else 1.0
        return self.in_flight / max(1.0, limit)


def server_failure(error: LLMError) -> bool:
    """The server failed (not the request): connection refused or lost, a timeout, a 5xx."""
    if isinstance(error, LLMTimeoutError):
        return True
    if not isinstance(error, LLMAPIError) or isinstance(error, LLMRateLimitError):
        return False
    return error.code == "connection_error" or (error.status_code or 0) >= 500


def movable(error: LLMError) -> bool:
    """Whether another server may answer instead: the server failed, or is rate limited."""
    return server_failure(error) or isinstance(error, LLMRateLimitError)


def _neutral(error: LLMError) -> bool:
    """Failures that never reached the server: they say nothing about its health."""
    return isinstance(error, (LLMBudgetExceededError, LLMConfigurationError, LLMRateLimitError))


class PoolAdapter(AdapterWrapper):
    """Sends each attempt to the least loaded healthy server (see the module doc).

    Args:
        servers: the pool, in configured order (at least one).
        breaker_threshold: consecutive server failures that take a server out.
        breaker_cooldown: seconds before a server out of the pool gets a probe.
        clock: monotonic seconds, for the breakers.
    """

    def __init__(
        self,
        servers: Sequence[Server],
        *,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not servers:
            raise ValueError("a pool needs at least one server")
        super().__init__(servers[0].adapter)  # ``inner``: the first server's stack
        self.servers = list(servers)
        self.breaker_cooldown = breaker_cooldown
        for server in self.servers:
            server.breaker = CircuitBreaker(breaker_threshold, breaker_cooldown, clock)

    def pick(self, tried: Sequence[Server] = ()) -> Server | None:
        """The server for the next attempt: a server due a probe first (a real attempt,
        moved on if it fails), else the least loaded one in the pool; ``None`` when every
        server not yet ``tried`` is out of the pool."""
        best: Server | None = None
        for server in self.servers:
            if server in tried:
                continue
            state = server.breaker.state
            if state == "half_open":
                if server.breaker.allow():  # this attempt is its probe
                    return server
                continue  # its probe is still out
            if state == "open":
                continue
            if best is None or server.load < best.load:
                best = server
        return best

    def snapshot(self) -> list[ServerStats]:
        """The servers' counters now, for ``since``."""
        return [replace(server.stats) for server in self.servers]

    def since(self, before: list[ServerStats]) -> list[ServerReport]:
        """What each server did after ``before`` (a ``snapshot``), and its state now."""
        return [
            ServerReport(
                server.url,
                server.stats.answered - old.answered,
                server.stats.moved_away - old.moved_away,
                server.stats.opened - old.opened,
                server.breaker.state,
            )
            for server, old in zip(self.servers, before, strict=True)
        ]

    def _down(self) -> EndpointDownError:
        urls = ", ".join(server.url for server in self.servers)
        return EndpointDownError(
            f"every server of the pool is out ({urls}): each failed "
            f"{self.servers[0].breaker.threshold} times in a row (refused, timed out or "
            f"HTTP 5xx); each gets a probe after {self.breaker_cooldown:g} s. "
            "Are the servers running?"
        )

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        tried: list[Server] = []
        moved: list[Attempt] = []
        server = self.pick()
        if server is None:
            raise self._down()
        while True:
            tried.append(server)
            server.in_flight += 1
            started = time.perf_counter()
            try:
                # the attempts moved away failed as seen: the next server gets a fresh key
                response = await server.adapter.execute(with_attempts(request, moved))
            except LLMError as exc:
                server.in_flight -= 1
                self._outcome(server, exc)
                if exc.endpoint is None:
                    exc.endpoint = server.url
                following = self.pick(tried) if movable(exc) else None
                if following is None:
                    exc.moved = (*moved, *exc.moved)
                    raise
                server.stats.moved_away += 1
                moved.extend(exc.moved)
                moved.append(
                    Attempt(
                        request.settings.model,
                        len(moved) + 1,
                        exc.usage,
                        time.perf_counter() - started,
                        exc.code,
                        endpoint=exc.endpoint,
                    )
                )
                server = following
                continue
            except BaseException:  # cancelled: says nothing about the server
                server.in_flight -= 1
                server.breaker.neutral()
                raise
            server.in_flight -= 1
            server.breaker.success()
            server.stats.answered += 1
            if response.endpoint is None or moved:
                response = _with(response, server.url, moved)
            return response

    def _outcome(self, server: Server, error: LLMError) -> None:
        breaker = server.breaker
        if server_failure(error):
            was_open = breaker.opened_at is not None
            breaker.failure()
            if breaker.opened_at is not None and not was_open:
                server.stats.opened += 1
        elif _neutral(error):
            breaker.neutral()
        else:  # the server answered (a refusal, a schema error, a 4xx): it is alive
            breaker.success()

    async def delete_response(self, response_id: str) -> None:
        """Pools keep no server-side chains (``chain_mode = "server"`` is refused for a
        list of servers), so deletions are the members' no-ops; each is asked."""
        for server in self.servers:
            await server.adapter.delete_response(response_id)

    async def aclose(self) -> None:
        """Close every server's HTTP client (its provider adapter's)."""
        for server in self.servers:
            if isinstance(server.provider, Closeable):
                await server.provider.aclose()


def _with(response: AdapterResponse, url: str, moved: list[Attempt]) -> AdapterResponse:
    return replace(
        response,
        endpoint=response.endpoint or url,
        moved=(*moved, *response.moved),
    )
