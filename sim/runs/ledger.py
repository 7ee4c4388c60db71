"""What runs spent and may spend: a run's spending read from its tick logs, and the budget
of a whole sweep or study (``Ledger``), shared out among the runs as they start."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from sim.ticklog.books import Books
from sim.ticklog.summary import logged_books


def spend(run_dir: Path) -> Books:
    """Everything a run's logs say it sent, abandoned logs included (their usage and cost,
    not their calls); unreadable logs skipped (a log cut short by a kill is read up to its
    last whole line by the log reader). A committed tick is counted from its summary
    (``logged_books``), not its whole log: the sweep's process reads every run's books, one
    after another."""
    total = Books()
    for _, aside, books in logged_books(run_dir):
        total.add(books, billed_only=aside)
    return total


# -- the budget of a sweep ---------------------------------------------------------------------


@dataclass
class Grant:
    usd: float | None = None
    tokens: int | None = None


class Ledger:
    """The sweep's budget: what runs spent, what runs still going were given, what is left."""

    def __init__(
        self, cap_usd: float | None, cap_tokens: int | None, spent: Books, jobs: int
    ) -> None:
        self.cap_usd = cap_usd
        self.cap_tokens = cap_tokens
        self.spent_usd = spent.cost.usd
        self.unpriced = set(spent.cost.unpriced)
        self.spent_tokens = spent.tokens
        self.jobs = jobs
        self.reserved_usd = 0.0
        self.reserved_tokens = 0
        self.lock = threading.Lock()

    def grant(self, waiting: int) -> Grant | str:
        """A share for a run about to start, or why it gets none."""
        with self.lock:
            share = max(1, min(self.jobs, waiting))
            grant = Grant()
            if self.cap_usd is not None:
                if self.unpriced:
                    return (
                        "not started: the cost of earlier runs is unknown (no price for "
                        f"{', '.join(sorted(self.unpriced))}); add [prices] to use --budget-usd"
                    )
                left = self.cap_usd - self.spent_usd - self.reserved_usd
                if left <= 1e-9:
                    return "not started: the sweep's --budget-usd is spent"
                grant.usd = left / share
            if self.cap_tokens is not None:
                left_tokens = self.cap_tokens - self.spent_tokens - self.reserved_tokens
                if left_tokens < share:
                    return "not started: the sweep's --budget-tokens is spent"
                grant.tokens = left_tokens // share
            self.reserved_usd += grant.usd or 0.0
            self.reserved_tokens += grant.tokens or 0
            return grant

    def settle(self, grant: Grant, before: Books, after: Books) -> None:
        """A run ended: its grant goes back, what it spent is counted."""
        with self.lock:
            self.reserved_usd -= grant.usd or 0.0
            self.reserved_tokens -= grant.tokens or 0
            self.spent_usd += after.cost.usd - before.cost.usd
            self.unpriced |= set(after.cost.unpriced)
            self.spent_tokens += after.tokens - before.tokens


__all__ = [
    "Grant",
    "Ledger",
    "spend",
]
