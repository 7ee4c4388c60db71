"""The base of cross-cutting adapter wrappers (STYLE #6): one hook, ``execute(request)``.

A wrapper (budget, rate limit, recovery, recording, a tuning scratch run, a test's
counter) overrides ``execute``: it sees the whole ``ModelRequest`` (structured output and
tool calls alike), may send a changed copy (``dataclasses.replace``) one or more times
with ``self.inner.execute``, and returns or raises what came back. Deletion passes
straight through unless a wrapper overrides ``delete_response`` too.
"""

from __future__ import annotations

from sim.llm.types import Adapter, AdapterResponse, ModelRequest


class AdapterWrapper:
    """Wraps an adapter; subclasses override ``execute``.

    Args:
        inner: the wrapped adapter (its ``name`` is this wrapper's name).
    """

    def __init__(self, inner: Adapter) -> None:
        self.inner = inner
        self.name: str = inner.name

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """Send ``request`` to the wrapped adapter; the default does nothing else."""
        return await self.inner.execute(request)

    async def delete_response(self, response_id: str) -> None:
        await self.inner.delete_response(response_id)
