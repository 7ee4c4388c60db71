"""Dispatch, the generic JSON-schema filler and the seeded RNG helper of the offline model.

Everything here is a pure function of its arguments: the only randomness is a
``random.Random`` seeded from the caller's ``seed`` string (string seeding hashes with SHA-512,
so it is stable across processes, unlike ``hash()``).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Sequence
from random import Random
from typing import Any

from sim import sections
from sim.offline import templates as T
from sim.offline.interview import answer
from sim.offline.planning import plan
from sim.offline.reflect import reflect
from sim.offline.resolution import resolve
from sim.offline.skills import intention
from sim.offline.story import narrate, summarize
from sim.offline.talk import utter

Json = dict[str, Any]
Skill = Callable[[Json, Random, Sequence[tuple[str, str]], Json], Json | None]

SKILLS: dict[str, Skill] = {
    "Intention": intention,
    "Resolution": resolve,
    "Narrative": narrate,
    "MemorySummary": summarize,
    "InterviewAnswer": answer,
    "Reflection": reflect,
    "Utterance": utter,
    "Plan": plan,
}

_WORD = re.compile(r"[A-Za-z][a-z]{2,13}")
_SCAN_CHARS = 1200
_MAX_DEPTH = 8
_HARD_DEPTH = 40
#: what one generic answer may cost to build, whatever its schema says: values made (each
#: string costs its length too), the items of one array, the characters of one string. A
#: schema demanding more (``minItems: 100000000``, a ``$ref`` that doubles at every level)
#: gets a short answer that does not fit it, soon, rather than a hang.
FILL_BUDGET = 500_000
FILL_ITEMS = 1000
FILL_CHARS = 100_000
_FALLBACK_WORDS = (
    "lantern",
    "harbor",
    "quiet",
    "amber",
    "river",
    "stone",
    "whisper",
    "market",
    "ember",
    "willow",
    "north",
    "gate",
    "salt",
    "copper",
    "morning",
    "shadow",
)
_NOISE = frozenset(
    (
        "the",
        "and",
        "for",
        "with",
        "from",
        "that",
        "this",
        "into",
        "have",
        "has",
        "was",
        "were",
        "are",
        "not",
        "but",
        "you",
        "your",
        "they",
        "their",
        "tick",
        "world",
        "character",
        "location",
        "description",
        "personality",
        "goals",
        "mood",
        "inventory",
        "memory",
        "summary",
        "recent",
        "atmosphere",
        "objects",
        "exits",
        "present",
        "name",
        "null",
        "true",
        "false",
        "none",
        "intention",
        "events",
        "outcome",
        "moved_to",
        "target",
        "content",
        "reasoning",
        "action",
        "over",
        "under",
        "about",
        "what",
        "when",
        "where",
        "which",
        "there",
        "here",
        "then",
        "than",
        "some",
        "very",
        "just",
        "also",
        "onto",
        "upon",
        "them",
        "its",
        "our",
    )
)
_FORMATS = {
    "date-time": "2024-01-01T12:00:00Z",
    "date": "2024-01-01",
    "time": "12:00:00",
    "duration": "PT1H",
    "email": "someone@example.com",
    "uri": "https://example.com/",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}
_FEELING_KEYS = ("mood", "feeling", "emotion")
_MOODS = (
    "hopeful",
    "wary",
    "resolute",
    "anxious",
    "bitter",
    "calm",
    "torn",
    "defiant",
    "weary",
    "cautiously optimistic",
    "angry",
    "uneasy",
)
#: fields answered with one whole sentence taken from the input (the subject's own words)
_REASON_KEYS = ("reason", "why", "because", "rationale", "justification", "statement")
_SENTENCE_CHARS = 2000
_SENTENCE = re.compile(r"[A-Z][^.!?\n{}\[\]\"]{18,180}[.!?]")
_LABEL = re.compile(r"^[A-Z][A-Za-z ]{1,30}:\s+")
_LONG_KEYS = (
    "description",
    "reasoning",
    "content",
    "text",
    "summary",
    "narrative",
    "outcome",
    "message",
    "words",
    "notes",
    "story",
    "explanation",
)


def make_rng(seed: str, *salt: str) -> Random:
    """The one source of randomness: a ``Random`` seeded from the seed string (plus salt)."""
    return Random(seed + "\x1f" + "\x1f".join(salt) if salt else seed)


def loads(text: str) -> object:
    """An input document: the built-in phases' labelled sections, or JSON (``sim.sections``)."""
    return sections.loads(text)


