"""Pausing the cyclic garbage collector around work that builds a large acyclic heap."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block, restoring it after.

    A tick, or a report gathering a long history, allocates plain dicts and lists with
    little cyclic garbage; with the collector on, its full collections rescan the growing
    heap again and again (measured: +40% on a 10,000-character tick, ~0.3 s of CPU on a
    report of a 500 x 100 history). Reference counting still frees everything acyclic at
    once; cycles left behind are collected when the collector resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
