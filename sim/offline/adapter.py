"""The ``offline`` provider: a deterministic stand-in for a model, with no network.

Answers come from ``sim.offline``, which writes schema-valid, plausible content from the
names, places and objects in its input. The same world seed, instructions, input and chain
window always give the same answer, response id and token counts, so a whole run is
byte-for-byte reproducible while exercising chains, usage and the response store exactly as
a real provider would.
"""

from __future__ import annotations

import hashlib

import orjson
from pydantic import BaseModel, ValidationError

from sim.llm.calls import schema_json
from sim.llm.enums import constrain
from sim.llm.errors import LLMSchemaError
from sim.llm.tools import FunctionCall, LLMMessage, ToolCalls, schema_of
from sim.llm.types import AdapterResponse, Exchange, ModelRequest, Usage
from sim.offline import estimate_tokens, generate, generate_tool_call
from sim.offline.tools import generate_query_call

#: instructions texts whose hash prefix is kept (a tick's phases send a handful)
_PREFIXES = 64


def message_text(message: LLMMessage) -> str:
    """One conversation message as text: its content, call or tool answer as JSON."""
    return orjson.dumps(message.model_dump(mode="json", exclude_none=True)).decode()


class OfflineAdapter:
    """Deterministic offline model.

    Args:
        seed: the world seed; part of every answer's randomness.
    """

    name = "offline"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.deleted: list[str] = []
        #: the hash state after the seed and each instructions text seen (a phase sends
        #: one text with every call): a copy of it is each call's start
        self._prefixes: dict[str, hashlib.blake2b] = {}

    def _seed(
        self,
        instructions: str,
        input_data: str,
        history: tuple[Exchange, ...],
        steps: tuple[str, ...] = (),
    ) -> str:
        prefix = self._prefixes.get(instructions)
        if prefix is None:
            prefix = hashlib.blake2b(digest_size=16)
            prefix.update(f"{self.seed}\x00".encode())
            prefix.update(instructions.encode())
            prefix.update(b"\x00")
            if len(self._prefixes) >= _PREFIXES:  # instructions that vary per call
                self._prefixes.clear()
            self._prefixes[instructions] = prefix
        digest = prefix.copy()
        digest.update(input_data.encode())
        for exchange in history:
            digest.update(b"\x00")
            digest.update(exchange.response_id.encode())
        for step in steps:  # none in a single-turn call: its seed is unchanged
            digest.update(b"\x01")
            digest.update(step.encode())
        return digest.hexdigest()

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """A seeded answer: schema-valid content, or a tool call when ``tools`` are set
        (a short text instead when ``tool_choice`` is ``none``). Each step of a tool
        conversation (``messages``) is part of the seed, so each gets its own answer."""
        steps = tuple(message_text(m) for m in request.messages)
        seed = self._seed(request.instructions, request.input, request.history, steps)
        window = [(e.input, e.output) for e in request.history]
        window += [(text, "") for text in steps]
        parsed: BaseModel
        if request.tools is not None and request.tool_choice == "none":
            parsed = ToolCalls(calls=[], content="Understood.")
            raw = parsed.dump()
            finish = "stop"
        elif request.tools is not None:
            # with sim's query tools offered, one look/recall/inventory step comes first
            step = None
            if not request.messages:
                offered = {tool.name for tool in request.tools}
                step = generate_query_call(offered, request.input, seed=seed)
            name, arguments = step or generate_tool_call(
                [tool.openai_responses() for tool in request.tools],
                request.input,
                seed=seed,
                history=window,
            )
            calls = [FunctionCall(name=name, arguments=arguments, call_id=f"call_{seed[:12]}")]
            parsed = ToolCalls(calls=calls if name else [])
            raw = parsed.dump()
            finish = "tool_calls" if name else "stop"
        else:
            schema = schema_of(self, request)
            # the ids a request sends as enums (``sim.llm.enums``) bind the offline model as
            # they bind a grammar-enforcing server: a field it fills picks one of them
            data = generate(
                constrain(schema_json(schema), request.enums),
                request.input,
                seed=seed,
                history=window,
                instructions=request.instructions,
            )
            try:
                parsed = schema.model_validate(data)
            except ValidationError as exc:  # a bug in the offline model, reported like a model's
                raise LLMSchemaError(
                    f"offline model produced output invalid for {schema.__name__}: {exc}",
                    model="offline",
                ) from exc
            raw = orjson.dumps(data).decode()
            finish = "stop"
        input_tokens = estimate_tokens(request.instructions) + estimate_tokens(request.input)
        for exchange in request.history:
            input_tokens += estimate_tokens(exchange.input) + estimate_tokens(exchange.output)
        input_tokens += sum(estimate_tokens(step) for step in steps)
        return AdapterResponse(
            parsed=parsed,
            response_id=f"off_{seed[:24]}",
            usage=Usage(input_tokens=input_tokens, output_tokens=estimate_tokens(raw)),
            model="offline",
            finish_reason=finish,
            raw=raw,
            provider=self.name,
        )

    async def delete_response(self, response_id: str) -> None:
        """Offline responses live only in the engine's store; record the request."""
        self.deleted.append(response_id)
