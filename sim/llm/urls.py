"""Where a provider's requests go when ``base_url`` is empty: the SDKs' own defaults."""

from __future__ import annotations

import os

#: the endpoints the SDKs use when ``base_url`` is empty (the OpenAI SDK reads
#: ``OPENAI_BASE_URL`` first, the Anthropic SDK ``ANTHROPIC_BASE_URL``)
DEFAULT_URLS = {
    "gemini": ("", "https://generativelanguage.googleapis.com"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
}


def endpoint_url(provider: str, base_url: str) -> str:
    """Where requests go: ``base_url``, else the provider's SDK default."""
    if base_url:
        return base_url
    env, url = DEFAULT_URLS.get(provider, ("OPENAI_BASE_URL", "https://api.openai.com/v1"))
    return (os.environ.get(env) if env else None) or url
