"""Tool calling over several turns, for any phase: query tools the engine answers, then a
final tool that decides.

Each subject's first request is asked with the final tools and the query tools; a subject
whose answer calls only query tools gets the engine's answers appended to its conversation
and is asked again, until it calls a final tool or ``max_steps`` query steps are used, after
which only the final tools are offered. Steps run in rounds: every subject still querying is
asked in one batch. Each step is one call of the phase's client, so it is one logged
exchange with its own request id (its identity covers the conversation): replay and resume
serve every step from the tick log, and usage counts every step.

Intentions in ``mode = "tools"`` use it (``sim.phases.intention_steps``: the final tools are
the actions), and so do declared phases that name ``tools`` (the final tool is ``answer``,
whose parameters are the phase's answer schema).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from sim.llm.client import LLMClient, LLMRequest
from sim.llm.tools import FunctionCall, FunctionResponse, LLMMessage, ToolCalls, ToolDeclaration

#: (the subject's index in the batch, one query call) -> the engine's answer
Answerer = Callable[[int, FunctionCall], dict[str, Any]]


def exchange(
    calls: Sequence[FunctionCall], answer: Callable[[FunctionCall], dict[str, Any]]
) -> tuple[LLMMessage, ...]:
    """The model's query calls and the engine's answers, as conversation messages."""
    messages: list[LLMMessage] = []
    for call in calls:
        messages.append(LLMMessage(role="assistant", function_call=call))
        messages.append(
            LLMMessage(
                role="function",
                function_response=FunctionResponse(
                    name=call.name, call_id=call.call_id, response=answer(call)
                ),
            )
        )
    return tuple(messages)


async def converse(
    client: LLMClient,
    requests: Sequence[LLMRequest],
    *,
    finals: tuple[ToolDeclaration, ...],
    queries: tuple[ToolDeclaration, ...],
    answer: Answerer,
    max_steps: int,
) -> tuple[list[Any], int]:
    """Ask every subject, answering its query calls, until each calls a final tool or runs
    out of steps.

    Args:
        requests: each subject's first request (its tools are replaced per step).
        finals: the tools that end a subject's turn (offered at every step).
        queries: the tools the engine answers (offered for the first ``max_steps`` steps).
        answer: the engine's answer to one query call of one subject.

    Returns:
        (each subject's last answer: a ``ToolCalls`` or an ``LLMError``, calls made).
    """
    results: list[Any] = [None] * len(requests)
    conversations: list[tuple[LLMMessage, ...]] = [()] * len(requests)
    pending = list(range(len(requests)))
    calls = 0
    deciding = frozenset(tool.name for tool in finals)
    asking = frozenset(tool.name for tool in queries)
    for step in range(max_steps + 1):
        tools = (*finals, *queries) if step < max_steps else finals
        batch = [replace(requests[i], tools=tools, messages=conversations[i]) for i in pending]
        answers = await client.create_batch(batch)
        calls += len(batch)
        querying = []
        for i, result in zip(pending, answers, strict=True):
            results[i] = result
            if not isinstance(result, ToolCalls) or step == max_steps:
                continue
            if any(c.name in deciding for c in result.calls):
                continue
            asked = [c for c in result.calls if c.name in asking]
            if asked:
                conversations[i] += exchange(asked, partial(answer, i))
                querying.append(i)
        pending = querying
        if not pending:
            break
    return results, calls


__all__ = ["Answerer", "converse", "exchange"]
