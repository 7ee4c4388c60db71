"""The tick log: what a tick leaves behind, written as it runs and read by every view of a
world's history (the recorder that writes it is ``sim.engine.recorder``; replay, rewind and
fork are the engine's; what ``sim log`` prints is ``sim.analysis.logview``).

Owns: the tick log's files: records, format and migrations, the writer, the reader,
compression, per-tick summaries, recovery after a crash, and the books (tokens and cost).

May import: ``sim.errors``, ``sim.llm`` (usage and call identities), ``sim.pack`` (a packed
world's state), ``sim.safefs``.

Next: a new record is a model in ``records`` (with a format bump and a migration in
``format`` when older readers must not ignore it).
"""
