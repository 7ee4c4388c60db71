"""A folder of runs: forks of one world, each continued by ``sim tick`` child processes;
the machinery ``sim sweep`` and ``sim study run`` share."""
