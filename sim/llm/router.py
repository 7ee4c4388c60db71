"""The router at the top of a stack's endpoints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from sim.llm.types import Adapter, AdapterResponse, ModelRequest, StructuredOutput
from sim.llm.wrapper import AdapterWrapper


class Router(AdapterWrapper):
    """Sends each attempt to the stack of the endpoint its settings name
    (``CallSettings.provider``; empty: the default endpoint).

    ``inner`` is the default endpoint's stack. An endpoint's own
    ``structured_output`` (``[providers.NAME]``) replaces the phase's for its requests:
    it describes that server.
    """

    def __init__(
        self,
        routes: Mapping[str, Adapter],
        default: str,
        structured: Mapping[str, StructuredOutput] | None = None,
    ) -> None:
        super().__init__(routes[default])
        self.default = default
        self.routes = dict(routes)
        self.structured = dict(structured or {})

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        name = request.settings.provider
        if name not in self.routes:
            # a request built from another config than this stack's (``sim replay --live``
            # re-runs a tick with its logged config and sends drifted requests where the
            # config now points): the default endpoint. A run's own requests always name
            # an endpoint of its stack (both come from ``sim.config.routing``).
            name = self.default
        form = self.structured.get(name)
        if form is not None and form != request.settings.structured_output:
            request = replace(request, settings=replace(request.settings, structured_output=form))
        return await self.routes[name].execute(request)
