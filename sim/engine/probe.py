"""Probing an endpoint before a tick is paid for (``sim check --provider/--base-url/--model``).

A tick fans out tens of calls at once; a wrong URL, key or model name costs a failed tick
to find out, and a local server's quirks (the structured-output form it takes, how many
requests it serves at once) are only noted once the tick runs. The probe asks the first
phase's endpoint, as a tick would reach it (the same provider adapter, key, headers and
TLS settings), what the tick would learn:

- reachable: one small structured request (a few tokens: ``{"ok": true}``) connects;
- key: the server did not refuse it (401/403);
- model: the server did not answer that it has no such model;
- structured output: the form the server took (``auto`` moves on from ``json_schema``
  the way a tick does, ``sim.providers._structured``);
- slots: how many requests it serves at once, as it reports it (``sim.llm.capacity``).

Each is a line of the result; the first failure ends the probe (what follows cannot be
told) and names the cause, such as a closed port. The request goes to the endpoint the
user chose, once, without retries or fallback models; its tokens are the only cost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from sim.config import Config, routing
from sim.engine.stack import provider_options
from sim.llm.capacity import ServerCapacity
from sim.llm.errors import LLMAPIError, LLMConfigurationError, LLMError, LLMIncompleteError
from sim.llm.redact import redact_text, redact_url
from sim.llm.types import Adapter, ModelRequest
from sim.providers import create_adapter, profile
from sim.providers._structured import FormSelector

#: the phase whose endpoint and model the probe asks (the first a tick calls)
SECTION = "phase1"
#: the answer's cap: room for ``{"ok": true}`` in any form, little to pay
MAX_OUTPUT_TOKENS = 64
#: the whole probe call's deadline at most (a tick's own may be minutes)
TIMEOUT_SECONDS = 60.0


class ProbeAnswer(BaseModel):
    """What the probe asks for: the smallest structured answer."""

    model_config = ConfigDict(title="Probe")

    ok: bool


@dataclass
class ProbeResult:
    """What the probe found.

    Attributes:
        endpoint: the endpoint's name, kind and URL (credentials redacted).
        model: the model asked.
        lines: ``(what, finding)`` in order: ``reachable``, ``key``, ``model``,
            ``structured output``, ``slots``.
        ok: every step passed.
    """

    endpoint: str
    model: str
    lines: list[tuple[str, str]] = field(default_factory=list)
    ok: bool = True

    def fail(self, what: str, finding: str) -> ProbeResult:
        self.lines.append((what, finding))
        self.ok = False
        return self

    def to_dict(self) -> dict[str, object]:
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "ok": self.ok,
            "steps": {what: finding for what, finding in self.lines},
        }


def probe(config: Config, seed: int = 0) -> ProbeResult:
    """Probe the first phase's endpoint (see the module doc); never raises an ``LLMError``
    (a failure is the result's last line)."""
    return asyncio.run(probe_async(config, seed))


async def probe_async(config: Config, seed: int = 0) -> ProbeResult:
    """``probe`` inside a running event loop."""
    table = routing(config)
    settings = config.call_settings(SECTION)
    spec = table.endpoints[settings.provider or table.default]
    url = redact_url(spec.base_url) if isinstance(spec.base_url, str) else ""
    where = f"{spec.name} ({spec.kind}" + (f", {url})" if url else ")")
    result = ProbeResult(where, settings.model)
    if not profile(spec.kind).network:
        result.lines.append(("reachable", f"{spec.kind}: no server to probe"))
        return result
    try:
        adapter = create_adapter(spec.kind, **provider_options(config, seed, spec))
    except LLMConfigurationError as exc:  # a missing key, an SDK not installed
        return result.fail("key", redact_text(str(exc)))
    if spec.structured_output is not None:
        settings = dataclasses.replace(settings, structured_output=spec.structured_output)
    request = ModelRequest(
        'Answer with {"ok": true}.',
        "ping",
        ProbeAnswer,
        settings=dataclasses.replace(
            settings,
            max_output_tokens=MAX_OUTPUT_TOKENS,
            timeout_seconds=min(settings.timeout_seconds, TIMEOUT_SECONDS),
            fallback_models=(),
            stream=False,
        ),
    )
    keyed = bool(spec.api_key_env and os.environ.get(spec.api_key_env))
    try:
        return await _steps(result, adapter, request, settings.structured_output, keyed)
    finally:
        close = getattr(adapter, "aclose", None)
        if close is not None:
            await close()


async def _steps(
    result: ProbeResult, adapter: Adapter, request: ModelRequest, mode: str, keyed: bool
) -> ProbeResult:
    try:
        response = await adapter.execute(request)
    except LLMError as exc:
        return _failed(result, exc, keyed)
    except Exception as exc:  # an adapter's own failure: reported, not a traceback
        return result.fail("reachable", f"unexpected error: {type(exc).__name__}: {exc}")
    else:
        answered = response.model or request.settings.model
        result.lines += [
            ("reachable", "yes"),
            ("key", _key_taken(keyed)),
            ("model", f"served (answered as {answered!r})"),
        ]
    result.lines.append(("structured output", _form(adapter, mode)))
    result.lines.append(("slots", await _slots(adapter)))
    return result


def _key_taken(keyed: bool) -> str:
    return "accepted" if keyed else "not needed (none set; the server took the request)"


def _failed(result: ProbeResult, exc: LLMError, keyed: bool) -> ProbeResult:
    """The step a failed probe call stopped at, with the error's own words."""
    message = redact_text(str(exc))
    code = exc.code
    status = exc.status_code if isinstance(exc, LLMAPIError) else None
    if code in ("connection_error", "tls_error", "timeout"):
        return result.fail("reachable", f"no: {message}")
    result.lines.append(("reachable", "yes"))
    if "rejected the API key" in message or status in (401, 403):
        return result.fail("key", f"refused: {message}")
    result.lines.append(("key", _key_taken(keyed)))
    if "unknown model" in message or status == 404:
        return result.fail("model", f"not served: {message}")
    if isinstance(exc, LLMIncompleteError):  # it answered, within a cap too small to tell
        result.lines.append(("model", "served"))
        return result.fail("structured output", f"unknown: {message}")
    return result.fail("answer", f"{code}: {message}")


def _form(adapter: object, mode: str) -> str:
    """The structured-output form the server took (``auto``: where it settled)."""
    forms = getattr(adapter, "forms", None)
    if not isinstance(forms, FormSelector):
        return "the provider's own (its API takes a schema)"
    if mode != "auto":
        return f"{mode} (as [llm] structured_output sets it)"
    refused = "; ".join(f"rejected {s.old} ({s.reason})" for s in forms.switches)
    taken = forms.current
    return (
        f"{taken}"
        + (f" ({refused})" if refused else "")
        + (f'; set [llm] structured_output = "{taken}" to start there' if refused else "")
    )


async def _slots(adapter: object) -> str:
    """How many requests the server serves at once, as it reports it."""
    ask = getattr(adapter, "server_capacity", None)
    if ask is None:
        return "not asked (a hosted API)"
    capacity = await ask()
    if not isinstance(capacity, ServerCapacity) or capacity.slots is None:
        return "not reported (the tick adapts its concurrency to latency and 429s)"
    return f"{capacity.slots} ({capacity.source})"


__all__ = ["ProbeAnswer", "ProbeResult", "probe", "probe_async"]
