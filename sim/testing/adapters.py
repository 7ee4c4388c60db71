"""Test doubles for the ``Adapter`` protocol: deterministic, offline, inspectable.

They ship with the package (not a dev extra), so user code and user tests may depend on
them (spec 001, "Mock adapters"). Queue answers and failures, then drive a client
(this example runs as a doctest in the test suite):

>>> import asyncio
>>> from sim.llm.client import LLMClient
>>> from sim.llm.errors import LLMRateLimitError
>>> from sim.phases.intentions import Intention
>>> adapter = MockAdapter()
>>> adapter.enqueue(
...     Intention(action="wait", target=None, content="rests", reasoning="tired"),
...     LLMRateLimitError("slow down"),
... )
>>> client = LLMClient(adapter, [{"identity": {"id": "ada"}}], default_depth=2)
>>> asyncio.run(client.create_response("Intend.", "{}", Intention, "intention:ada"))
Intention(action='wait', target=None, content='rests', reasoning='tired')
>>> asyncio.run(client.create_response("Intend.", "{}", Intention, "intention:ada"))
Traceback (most recent call last):
...
sim.llm.errors.LLMRateLimitError: slow down
>>> adapter.call_count, adapter.pending
(2, 0)

With nothing queued, an answer is built from the schema (``default_instance``):

>>> asyncio.run(client.create_response("Intend.", "{}", Intention)).action
'move'
"""

from __future__ import annotations

import asyncio
import enum
import types
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from sim.llm.errors import LLMError, LLMSchemaError
from sim.llm.tools import FunctionCall, ToolCalls, ToolDeclaration
from sim.llm.types import AdapterResponse, ModelRequest, Usage

#: What ``MockAdapter.enqueue`` accepts: an answer, or an exception to raise.
MockItem = BaseModel | Mapping[str, Any] | BaseException
#: ``default=`` callable: builds the answer when the queue is empty.
DefaultFactory = Callable[[type[BaseModel], str], BaseModel | Mapping[str, Any]]


#: One recorded ``execute`` call: the request the adapter was sent.
MockCall = ModelRequest


def default_instance(schema: type[BaseModel]) -> BaseModel:
    """A schema-valid instance with every required field filled by a placeholder.

    ``str`` -> ``"mock"``, ``int`` -> ``0``, ``float`` -> ``0.0``, ``bool`` -> ``False``,
    collections -> empty, ``Literal`` / enum -> first value, optional -> ``None``, nested
    models recursively. Simple bounds (``ge``, ``gt``, ``le``, ``lt``, ``min_length``,
    ``max_length``) are respected.

    Raises:
        TypeError: the schema has a required field of a type this cannot fill; pass
            ``default=`` to ``MockAdapter`` instead.
    """
    try:
        return schema.model_validate(_model_fields(schema))
    except ValidationError as exc:
        raise TypeError(
            f"cannot build a default {schema.__name__}; give MockAdapter a default=: {exc}"
        ) from exc


def _model_fields(schema: type[BaseModel]) -> dict[str, Any]:
    return {
        field.alias or name: _placeholder(field.annotation, field.metadata)
        for name, field in schema.model_fields.items()
        if field.is_required()
    }


def _bound(metadata: Iterable[Any], attr: str) -> Any:
    for item in metadata:
        value = getattr(item, attr, None)
        if value is not None:
            return value
    return None


def _number(kind: type[int] | type[float], metadata: Sequence[Any]) -> int | float:
    value: int | float = kind(0)
    ge, gt, le, lt = (_bound(metadata, a) for a in ("ge", "gt", "le", "lt"))
    if ge is not None and value < ge:
        value = kind(ge)
    if gt is not None and value <= gt:
        value = kind(gt) + 1 if kind is int else gt + 1.0
    if le is not None and value > le:
        value = kind(le)
    if lt is not None and value >= lt:
        value = kind(lt) - 1 if kind is int else lt - 1.0
    return value


