"""Spec 001's adapter surface: one synchronous call to a model, for scripts and notebooks.

The configured model in one line (``./config.toml``'s ``[llm]``, as ``sim tick`` would use
it: the same stack of recovery, budget and rate limits, every attempt counted)::

    from sim.connect import RunConfig, configured

    answer = configured().execute_prompt("Name a harbour town.", RunConfig())
    print(answer.content, answer.usage["total_tokens"], answer.metadata["provider"])

The names are spec 001's exactly: ``LLMAdapter`` (``execute_prompt``, ``validate_config``,
``async_execute_prompt``), ``RunConfig``, ``LLMResponse``, ``MockLLMAdapter``,
``ErrorLLMAdapter`` and the error tree (``LLMError`` and its subclasses, each with
``cause`` and ``context``). They are a facade over ``sim.llm``: a ``RunConfig`` becomes
the ``CallSettings`` of one ``ModelRequest``, the answer's ``AdapterResponse`` becomes an
``LLMResponse``; nothing of the call pipeline is repeated here.

A prompt is answered in text: the request asks for ``{"text": ...}`` (``Answer``), which
every provider can give (``cli`` and chat servers through the schema in the prompt), and
``content`` is that text. ``model_params={"schema": MyModel}`` asks for your own schema
instead: ``content`` is then the answer's JSON and ``metadata["parsed"]`` the validated
``MyModel``.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from sim.config import (
    Config,
    LLMConfig,
    PhaseConfig,
    load_config,
    merge_tables,
    phase_section,
    redacted,
    resolve_model,
    routing,
    validated,
)
from sim.engine.stack import Stack, build_stack, make_budget
from sim.errors import InputError
from sim.llm.budget import Budget
from sim.llm.errors import (
    LLMAPIError,
    LLMBudgetExceededError,
    LLMConfigurationError,
    LLMError,
    LLMRateLimitError,
    LLMSubprocessError,
    LLMTimeoutError,
)
from sim.llm.types import Adapter, AdapterResponse, Attempt, CallSettings, ModelRequest, Usage
from sim.testing.adapters import ErrorAdapter, MockAdapter
from sim.ticklog.books import Books
from sim.ticklog.records import AttemptRecord, CallRecord, TokenCounts

T = TypeVar("T")

#: the ``model_params`` keys ``execute_prompt`` of a configured adapter reads (``instructions``:
#: the system prompt; ``schema``: a pydantic model to answer in; ``fallback_models``)
MODEL_PARAMS = frozenset({"instructions", "schema", "fallback_models"})


class RunConfig(BaseModel):
    """One call's settings (spec 001): validated on creation and on assignment.

    ``max_depth`` and ``skip_if_exists`` are kept for code written against the spec; one
    call has no use for them. ``budget_tracker``: a ``sim.llm.budget.Budget`` the call is
    reserved against and counted in (a configured adapter's own, from ``[budget]``, when
    ``None``).
    """

    model_config = ConfigDict(
        validate_assignment=True, arbitrary_types_allowed=True, allow_inf_nan=False
    )

    model_name: str = Field("gpt-4", min_length=1)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    max_tokens: int = Field(2000, gt=0)
    model_params: dict[str, Any] = Field(default_factory=dict)
    max_depth: int = Field(3, ge=0)
    skip_if_exists: bool = True
    timeout_seconds: int = Field(300, gt=0)
    budget_tracker: Budget | None = None


@dataclass(frozen=True)
class LLMResponse:
    """One answer (spec 001).

    Attributes:
        content: the answer's text (with a ``schema``: its JSON).
        model: the model that answered (a fallback model, when the call fell back).
        usage: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` over every
            attempt of the call (each was paid for).
        finish_reason: ``"stop"``.
        metadata: ``provider`` (the adapter kind that answered: ``openai``, ``chat``,
            ``cli``, ``offline``, ``mock``...) always; from a configured adapter also
            ``endpoint``, ``response_id``, ``attempts``, ``fallback_from``/``fallback_to``
            and ``parsed`` (the validated answer).
    """

    content: str
    model: str
    usage: dict[str, int]
    finish_reason: str = "stop"
    metadata: dict[str, Any] = field(default_factory=dict)


def usage_dict(usage: Usage) -> dict[str, int]:
    """spec 001's usage keys for a ``Usage``."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


class LLMAdapter(ABC):
    """A model behind one synchronous call (spec 001).

    ``execute_prompt`` returns an ``LLMResponse`` or raises an ``LLMError`` subclass,
    never anything else; it does not change ``config``. ``validate_config`` is advisory and
    free of side effects.
    """

    @abstractmethod
    def execute_prompt(self, prompt: str, config: RunConfig) -> LLMResponse: ...

    @abstractmethod
    def validate_config(self, config: RunConfig) -> bool: ...

    async def async_execute_prompt(self, prompt: str, config: RunConfig) -> LLMResponse:
        """``execute_prompt`` in a worker thread, so an event loop is not blocked."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self.execute_prompt, prompt, config
        )


class Answer(BaseModel):
    """What a plain prompt is answered with."""

    model_config = ConfigDict(title="Answer")

    text: str = Field(description="your whole answer to the prompt, as plain text")


class PipelineAdapter(LLMAdapter):
    """Spec 001's call as a thin face over the pipeline's contract: any
    ``sim.llm.types.Adapter`` (a provider's adapter, a built stack, a test double). A
    ``RunConfig`` becomes one ``ModelRequest`` (``_request``), the adapter answers it on
    an event loop of the face's own in a background thread (so it works from plain
    scripts and from notebooks whose loop is already running), and its ``AdapterResponse``
    becomes an ``LLMResponse`` (``_response``). ``close()`` (or ``with``) stops the loop.

    Args:
        adapter: what answers (``sim.llm.types.Adapter``).
        settings: the calls' settings before a ``RunConfig`` applies its own
            (``model_name`` always, for a face over one adapter).
    """

    def __init__(self, adapter: Adapter | None, settings: CallSettings | None = None) -> None:
        #: what answers (``None`` until a subclass has built it)
        self.adapter = adapter
        self.settings = settings or CallSettings()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- the spec's calls -----------------------------------------------------------------

    def execute_prompt(self, prompt: str, config: RunConfig) -> LLMResponse:
        """Send ``prompt`` as ``config`` says; the answer.

        Raises:
            LLMError: the call failed (a subclass names how); nothing else leaves.
        """
        if not isinstance(prompt, str) or not isinstance(config, RunConfig):
            raise LLMConfigurationError(
                "execute_prompt takes a prompt (str) and a RunConfig",
                context={"prompt": type(prompt).__name__, "config": type(config).__name__},
            )
        request = self._request(prompt, config)
        adapter = self._adapter(config)
        try:
            response = self._run(self._call(adapter, request, config.timeout_seconds))
        except LLMError as exc:
            self._count(exc.attempts, request, failed=exc)
            raise
        except Exception as exc:  # invariant 2: nothing but an LLMError leaves
            raise LLMError(f"unexpected error: {exc!r}", code="unexpected", cause=exc) from exc
        self._count(response.attempts, request)
        return self._response(response, request.settings)

    def validate_config(self, config: RunConfig) -> bool:
        """Whether ``config`` makes a request (its ``model_params`` of the right types).
        Advisory (spec 001); nothing is sent."""
        try:
            self._request("", config)
        except LLMError:
            return False
        return True

    def close(self) -> None:
        """Stop the face's loop (idempotent)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def __enter__(self) -> PipelineAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- from a RunConfig to a ModelRequest and back -----------------------------------------

    def _adapter(self, config: RunConfig) -> Adapter:
        """What answers a call made with ``config``."""
        if self.adapter is None:  # pragma: no cover - every subclass builds one
            raise LLMConfigurationError("this adapter has nothing to answer with")
        return self.adapter

    def _settings(self, config: RunConfig) -> CallSettings:
        """The settings before ``config``'s temperature, token cap and timeout apply."""
        return replace(self.settings, model=config.model_name)

    def _request(self, prompt: str, config: RunConfig) -> ModelRequest:
        """The request ``config`` makes of ``prompt`` (``LLMConfigurationError``: a
        ``model_params`` value or a model this adapter cannot use)."""
        params = config.model_params
        schema = params.get("schema", Answer)
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise LLMConfigurationError(
                f"model_params['schema'] must be a pydantic model class, got {schema!r}"
            )
        instructions = params.get("instructions", "")
        if not isinstance(instructions, str):
            raise LLMConfigurationError("model_params['instructions'] must be a string")
        settings = self._settings(config)
        try:
            settings = replace(
                settings,
                temperature=config.temperature,
                max_output_tokens=config.max_tokens,
                timeout_seconds=float(config.timeout_seconds),
            )
        except ValueError as exc:  # RunConfig's own ranges make this unreachable
            raise LLMConfigurationError(str(exc), cause=exc) from None
        return ModelRequest(instructions, prompt, schema, settings=settings)

    def _response(self, response: AdapterResponse, settings: CallSettings) -> LLMResponse:
        parsed = response.parsed
        if isinstance(parsed, Answer):
            content = parsed.text
        else:
            content = response.raw or parsed.model_dump_json()
        total = _total(response.attempts) if response.attempts else response.usage
        return LLMResponse(
            content=content,
            model=response.model or settings.model,
            usage=usage_dict(total),
            finish_reason=response.finish_reason,
            metadata={
                "provider": response.provider or settings.provider,
                # the endpoint that answered (a fallback model's may be another)
                "endpoint": response.attempts[-1].provider
                if response.attempts
                else settings.provider,
                "response_id": response.response_id,
                "attempts": len(response.attempts) or 1,
                "fallback_from": response.fallback_from,
                "fallback_to": response.fallback_to,
                "served_from": response.served_from,
                "parsed": parsed,
            },
        )

    def _count(
        self, attempts: Iterable[Attempt], request: ModelRequest, failed: LLMError | None = None
    ) -> None:
        """Count one call (a face over one adapter keeps no books)."""

    # -- the adapter on the face's loop -----------------------------------------------------

    async def _call(self, adapter: Adapter, request: ModelRequest, seconds: int) -> AdapterResponse:
        try:
            async with asyncio.timeout(seconds):
                return await adapter.execute(request)
        except TimeoutError as exc:
            raise LLMTimeoutError(
                f"no answer within timeout_seconds = {seconds}",
                cause=exc,
                model=request.settings.model,
                context={"timeout_seconds": seconds},
            ) from None

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the face's loop (started on first use) and wait for it;
        Ctrl-C cancels it."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="sim.connect", daemon=True
                )
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise


class ConfiguredAdapter(PipelineAdapter):
    """The configured provider behind spec 001's call: made by ``configured``.

    Built once, it keeps the run's stack (recovery, breakers, budget, rate limits, HTTP
    clients) on an event loop of its own in a background thread, so it works from plain
    scripts and from notebooks whose loop is already running. ``books`` counts every call
    and attempt (``sim.ticklog.books.Books``: calls, failures, tokens, cost at
    ``[prices]``); ``budget`` is ``[budget]``'s. ``close()`` (or ``with``) closes it.

    Args:
        config: the effective configuration.
        phase: whose model, fallback models and settings a call uses (default ``narrative``).
        seed: the offline provider's seed.

    Raises:
        LLMConfigurationError: unknown phase, provider or model, missing API key.
    """

    def __init__(self, config: Config, *, phase: str = "narrative", seed: int = 0) -> None:
        section = _section(phase, config)
        self.config = config
        self.phase = phase
        self.seed = seed
        self.endpoints = frozenset(spec.name for spec in routing(config).used())
        self.budget = make_budget(config)
        self.books = Books()
        self._prices: dict[str, Any] = {}
        self._stacks: dict[int, tuple[Budget, Stack]] = {}
        super().__init__(None, config.call_settings(section))
        try:
            self.adapter = self._stack(self.budget)  # a missing key fails here, before any call
        except BaseException:
            self.close()
            raise

    # -- the spec's calls -----------------------------------------------------------------

    def execute_prompt(self, prompt: str, config: RunConfig) -> LLMResponse:
        """Send ``prompt`` to the configured model (``config.model_name`` instead, when
        set explicitly), through recovery, the budget and the rate limits.

        Raises:
            LLMError: the call failed after recovery (a subclass names how).
        """
        answer = super().execute_prompt(prompt, config)
        unused = unused_params(config)
        if unused:  # a pass-through no sim provider takes: said, not silently dropped
            answer.metadata["unused_model_params"] = unused
        return answer

    def validate_config(self, config: RunConfig) -> bool:
        """Whether ``config`` suits this adapter: only ``model_params`` it reads, a schema
        that is a pydantic model, and a ``model_name`` (when set) on an endpoint it was
        built with. Advisory (spec 001): other ``model_params`` do not stop a call (they
        are listed in its ``metadata["unused_model_params"]``); nothing is sent."""
        try:
            self._request("", config)
        except LLMError:
            return False
        return not unused_params(config)

    def close(self) -> None:
        """Close every HTTP client on the adapter's loop and stop it (idempotent)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        stacks, self._stacks = list(self._stacks.values()), {}
        for _, stack in stacks:
            self._run(stack.aclose())
        super().close()

    def __enter__(self) -> ConfiguredAdapter:
        return self

    # -- from a RunConfig to a ModelRequest and back -----------------------------------------

    def _adapter(self, config: RunConfig) -> Adapter:
        return self._stack(config.budget_tracker or self.budget)

    def _settings(self, config: RunConfig) -> CallSettings:
        """The configured phase's settings, with ``config.model_name`` (when set
        explicitly) and ``model_params['fallback_models']`` resolved on the endpoints
        this adapter was built with."""
        settings = self.settings
        params = config.model_params
        if "model_name" in config.model_fields_set:  # else the configured model (spec: MAY)
            settings = self._on(settings, config.model_name)
        if "fallback_models" in params:
            fallbacks = params["fallback_models"]
            if isinstance(fallbacks, str) or not all(isinstance(m, str) for m in fallbacks):
                raise LLMConfigurationError("model_params['fallback_models'] must be model names")
            for model in fallbacks:
                self._on(settings, model)  # each on an endpoint this adapter was built with
            settings = replace(
                settings, fallback_models=tuple(resolve_model(self.config, m) for m in fallbacks)
            )
        return settings

    def _on(self, settings: CallSettings, model: str) -> CallSettings:
        """``settings`` with ``model`` (``provider/model`` or bare) as the model to call."""
        target = resolve_model(self.config, model)
        if target.provider not in self.endpoints:
            raise LLMConfigurationError(
                f"model {model!r} runs on endpoint {target.provider!r}, which this adapter "
                f"was not built with ({', '.join(sorted(self.endpoints))}); name it in the "
                "config or in configured(model=...)",
                model=model,
            )
        return replace(settings, model=target.model, provider=target.provider, fallback_models=())

    # -- the stack on the adapter's loop ----------------------------------------------------

    def _stack(self, budget: Budget) -> Adapter:
        """The stack that reserves against ``budget`` (one per budget, built once)."""
        with self._lock:
            found = self._stacks.get(id(budget))
        if found is not None:
            return found[1].adapter

        async def build() -> Stack:
            return build_stack(self.config, self.seed, budget=budget)

        stack = self._run(build())
        with self._lock:
            self._stacks[id(budget)] = (budget, stack)  # the budget kept: its id stays its
        return stack.adapter

    def _count(
        self, attempts: Iterable[Attempt], request: ModelRequest, failed: LLMError | None = None
    ) -> None:
        """Count one call in the books: every attempt, priced at ``[prices]``."""
        records = [
            AttemptRecord(
                attempt=a.attempt,
                model=a.model,
                provider=a.provider,
                usage=TokenCounts.of(a.usage),
                latency=a.latency,
                error_code=a.error_code,
            )
            for a in attempts
        ]
        if not records:  # failed before recovery recorded an attempt
            usage = failed.usage if failed is not None else Usage()
            records = [
                AttemptRecord(
                    model=request.settings.model,
                    provider=request.settings.provider,
                    usage=TokenCounts.of(usage),
                    error_code=failed.code if failed is not None else None,
                )
            ]
        with self._lock:
            call = CallRecord(
                request_id=f"connect:{self.books.calls + 1}",
                phase="connect",
                model=request.settings.model,
                error_code=failed.code if failed is not None else None,
                attempts=records,
            )
            self.books.add_call(call, self.config.prices, self._prices)


def unused_params(config: RunConfig) -> list[str]:
    """The ``model_params`` keys a configured adapter does not read (``MODEL_PARAMS``)."""
    return sorted(set(config.model_params) - MODEL_PARAMS)


def _total(attempts: Iterable[Attempt]) -> Usage:
    total = Usage()
    for attempt in attempts:
        total = total + attempt.usage
    return total


#: ``configured`` keywords that set the chosen phase's settings (the rest are ``[llm]``'s)
_PHASE_KEYS = frozenset(PhaseConfig.model_fields) - {"provider", "base_url", "api_key_env"}


def configured(config: Config | str | Path | None = None, **overrides: Any) -> LLMAdapter:
    """The configured provider as a spec-001 ``LLMAdapter``, over the same stack a tick
    uses: recovery (retries, fallback models, breakers), the budget, rate limits, and the
    books (every attempt counted: ``adapter.books``).

    Args:
        config: a ``Config``, a ``config.toml`` path, or ``None``: ``./config.toml`` over
            the defaults, as ``sim tick`` reads it (no world's config).
        overrides: ``phase`` (whose model and settings a call uses; default
            ``narrative``), ``seed``; a phase setting (``model``, ``fallback_models``,
            ``temperature``, ``max_output_tokens``, ``structured_output``...) for that
            phase; or any ``[llm]`` key (``provider``, ``base_url``, ``command``,
            ``timeout_seconds``...). Validated like the config file.

    Raises:
        LLMConfigurationError: a bad setting, an unknown provider, phase or key, a
            missing API key or command.
    """
    phase = str(overrides.pop("phase", "narrative"))
    seed = overrides.pop("seed", 0)
    if not isinstance(seed, int):
        raise LLMConfigurationError(f"seed must be an integer, got {seed!r}")
    llm_keys = set(LLMConfig.model_fields)
    unknown = sorted(k for k in overrides if k not in llm_keys and k not in _PHASE_KEYS)
    if unknown:
        raise LLMConfigurationError(
            f"configured(): unknown setting(s) {', '.join(map(repr, unknown))}; it takes "
            "phase, seed, a phase setting (model, fallback_models, temperature...) or an "
            "[llm] key (provider, base_url, command...)"
        )
    llm = {k: v for k, v in overrides.items() if k in llm_keys}
    own = {k: v for k, v in overrides.items() if k not in llm_keys}
    try:
        if isinstance(config, Config):
            base, layer = config, ({"llm": llm} if llm else {})
        else:
            path = Path(config) if config is not None else None
            base = load_config(config_file=path, overrides={"llm": llm} if llm else None)
            layer = {}
        if own:  # the phase's settings: its section known once the config is
            layer.update(_nest(_section(phase, base), own))
        built = validated(merge_tables(redacted(base), layer), None) if layer else base
    except InputError as exc:
        raise LLMConfigurationError(_described(exc), cause=exc) from None
    return ConfiguredAdapter(built, phase=phase, seed=seed)


def _described(error: InputError) -> str:
    """A config problem as ``configured()`` reports it: a file's problems name the file;
    those of its keyword overrides name the setting."""
    problems = getattr(error, "problems", None) or [error]
    if any(p.path is not None for p in problems):
        return str(error)
    parts = [f"{p.field}: {p.problem}" if p.field else p.problem for p in problems]
    return "configured(): " + "; ".join(parts)


def _section(phase: str, config: Config) -> str:
    """The config section of ``phase`` (``narrative``, ``phase2b``, a declared phase)."""
    try:
        return phase_section(phase, tuple(config.phases))
    except InputError as exc:
        raise LLMConfigurationError(
            "phase: " + exc.problem.replace("unknown phase", "no phase named"), cause=exc
        ) from None


def _nest(section: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"phases": {"x": values}}`` for ``phases.x``, else ``{section: values}``."""
    head, _, name = section.partition(".")
    return {head: {name: dict(values)}} if name else {head: dict(values)}


# -- test primitives (spec 001: part of Core) ------------------------------------------------


class _RecordingFace(PipelineAdapter):
    """What spec 001's two test primitives share: the count of calls (the pipeline double's)
    and the last call's prompt and config."""

    adapter: MockAdapter | ErrorAdapter

    @property
    def call_count(self) -> int:
        return self.adapter.call_count

    def reset(self) -> None:
        self.adapter.reset()
        self.last_prompt: str | None = None
        self.last_config: RunConfig | None = None

    def _note(self, prompt: str, config: RunConfig) -> None:
        self.last_prompt = prompt if isinstance(prompt, str) else None
        self.last_config = config if isinstance(config, RunConfig) else None


class MockLLMAdapter(_RecordingFace):
    """A deterministic adapter without network I/O (spec 001): the face over the
    pipeline's own test double (``sim.testing.adapters.MockAdapter``), so both surfaces
    share one set of mocks.

    Answers each call with the next of ``responses``, then with ``response``. Counts calls
    (``call_count``) and records ``last_prompt`` and ``last_config``; ``reset()`` clears
    them and restores the queue. The pipeline's mock is ``mock.adapter`` (its recorded
    ``ModelRequest``s in ``mock.adapter.calls``).

    Args:
        response: the answer once ``responses`` are used up (non-empty).
        responses: answers for the first calls, in order.
        model: the model the answers claim (default: the config's ``model_name``).
    """

    adapter: MockAdapter

    def __init__(
        self,
        response: str = "This is a mock response.",
        *,
        responses: Iterable[str] = (),
        model: str | None = None,
    ) -> None:
        self.response = response
        self.responses = tuple(responses)
        if not all((*self.responses, response)):
            raise ValueError("a mock's responses must be non-empty (spec 001, invariant 1)")
        self.model = model
        super().__init__(MockAdapter(lambda schema, _input: Answer(text=self.response)))
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.adapter.enqueue(*(Answer(text=r) for r in self.responses))
        self.prompts: list[str] = []

    def execute_prompt(self, prompt: str, config: RunConfig) -> LLMResponse:
        self._note(prompt, config)
        self.prompts.append(prompt)
        answer = super().execute_prompt(prompt, config)
        answer.metadata["call"] = self.call_count
        return answer

    def _settings(self, config: RunConfig) -> CallSettings:
        return replace(self.settings, model=self.model or config.model_name)

    def validate_config(self, config: RunConfig) -> bool:
        return isinstance(config, RunConfig)


class ErrorLLMAdapter(_RecordingFace):
    """An adapter whose every call fails with ``error`` (spec 001's test primitive): the
    face over the pipeline's ``sim.testing.adapters.ErrorAdapter``.

    Args:
        error: the ``LLMError`` to raise (default: an HTTP 500 ``LLMAPIError``).
    """

    adapter: ErrorAdapter

    def __init__(self, error: LLMError | None = None) -> None:
        self.error = error or LLMAPIError("mock failure", status_code=500, code="server_error")
        super().__init__(ErrorAdapter(self.error))
        self.reset()

    def execute_prompt(self, prompt: str, config: RunConfig) -> LLMResponse:
        self._note(prompt, config)
        return super().execute_prompt(prompt, config)

    def validate_config(self, config: RunConfig) -> bool:
        return isinstance(config, RunConfig)


__all__ = [
    "Answer",
    "ConfiguredAdapter",
    "ErrorLLMAdapter",
    "LLMAPIError",
    "LLMAdapter",
    "LLMBudgetExceededError",
    "LLMConfigurationError",
    "LLMError",
    "LLMRateLimitError",
    "LLMResponse",
    "LLMSubprocessError",
    "LLMTimeoutError",
    "MockLLMAdapter",
    "PipelineAdapter",
    "RunConfig",
    "configured",
    "usage_dict",
]
