"""A deterministic, offline stand-in for a language model.

``generate`` fills a JSON schema (pydantic v2 ``model_json_schema()``) from an input text, as a
pure function of its arguments and a caller-supplied seed. Schemas titled ``Intention``,
``Resolution``, ``Narrative`` or ``MemorySummary`` are written by sim-specific "skills" that
read the (JSON) input and the chain window; anything else gets a generic, schema-valid filler.
``generate_tool_call`` does the same for OpenAI-style function tools.

Owns: the offline model (schema-valid answers from the input alone, a pure function of
a seed) and the ``offline`` provider's adapter.

May import: ``sim.llm`` (the adapter contract), ``sim.sections`` (the input documents it
reads back).

Next: a skill for a new schema title is a module here, dispatched by title in ``engine``.
"""

from sim.llm.tokens import estimate_tokens
from sim.offline.engine import generate
from sim.offline.tools import generate_tool_call

__all__ = ["estimate_tokens", "generate", "generate_tool_call"]
