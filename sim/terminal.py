"""Untrusted text (from worlds, logs and models) as a terminal shows it: the characters a
terminal would act on are shown as escapes, never sent.

``printable`` keeps line feeds and tabs: text such as a narrative or a model's answer may
hold several lines. ``one_line`` is for what is printed inside a line (a name, an id, a
place's header, a progress line): a line break there would end the line and start one
the world wrote (a character named ``"Ada\\ntick 9 committed: ..."`` would print a forged
line), so it shows line breaks too.
"""

from __future__ import annotations

import re
import textwrap

#: the Unicode bidirectional formatting controls: invisible, they reorder the text around
#: them as a terminal shows it (U+202E turns "txt.exe" into what reads as "exe.txt"): the
#: embeddings and overrides (U+202A-U+202E), the isolates (U+2066-U+2069) and the marks
#: (U+200E, U+200F, U+061C)
BIDI_CONTROLS = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
#: what a terminal acts on rather than shows: C0 controls but line feed and tab (ESC starts
#: every escape sequence, BEL ends OSC titles, CR rewrites a line), DEL, the C1 controls
#: and the bidirectional controls
_CONTROL = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI_CONTROLS}]")
#: the same, and every line break (line feed; the Unicode line and paragraph separators,
#: which programs reading the output split lines at): all but tab
_LINE_CONTROL = re.compile(rf"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029{BIDI_CONTROLS}]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character a terminal would act on shown as ``\\xNN``
    (a bidirectional control as ``\\uNNNN``); line feeds and tabs kept.

    Names, narratives, answers and messages come from worlds, logs and models: untrusted.
    A name holding ``\\x1b]0;...\\x07`` would retitle the terminal, ``\\x1b[2J`` clear it,
    and ``\\u202e`` print the rest of the line right to left.
    """
    return _CONTROL.sub(_shown, text)


def one_line(text: str) -> str:
    """``printable(text)`` that stays on one line: a line feed is shown as ``\\x0a`` (as a
    carriage return is ``\\x0d``), U+2028 and U+2029 as ``\\u2028``, ``\\u2029``.

    For what is printed inside a line, where a line break would start a line the world
    wrote: names, ids, places' headers, progress and status lines. Text without control
    characters comes back as it was, and ``printable`` leaves the result as it is.
    """
    return _LINE_CONTROL.sub(_shown, text)


#: a paragraph wrapped at 88 columns between words; a word with a hyphen is split only when
#: it alone is too long (textwrap's split at every hyphen took twice as long: 0.2 s for the
#: narratives of 4,000 places)
_PARAGRAPH = textwrap.TextWrapper(width=88, break_on_hyphens=False)


def wrapped(text: str) -> str:
    """``text`` (a narrative, a model's answer) as one paragraph of lines of 88 columns at
    most, as ``sim tick`` and ``sim log`` show it (not made printable: see ``printable``)."""
    return _PARAGRAPH.fill(text)