def _sized(items: Callable[[int], Any], metadata: Sequence[Any]) -> Any:
    min_length = _bound(metadata, "min_length") or 0
    return items(int(min_length))


def _placeholder(annotation: Any, metadata: Sequence[Any] = ()) -> Any:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return _placeholder(args[0], [*metadata, *args[1:]])
    if annotation is None or annotation is type(None) or annotation is Any:
        return None
    if origin is Union or origin is types.UnionType:
        if type(None) in args:
            return None
        return _placeholder(args[0], metadata)
    if origin is Literal:
        return args[0]
    if isinstance(annotation, type) and origin is None:
        if issubclass(annotation, BaseModel):
            return _model_fields(annotation)
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, bool):
            return False
        if issubclass(annotation, int):
            return _number(int, metadata)
        if issubclass(annotation, float):
            return _number(float, metadata)
        if issubclass(annotation, str):
            text = "mock".ljust(int(_bound(metadata, "min_length") or 0), "k")
            max_length = _bound(metadata, "max_length")
            return text[:max_length] if max_length is not None else text
        if issubclass(annotation, bytes):
            return b"mock"
        if issubclass(annotation, list | set | frozenset | tuple):
            return []
        if issubclass(annotation, dict):
            return {}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sized(lambda n: [_placeholder(args[0])] * n, metadata)
        return [_placeholder(arg) for arg in args if arg != ()]
    if isinstance(origin, type):
        if issubclass(origin, Mapping):
            return {}
        if issubclass(origin, Iterable) and not issubclass(origin, str | bytes):
            item = args[0] if args else None
            return _sized(lambda n: [_placeholder(item) for _ in range(n)], metadata)
    return None  # unknown: validation reports it


def default_tool_calls(tools: Sequence[ToolDeclaration]) -> ToolCalls:
    """One call of the first declared tool, its required arguments filled from their JSON
    Schema (``"mock"``, ``0``, ``False``, empty collections, an enum's first value).

    >>> wait = ToolDeclaration(name="wait", description="Wait.", parameters={"type": "object"})
    >>> say = ToolDeclaration(
    ...     name="say",
    ...     description="Say something.",
    ...     parameters={
    ...         "type": "object",
    ...         "properties": {"to": {"type": "string"}, "loud": {"type": "boolean"}},
    ...         "required": ["to"],
    ...     },
    ... )
    >>> default_tool_calls([say, wait]).calls
    [FunctionCall(name='say', arguments={'to': 'mock'}, call_id='mock_call_1')]
    """
    if not tools:
        return ToolCalls()
    tool = tools[0]
    properties = tool.parameters.get("properties") or {}
    arguments = {
        name: _json_placeholder(properties.get(name) or {})
        for name in tool.parameters.get("required") or []
    }
    return ToolCalls(
        calls=[FunctionCall(name=tool.name, arguments=arguments, call_id="mock_call_1")]
    )


