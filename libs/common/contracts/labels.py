"""Human labels of the codes the product records: events, condition attributes, reasons (a stop, a skip, a
wait, a refusal) and sources (of an enrollment, of a message).

The one catalogue: the dashboard shows a code through :func:`label` (its ``label`` filter), and
``docs/labels.md`` is this catalogue written out (``python -m libs.common.contracts.labels > docs/labels.md``;
``tests/test_labels.py`` fails when the two differ, and that every code of the API's reason enums has a
label here). A code missing here is shown readably all the same (``message_too_long`` as "message too
long"); a code with a value after a colon (an episode key ``awaiting_agent:<time>``), or a reason with its
detail (a step run's ``only_if`` and the condition, ``ai_fallback`` and why), is labelled by its code, then
its value.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final, Literal

#: What a code is: the catalogue has one table of each.
LabelKind = Literal["event", "attribute", "reason", "source"]

#: Rule trigger events and the outbox events a timeline shows.
EVENTS: Final[dict[str, str]] = {
    "contact.created": "Contact created",
    "contact.tag_added": "Tag added to the contact",
    "contact.tag_removed": "Tag removed from the contact",
    "contact.updated": "Contact updated",
    "contact.opted_out": "Contact opted out",
    "contact.erased": "Contact erased",
    "lead.created": "Lead created",
    "lead.status_changed": "Lead status changed",
    "lead.closed": "Lead closed",
    "deal.stage_changed": "Deal stage changed",
    "conversation.created": "Conversation started",
    "conversation.updated": "Conversation updated",
    "conversation.opened": "Conversation opened",
    "conversation.resolved": "Conversation resolved",
    "conversation.status_changed": "Conversation status changed",
    "message.created": "Message in the conversation",
    "message.received": "Message from the contact",
    "message.human": "Message from an agent",
    "message.queued": "Message queued",
    "message.sent": "Message sent",
    "message.delivered": "Message delivered",
    "message.read": "Message read",
    "message.failed": "Message failed",
    "followup.enrolled": "Enrolled in a sequence",
    "followup.sent": "Follow-up queued",
    "followup_sent": "Follow-up queued",
    "followup.completed": "Sequence completed",
    "followup.stopped": "Sequence stopped",
    "followup.failed": "Sequence failed",
    "followup.converted": "Sequence goal met",
    "followup.exited": "Sequence exit criterion met",
}

#: The attributes of rule conditions (``contact.attributes.<key>`` is labelled by its key).
ATTRIBUTES: Final[dict[str, str]] = {
    "contact.name": "Contact's name",
    "contact.phone": "Contact's phone",
    "contact.timezone": "Contact's time zone",
    "contact.consent": "Contact's consent",
    "contact.opted_out": "Contact opted out",
    "contact.tags": "Contact's tags",
    "contact.attributes": "Contact attribute",
    "conversation.status": "Conversation status",
    "conversation.priority": "Conversation priority",
    "conversation.assignee": "Conversation assignee",
    "conversation.team": "Conversation team",
    "conversation.inbox": "Conversation inbox",
    "conversation.number": "Conversation's number",
    "conversation.labels": "Conversation labels",
    "conversation.attributes": "Conversation attribute",
    "conversation.private_note": "Conversation private note",
    "message.type": "Message direction",
    "message.content": "Message text",
    "lead.status": "Lead status",
    "deal.stage": "Deal stage",
    "changed": "Changed attributes",
    "event.tags_added": "Tags this change added",
    "event.tags_removed": "Tags this change removed",
    "event.labels_added": "Labels this change added",
    "event.labels_removed": "Labels this change removed",
}

#: Why an enrollment stopped, paused or waits, why a step or an execution was skipped, why a bulk
#: enrollment skipped a contact, why an AI step took its fallback; and a delayed rule's episode kinds.
REASONS: Final[dict[str, str]] = {
    # stops
    "replied": "Contact replied",
    "human_message": "An agent wrote",
    "opted_out": "Contact opted out",
    "lead_closed": "Lead closed",
    "conversation_resolved": "Conversation resolved",
    "contact_erased": "Contact erased",
    "manual": "By hand",
    "reentered": "Replaced by a new enrollment",
    "plan_lost": "The project's plan ended",
    "sequence_paused": "Sequence paused",
    "instance_unavailable": "No number connected",
    "undeliverable": "The provider cannot deliver to the contact",
    "error": "Error",
    # goals and exits (a message cancelled for them; an enrollment refused)
    "converted": "Goal met",
    "exited": "Exit criterion met",
    "exit_criteria": "An exit criterion holds",
    # skipped steps and waits
    "only_if": "Condition not met",
    "no_reply_since_previous_step": "no reply since the previous step",
    "replied_since_previous_step": "replied since the previous step",
    "no_consent": "No consent",
    "outside_service_window": "Outside the 24-hour service window",
    "service_window_template": "Sent as a template (outside the service window)",
    "past_due": "Too late (past its grace)",
    "message_too_long": "Message too long",
    "missing_value": "A placeholder has no value",
    "missing_variable": "A placeholder has no value",
    "send_window": "Outside the send window",
    "rescheduled": "Step rescheduled",
    "busy": "Number busy",
    "pacing": "Pacing on the number",
    "in_flight": "Too many messages in flight",
    "quota": "Monthly quota reached",
    "backlog": "Send lane backlog",
    "contact_cap": "Per-contact cap reached",
    "contact_day_cap": "Per-contact daily cap reached",
    "messaging_limit": "The portfolio's messaging limit reached",
    "user_marketing_limit": "The contact's marketing limit (WhatsApp 131049)",
    "recipient_gap": "Spacing between messages to the contact",
    # what a provider's failure changed (a message's timeline)
    "marketing_deferred": "Marketing follow-ups deferred until",
    "template_retry": "Retried as its template",
    "step_skipped": "Step skipped",
    "contact_undeliverable": "Contact undeliverable, follow-ups stopped",
    "requeued": "Queued again, the number slowed",
    "recorded": "Recorded",
    # the path a step that sends nothing took (a branched step run; the path's or variant's name follows)
    "path": "Took the path",
    "otherwise": "No path held: took otherwise",
    "no_reply": "No reply by the deadline",
    "variant": "Assigned the variant",
    "holdout": "Held out (sent nothing more)",
    "ai_fallback": "AI fallback",
    "ai_unavailable": "model unavailable",
    "ai_budget_exhausted": "AI budget used up",
    "ai_timeout": "model timed out",
    "ai_error": "model call failed",
    "ai_invalid_output": "model answer unusable",
    "ai_low_confidence": "model not confident",
    "ai_policy": "AI policy",
    # delayed rules
    "rule_inactive": "Rule disabled",
    "conversation_gone": "Conversation deleted",
    "episode_moved": "The conversation moved on",
    "conditions_changed": "Conditions no longer hold",
    "cancelled": "Cancelled",
    "expired": "Too late (after an outage)",
    "failed": "Failed",
    "status": "Conversation in a status",
    "awaiting_agent": "Waiting for an agent since",
    "awaiting_customer": "Waiting for the customer since",
    "reply_chase": "Waiting for the customer's answer to",
    "event": "The event itself",
    # rule runs refused
    "no_conversation": "No open conversation",
    "rejected": "Rejected",
    # bulk enrollments
    "already_enrolled": "Already enrolled",
    "reentry_not_allowed": "Re-entry not allowed",
    "plan_limit": "Plan limit reached",
    "sequence_not_enrollable": "Sequence not enrollable",
    "unknown_contact": "Unknown contact",
    "invalid_phone": "Invalid phone",
    "missing_anchor": "No anchor time",
    "invalid": "Invalid value",
    # message failures
    "CANCELLED": "Cancelled",
    # a stored code this version does not know (its text is the detail)
    "other": "Other",
}

#: Who made an enrollment, who wrote a message.
SOURCES: Final[dict[str, str]] = {
    "api": "API",
    "dashboard": "Dashboard",
    "rule": "Rule",
    "bulk": "Bulk enrollment",
    "campaign": "Campaign",
    "conversation": "Conversation shortcut",
    "followup": "Follow-up",
    "contact": "Contact",
    "human": "Agent",
}

#: Every table of the catalogue, by kind, with its heading in ``docs/labels.md``.
CATALOGUE: Final[dict[LabelKind, tuple[str, dict[str, str]]]] = {
    "event": ("Events", EVENTS),
    "attribute": ("Condition attributes", ATTRIBUTES),
    "reason": ("Reasons", REASONS),
    "source": ("Sources", SOURCES),
}


def label(code: str | None, kind: LabelKind, detail: str | None = None) -> str:
    """The human label of ``code`` (a ``kind``): the catalogue's, else the code made readable; then the
    ``detail`` answered beside a reason (``only_if`` and ``previous_not_read``), if any."""
    if not code:
        return "—"
    table = CATALOGUE[kind][1]
    if detail is not None:
        return f"{label(code, kind)}: {_value(detail, table)}"
    found = table.get(code)
    if found is not None:
        return found
    head, sep, rest = code.partition(":")
    if sep:
        return f"{label(head, kind)}: {_value(rest, table)}"
    if kind == "attribute":
        for prefix in ("contact.attributes.", "conversation.attributes."):
            if code.startswith(prefix):
                return f"{table[prefix.rstrip('.')]} “{code.removeprefix(prefix)}”"
    return code.replace("_", " ").replace(".", " ").capitalize()


def _value(text: str, table: dict[str, str]) -> str:
    """The value after a code's colon: a time to the second (UTC), a known code's label, else the text
    with its underscores as spaces (and so on after a further colon: ``status:open:<time>``)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        pass
    else:
        if moment.utcoffset() is not None:
            return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    found = table.get(text)
    if found is not None:
        return found
    head, sep, rest = text.partition(":")
    if sep:
        return f"{table.get(head, head.replace('_', ' '))}, {_value(rest, table)}"
    return text.replace("_", " ")


def markdown() -> str:
    """The catalogue as ``docs/labels.md``."""
    lines = [
        "# Labels",
        "",
        "What the dashboard shows for each code the API answers. Written from",
        "`libs/common/contracts/labels.py` (`python -m libs.common.contracts.labels > docs/labels.md`):",
        "edit that module, not this file. A code not listed is shown with its underscores as spaces; a",
        "code with a value after a colon (`awaiting_agent:<time>`), or a reason with its detail",
        "(`reason_detail`, `skip_detail`: `only_if` and the condition, `ai_fallback` and why), is shown as",
        "its code's label, then the value's.",
    ]
    for heading, table in CATALOGUE.values():
        lines += ["", f"## {heading}", "", "| code | label |", "|---|---|"]
        lines += [f"| `{code}` | {text} |" for code, text in table.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
