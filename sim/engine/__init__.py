"""The tick engine: the runner, the guard that decides whether a tick may commit, and the
deletion of evicted responses after a commit."""
