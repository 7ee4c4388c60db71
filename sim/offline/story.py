"""Offline skills that write prose: the Narrative of a location and a character's MemorySummary."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from random import Random
from typing import Any

from sim import sections
from sim.offline import templates as T

Json = dict[str, Any]

SUMMARY_LIMIT = 600
_MIDDLE_BUDGET = 4  # narrative sentences between the opening and the closing
_KNOWN_MAX = 12
_LOWER_OPENERS = ("The ", "A ", "An ", "While ", "With ", "Having ")
_CAPS = re.compile(r"[A-Z][\w'’-]*(?:\s+(?:of\s+)?(?:the\s+)?[A-Z][\w'’-]*)*")
_STOP = frozenset(
    (
        "The",
        "A",
        "An",
        "I",
        "You",
        "He",
        "She",
        "They",
        "It",
        "We",
        "My",
        "Your",
        "His",
        "Her",
        "Their",
        "Its",
        "Tick",
        "At",
        "In",
        "On",
        "To",
        "From",
        "By",
        "With",
        "After",
        "Before",
        "Then",
        "Meanwhile",
        "When",
        "While",
        "As",
        "And",
        "But",
        "Or",
        "Of",
        "For",
        "Once",
        "Still",
        "Yesterday",
        "Today",
        "Earlier",
        "Later",
        "Known",
        "Someone",
        "Something",
        "Nothing",
        "Everyone",
        "No",
        "Not",
        "This",
        "That",
        "There",
        "Here",
        "If",
        "So",
        "Yet",
        "Now",
        "Perhaps",
        "Maybe",
        "What",
        "Why",
        "How",
        "Who",
        "Where",
        "Good",
        "Listen",
        "Tell",
        "Be",
        "Can",
        "Could",
        "Do",
        "Did",
        "Let",
        "Well",
        "Yes",
        "Oh",
        "Whatever",
        "Around",
        "Having",
        "Being",
        "Enough",
        "Last",
        "Another",
        "Nobody",
        "Only",
        "Even",
        "Just",
        "All",
        "Every",
        "Some",
        "Most",
        "Each",
        "Both",
        "Such",
        "Many",
        "Few",
        "Since",
        "Until",
        "Though",
        "Although",
        "Because",
        "Unless",
        "Without",
        "Into",
        "Upon",
        "Under",
        "Over",
        "Near",
        "Inside",
        "Outside",
        "Everything",
        "Anyone",
        "Soon",
    )
)


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


# --------------------------------------------------------------------------- narrative


def _event_line(ev: Json, name: str) -> str:
    outcome = _s(ev.get("outcome")).strip()
    if outcome:
        line = T.first_sentence(outcome)
        if name in line:
            return line
    it = T.as_dict(ev.get("intention"))
    action = it.get("action")
    if ev.get("moved_to"):
        return f"{name} moved on."
    if action == "speak":
        words = T.short(_s(it.get("content")).replace('"', "'"), 80)
        return f'{name} spoke up: "{words}"' if words else f"{name} spoke up."
    if action == "act" and isinstance(it.get("target"), str):
        return f"{name} busied themselves with {T.the(it['target'])}."
    return f"{name} kept still and watched."


@lru_cache(maxsize=1024)
def _previous_cast(last_in: str) -> dict[str, str]:
    """Who appeared in the previous exchange's events (id → name). Cached; read-only."""
    prev = sections.loads(last_in)
    cast: dict[str, str] = {}
    if isinstance(prev, dict) and isinstance(prev.get("events"), list):
        for ev in prev["events"]:
            if isinstance(ev, dict) and isinstance(ev.get("id"), str):
                cast[ev["id"]] = _s(ev.get("name")) or ev["id"]
    return cast


