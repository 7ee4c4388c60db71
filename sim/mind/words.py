"""The words of a text that can make it relevant (memory retrieval, names in a cell)."""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9][a-z0-9_-]*")
#: words that say nothing about what a memory is about
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "been",
        "but",
        "by",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "hers",
        "him",
        "his",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "will",
        "with",
        "you",
        "your",
    ]
)


def terms(text: str) -> list[str]:
    """The words of a text that can make it relevant: lower case, stopwords dropped."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]
