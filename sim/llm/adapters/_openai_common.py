"""What the ``openai`` and ``chat`` adapters share: building the SDK client, strict schemas,
checking an answer's text against its schema."""

from __future__ import annotations

import os
from typing import Any

import openai
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, ValidationError

from sim.llm.errors import LLMConfigurationError, LLMSchemaError
from sim.llm.types import CallSettings, Usage

_STRICT: dict[type[BaseModel], dict[str, Any]] = {}


def strict_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """The schema in OpenAI's strict structured-output form, computed once per class."""
    cached = _STRICT.get(schema)
    if cached is None:
        cached = _STRICT[schema] = to_strict_json_schema(schema)
    return cached


def build_client(
    *,
    base_url: str | None,
    api_key_env: str,
    timeout_seconds: float,
    connect_timeout_seconds: float,
    require_key: bool = True,
) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` with the SDK's retries off and an explicit timeout.

    Raises:
        LLMConfigurationError: the key variable is unset (named, never printed).
    """
    key = os.environ.get(api_key_env, "")
    if not key:
        if require_key:
            raise LLMConfigurationError(
                f"no API key: set the environment variable {api_key_env} "
                "(or change [llm] api_key_env in config.toml)"
            )
        key = "unused"  # local servers (Ollama, llama.cpp) accept any key
    return openai.AsyncOpenAI(
        api_key=key,
        base_url=base_url or None,
        max_retries=0,
        timeout=openai.Timeout(timeout_seconds, connect=connect_timeout_seconds),
    )


def request_timeout(settings: CallSettings, connect_timeout_seconds: float) -> openai.Timeout:
    return openai.Timeout(settings.timeout_seconds, connect=connect_timeout_seconds)


def validate_text(
    schema: type[BaseModel], text: str, usage: Usage, context: dict[str, Any]
) -> BaseModel:
    """Parse ``text`` into ``schema``.

    Raises:
        LLMSchemaError: not valid JSON for the schema; ``context`` gets the usage, so the
            attempt is still paid for.
    """
    try:
        return schema.model_validate_json(text)
    except ValidationError as exc:
        raise LLMSchemaError(
            f"output does not validate against {schema.__name__}: "
            f"{exc.errors(include_url=False)[:3]}",
            cause=exc, context={**context, "usage": usage, "raw": text[:2000]},
        ) from exc


def valid_settings(settings: CallSettings) -> bool:
    return bool(settings.model) and 0.0 <= settings.temperature <= 2.0 and (
        settings.max_output_tokens > 0 and settings.timeout_seconds > 0
    )
