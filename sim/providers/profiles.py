"""The built-in providers' profiles, one per kind (``sim.llm.profile.ProviderProfile``):
the facts about a kind that the config, the stack, the phases and the policy ask for.

They live here, beside the registry (``sim.providers``), rather than in the adapters'
modules, so that reading one imports no SDK and no HTTP client (the config is checked
before any adapter is built). A package's provider declares its own as its adapter
class's ``profile`` attribute. Adding a built-in kind: its adapter module, its profile
here, and its line in the registry (``sim.providers._BUILTIN``).
"""

from __future__ import annotations

from dataclasses import replace

from sim.llm.profile import ProviderProfile
from sim.providers._capacity import llama_cpp_capacity

#: what the OpenAI wire family (``openai``, ``chat``) shares: OpenAI's SDK defaults, every
#: structured-output form, embeddings, the Batch API, and a local server's capacity read
#: as llama.cpp reports it. OpenAI's own API's strict mode takes neither a root ``anyOf``
#: nor ``prefixItems``; a self-hosted server's grammar takes both.
_OPENAI_FAMILY = ProviderProfile(
    kind="",
    base_url="https://api.openai.com/v1",
    base_url_env="OPENAI_BASE_URL",
    key_env="OPENAI_API_KEY",
    structured_output=("json_schema", "json_object_schema", "tool", "prompt"),
    root_any_of=True,
    prefix_items=True,
    grammarless_hosts=("api.openai.com",),
    embeddings="fetched",
    embedding_example="text-embedding-3-small",
    capacity=llama_cpp_capacity,
    batch_api=True,
)

#: the Responses API. ``constrain_refs = "auto"`` checks answers rather than sending
#: enums: "the first request you make with any schema will have additional latency as our
#: API processes the schema" (OpenAI, Structured Outputs): a schema per request would pay
#: it on every call. The one kind that keeps responses (server chains).
OPENAI = replace(_OPENAI_FAMILY, kind="openai", server_chains=True)

#: chat completions, on OpenAI or any OpenAI-compatible server. Local servers compile a
#: grammar per request anyway (llama.cpp, vLLM), so an enum costs nothing there and makes
#: a wrong id impossible: ``auto`` sends enums. It takes the world seed.
CHAT = replace(_OPENAI_FAMILY, kind="chat", constrain_refs="schema", takes_seed=True)

#: the Gemini API (the ``google-genai`` SDK). Its response schema takes ``enum``, with no
#: per-schema cost documented: ``auto`` sends enums.
GEMINI = ProviderProfile(
    kind="gemini",
    base_url="https://generativelanguage.googleapis.com",
    key_env="GEMINI_API_KEY",
    structured_output=("json_schema",),
    constrain_refs="schema",
    embeddings="fetched",
    embedding_example="gemini-embedding-001",
    no_chains_why="the Gemini API keeps no responses to chain",
    batch_api=False,
    default_model="gemini-2.5-flash",
    default_model_env="GEMINI_MODEL",
    sdk_extra="gemini",
)

#: the Messages API (the ``anthropic`` SDK). Structured output is a forced tool whose
#: input schema is not enforced, so an enum would only be a hint: ``auto`` checks.
ANTHROPIC = ProviderProfile(
    kind="anthropic",
    base_url="https://api.anthropic.com",
    base_url_env="ANTHROPIC_BASE_URL",
    key_env="ANTHROPIC_API_KEY",
    structured_output=("tool",),
    no_chains_why="the Messages API keeps no responses to chain",
    batch_api=False,
    sdk_extra="anthropic",
)

#: the offline model: no network, no key, seeded; it reads the valid ids from its input
#: (nothing is enforced on a wire), hashes its embeddings, and answers as the model
#: ``offline`` whatever a phase names (priced as ``[prices."offline"]``, $0 by default)
OFFLINE = ProviderProfile(
    kind="offline",
    network=False,
    takes_seed=True,
    embeddings="hashed",
    batch_api=False,
    answers_as="offline",
    refs_as_enums=True,
)

#: a local command: prompt on stdin, answer on stdout, the schema in the prompt
CLI = ProviderProfile(
    kind="cli",
    network=False,
    runs_command=True,
    structured_output=("prompt",),
    batch_api=False,
)

#: the recorded answers of a tick log (``sim replay``, resume): sim builds it, no config
#: chooses it
REPLAY = ProviderProfile(kind="replay", network=False, selectable=False)

#: a package's provider whose adapter class declares no ``profile``: what sim assumed of
#: such a provider before profiles (an OpenAI-compatible server's default URL in messages,
#: nothing else offered)
UNDECLARED = ProviderProfile(
    kind="",
    base_url=_OPENAI_FAMILY.base_url,
    base_url_env=_OPENAI_FAMILY.base_url_env,
)
