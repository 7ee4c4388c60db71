"""A character's mind: memory cells rated and indexed, retrieved by recency, importance and
relevance to the situation (``[memory] mode = "retrieve"``), and reflections drawn from them.

Owns: what a character remembers and what of it a phase's input shows (the memory
strategies, ``strategy.py``), the scoring behind retrieval, a provider's embeddings cache.

May import: ``sim.config``, ``sim.world`` and ``sim.errors``; ``sim.llm``'s ``Embedder``
contract and ``sim.safefs`` (``vectors.py``, the embeddings cache); ``sim.plugins``
(strategies from packages). Nothing above it: the phases call it when they build inputs.

Next: a memory strategy is a module of its own here, named in ``strategy.BUILTIN`` (or,
from a package, in the ``sim.memory`` entry-point group).
"""