def narrate(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    """3–6 sentences weaving a location's events, echoing who was here last time."""
    loc = data.get("location")
    if not isinstance(loc, dict):
        return None
    raw = data.get("events")
    events = [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    kw = {
        "place": _s(loc.get("name")) or "the place",
        "atmos": T.clause(_s(loc.get("atmosphere"))) or "quiet",
    }
    parts = [T.cap(rng.choice(T.OPEN).format(**kw))]
    # events injected this tick (`sim inject`) come first, in their own words; no draw
    # from the seeded generator, so a narrative without them is as it was
    raw_happenings = data.get("happenings")
    if isinstance(raw_happenings, list):
        parts.extend(_s(h).strip() for h in raw_happenings[:2] if _s(h).strip())
    budget = _MIDDLE_BUDGET
    prev = _previous_cast(history[-1][0]) if history else {}
    if prev:
        now = {i for e in events if isinstance(i := e.get("id"), str)}
        stayed = {i for e in events if isinstance(i := e.get("id"), str) and not e.get("moved_to")}
        gone = [n for i, n in prev.items() if i not in now]
        back = [n for i, n in prev.items() if i in stayed]
        if gone and (not back or rng.random() < 0.5):
            parts.append(T.ECHO_GONE.format(name=rng.choice(gone)))
        elif back and rng.random() < 0.7:
            parts.append(rng.choice(T.ECHO_BACK).format(name=rng.choice(back)))
        budget -= len(parts) - 1
    if not events:
        parts.append(rng.choice(T.QUIET).format(**kw))
    else:
        shown = events if len(events) <= budget else events[: budget - 1]
        link = ""
        for i, ev in enumerate(shown):
            name = _s(ev.get("name")) or _s(ev.get("id")) or "Someone"
            line = _event_line(ev, name)
            if i:
                link = rng.choice([lk for lk in T.LINK if lk != link])
                if link and line.startswith(_LOWER_OPENERS):
                    line = line[:1].lower() + line[1:]
                line = link + line
            parts.append(line)
        rest = [_s(e.get("name")) or _s(e.get("id")) for e in events[len(shown) :]]
        if rest:
            names = rest[:4] + (["others"] if len(rest) > 4 else [])
            parts.append(rng.choice(T.REST).format(names=T.join_names(names)))
    parts.append(rng.choice(T.CLOSE).format(**kw))
    return {"narrative": " ".join(parts)}


# --------------------------------------------------------------------------- memory summary


def _parse_summary(summary: str) -> tuple[list[str], list[str], list[str]]:
    """Split a summary written by ``summarize`` back into (digest, events, known names)."""
    text = summary.strip()
    known: list[str] = []
    at = text.rfind("Known: ")
    if at >= 0:
        known = [k.strip() for k in text[at + 7 :].rstrip(".").split(", ") if k.strip()]
        text = text[:at].strip()
    digest: list[str] = []
    if text.startswith("Earlier: "):
        end = text.find(" [t")
        head = text[9:] if end < 0 else text[9:end]
        digest = [d.strip() for d in head.rstrip(".").split("; ") if d.strip()]
        text = "" if end < 0 else text[end + 1 :]
    chunks = text.split(" [t") if text else []
    events: list[str] = []
    for i, chunk in enumerate(chunks):
        if i == 0 and not chunk.startswith("[t"):
            digest.append(T.short(chunk, 120).rstrip("."))  # foreign text: keep a condensed form
        else:
            events.append(chunk if chunk.startswith("[t") else "[t" + chunk)
    return digest, events, known


def _condense(text: str) -> str:
    text = " ".join(text.split())
    low = text[:12].lower()
    if low.startswith("tick") and ":" in text[:12]:
        text = text[text.index(":") + 1 :].strip()
    return T.short(T.first_sentence(text), 110) if text else ""


def _names_in(text: str, own: str, own_parts: frozenset[str]) -> list[str]:
    """Capitalised names and places in ``text`` (outside quoted speech), minus the owner's."""
    plain = " ".join(text[:400].split('"')[::2])
    out: list[str] = []
    for match in _CAPS.finditer(plain):
        words = match.group().split()
        while words and words[0] in _STOP:
            words.pop(0)
        found = " ".join(words)
        if found.endswith(("'s", "’s")):
            found = found[:-2]
        if not found or found == own or found in own_parts:
            continue
        at = match.start()
        if len(words) == 1 and (at == 0 or plain[at - 2 : at] in (". ", "! ", "? ", "; ")):
            continue  # a lone capitalised word opening a sentence is usually not a name
        out.append(found)
    return out


def _brief(event: str, own: str) -> str:
    """'[t3] Mara met Bob at the Old Mill.' → 't3 met Bob at the Old…' (own name dropped)."""
    tick, _, text = event.strip("[").partition("] ")
    if own and text.startswith(own + " "):
        text = text[len(own) + 1 :]
    words = text.rstrip(".").split()
    return f"t{tick.lstrip('t')} " + " ".join(words[:7]) + ("…" if len(words) > 7 else "")


def _render(digest: list[str], events: list[str], known: list[str]) -> str:
    parts = []
    if digest:
        head = "; ".join(digest)
        parts.append("Earlier: " + head + ("" if head.endswith(("…", ".")) else "."))
    parts.extend(events)
    if known:
        parts.append("Known: " + ", ".join(known) + ".")
    return " ".join(parts)


def summarize(
    data: Json, rng: Random, history: Sequence[tuple[str, str]], schema: Json
) -> Json | None:
    """Fold evicted memory cells into the running summary, bounded to ~600 characters."""
    evicted = data.get("evicted")
    if not isinstance(evicted, list):
        return None
    ch = T.as_dict(data.get("character"))
    own = _s(ch.get("name"))
    own_parts = frozenset(own.split())
    digest, events, known = _parse_summary(_s(data.get("summary")))
    for cell in evicted:
        if isinstance(cell, dict):
            text, tick = _s(cell.get("text")), cell.get("tick")
        else:
            text, tick = _s(cell), None
        line = _condense(text)
        if not line:
            continue
        events.append(f"[t{tick}] {line}" if isinstance(tick, int) else f"[t?] {line}")
        for found in _names_in(text, own, own_parts):
            if any(k.startswith(found + " ") for k in known):
                continue  # "Pell" when "Pell Dunmore" is already known
            known[:] = [k for k in known if k != found and not found.startswith(k + " ")]
            known.append(found)
    del known[:-_KNOWN_MAX]
    out = _render(digest, events, known)
    while len(out) > SUMMARY_LIMIT:
        if len(events) > 2:
            digest.append(_brief(events.pop(0), own))
        elif len(digest) > 1:
            digest.pop(0)
        elif len(known) > 4:
            known.pop(0)
        elif digest:
            digest.pop(0)
        elif len(events) > 1:
            events.pop(0)
        else:
            out = T.short(out, SUMMARY_LIMIT - 1)
            break
        out = _render(digest, events, known)
    return {"summary": out}
