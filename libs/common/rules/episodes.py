"""Episodes of a delayed rule (seed 002, "don't reset the clock"): one pending execution per (rule,
conversation, episode); the episode key comes from the anchors captured in the event's transaction, never
re-read later:

    status          status:<status_changed_at>        the conversation's status episode (conversation
                                                       events): a rule whose conditions involve the status
                                                       is due status_changed_at + delay (story 1), any
                                                       other the event + delay; a repeated event of the
                                                       episode does not reset the clock
    reply_chase     reply_chase:<last incoming id>     an agent's message (the customer went quiet): due
                                                       the latest agent reply + delay, moved forward only
    awaiting_agent  awaiting_agent:<waiting_since>     a customer's message (the agent went quiet): due
                                                       waiting_since + delay; an agent reply ends the wait
    event           event:<trigger id>                 an event without a conversation: each its own
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from libs.common.platform.conditions import Group, Leaf, Node
from libs.common.rules.actions import Subject

#: What an episode is keyed on (see the module).
EpisodeKind = Literal["status", "reply_chase", "awaiting_agent", "event"]
#: The attribute a status-based rule names (its delay counts from when the status was entered).
STATUS = "conversation.status"


@dataclass(frozen=True)
class Episode:
    """The episode an event opens or continues: its kind, its key, and when its clock started."""

    kind: EpisodeKind
    key: str
    #: When the episode's clock started (the delay counts from it).
    since: datetime


def _stamp(value: Any) -> datetime | None:
    """A timestamp of the anchors (ISO text in JSON, or a datetime read from the table), in UTC."""
    if value is None:
        return None
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    assert isinstance(moment, datetime)
    return moment.astimezone(UTC)


def _key(kind: str, anchor: Any) -> str:
    stamp = _stamp(anchor) if kind in ("status", "awaiting_agent") else None
    return f"{kind}:{stamp.isoformat() if stamp is not None else anchor}"


def involves_status(node: Node) -> bool:
    """Whether conditions involve the conversation's status: a leaf about it, or ``changed`` naming it."""
    if isinstance(node, Group):
        return any(involves_status(child) for child in node.children)
    assert isinstance(node, Leaf)
    if node.attribute == STATUS:
        return True
    values = node.value if isinstance(node.value, list) else [node.value]
    return node.attribute == "changed" and STATUS in values


def episode_of(subject: Subject, *, from_status: bool = True) -> Episode:
    """The episode an event opens or continues, from the anchors captured with it. ``from_status``: the
    rule's conditions involve the status, so a status episode's clock starts when the status was entered;
    else it starts at the event (one occurrence per episode either way)."""
    payload, occurred_at = subject.payload, subject.occurred_at
    anchors = payload.get("anchors") or {}
    if subject.conversation_id is None:
        return Episode("event", f"event:{subject.trigger_id}", occurred_at)
    if subject.type == "message.created":
        message = payload.get("message") or {}
        if message.get("type") == "outgoing":
            return Episode(
                "reply_chase", _key("reply_chase", anchors.get("last_incoming_message_id")), occurred_at
            )
        waiting = anchors.get("waiting_since")
        return Episode("awaiting_agent", _key("awaiting_agent", waiting), _stamp(waiting) or occurred_at)
    changed = anchors.get("status_changed_at")
    since = (_stamp(changed) or occurred_at) if from_status else occurred_at
    return Episode("status", _key("status", changed), since)


def current_key(kind: str, row: dict[str, Any]) -> str | None:
    """The episode key the conversation has now (None: an event episode, always current)."""
    if kind == "event":
        return None
    anchor = {
        "status": row["status_changed_at"],
        "reply_chase": str(row["last_incoming_message_id"]) if row["last_incoming_message_id"] else None,
        "awaiting_agent": row["waiting_since"],
    }[kind]
    return _key(kind, anchor)