#: what a sim skill answers when it cannot read its input: nothing named, nothing changed
_IDLE: dict[str, Json] = {
    "Intention": {"action": "wait", "target": None},
    "Resolution": {"outcomes": [], "location_update": None},
}


def generate(
    schema: Json,
    input_text: str,
    *,
    seed: str,
    history: Sequence[tuple[str, str]] = (),
    instructions: str = "",
) -> Json:
    """Produce a dict valid for ``schema`` as a deterministic function of the arguments.

    ``schema["title"]`` selects a sim skill (Intention, Resolution, Narrative, MemorySummary);
    any other title, or an input the skill cannot use, goes to the generic filler.
    """
    rng = make_rng(seed)
    title = schema.get("title")
    skill = SKILLS.get(title) if isinstance(title, str) else None
    if skill is not None:
        data = loads(input_text)
        if isinstance(data, dict):
            try:
                out = skill(data, rng, history, schema)
            except Exception:  # a skill bug must never take the simulation down
                out = None
            if out is not None:
                return _complete(schema, out, rng, input_text)
        # an input the skill cannot read (a world's own prose template): an answer that
        # names nothing, rather than ids made of its words (the engine would reject them)
        idle = _IDLE.get(title) if isinstance(title, str) else None
        if idle is not None:
            return _complete(schema, dict(idle), rng, input_text)
    try:
        value = Filler(schema, rng, input_text).fill(schema)
    except Exception:  # never raise: a malformed schema yields an empty object
        value = None
    return value if isinstance(value, dict) else {}


def _complete(schema: Json, out: Json, rng: Random, input_text: str) -> Json:
    """Fill any required field of the caller's schema that the skill did not produce."""
    required = schema.get("required")
    if isinstance(required, list):
        missing = [k for k in required if k not in out]
        if missing:
            filler = Filler(schema, rng, input_text)
            props = schema.get("properties", {})
            for key in missing:
                out[key] = filler.fill(props.get(key, {}), key=key)
    return out


