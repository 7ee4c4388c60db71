"""The tick engine.

Owns: running ticks: the runner (a tick = phases in order, the commit, deletions after),
the adapter stack built from the config, the tick recorder (the tick's log), the guard,
replay, rewind and fork, log compaction, the repair of corrupt engine state.

May import: ``sim.config``, ``sim.errors``, ``sim.gcpause``, ``sim.interrupts``,
``sim.interventions``, ``sim.llm``, ``sim.messages``, ``sim.mind``, ``sim.pack`` (a
fork of a packed world is packed), ``sim.phases``, ``sim.policy``, ``sim.providers``,
``sim.safefs``, ``sim.storage``, ``sim.ticklog``, ``sim.world``.

Next: what a tick does to the world goes in a phase (``sim.phases``), not here; something
the runner does around the phases (before them, between them, around the commit) is a
module here that the runner calls.
"""
