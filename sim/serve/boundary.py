"""The trust boundary of ``sim serve``: what a request must show before any handler runs,
and the headers every answer carries.

The world is untrusted and so is the network. Every ``/api/`` request needs the token
(``Authorization: Bearer TOKEN``) or the page's session cookie, which opening
``/?token=TOKEN`` sets; a request whose ``Host`` is not the address it reached is refused
(DNS rebinding); a change whose ``Origin`` is another site's, or that is not JSON, is
refused (CSRF); bodies are limited to ``MAX_BODY`` bytes; the page may run only its own
scripts (``Content-Security-Policy``) and shows world text as text. With ``read_only``,
or on a study's or a sweep's folder, every change is refused.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

from sim.llm.redact import redact_text
from sim.serve import runs

#: the largest request body accepted (bytes): an injected text or a question fits easily
MAX_BODY = 64 * 1024
#: what every answer carries: the page runs only its own scripts, in no frame, and nothing
#: is cached or sent on as a referrer
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Guarded(Protocol):
    """What the boundary reads of a server's settings (``sim.serve.app.Settings``)."""

    world_dir: Path
    token: str
    #: the page's session cookie's value
    session: str
    read_only: bool
    #: ``world_dir`` is a study's or a sweep's folder (shown, not changed)
    runs: runs.Kind | None


def problem(status: int, message: str) -> web.Response:
    """A JSON answer naming the problem (``{"error": ...}``, any URL in it redacted)."""
    return web.json_response({"error": redact_text(message)}, status=status)


def _served(request: web.Request) -> tuple[str, int] | None:
    """The address the connection reached (the server's side of it)."""
    transport = request.transport
    sock = transport.get_extra_info("sockname") if transport is not None else None
    if not isinstance(sock, tuple) or len(sock) < 2:
        return None
    return str(sock[0]), int(sock[1])


def allowed_hosts(address: str, port: int) -> set[str]:
    """The ``Host`` values a request to ``address:port`` may carry: that address (and
    ``localhost`` for a loopback one). A DNS name bound to it by someone else is not one."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    shown = f"[{ip}]" if ip.version == 6 else str(ip)
    hosts = {f"{shown}:{port}"}
    if ip.is_loopback:
        hosts |= {f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"}
    return hosts


def _cookie_name(port: int) -> str:
    return f"sim_serve_{port}"  # cookies ignore ports: each server its own


def _authorized(request: web.Request, settings: Guarded, port: int) -> str | None:
    """How the request proves it holds the token: ``"bearer"``, ``"cookie"`` or ``None``."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), settings.token.encode()
    ):
        return "bearer"
    cookie = request.cookies.get(_cookie_name(port), "")
    if cookie and hmac.compare_digest(cookie.encode(), settings.session.encode()):
        return "cookie"
    return None


def guard(settings: Guarded) -> Middleware:
    """The trust boundary of the server ``settings`` describe, before any handler runs (see
    the module's docstring)."""

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        served = _served(request)
        if served is None:
            return problem(400, "cannot tell which address was reached")
        host = request.headers.get("Host", "")
        if host not in allowed_hosts(*served):
            return problem(421, f"Host {host!r} is not this server's address")
        changes = request.method not in ("GET", "HEAD", "OPTIONS")
        origin = request.headers.get("Origin")
        if changes and origin is not None and origin != f"http://{host}":
            return problem(403, f"Origin {origin!r} may not change this world")
        path = request.path
        if path == "/" or path.startswith("/api/"):
            how = _authorized(request, settings, served[1])
            if path == "/" and how is None:
                token = request.query.get("token", "")
                if token and hmac.compare_digest(token.encode(), settings.token.encode()):
                    response = web.HTTPSeeOther("/")  # the token leaves the address bar
                    response.set_cookie(
                        _cookie_name(served[1]),
                        settings.session,
                        httponly=True,
                        samesite="Strict",
                        path="/",
                    )
                    raise response
            if how is None:
                return problem(
                    401,
                    "this needs the token: open the address `sim serve` printed "
                    "(/?token=...), or send 'Authorization: Bearer TOKEN'",
                )
            if changes and how == "cookie" and origin is None:
                return problem(403, "a change from the page must carry its Origin")
        if changes:
            if settings.read_only:
                return problem(403, "read-only: this server was started with --read-only")
            if settings.runs is not None:
                return problem(
                    403,
                    f"{settings.world_dir} is a {settings.runs}'s folder: its runs are shown, "
                    "not changed; serve a run's folder (--world) to steer it",
                )
            if request.content_type != "application/json":
                return problem(415, "expected a JSON body (Content-Type: application/json)")
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return problem(413, f"the request body is over {MAX_BODY} bytes")

    return guarded


@web.middleware
async def headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer, an error's too, carries ``SECURITY_HEADERS``."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise
    response.headers.update(SECURITY_HEADERS)
    return response
