"""How a local OpenAI-compatible server says how many requests it serves at once: the
``capacity`` of the ``chat`` and ``openai`` profiles (``sim.llm.capacity`` holds what any
provider's answer becomes).

- llama.cpp's server: ``GET /props`` -> ``total_slots`` (its ``--parallel``);
  else ``GET /slots`` -> one entry per slot (when started with ``--slots``);
- llama-cpp-python's server reports no capacity, but it serves one request at a time by
  design (its model sits behind one lock), and says who it is: its ``/openapi.json``
  is titled ``🦙 llama.cpp Python API``;
- anything else (vLLM, Ollama, SGLang, a gateway): unreported.
"""

from __future__ import annotations

from sim.llm.capacity import UNREPORTED, Fetch, ServerCapacity, believed_slots

#: the title of llama-cpp-python's FastAPI app (``llama_cpp/server/app.py``: after an emoji)
LLAMA_CPP_PYTHON_TITLE = "llama.cpp Python API"


def server_root(base_url: str) -> str:
    """The server's root: ``base_url`` without a trailing ``/v1`` (where llama.cpp serves
    ``/props``)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


async def llama_cpp_capacity(fetch: Fetch) -> ServerCapacity:
    """Ask the server (see the module doc); ``UNREPORTED`` when it says nothing usable."""
    props = await fetch("/props")
    if isinstance(props, dict):
        slots = believed_slots(props.get("total_slots"))
        if slots is not None:
            return ServerCapacity(slots, "llama.cpp /props total_slots")
    listed = await fetch("/slots")
    if isinstance(listed, list):
        slots = believed_slots(len(listed))
        if slots is not None:
            return ServerCapacity(slots, "llama.cpp /slots")
    spec = await fetch("/openapi.json")
    info = spec.get("info") if isinstance(spec, dict) else None
    title = info.get("title") if isinstance(info, dict) else None
    if isinstance(title, str) and title.endswith(LLAMA_CPP_PYTHON_TITLE):
        return ServerCapacity(1, "llama-cpp-python serves one request at a time")
    return UNREPORTED