def _json_placeholder(schema: Mapping[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return {
        "string": "mock",
        "integer": 0,
        "number": 0.0,
        "boolean": False,
        "array": [],
        "object": {},
    }.get(str(kind))


class MockAdapter:
    """A deterministic offline adapter: queued answers first, then schema defaults.

    Args:
        default: ``(schema, input_data) -> model | dict`` used when the queue is empty;
            without it, ``default_instance(schema)``.
        delay: seconds each ``execute`` sleeps, to exercise concurrency.
        cached_input_tokens: reported as cached in every response's usage (capped at
            the input tokens).
    """

    name = "mock"

    def __init__(
        self,
        default: DefaultFactory | None = None,
        *,
        delay: float = 0.0,
        cached_input_tokens: int = 0,
    ) -> None:
        self.default = default
        self.delay = delay
        self.cached_input_tokens = cached_input_tokens
        self._queue: deque[MockItem] = deque()
        self.call_count = 0
        self.calls: list[ModelRequest] = []
        self.deleted: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._next_id = 0

    @property
    def last_request(self) -> ModelRequest | None:
        """The most recent call, or ``None`` before the first."""
        return self.calls[-1] if self.calls else None

    @property
    def pending(self) -> int:
        """Queued items not yet consumed."""
        return len(self._queue)

    def enqueue(self, *items: MockItem) -> None:
        """Queue answers (models or dicts) or exceptions, consumed one per call in order.

        ``LLMError`` instances simulate provider failures; other exceptions simulate a
        misbehaving adapter (the protocol allows only ``LLMError``).
        """
        self._queue.extend(items)

    def reset(self) -> None:
        """Forget calls, deletions, queued items and counters."""
        self._queue.clear()
        self.call_count = 0
        self.calls.clear()
        self.deleted.clear()
        self.in_flight = 0
        self.max_in_flight = 0
        self._next_id = 0

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """Record the call, then answer from the queue or the default.

        A tool-calling request (``request.tools``) is answered with a ``ToolCalls``: a
        queued ``ToolCalls``, ``FunctionCall`` (one call) or dict, else ``default``, else
        a call of the first declared tool with its required arguments filled
        (``default_tool_calls``). A queued call of an undeclared tool is answered as is,
        as a model might.
        """
        self.call_count += 1
        self.calls.append(request)
        schema = ToolCalls if request.tools is not None else request.schema
        assert schema is not None  # a ModelRequest has exactly one of schema and tools
        item = self._queue.popleft() if self._queue else None
        if isinstance(item, FunctionCall):
            item = ToolCalls(calls=[item])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay > 0:
                await asyncio.sleep(self.delay)
            if isinstance(item, BaseException):
                raise item
            if item is None:
                if self.default is not None:
                    item = self.default(schema, request.input)
                elif request.tools is not None:
                    item = default_tool_calls(request.tools)
                else:
                    item = default_instance(schema)
            parsed = _coerce(item, schema)
        finally:
            self.in_flight -= 1
        self._next_id += 1
        raw = parsed.model_dump_json()
        sent = len(request.instructions) + len(request.input)
        sent += sum(len(exchange.input) + len(exchange.output) for exchange in request.history)
        input_tokens = sent // 4 + 1
        return AdapterResponse(
            parsed=parsed,
            response_id=f"mock_{self._next_id}",
            usage=Usage(
                input_tokens=input_tokens,
                output_tokens=len(raw) // 4 + 1,
                cached_input_tokens=min(self.cached_input_tokens, input_tokens),
            ),
            model=request.settings.model,
            raw=raw,
            provider=self.name,
        )

    async def delete_response(self, response_id: str) -> None:
        """Record the deletion."""
        self.deleted.append(response_id)


def _coerce(item: BaseModel | Mapping[str, Any], schema: type[BaseModel]) -> BaseModel:
    """Validate a queued answer against the requested schema, as a real adapter would."""
    if isinstance(item, schema):
        return item
    data = item.model_dump() if isinstance(item, BaseModel) else item
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise LLMSchemaError(
            f"mock answer does not validate against {schema.__name__}: {exc}", cause=exc
        ) from exc


class ErrorAdapter:
    """An adapter whose every ``execute`` raises ``error``.

    Args:
        error: the ``LLMError`` to raise (the same instance each time).
    """

    name = "error"

    def __init__(self, error: LLMError) -> None:
        self.error = error
        self.call_count = 0
        self.deleted: list[str] = []

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """Count the call and raise ``error``."""
        self.call_count += 1
        raise self.error.with_traceback(None)

    async def delete_response(self, response_id: str) -> None:
        """Record the id; nothing to delete."""
        self.deleted.append(response_id)

    def reset(self) -> None:
        """Forget calls and deletions."""
        self.call_count = 0
        self.deleted.clear()


__all__ = [
    "DefaultFactory",
    "ErrorAdapter",
    "MockAdapter",
    "MockCall",
    "MockItem",
    "default_instance",
    "default_tool_calls",
]