class Filler:
    """Builds a value valid for a JSON schema (pydantic v2 flavour), with words from the input."""

    def __init__(self, root: Json, rng: Random, input_text: str) -> None:
        self.root = root
        self.rng = rng
        self._text = input_text
        self._words: list[str] | None = None
        self._sentences: list[str] | None = None
        #: what is left of ``FILL_BUDGET`` for this answer
        self.left = FILL_BUDGET

    @property
    def words(self) -> list[str]:
        if self._words is None:
            seen: dict[str, None] = {}
            for w in _WORD.findall(self._text[:_SCAN_CHARS]):
                if w.lower() not in _NOISE:
                    seen.setdefault(w, None)
            self._words = list(seen) or list(_FALLBACK_WORDS)
        return self._words

    @property
    def sentences(self) -> list[str]:
        """Whole sentences of the input (of its text values, when it is JSON), in order,
        from about its first ``_SENTENCE_CHARS`` characters (the subject comes first)."""
        if self._sentences is None:
            head = self._text[: _SENTENCE_CHARS * 2]
            data = loads(self._text) if self._text[:1] in "{[#" else None
            texts: list[str] = []
            if isinstance(data, dict | list):
                _strings_in(data, texts)
            else:
                texts = [head]
            kept, size = [], 0
            for text in texts:
                if size >= _SENTENCE_CHARS:
                    break
                kept.append(text[:_SENTENCE_CHARS])
                size += len(text)
            texts = kept
            found = [
                T.cap(_LABEL.sub("", m.group(0).strip()))
                for t in texts
                for m in _SENTENCE.finditer(t)
            ]
            # a "Label: value." line is a field, not a sentence, once its label is gone
            self._sentences = list(dict.fromkeys(f for f in found if len(f.split()) >= 4))
        return self._sentences

    def resolve_ref(self, node: Json) -> Json:
        for _ in range(16):
            ref = node.get("$ref")
            if not isinstance(ref, str) or not ref.startswith("#"):
                return node
            target: Any = self.root
            for part in ref[2:].split("/") if len(ref) > 2 else ():
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part, {}) if isinstance(target, dict) else {}
            merged = dict(target) if isinstance(target, dict) else {}
            merged.update({k: v for k, v in node.items() if k != "$ref"})
            node = merged
        return node

    def fill(self, node: object, depth: int = 0, key: str = "") -> Any:
        if not isinstance(node, dict):
            return self.phrase(key)
        if depth > _HARD_DEPTH:  # an unsatisfiable (infinitely recursive) schema: give up
            return None
        self.left -= 1
        if self.left < 0:  # a schema that demands too much: stop building
            return None
        node = self.resolve_ref(node)
        rng = self.rng
        if "const" in node:
            return node["const"]
        enum = node.get("enum")
        if isinstance(enum, list) and enum:
            return rng.choice(enum)
        for combo in ("anyOf", "oneOf"):
            options = node.get(combo)
            if isinstance(options, list) and options:
                opts = [self.resolve_ref(o) for o in options if isinstance(o, dict)]
                real = [o for o in opts if o.get("type") != "null"]
                if not real or (len(real) < len(opts) and (depth > 3 or rng.random() < 0.2)):
                    return None
                return self.fill(rng.choice(real), depth + 1, key)
        all_of = node.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged: Json = {}
            for part in all_of:
                if isinstance(part, dict):
                    merged.update(self.resolve_ref(part))
            merged.update({k: v for k, v in node.items() if k != "allOf"})
            return self.fill(merged, depth + 1, key)
        kind = node.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"] or ["null"]
            kind = rng.choice(kinds)
        if kind is None:
            if "properties" in node:
                kind = "object"
            elif "items" in node or "prefixItems" in node:
                kind = "array"
            elif "default" in node:
                return node["default"]
            else:
                return self.phrase(key)
        if kind == "object":
            return self._object(node, depth)
        if kind == "array":
            return self._array(node, depth, key)
        if kind == "string":
            return self._string(node, key)
        if kind == "integer":
            return int(self._number(node, True))
        if kind == "number":
            return self._number(node, False)
        if kind == "boolean":
            return rng.random() < 0.5
        return None

    def _object(self, node: Json, depth: int) -> Json:
        props = node.get("properties")
        required = node.get("required")
        req = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        out: Json = {}
        if isinstance(props, dict):
            for name, sub in props.items():
                if name in req or (depth < 3 and self.rng.random() < 0.5):
                    out[name] = self.fill(sub, depth + 1, name)
        extra = node.get("additionalProperties")
        if not props and isinstance(extra, dict) and depth < _MAX_DEPTH:
            for _ in range(self._count(node, "minProperties", "maxProperties")):
                if self.left <= 0:
                    break
                out[self.rng.choice(self.words).lower()] = self.fill(extra, depth + 1)
        return out

    def _count(self, node: Json, lo_key: str, hi_key: str) -> int:
        lo = node.get(lo_key, 0)
        if not isinstance(lo, int):
            return 1
        lo = max(lo, 0)
        lo = min(lo, FILL_ITEMS)
        hi = node.get(hi_key, max(lo, 3))
        if not isinstance(hi, int):
            return max(lo, 1)
        hi = min(hi, FILL_ITEMS)
        return lo if lo >= hi else self.rng.randint(max(lo, min(1, hi)), max(lo, min(hi, lo + 3)))

    def _array(self, node: Json, depth: int, key: str) -> list[Any]:
        prefix = node.get("prefixItems")
        if isinstance(prefix, list):
            return [self.fill(p, depth + 1, key) for p in prefix]
        items = node.get("items", {})
        n = self._count(node, "minItems", "maxItems")
        if depth >= _MAX_DEPTH:
            n = node.get("minItems", 0) if isinstance(node.get("minItems"), int) else 0
            n = min(max(n, 0), FILL_ITEMS)
        out: list[Any] = []
        for _ in range(n * 4 if node.get("uniqueItems") else n):
            if self.left <= 0:
                break
            value = self.fill(items, depth + 1, key)
            if node.get("uniqueItems") and value in out:
                continue
            out.append(value)
            if len(out) == n:
                break
        return out

    def _string(self, node: Json, key: str) -> str:
        fmt = node.get("format")
        if fmt == "uuid":
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        text = self.phrase(key)
        lo, hi = node.get("minLength"), node.get("maxLength")
        if isinstance(lo, int):
            lo = min(lo, FILL_CHARS, max(self.left, 0))
            words = [text]
            size = len(text)
            while size < lo:
                word = self.rng.choice(self.words)
                words.append(word)
                size += len(word) + 1
            text = " ".join(words)
        if isinstance(hi, int) and len(text) > hi:
            text = text[: max(hi, 0)].rstrip() or text[: max(hi, 0)]
            if isinstance(lo, int) and len(text) < lo:
                text = text.ljust(lo, "x")
        self.left -= len(text)
        return text

    def phrase(self, key: str = "") -> str:
        """A short plausible string for a field called ``key``, from the input's words."""
        rng, words = self.rng, self.words
        k = key.lower()
        if k == "id" or k.endswith("_id") or k.endswith("_ids"):
            return rng.choice(words).lower()
        if k in ("name", "title") or k.endswith("_name"):
            return " ".join(w.capitalize() for w in rng.sample(words, min(2, len(words))))
        if any(part in k for part in _FEELING_KEYS):
            return rng.choice(_MOODS)
        if any(part in k for part in _REASON_KEYS) and not k.startswith("reasoning"):
            sentences = self.sentences
            if sentences:
                return rng.choice(sentences)
        if any(part in k for part in _LONG_KEYS):
            picked = rng.sample(words, min(len(words), rng.randint(4, 8)))
            return T.cap(" ".join(picked)) + "."
        return " ".join(rng.sample(words, min(len(words), rng.randint(1, 3))))

    def _number(self, node: Json, integer: bool) -> float:
        step = 1.0 if integer else 0.01
        low = _num(node.get("minimum"))
        if low is None and (x := _num(node.get("exclusiveMinimum"))) is not None:
            low = x + step
        high = _num(node.get("maximum"))
        if high is None and (x := _num(node.get("exclusiveMaximum"))) is not None:
            high = x - step
        if low is None:
            low = 0.0 if high is None or high >= 0 else high - 10
        if high is None or high < low:
            high = max(low, low + 10 if high is None else low)
        mult = _num(node.get("multipleOf"))
        if mult is not None and mult > 0:
            k_lo, k_hi = math.ceil(low / mult), math.floor(high / mult)
            return self.rng.randint(k_lo, max(k_lo, k_hi)) * mult
        if integer:
            k_lo, k_hi = math.ceil(low), math.floor(high)
            return self.rng.randint(k_lo, max(k_lo, k_hi))
        return min(max(round(self.rng.uniform(low, high), 2), low), high)


def _strings_in(data: object, out: list[str], depth: int = 0) -> None:
    if depth > 8 or len(out) > 200:
        return
    if isinstance(data, str):
        out.append(data)
    elif isinstance(data, dict):
        for value in data.values():
            _strings_in(value, out, depth + 1)
    elif isinstance(data, list):
        for value in data:
            _strings_in(value, out, depth + 1)


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
