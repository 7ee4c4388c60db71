"""The shared frame of the loopback stubs that speak a non-OpenAI API (Gemini, Anthropic).

Each of those stubs is a ``StubServer`` (same faults script, stats, offline answers and
``ServerThread``) that differs only in its route, its error body and how it words the
HTTP-level faults. This base holds what they do alike: the API root the SDK is given,
checking scripted faults against the API's list, routing a request (stub control routes,
404, a body that is not JSON), and the latency / fault / hang prelude of a generation.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from sim.testing.stub_model import Json
from sim.testing.stub_server import BAD_GATEWAY_BODY, FAULTS, StubServer, _HTTPError


class SDKStubServer(StubServer):
    """``StubServer`` for an API whose SDK adds its own route to ``base_url``.

    A subclass names its ``FAULTS``, words errors with ``_error``, answers its route in
    ``_route`` and maps the HTTP-level faults in ``_http_fault``.
    """

    batch_api = False  # OpenAI's Batch API routes are not this API's

    #: the faults this API's stub knows (``enqueue`` refuses others)
    FAULTS: ClassVar[tuple[str, ...]] = FAULTS
    #: the message of the 400 answered to a body that is not JSON
    NOT_JSON: ClassVar[str] = "body is not JSON"

    @property
    def base_url(self) -> str:
        """The API root the SDK takes as ``base_url`` (it adds the route itself)."""
        return f"http://127.0.0.1:{self.port}"

    def enqueue(self, *faults: str | None) -> None:
        known = self.FAULTS
        for fault in faults:
            if fault is not None and fault not in known:
                raise ValueError(f"unknown fault {fault!r}; expected one of {known}")
            self.script.append(fault)

    def _error(self, status: int, type_: str, message: str) -> Json:
        """An error body in this API's format (``type_``: the Anthropic-style error type)."""
        raise NotImplementedError

    async def _route(self, method: str, path: str, request: Any) -> Json | bytes | None:
        """The answer to a request on this API's route (``bytes``: sent as they are),
        ``None`` when it is not the route."""
        raise NotImplementedError

    def _http_fault(self, fault: str, model: str) -> str | None:
        """Raise the ``_HTTPError`` an HTTP-level ``fault`` is (for ``model``); else the
        answer-level fault."""
        raise NotImplementedError

    def _not_json(self) -> Json:
        return self._error(400, "invalid_request_error", self.NOT_JSON)

    async def _handle(
        self, method: str, path: str, request: Json, idempotency_key: str | None
    ) -> Any:
        answer = await self._route(method, path, request)
        if answer is not None:
            return answer
        if path.startswith("/stub/"):
            return self._control(method, path, request)
        raise _HTTPError(404, self._error(404, "not_found_error", f"no route {method} {path}"))

    async def _sdk_prelude(self, model: str) -> str | None:
        """Latency and HTTP-level faults in this API's format; returns an answer fault."""
        fault = await self._delay_and_fault(model)
        if fault is None:
            return None
        if fault in ("hang", "stall"):  # no streams here: a stall is a hang, as unstreamed
            await asyncio.sleep(self.options.hang_seconds)
            raise _HTTPError(500, self._error(500, "api_error", "hung"))
        if fault == "bad_gateway":  # a proxy in front of the API: its page, not JSON
            raise _HTTPError(502, BAD_GATEWAY_BODY)
        return self._http_fault(fault, model)
