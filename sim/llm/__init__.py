"""The provider-agnostic LLM pipeline: what a phase's call goes through on its way to a
provider and back.

Owns: requests and answers (``types``), the client phases call (``client``), chains
and their store, tool calling, and the wrappers an adapter is stacked in (recovery,
budget, rate limits, backpressure, pools, the router, batching).

May import: nothing else of sim: it knows nothing of config, worlds or ticks (the
standard library, pydantic and orjson only).

Next: a new wrapper subclasses ``wrapper.AdapterWrapper`` in a module of its own; a new
provider goes in ``sim.providers``, never here.
"""
