"""The connection pools of the adapters that send through a vendor's SDK (``gemini``,
``anthropic``): their httpx clients are sized here, as the routes' aiohttp pools are in
``route`` and ``pool_sizes``, so that this package is the one place that decides how many
connections a provider keeps open. Imported only by those adapters (httpx and the SDKs
are not loaded for a route's call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import httpx2

ClientT = TypeVar("ClientT", bound=httpx2.AsyncClient)


def sdk_limits(max_concurrency: int) -> httpx2.Limits:
    """A connection pool sized for the run's calls in flight, every connection kept alive."""
    return httpx2.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)


def sdk_http_client(max_concurrency: int, make: Callable[..., ClientT], **options: Any) -> ClientT:
    """An httpx client made by ``make`` (``httpx2.AsyncClient``, an SDK's default client
    class) with ``options`` and a pool of ``sdk_limits(max_concurrency)``."""
    return make(limits=sdk_limits(max_concurrency), **options)
