"""The ``replay`` provider: answers from a tick log's recorded calls instead of a model.

A request is matched by its request id (``{tick}:{phase}:{entity_key}:{n}``) and by the
digest of everything that decides its answer (``sim.llm.calls``). Two uses:

- ``mode="replay"`` (``sim replay``): a request whose digest differs from its recording has
  *drifted*; it is reported (which fields differ, a short diff) and then either answered
  from the recording anyway, so the rest of the tick runs as recorded and only the requests
  whose construction changed are named, or, with ``live``, sent to the live provider. A
  request the log does not hold at all fails with ``replay_missing`` (the phase falls back).
- ``mode="resume"`` (a tick interrupted by a crash, Ctrl-C or a stop such as a budget cap):
  calls the partial log completed successfully are answered from it and never sent again;
  every other request, failed ones included, goes to ``live``.

The call's identity comes in the request (``ModelRequest.call``), named by the tick
recorder: a request without one cannot be matched.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from sim.llm.calls import CallIdentity, describe_drift
from sim.llm.errors import LLMConfigurationError, LLMError, LLMSchemaError
from sim.llm.types import Adapter, AdapterResponse, Attempt, ModelRequest, Usage
from sim.providers.profiles import REPLAY


@dataclass(frozen=True, slots=True)
class Drift:
    """A request that no longer matches its recording."""

    request_id: str
    entity_key: str | None
    fields: tuple[str, ...]
    diff: str


def _attempt(data: Mapping[str, Any], number: int) -> Attempt:
    """A recorded attempt, as recovery records one."""
    return Attempt(
        str(data.get("model") or ""),
        int(data.get("attempt") or number),
        _usage(data.get("usage")),
        float(data.get("latency") or 0.0),
        data.get("error_code"),
        str(data.get("provider") or ""),
    )


def _usage(data: Mapping[str, Any] | None) -> Usage:
    data = data or {}
    return Usage(
        input_tokens=int(data.get("input_tokens", 0)),
        output_tokens=int(data.get("output_tokens", 0)),
        cached_input_tokens=int(data.get("cached_input_tokens", 0)),
    )


def _result_class(record: Mapping[str, Any], schema: type[BaseModel] | None) -> type[BaseModel]:
    """The class to rebuild the answer as: the request's schema, or for a tool call (no
    schema) the class the log names, imported only from inside ``sim``."""
    if schema is not None:
        return schema
    named = str(record.get("result_type") or "")
    module, _, qualname = named.partition(":")
    if module == "sim" or module.startswith("sim."):
        cls = getattr(importlib.import_module(module), qualname, None)
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            return cls
    raise LLMSchemaError(f"{record.get('request_id')}: cannot rebuild a {named or '?'} answer")


class ReplayAdapter:
    """Serve recorded calls.

    Args:
        calls: call records by request id (``TickLog.calls``).
        instructions: recorded instructions texts by digest, for drift diffs.
        live: where unmatched requests go (resume; ``sim replay --live``), else nowhere.
        mode: ``"replay"`` or ``"resume"`` (see the module docstring).
    """

    name = "replay"
    profile = REPLAY

    def __init__(
        self,
        calls: Mapping[str, Mapping[str, Any]],
        *,
        instructions: Mapping[str, str] | None = None,
        live: Adapter | None = None,
        mode: Literal["replay", "resume"] = "replay",
    ) -> None:
        self.calls = dict(calls)
        self.instructions = dict(instructions or {})
        self.live = live
        self.mode = mode
        self.drifts: list[Drift] = []
        self.served = 0
        self.sent = 0
        if mode == "resume" and live is not None:
            self.name = live.name  # chain ids belong to the provider that made them

    async def execute(self, request: ModelRequest) -> AdapterResponse:
        """The recorded answer, or (unmatched, with ``live``) the live provider's."""
        served = self._lookup(request)
        if served is not None:
            return served
        assert self.live is not None
        self.sent += 1
        return await self.live.execute(request)

    def _lookup(self, request: ModelRequest) -> AdapterResponse | None:
        """The recorded answer to serve, or ``None`` to send the request live."""
        schema = request.schema
        ident = request.call
        if ident is None:
            raise LLMConfigurationError(
                "the replay provider needs calls named by the tick recorder"
            )
        record = self.calls.get(ident.request_id)
        if self.mode == "resume" and record is not None and record.get("error_code"):
            record = None  # a failed call is tried again: the outage may be over
        if record is not None and record.get("digest") == ident.digest:
            return self._serve(record, schema)
        if self.mode == "replay":
            self._drifted(ident, record)
        if self.live is not None:
            return None
        if record is None:
            raise LLMError(
                f"{ident.request_id}: no recorded response to replay", code="replay_missing"
            )
        return self._serve(record, schema)

    def _drifted(self, ident: CallIdentity, record: Mapping[str, Any] | None) -> None:
        if record is None:
            self.drifts.append(
                Drift(
                    ident.request_id,
                    ident.entity_key,
                    ("missing",),
                    "the log holds no such request",
                )
            )
            return
        recorded_text = self.instructions.get(str(record.get("instructions_digest")))
        fields, diff = describe_drift(dict(record), ident, recorded_text)
        self.drifts.append(Drift(ident.request_id, ident.entity_key, tuple(fields), diff))

    def _serve(self, record: Mapping[str, Any], schema: type[BaseModel] | None) -> AdapterResponse:
        self.served += 1
        attempts = tuple(_attempt(a, i) for i, a in enumerate(record.get("attempts") or [], 1))
        if record.get("error_code"):
            raise LLMError(
                str(record.get("error") or record["error_code"]),
                code=str(record["error_code"]),
                served_from=self.mode,
                attempts=attempts,
                usage=_usage(record.get("usage")),
            )
        cls = _result_class(record, schema)
        try:
            parsed = cls.model_validate(record["result"])
        except ValidationError as exc:  # the schema changed since the recording
            raise LLMSchemaError(
                f"{record.get('request_id')}: the recorded answer does not fit "
                f"{cls.__name__} any more: {exc}",
                served_from=self.mode,
            ) from exc
        raws = record.get("attempts") or [{}]
        return AdapterResponse(
            parsed=parsed,
            response_id=str(record["response_id"]),
            usage=_usage(record.get("usage")),
            model=str(record.get("response_model") or record.get("model") or ""),
            finish_reason=str(record.get("finish_reason") or "stop"),
            raw=str(raws[-1].get("raw") or ""),
            provider=self.name,
            served_from=self.mode,
            attempts=attempts,
        )

    async def delete_response(self, response_id: str) -> None:
        """Resume deletes through the live provider; a replay never touches the provider."""
        if self.mode == "resume" and self.live is not None:
            await self.live.delete_response(response_id)
