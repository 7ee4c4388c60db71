"""Where a request goes and what it carries: the ``Target`` of a route, headers merged as
the SDKs merge them, the proxy the environment sets, and a URL as errors show it."""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

#: the header that carries a call's idempotency key (``sim.llm.calls.idempotency_key``)
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a route POSTs, and what every request carries, built by the adapters
    without an SDK client.

    Attributes:
        base_url: the API root (``https://api.openai.com/v1``); its own query, if any, is
            not sent (as the SDK joins paths), ``query`` is.
        query: the default query of every request (``api-version`` and the like).
        headers: sent with every request in this order (auth first, then the defaults,
            a later name replacing an earlier one of any case). They hold the key, so
            they are left out of the repr.
    """

    base_url: str
    query: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)


def merge_headers(*layers: Mapping[str, str | None]) -> tuple[tuple[str, str], ...]:
    """Headers merged case-insensitively, a later layer's name replacing an earlier one's
    and ``None`` removing it (what the SDK does with its ``Omit``)."""
    merged: dict[str, tuple[str, str]] = {}
    for layer in layers:
        for name, value in layer.items():
            if value is None:
                merged.pop(name.lower(), None)
            else:
                merged[name.lower()] = (name, value)
    return tuple(merged.values())


def environment_proxy(url: str) -> str | None:
    """The proxy the environment sets for ``url`` (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``, any case), or ``None``: none set, or ``NO_PROXY`` covers its host."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme.lower()) or proxies.get("all")
    if not proxy:
        return None
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def shown_url(url: str) -> str:
    """A URL as errors name it: no user info, no query."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # IPv6 in brackets
    default_port = 443 if parts.scheme.lower() == "https" else 80
    if parts.port is not None and parts.port != default_port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}".rstrip("/")
