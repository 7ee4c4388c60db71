"""Structured output in the form a chat-completions server understands.

Servers that all call themselves OpenAI-compatible disagree on how a schema is asked for:

- ``json_schema``: OpenAI's ``response_format: {"type": "json_schema", "json_schema": ...}``
  (OpenAI, vLLM, SGLang, LM Studio, Ollama's ``/v1``).
- ``json_object_schema``: ``response_format: {"type": "json_object", "schema": ...}``
  (llama-cpp-python's server, which rejects ``json_schema`` with HTTP 500).
- ``tool``: force one function call whose parameters are the schema.
- ``prompt``: no constraint on the server; the schema goes in the instructions and the
  answer is validated (and, by recovery, retried with the validation error fed back).

``auto`` starts with ``json_schema``; when the server rejects the form (HTTP 400, 422 or
500 whose body names ``response_format``, or for ``tool`` names ``tool``), the endpoint
switches to the next form once and keeps it for the rest of the run (``FormSelector``).
A server may also take a form and drop its schema (llama-stack 0.7.3 turns ``json_object``
with a schema into plain ``json_object``): a provider that can tell (``openai``) checks
the probing call's complete answer for the schema's shape (``fits_shape``), and a
misfit moves on to the next form as a refusal does.
The form is settled once per endpoint before a phase fans out: while it is not, one call
probes the server (switching as often as it is refused) and the calls behind it wait, so
a run sends at most one refused request per form, however many calls start at once.

The Responses API (``openai``) has the same four forms in its own fields: ``text.format``
of type ``json_schema`` or ``json_object`` with a ``schema`` (what a Responses bridge in
front of llama-cpp-python passes on), a forced function call, or the schema in the
instructions (``responses_fields``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from sim.llm.errors import LLMAPIError, LLMConfigurationError
from sim.llm.types import StructuredOutput as Mode

Form = Literal["json_schema", "json_object_schema", "tool", "prompt"]
FORMS: tuple[Form, ...] = get_args(Form)
MODES: tuple[Mode, ...] = get_args(Mode)
#: the order ``auto`` tries forms in: the most constrained first
AUTO_ORDER: tuple[Form, ...] = ("json_schema", "json_object_schema", "tool", "prompt")
#: the HTTP statuses with which servers refuse a request shape they do not know
#: (llama-cpp-python answers a pydantic validation error with 500)
_REJECT_STATUSES = (400, 422, 500)

Json = dict[str, Any]
T = TypeVar("T")

PROMPT_SCHEMA = (
    "\n\nAnswer with one JSON object and nothing else (no prose, no code fence). "
    "It must validate against this JSON Schema:\n{schema}"
)


def checked_mode(value: str) -> Mode:
    """``value`` as a ``structured_output`` setting; anything else is a configuration error."""
    if value not in MODES:
        raise LLMConfigurationError(
            f"unknown structured_output {value!r}; expected one of: {', '.join(MODES)}"
        )
    return value


def request_fields(form: Form, name: str, schema: Json) -> Json:
    """The chat-completions body fields that ask for ``schema`` in ``form``.

    Args:
        form: the structured-output form.
        name: the schema's name (a function name for ``tool``).
        schema: the JSON Schema (OpenAI's strict form).
    """
    if form == "json_schema":
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            }
        }
    if form == "json_object_schema":
        return {"response_format": {"type": "json_object", "schema": schema}}
    if form == "tool":
        return {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": f"Give the answer as a {name}.",
                        "parameters": schema,
                    },
                }
            ],
            "tool_choice": {"type": "function", "function": {"name": name}},
        }
    return {}


def responses_fields(form: Form, name: str, schema: Json) -> Json:
    """The Responses API body fields that ask for ``schema`` in ``form`` (the arguments as
    ``request_fields``'s)."""
    if form == "json_schema":
        return {
            "text": {
                "format": {"type": "json_schema", "name": name, "schema": schema, "strict": True}
            }
        }
    if form == "json_object_schema":
        return {"text": {"format": {"type": "json_object", "schema": schema}}}
    if form == "tool":
        return {
            "tools": [
                {
                    "type": "function",
                    "name": name,
                    "description": f"Give the answer as a {name}.",
                    "parameters": schema,
                    "strict": True,
                }
            ],
            "tool_choice": {"type": "function", "name": name},
        }
    return {}


def instructions_for(form: Form, instructions: str, schema: Json) -> str:
    """The instructions to send: ``prompt`` appends the schema, the others send them as is."""
    if form != "prompt":
        return instructions
    return instructions + PROMPT_SCHEMA.format(schema=json.dumps(schema, separators=(",", ":")))


_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n(.*?)\n?\s*```\s*$", re.DOTALL)


def unfenced(text: str) -> str:
    """``text`` without a surrounding code fence (small models add one when told not to)."""
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text.strip()


def answer_text(form: Form, message: Json) -> str:
    """The JSON text of the answer in a chat ``message``.

    ``tool``: the forced call's arguments (falling back to the content when a server
    answers in text). ``prompt``: the content without a surrounding code fence, which
    small models add even when told not to.
    """
    if form == "tool":
        for call in message.get("tool_calls") or ():
            arguments = (call.get("function") or {}).get("arguments")
            if isinstance(arguments, dict):
                return json.dumps(arguments)
            if arguments:
                return str(arguments)
    text = str(message.get("content") or "")
    return unfenced(text) if form == "prompt" else text


def rejects_form(error: LLMAPIError, form: Form, schema_field: str = "response_format") -> bool:
    """Whether ``error`` is the server refusing the request shape of ``form``.

    HTTP 400, 422 or 500 whose body names ``schema_field`` (the ``json_schema`` and
    ``json_object_schema`` forms: ``response_format`` for chat completions, ``format`` for
    the Responses API's ``text.format``) or ``tool`` (the ``tool`` form). ``prompt`` asks
    nothing of the server, so nothing rejects it.
    """
    if error.status_code not in _REJECT_STATUSES or form == "prompt":
        return False
    body = error.response_body
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    text = f"{text} {error.message}"
    needle = "tool" if form == "tool" else schema_field
    return needle in text


def fits_shape(text: str, schema: Json) -> bool:
    """Whether ``text`` is a JSON object of ``schema``'s top-level shape: every required
    key, and no key outside its properties when ``additionalProperties`` is false.

    A server that applies the schema (a grammar, guided decoding) cannot answer
    otherwise, whatever the model; one that took the form and dropped the schema answers
    whatever JSON the model likes. Only the top level is looked at: the answer's content
    is the validator's to judge, and its errors are fed back by recovery.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    if any(key not in data for key in schema.get("required") or ()):
        return False
    properties = schema.get("properties") or {}
    return schema.get("additionalProperties", True) is not False or all(
        key in properties for key in data
    )


def next_form(form: Form, order: tuple[Form, ...] = AUTO_ORDER) -> Form | None:
    """The form ``auto`` tries after ``form`` (``order``: the endpoint's kind's forms)."""
    index = order.index(form) if form in order else len(order)
    return order[index + 1] if index + 1 < len(order) else None


@dataclass(frozen=True, slots=True)
class FormSwitch:
    """One switch ``auto`` made, for the tick summary."""

    endpoint: str
    old: Form
    new: Form
    reason: str

    def note(self) -> str:
        return (
            f"structured output: {self.endpoint} rejected {self.old} ({self.reason}); "
            f"using {self.new} for the rest of the run "
            f'(set [llm] structured_output = "{self.new}" to start there)'
        )


class FormSelector:
    """Which form each call to one endpoint uses; ``auto``'s memory for the run.

    Args:
        endpoint: the server's base URL, named in notes.
        schema_field: the request field a server names when it refuses a schema form
            (``rejects_form``).
        order: the forms ``auto`` tries, in order (the kind's profile's
            ``structured_output``; default ``AUTO_ORDER``).
    """

    def __init__(
        self,
        endpoint: str,
        schema_field: str = "response_format",
        order: tuple[Form, ...] = AUTO_ORDER,
    ) -> None:
        self.endpoint = endpoint
        self.schema_field = schema_field
        self.order = order or AUTO_ORDER
        self.current: Form = self.order[0]
        #: the server took ``current`` (or refused every form): no call probes any more
        self.settled = False
        self.switches: list[FormSwitch] = []
        #: how many of ``switches`` an answer has said (``untold``)
        self.told = 0
        self._lock = threading.Lock()
        self._probe: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def form(self, mode: Mode) -> Form:
        """The form to send for a call whose setting is ``mode``."""
        return self.current if mode == "auto" else mode

    def switch(self, rejected: Form, error: LLMAPIError | str) -> FormSwitch | None:
        """After the server rejected ``rejected`` (``error``: its refusal, or why its
        answer shows the form was not applied): move on to the next form, once.

        Calls in flight when the switch happens were sent with the old form; their
        rejections find the endpoint already moved on and get ``None`` back with
        ``current`` changed, so they simply resend. Returns the switch this call made, or
        ``None`` (already switched past ``rejected``, or no form left).
        """
        with self._lock:
            if self.current != rejected:
                return None
            new = next_form(rejected, self.order)
            if new is None:
                return None
            if isinstance(error, str):
                reason = error
            else:
                needle = "tool" if rejected == "tool" else self.schema_field
                reason = f"HTTP {error.status_code} naming {needle}"
            made = FormSwitch(self.endpoint, rejected, new, reason)
            self.current = new
            self.switches.append(made)
            return made

    def untold(self) -> list[str]:
        """The notes of the switches no answer has said yet, marked said: a switch made
        by a call that then failed (its answer a schema error, say) is said by the next
        answer instead of being lost with the error."""
        with self._lock:
            notes = [made.note() for made in self.switches[self.told :]]
            self.told = len(self.switches)
            return notes

    def _probe_lock(self) -> asyncio.Lock:
        """The lock the probing call holds (one per event loop: a lock is bound to one)."""
        loop = asyncio.get_running_loop()
        if self._probe is None or self._probe[0] is not loop:
            self._probe = (loop, asyncio.Lock())
        return self._probe[1]

    async def send(
        self,
        mode: Mode,
        post: Callable[[Form], Awaitable[T]],
        *,
        probe: bool = True,
        applied: Callable[[T, Form], bool | None] | None = None,
    ) -> tuple[T, Form, FormSwitch | None]:
        """Send one call with ``post(form)``: its answer, the form it went in, and the
        switch it made, if any.

        A fixed ``mode`` is sent as it is. With ``auto``, while the endpoint's form is not
        settled, one call at a time probes: it holds the probe lock, moves on to the next
        form each time the server refuses one, and settles the form when the server
        answers. The calls behind it wait (before anything is sent: no timeout runs) and
        then go in the settled form. A probe that fails otherwise (a timeout, a 5xx not
        naming the form) settles nothing: the next call probes.

        Without ``probe`` (a call that is a line of a Batch API upload: holding the others
        back would hold back the batch it waits for) the current form is sent as it is.

        ``applied(answer, form)``: whether the probing call's answer shows the server
        applied the form's schema (``None``: cannot tell, e.g. an answer cut short). A
        ``False`` moves on to the next form as a refusal does; a ``None`` settles nothing.
        """
        if mode != "auto" or not probe:
            form = self.form(mode)
            return await post(form), form, None
        if not self.settled:
            async with self._probe_lock():
                if not self.settled:
                    answer, form, switched, known = await self._fall_back(post, applied)
                    self.settled = known
                    return answer, form, switched
        answer, form, switched, _ = await self._fall_back(post)
        return answer, form, switched

    async def _fall_back(
        self,
        post: Callable[[Form], Awaitable[T]],
        applied: Callable[[T, Form], bool | None] | None = None,
    ) -> tuple[T, Form, FormSwitch | None, bool]:
        """The answer, its form, the switch made, and whether the form is known to work."""
        form = self.current
        switched: FormSwitch | None = None
        while True:
            try:
                answer = await post(form)
            except LLMAPIError as exc:
                if not rejects_form(exc, form, self.schema_field):
                    raise
                switched = self.switch(form, exc) or switched
                if self.current == form:  # no form left to try
                    self.settled = True
                    raise
                form = self.current
                continue
            verdict = True if applied is None else applied(answer, form)
            if verdict is False:
                misfit = "answered outside the schema: the server dropped it"
                switched = self.switch(form, misfit) or switched
                if self.current != form:
                    form = self.current
                    continue
                verdict = True  # no form left: keep this one
            return answer, form, switched, verdict is True
