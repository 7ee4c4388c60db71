"""English phrase tables and small text helpers shared by the offline skills.

Templates use ``str.format`` fields. Field names used across the tables:
``name`` (the actor), ``place`` (current location name), ``exit`` (destination name),
``other`` (another character's name), ``obj`` (an object with its article, e.g. "the lantern"),
``Obj`` (the same, capitalised), ``goal`` (a goal as a verb phrase), ``persona`` (personality
as an adjective phrase), ``atmos`` (the location's atmosphere), ``omood`` (other's mood).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

# --------------------------------------------------------------------------- helpers

_ARTICLES = frozenset({"a", "an", "the", "some", "his", "her", "their", "my", "your", "its"})


def the(thing: str) -> str:
    """Give a common noun phrase an article; leave proper nouns and articled phrases alone."""
    if not thing:
        return "something"
    words = thing.split(" ", 2)
    first = words[0]
    if first.lower() in _ARTICLES:
        return thing
    if first[:1].isupper() and (
        first.endswith(("'s", "’s")) or all(w[:1].isupper() for w in words[:2])
    ):
        return thing  # a proper name or possessive: "Excalibur", "Old Mill", "Orla's desk"
    return "the " + thing


def as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@lru_cache(maxsize=4096)
def clause(text: str, keep: bool = False) -> str:
    """Turn a sentence-like goal/personality into an inline clause (no final stop, lower start).

    ``keep`` leaves the first letter alone (the sentence starts with a proper name).
    """
    text = text.split(";", 1)[0].split(" — ", 1)[0].strip().rstrip(".!,:")
    if not text:
        return text
    first = text.split(" ", 1)[0]
    if keep or first == "I" or (len(first) > 1 and first[1:2].isupper()):
        return text
    return text[:1].lower() + text[1:]


def short(text: str, limit: int = 80) -> str:
    """Cut ``text`` to at most ``limit`` characters at a word boundary."""
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip(",;:—- ") + "…"


#: the characters that can end a sentence or open and close quoted speech
_MARKS = re.compile(r'[".!?]')


def first_sentence(text: str) -> str:
    """The first sentence of ``text``, treating double-quoted speech as opaque.

    Only the marks are visited (a regular expression finds them), not every character:
    memory texts are long and this runs for each of them.
    """
    quoted = False
    n = len(text)
    for mark in _MARKS.finditer(text):
        i = mark.start()
        if text[i] == '"':
            quoted = not quoted
            if not quoted and i > 0 and text[i - 1] in ".!?" and (i + 1 == n or text[i + 1] == " "):
                return text[: i + 1]
        elif not quoted and (i + 1 == n or text[i + 1] == " "):
            return text[: i + 1]
    text = text.strip()
    return text if text[-1:] in '.!?"' else text + "."


def join_names(names: Sequence[str]) -> str:
    if not names:
        return "no one"
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


_TITLES = frozenset(
    (
        "Brother",
        "Sister",
        "Father",
        "Mother",
        "Captain",
        "Lady",
        "Lord",
        "Sir",
        "Dame",
        "Mr",
        "Mrs",
        "Ms",
        "Miss",
        "Doctor",
        "Dr",
        "Old",
        "Young",
        "Master",
        "Mistress",
        "Aunt",
        "Uncle",
    )
)


def address(name: str) -> str:
    """How one character addresses another in speech: the first name, or title and name."""
    first = name.split(" ", 1)[0]
    return name if first.rstrip(".") in _TITLES or first == name else first


@lru_cache(maxsize=8192)
def keyword(name: str) -> str:
    """The most distinctive (longest) lowercase word of a name, for cheap goal matching."""
    best = ""
    for w in name.lower().replace("'", " ").replace("-", " ").split():
        if len(w) > len(best) and w not in _ARTICLES:
            best = w
    return best if len(best) >= 3 else ""


# --------------------------------------------------------------------------- intention

MOVE_PLAIN: tuple[str, ...] = (
    "Set off for {exit} — {place} has given up all it will today.",
    "Slip quietly out of {place} and make for {exit}.",
    "Follow the path to {exit}, hoping for a change of luck.",
    "Leave {place} behind and see what {exit} holds.",
    "Try {exit}; staying here any longer would be a waste.",
    "Head for {exit} before {place} gets any stranger.",
)
MOVE_GOAL: tuple[str, ...] = (
    "Head to {exit} to {goal}.",
    "Go to {exit} — if there is any chance to {goal}, it lies that way.",
    "Make for {exit}; it is the likeliest place to {goal}.",
)
SPEAK_PLAIN: tuple[str, ...] = (
    "{other}! Strange seeing you here in {place}. What brings you?",
    "You look {omood}, {other}. Has {place} been treating you badly?",
    "Listen, {other}. Something about {place} feels wrong today — stay close.",
    "Good to see a friendly face, {other}. It gets lonely in {place}.",
    "Tell me, {other} — have you noticed anything odd about {obj}?",
    "{other}, if you know anything about {obj}, now is the time to say it.",
)
SPEAK_GOAL: tuple[str, ...] = (
    "{other}, I need your help. I mean to {goal}, and I can't do it alone.",
    "I won't pretend otherwise, {other}: I came to {place} to {goal}.",
    "Can I count on you, {other}? I mean to {goal}, sooner rather than later.",
    "Be honest with me, {other}. Could someone like me really {goal}?",
)
SPEAK_AGAIN: tuple[str, ...] = (
    "As I was saying, {other} — I haven't finished.",
    "Where were we, {other}? You never answered me properly.",
    "One more thing, {other}, before you change the subject again.",
)
ACT_HERE: tuple[str, ...] = (
    "Examine {obj} closely, looking for anything out of place.",
    "Pick up {obj} and turn it over carefully.",
    "Search around {obj} for anything hidden.",
    "Try {obj}, just to see what happens.",
    "Quietly pocket {obj} while no one is looking.",
    "Run a hand over {obj}, feeling for marks or seams.",
)
ACT_HERE_GOAL: tuple[str, ...] = (
    "Study {obj}; it might help to {goal}.",
    "Put {obj} to use — anything that helps to {goal} is worth a try.",
)
ACT_HELD: tuple[str, ...] = (
    "Take out {obj} and check that it is still in one piece.",
    "Polish {obj} absent-mindedly while thinking.",
    "Hold up {obj} to the light and study it again.",
    "Offer {obj} around, to see who reacts.",
)
ACT_HELD_GOAL: tuple[str, ...] = ("Use {obj} to {goal}.",)
WAIT: tuple[str, ...] = (
    "Stay put and watch {place} for a while.",
    "Lean back and listen to the sounds of {place}.",
    "Wait to see who turns up next.",
    "Take a moment to think things through.",
    "Sit quietly and take in the mood of {place}.",
)
WHY_MOVE: tuple[str, ...] = (
    "{name} wants to {goal}, and that won't happen standing still in {place}.",
    "{exit} seems the likeliest place to {goal}.",
    "Nothing in {place} brings {name} any closer to the aim: to {goal}.",
)
WHY_MOVE_P: tuple[str, ...] = (
    "Being {persona}, {name} never stays in one place for long.",
    "{name} is {persona}, and {place} has started to feel small.",
)
WHY_SPEAK: tuple[str, ...] = (
    "{other} might know something useful, and {name} needs to {goal}.",
    "Winning {other} over could help {name} {goal}.",
)
WHY_SPEAK_P: tuple[str, ...] = (
    "Being {persona}, {name} can't resist striking up a conversation with {other}.",
    "{name} is {persona}; {other}'s {omood} look is hard to ignore.",
)
WHY_ACT: tuple[str, ...] = (
    "{Obj} could matter if {name} is to {goal}.",
    "To {goal}, {name} will need every advantage — {obj} included.",
)
WHY_ACT_P: tuple[str, ...] = (
    "Being {persona}, {name} can't leave {obj} alone.",
    "{name} is {persona}, and {obj} is right there.",
)
WHY_WAIT: tuple[str, ...] = (
    "{name} needs time to work out how to {goal}.",
    "Rushing would not help {name} {goal}; better to watch first.",
)
WHY_WAIT_P: tuple[str, ...] = (
    "Being {persona}, {name} prefers to watch before acting.",
    "{name} is {persona}, and {place} calls for patience right now.",
)
RECALL_MOVED: tuple[str, ...] = (
    "Having only just reached {place}, {name} takes stock.",
    "{name} is still getting the measure of {place} after arriving.",
)
RECALL_STUCK: tuple[str, ...] = (
    "{name} has lingered in {place} for {n} turns now.",
    "After {n} turns in {place}, {name} wants a change.",
    "{name} has been in {place} a while and it is starting to show.",
)
RECALL_SPOKE: tuple[str, ...] = (
    "The conversation with {other} is unfinished.",
    "{other} still owes {name} a proper answer from before.",
)
RECALL_ACTED: tuple[str, ...] = (
    "{Obj} is still on {name}'s mind from before.",
    "Last time {obj} gave up nothing; maybe this time it will.",
)
RECALL_WAITED: tuple[str, ...] = (
    "After waiting last time, {name} is ready to do something.",
    "Enough watching from the sidelines, {name} decides.",
)

# --------------------------------------------------------------------------- resolution

GO_OK: tuple[str, ...] = (
    "{name} left {place} and made their way to {exit}.",
    "{name} slipped out of {place}, bound for {exit}.",
    "{name} set off toward {exit} without a backward glance.",
    "With a last look around {place}, {name} headed for {exit}.",
    "{name} gathered their things and walked out toward {exit}.",
)
GO_FAIL: tuple[str, ...] = (
    "{name} started for {exit}, but {why}, so the trip would have to wait.",
    "{name} meant to reach {exit}; {why}, and {place} kept them a while longer.",
)
GO_OBSTACLE: tuple[str, ...] = (
    "the way was blocked by a knot of arguing strangers",
    "a sudden downpour drove them back inside",
    "a shout from behind made them turn around",
    "the door stuck fast in its frame",
    "second thoughts got the better of them",
)
SAY: tuple[str, ...] = (
    '{name} spoke to {other}: "{words}"',
    '{name} drew {other} aside and said, "{words}"',
    '{name} caught {other}\'s eye: "{words}"',
    '{name} told {other} quietly, "{words}"',
)
REACT_GOOD: tuple[str, ...] = (
    "{other} listened carefully and nodded.",
    "{other} answered warmly, glad of the company.",
    "{other} smiled and promised to help.",
    "{other} leaned in, clearly interested.",
)
REACT_BAD: tuple[str, ...] = (
    "{other} frowned, unconvinced.",
    "{other} gave a guarded reply and changed the subject.",
    "{other} laughed it off, which stung.",
    "{other} looked away, plainly uneasy.",
)
SAY_EMPTY: tuple[str, ...] = (
    "{name} called out, but no one answered; the words hung in the air of {place}.",
    "{name} spoke to an empty corner of {place} and felt foolish for it.",
)
TAKE: tuple[str, ...] = (
    "{name} took {obj} and tucked it away.",
    "{name} lifted {obj} from its place and kept it.",
    "While no one was looking, {name} pocketed {obj}.",
)
USE_HERE: tuple[str, ...] = (
    "{name} examined {obj} closely and {found}.",
    "{name} tried {obj} and {found}.",
    "{name} spent a long moment with {obj} and {found}.",
)
FOUND: tuple[str, ...] = (
    "found a scratched symbol no one had noticed before",
    "learned little, though it passed the time",
    "came away more puzzled than before",
    "found it sturdier than it looked",
    "noticed something that might matter later",
)
USE_HELD: tuple[str, ...] = (
    "{name} took out {obj} and turned it over, reassured.",
    "{name} made good use of {obj}, to the interest of anyone watching.",
    "{name} held {obj} up to the light; it had not changed.",
)
DROP: tuple[str, ...] = ("{name} set {obj} down in {place} and left it there.",)
NOT_FOUND: tuple[str, ...] = (
    "{name} searched {place} for {obj} but came up empty-handed.",
    "{name} looked around for {obj}, without luck.",
)
IDLE: tuple[str, ...] = (
    "{name} waited, watching {place} and saying little.",
    "{name} kept to the edges of {place}, listening.",
    "{name} let the moment pass, lost in thought.",
    "{name} stayed put, quietly taking the measure of {place}.",
)
GM_RECALL_ACT = "It was not the first time {name} had looked at {obj}."
GM_RECALL_SAY = "{name} had not forgotten the earlier words with {other}."
GM_RECALL_WAIT = "{name} had been waiting here since the last turn."
GM_RECALL_NEW = "{name} was new to {place}, and it showed."
SAY_GONE = "{name} turned to speak to {other}, but {other} had already gone."
MOODS_GO: tuple[str, ...] = ("hopeful", "restless", "determined", "eager")
MOODS_STUCK: tuple[str, ...] = ("frustrated", "impatient", "thwarted")
MOODS_GOOD: tuple[str, ...] = ("cheered", "warm", "relieved", "encouraged")
MOODS_BAD: tuple[str, ...] = ("irritated", "uneasy", "wary", "stung")
MOODS_ACT: tuple[str, ...] = ("curious", "satisfied", "intrigued", "pleased")
MOODS_IDLE: tuple[str, ...] = ("calm", "bored", "pensive", "watchful")
ATMOS_LEFT: tuple[str, ...] = (
    "quieter since {name} left",
    "a little emptier without {name}",
    "unsettled after {name}'s departure",
)
ATMOS_TAKEN: tuple[str, ...] = (
    "watchful, as though something were missing",
    "uneasy, with everyone eyeing the gap where {obj} had been",
)
ATMOS_MISSING = "still marked by the absence of {obj}"
ATMOS_TALK: tuple[str, ...] = (
    "alive with murmured talk",
    "thick with half-finished conversations",
    "warmer for the company",
)
ATMOS_ANY: tuple[str, ...] = (
    "hushed and expectant",
    "drowsy, the hours dragging",
    "sharp with the smell of rain",
    "restless, like the air before a storm",
    "warmer than before",
    "tense and watchful",
)

# --------------------------------------------------------------------------- narrative

OPEN: tuple[str, ...] = (
    "At {place}, the air was {atmos}.",
    "Another turn came to {place}, and the mood there was {atmos}.",
    "In {place}, everything felt {atmos}.",
    "The light shifted over {place}, and the mood stayed {atmos}.",
    "Nothing about {place} felt settled; it was {atmos}.",
)
LINK: tuple[str, ...] = ("Meanwhile, ", "Not long after, ", "At the same time, ", "Then ", "")
REST: tuple[str, ...] = (
    "{names} kept to their own business, watching from the edges.",
    "Around them, {names} went about their own affairs.",
)
QUIET: tuple[str, ...] = (
    "No one came or went; {place} kept its own counsel.",
    "For a long while, nothing stirred.",
    "The hours passed without a single visitor.",
)
ECHO_GONE = "Of {name}, who had been here before, there was no sign now."
ECHO_BACK: tuple[str, ...] = (
    "Once again, {name} was at the heart of things.",
    "{name} was still there, as if the place would not let go.",
    "{name}, seen here before, had not moved on.",
)
CLOSE: tuple[str, ...] = (
    "By the end of it, {place} had settled into an uneasy quiet.",
    "Whatever came next, {place} would remember this turn.",
    "And still {place} waited for what the next hour would bring.",
    "The moment passed, but something in {place} had shifted.",
    "Somewhere beyond {place}, the world went on turning.",
)
