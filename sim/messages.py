"""The message channel (``[messages]``): a character reaches anyone it has a tie with.

With ``[messages] enabled = true`` the intention schema gains the ``message`` action. Its
target must be one of the sender's *contacts*: the characters its relationships name,
kept by the world's tie rule (``kinds``, ``min_trust``; default: every relationship), not
where they stand. The apply phase delivers each message (in a sharded tick, every shard's
to the shard of each recipient: ``sim.phases.apply.deliver``):

- into the recipient's ``inbox`` (its character file), which its next tick's intentions
  input shows as the ``messages`` section, and which the apply phase after it empties;
- into the recipient's memory, as a cell of the tick it was sent;
- into the tick log, as the apply phase's results (``{"messages": [...]}``), which
  ``sim log`` shows and ``sim export`` reads as the ``messages`` table.

A world without ``[messages]`` (or with ``enabled = false``) keeps its schemas, inputs,
files and logs byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.config import Config, MessagesConfig

if TYPE_CHECKING:
    from sim.world import Entity, World

#: the action's name in the intention schema
MESSAGE = "message"
#: how the intentions prompt describes it (it lists the world's verbs the same way)
DESCRIPTION = (
    "send a message to someone you have a tie with, wherever they are "
    "(an id from Contacts; `content`: the message)"
)


def rule(config: Config) -> MessagesConfig | None:
    """The channel's settings when it is on; ``None``: no ``message`` action."""
    found = config.messages
    return found if found is not None and found.enabled else None


def actions(config: Config) -> dict[str, str]:
    """The world's own verbs (``[actions]``), and ``message`` when the channel is on."""
    if rule(config) is None:
        return dict(config.actions)
    return {**config.actions, MESSAGE: DESCRIPTION}


def is_tie(tie: Mapping[str, Any], settings: MessagesConfig) -> bool:
    """Whether a relationship counts as a tie under the world's rule."""
    if settings.kinds and tie.get("kind") not in settings.kinds:
        return False
    trust = tie.get("trust", 0.5)
    return isinstance(trust, int | float) and trust >= settings.min_trust


def contacts(char: Entity, settings: MessagesConfig) -> list[str]:
    """The ids ``char`` may message: its ties, in file order. Only the character is read
    (a relationship names a character of the world, checked when it is loaded), so a part
    of the world, such as a shard's, gives the same contacts as the whole."""
    cid = char["identity"]["id"]
    ties = char.get("relationships") or {}
    return [other for other, tie in ties.items() if other != cid and is_tie(tie, settings)]


def contacts_view(world: World, ids: list[str]) -> list[dict[str, str]]:
    """Contacts as the intentions input shows them: id and name (the id when the
    character is not at hand)."""
    out = []
    for i in ids:
        other = world.characters.get(i)
        out.append({"id": i, "name": other["identity"]["name"] if other is not None else i})
    return out


def inbox_view(world: World, char: Entity) -> list[dict[str, Any]]:
    """The messages a character received last tick, as its input shows them."""
    out = []
    for item in char.get("inbox") or ():
        sender = world.characters.get(item["from"])
        name = sender["identity"]["name"] if sender is not None else item["from"]
        out.append({"tick": item["tick"], "from": item["from"], "name": name, "text": item["text"]})
    return out


@dataclass(frozen=True, slots=True)
class Sent:
    """A message delivered in a tick (the apply phase's log results, a ``messages`` row)."""

    sender: str
    recipient: str
    text: str

    def record(self) -> dict[str, str]:
        return {"from": self.sender, "to": self.recipient, "text": self.text}


def memory_text(sender_name: str, text: str) -> str:
    """The recipient's memory of a message."""
    return f"A message from {sender_name}: {text}"


__all__ = [
    "DESCRIPTION",
    "MESSAGE",
    "Sent",
    "actions",
    "contacts",
    "contacts_view",
    "inbox_view",
    "is_tie",
    "memory_text",
    "rule",
]
