"""A character's mind: memory cells rated and indexed, retrieved by recency, importance and
relevance to the situation (``[memory] mode = "retrieve"``), and reflections drawn from them.

Depends on ``sim.config`` and ``sim.world`` only; the phases call it to build inputs.
"""
