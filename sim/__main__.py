from sim.runs.warm import is_worker, serve

if is_worker():
    serve()  # a warm worker: returns only in a step's fork (sim.runs.warm)

from sim.cli import main

main()
