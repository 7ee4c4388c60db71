"""``sim study``: a designed experiment in one file.

- ``design``: the study file (TOML: world, seeds, ticks, factors, conditions of scheduled
  interventions, surveys), validated, and its expansion into units and matched arms;
- ``run``: running it with the sweep's machinery (one process per step, the whole-study
  budget, resume), the shared prefix of each seed run once and forked into its arms;
- ``tables``: ``load_study``, every run's tables with its condition, seed and factors;
- ``report``: ``sim study report``, a field's mean per condition per tick, with intervals.
"""
