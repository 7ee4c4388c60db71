"""The base of cross-cutting adapter wrappers (STYLE #6): one hook around every call.

A wrapper that only needs to act before and after a call (budget, rate limit, recording)
overrides ``around``; both call kinds — structured output and tool calls — go through it,
and deletion and config checks pass straight to the wrapped adapter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sim.llm.tools import ToolDeclaration, require_tools
from sim.llm.types import AdapterResponse, CallSettings, Exchange

Call = Callable[[], Awaitable[AdapterResponse]]


@dataclass(frozen=True, slots=True)
class Sent:
    """What one call sends, as a wrapper sees it."""

    instructions: str
    input_data: str
    settings: CallSettings
    history: tuple[Exchange, ...]
    previous_response_id: str | None


class AdapterWrapper:
    """Wraps an adapter; subclasses override ``around``.

    Args:
        inner: the wrapped adapter (its ``name`` is this wrapper's name).
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = inner.name

    async def around(self, call: Call, sent: Sent) -> AdapterResponse:
        """Run ``call`` (the wrapped adapter's call); the default does nothing else."""
        return await call()

    async def execute(
        self,
        instructions: str,
        input_data: str,
        schema: type[BaseModel],
        previous_response_id: str | None = None,
        settings: CallSettings | None = None,
        history: tuple[Exchange, ...] = (),
    ) -> AdapterResponse:
        settings = settings or CallSettings()
        sent = Sent(instructions, input_data, settings, history, previous_response_id)
        return await self.around(
            lambda: self.inner.execute(
                instructions, input_data, schema, previous_response_id, settings, history
            ),
            sent,
        )

    async def execute_tools(
        self,
        instructions: str,
        input_data: str,
        tools: tuple[ToolDeclaration, ...],
        settings: CallSettings | None = None,
        history: tuple[Exchange, ...] = (),
    ) -> AdapterResponse:
        """The optional tool-calling capability; fails loudly if the wrapped adapter lacks it."""
        settings = settings or CallSettings()
        inner = require_tools(self.inner)
        sent = Sent(instructions, input_data, settings, history, None)
        return await self.around(
            lambda: inner.execute_tools(instructions, input_data, tools, settings, history),
            sent,
        )

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)

    def validate_config(self, settings: CallSettings) -> bool:
        return bool(self.inner.validate_config(settings))
