"""A folder of runs: forks of one world, each continued by ``sim tick`` child processes;
the machinery ``sim sweep`` and ``sim study run`` share.

Owns: a sweep's design (seeds by settings), each run's fork, the ledger of what runs
spent, the child processes, the sweep.

May import: ``sim.config``, ``sim.engine`` (verify replays a run's last tick),
``sim.errors``, ``sim.interview`` (its answer records), ``sim.lifeline``, ``sim.llm``,
``sim.pack`` (a run of a packed world is packed), ``sim.safefs``, ``sim.storage``,
``sim.ticklog``, ``sim.version``, ``sim.world``.

Next: what a run does is a ``sim tick`` child's (``process.tick_command``); another kind of
folder of runs is a module beside ``sweep`` (as ``sim.study`` builds on these).
"""
