"""``sim study``: a designed experiment in one file.

- ``design``: the study file (TOML: world, seeds, ticks, factors, conditions of scheduled
  interventions, surveys), validated, and its expansion into units and matched arms;
- ``run``: running it with the sweep's machinery (one process per step, the whole-study
  budget, resume), the shared prefix of each seed run once and forked into its arms;
- beside analysis: ``sim.analysis.studytables`` (``load_study``, every run's tables with its
  condition, seed and factors) and ``sim.analysis.studyreport`` (``sim study report``, a
  field's mean per condition per tick, with intervals).

Owns: the study file and its design, and running it.

May import: ``sim.config``, ``sim.errors``, ``sim.interventions``, ``sim.interview``,
``sim.llm``, ``sim.network``, ``sim.runs``, ``sim.safefs``, ``sim.storage``,
``sim.ticklog``, ``sim.world``.

Next: a new kind of step (beside tick, ask, inject and set) goes in ``run``, its fields in
``design``.
"""
